"""A real Kubernetes node beside the agent's nodes: containerd + runc + bridge CNI, kubelet and kube-proxy.

The node agent runs pods as processes, which is fast but emulates what users run first: images and their
entrypoints, the 64 MiB /dev/shm, non-root users, kube-proxy Services, cluster DNS, kubelet's signals and
grace periods, OOM kills. This package runs the real thing on the same machine (one real node per machine:
it takes host ports, /var/lib/kubelet, cni0 and iptables) and puts the host back as it found it on `down`.
"""
