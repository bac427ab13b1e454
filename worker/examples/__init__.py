"""Example training scripts that the demo and the tests run."""
