"""A local Kubernetes cluster: the real control plane plus a node agent that runs pods as processes."""
