"""Settings of the node agent and their command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from phalanx.devcluster import podnetwork
from phalanx.devcluster.binaries import KUBERNETES_VERSION


class AgentConfig(BaseModel):
    """Everything the agent needs to know; built from the command line."""

    kubeconfig: Path
    """Kubeconfig of the cluster (admin credentials)."""
    state_dir: Path
    """Root of the agent's files: pod directories, logs, pid files, provisioned volumes, TLS material."""
    nodes: int = Field(default=2, ge=0)
    """Number of real nodes (`node-0..N-1`), whose pods run as processes."""
    simulated_nodes: int = Field(default=0, ge=0)
    """Number of simulated nodes (`sim-0..M-1`), whose pods become Running without a process."""
    cluster_octet: int = Field(default=42, ge=1, le=254)
    """X in 127.X.0.0/16, the pod network of this cluster when `pod_prefix` is empty; two clusters on one machine
    need different values."""
    pod_prefix: str = Field(default="", pattern=r"^(\d{1,3}\.\d{1,3})?$")
    """The first two octets of the pod network when the control plane routed a /16 to this host for the cluster
    (devcluster/podnetwork.py): its Services then get endpoints, which refuse 127.X addresses. Empty: 127.X."""
    api_port: int = Field(default=6443, ge=1, le=65535)
    """Port of the apiserver on 127.0.0.1, injected into pods as KUBERNETES_SERVICE_PORT."""
    kubelet_port: int = Field(default=0, ge=0, le=65535)
    """Port of the HTTPS log server advertised as every node's kubelet endpoint (0: pick a free one)."""
    dns_port: int = Field(default=53, ge=0, le=65535)
    """Port of the cluster DNS server on the pod network's first address (pods' resolv.conf can only name port
    53)."""
    node_cpu: str = "8"
    """CPU capacity of each node."""
    node_memory: str = "16Gi"
    """Memory capacity of each node."""
    machine_memory: int | None = Field(default=None, ge=1)
    """Bytes of memory of the machine the real nodes' pods run on (set by the agent at start): each real node
    advertises at most an equal share of it, so the scheduler never binds more memory than the machine has.
    None: `nodeMemory` as it is."""
    gpus_per_node: int = Field(default=0, ge=0)
    """`nvidia.com/gpu` capacity of each node (0: the resource is not advertised)."""
    zones: int = Field(default=2, ge=1)
    """Number of zones (`zone-a`, `zone-b`, ...); nodes are assigned to zones in contiguous blocks."""
    nodes_per_rack: int = Field(default=2, ge=1)
    """Nodes per `phalanx.dev/rack` block (racks never straddle zones)."""
    lease_interval: float = Field(default=2.0, gt=0)
    """Seconds between node Lease renewals."""
    status_interval: float = Field(default=10.0, gt=0)
    """Seconds between node status heartbeats (Ready condition)."""
    real_node_dns: str | None = None
    """Address of the DNS server for a real kubelet node's pods (its kubelet's clusterDNS): it answers
    ClusterIPs, which kube-proxy routes there, and forwards outside names to the host's resolver. None: none."""
    kubelet_version: str = f"v{KUBERNETES_VERSION}"
    """The version each node reports as its kubelet's and kube-proxy's: the control plane's, so that no node
    looks older than the version skew Kubernetes allows."""
    use_namespaces: bool | None = None
    """Force (True) or forbid (False) `unshare` mount/UTS namespaces; None: probe at start."""

    @property
    def pod_network_prefix(self) -> str:
        return self.pod_prefix or podnetwork.loopback_prefix(self.cluster_octet)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m phalanx.devcluster.agent", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--simulated-nodes", type=int, default=0)
    parser.add_argument("--cluster-octet", type=int, default=42)
    parser.add_argument("--pod-prefix", default="")
    parser.add_argument("--api-port", type=int, default=6443)
    parser.add_argument("--kubelet-port", type=int, default=0)
    parser.add_argument("--dns-port", type=int, default=53)
    parser.add_argument("--node-cpu", default="8")
    parser.add_argument("--node-memory", default="16Gi")
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--zones", type=int, default=2)
    parser.add_argument("--nodes-per-rack", type=int, default=2)
    parser.add_argument("--lease-interval", type=float, default=2.0)
    parser.add_argument("--status-interval", type=float, default=10.0)
    parser.add_argument("--real-node-dns", default=None)
    parser.add_argument("--kubelet-version", default=f"v{KUBERNETES_VERSION}")
    ns = parser.add_mutually_exclusive_group()
    ns.add_argument("--namespaces", dest="use_namespaces", action="store_true", default=None)
    ns.add_argument("--no-namespaces", dest="use_namespaces", action="store_false")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> AgentConfig:
    args = build_parser().parse_args(argv)
    return AgentConfig(**vars(args))
