"""The real node's configuration files, rendered from its settings (pure functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from phalanx.devcluster.binaries import KUBERNETES_VERSION, is_legacy
from phalanx.images import containerd

PAUSE_IMAGE = "localhost/pause:3.2"
"""1.20's sandbox image, built locally from the Kubernetes sources' pause.c: no registry is needed."""
CNI_BIN_DIR = "/usr/lib/cni"
"""Where Debian's containernetworking-plugins put the plugins (not /opt/cni/bin)."""
CNI_CONF_DIR = Path("/etc/cni/net.d")
CNI_CONF_NAME = "10-phalanx-bridge.conflist"
CONTAINERD_SOCKET = containerd.SOCKET
CONTAINERD_ROOT = Path("/var/lib/containerd")
CONTAINERD_STATE = Path("/run/containerd")
KUBELET_ROOT = Path("/var/lib/kubelet")
BRIDGE = "cni0"
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
PROXY_HEALTHZ_PORT = 10256
PROXY_METRICS_PORT = 10249


@dataclass(frozen=True)
class NodeSettings:
    """One real node: its name, the host address it advertises, and its files."""

    name: str
    node_ip: str
    state_dir: Path
    """The cluster's state dir: configs, logs and pid files go under `real-node/`."""
    kubernetes_version: str = KUBERNETES_VERSION
    """The release of the node's kubelet and kube-proxy (the control plane's): its config follows it."""

    @property
    def root(self) -> Path:
        return self.state_dir / "real-node"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def containerd_config(self) -> Path:
        return self.etc / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.etc / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.etc / "kubelet.kubeconfig"

    @property
    def proxy_config(self) -> Path:
        return self.etc / "kube-proxy.yaml"

    @property
    def proxy_kubeconfig(self) -> Path:
        return self.etc / "kube-proxy.kubeconfig"

    @property
    def saved_sysctls(self) -> Path:
        return self.root / "sysctl.orig.json"


def pause_image(pause_version: str) -> str:
    """The local sandbox image's reference for a pause release (`3.2` for 1.20, `3.10.2` for 1.37)."""
    return f"localhost/pause:{pause_version}"


def containerd_toml(sandbox_image: str = PAUSE_IMAGE) -> str:
    """containerd's CRI config for this host: cgroupfs (kubelet's driver on cgroup v1, no systemd), the local
    pause image, Debian's CNI plugin dir, and oom_score_adj clamped (see below). The sandbox image is
    containerd's to choose: kubelets after 1.34 have no flag for it any more."""
    return f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{CONTAINERD_STATE}"
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # Machines without CAP_SYS_RESOURCE (VMs, nested containers) cannot set the negative oom_score_adj that
  # kubelet asks for, and every sandbox would fail: clamp it to containerd's own score instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{CNI_CONF_DIR}"
"""


def cni_conflist() -> str:
    """A bridge with hairpin (a pod reaching itself through its Service) and masquerade, host-local IPAM."""
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "phalanx-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet_yaml(client_ca: Path, dns_ip: str, kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """The kubelet's API trusts the apiserver's client certificate and asks the apiserver who may do what;
    pods resolve through the node agent's DNS server for real-node pods on `dns_ip` (the node's address)."""
    legacy = is_legacy(kubernetes_version)
    config: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "clusterDNS": [dns_ip],
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        # The controller-manager here marks a node NotReady after 8 s of silence (a crashed node is seen in
        # seconds): renew the node Lease every 2 s (a quarter of its duration) and the status as often.
        "nodeLeaseDurationSeconds": 8,
        "nodeStatusUpdateFrequency": "2s",
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        # Floors in bytes, not shares: the node shares a development machine's disk, where a few percent
        # of a large disk is still gigabytes, and the worker image alone is 1.5 GB.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2Gi", "imagefs.available": "2Gi"},
        # No image garbage collection: every image here (the pause image included) was imported offline and
        # cannot be pulled again, and on a disk fuller than 85% the kubelet deleted the pause image between
        # two pods, so that no pod could start after it.
        "imageGCHighThresholdPercent": 100,
    }
    if legacy:
        # A memory-backed emptyDir is a tmpfs of its sizeLimit, as on Kubernetes 1.22 and later where this
        # gate is on by default (1.37 no longer has the gate): a snapshot that does not fit in /dev/shm fails to
        # allocate (and says which setting to raise) instead of the pod being evicted later for using more
        # than the limit.
        config["featureGates"] = {"SizeMemoryBackedVolumes": True}
    else:
        # The runtime's socket moved from a flag into the config (the flag is deprecated). A newer kubelet
        # refuses cgroup v1 hosts unless told otherwise (failCgroupV1 defaults to true); cgroup v1 is in
        # maintenance, not removed, and is all some machines (this project's among them) have.
        config["containerRuntimeEndpoint"] = f"unix://{CONTAINERD_SOCKET}"
        config["failCgroupV1"] = False
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_argv(kubelet: str, settings: NodeSettings) -> list[str]:
    # 1.20 still defaults to its built-in Docker shim and asks for the sandbox image itself; later kubelets
    # speak CRI only (--container-runtime went in 1.27) and leave the sandbox image to the runtime.
    runtime = (
        [
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{CONTAINERD_SOCKET}",
            f"--pod-infra-container-image={PAUSE_IMAGE}",
        ]
        if is_legacy(settings.kubernetes_version)
        else []
    )
    return [
        kubelet,
        f"--config={settings.kubelet_config}",
        f"--kubeconfig={settings.kubelet_kubeconfig}",
        *runtime,
        f"--hostname-override={settings.name}",
        f"--node-ip={settings.node_ip}",
        f"--root-dir={KUBELET_ROOT}",
        "--node-labels=phalanx.dev/real-node=true",
        "--v=1",
    ]


def kube_proxy_yaml(settings: NodeSettings) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(settings.proxy_kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": settings.name,
        "bindAddress": settings.node_ip,
        "healthzBindAddress": f"127.0.0.1:{PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{PROXY_METRICS_PORT}",
        # 0: leave the host's conntrack table size alone (the default would raise it).
        "conntrack": {"maxPerCore": 0},
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubeconfig(server: str, ca: Path, token: str, user: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "phalanx-dev", "cluster": {"server": server, "certificate-authority": str(ca)}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "phalanx-dev", "context": {"cluster": "phalanx-dev", "user": user}}],
            "current-context": "phalanx-dev",
        },
        sort_keys=False,
    )
