"""Phalanx: keeps large PyTorch training runs alive on Kubernetes."""

__version__ = "0.1.0"

API_GROUP = "phalanx.dev"
"""The API group of Phalanx's custom resources; also the prefix of its labels and annotations."""
