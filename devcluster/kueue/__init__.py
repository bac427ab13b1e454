"""Kueue (sigs.k8s.io/kueue) beside the local cluster: built from its Go module, run as a host process."""
