"""`phalanx dev up/down/status`: the real control plane plus the node agent, as local daemons.

Everything lives in one state dir: keys, etcd data, logs, pid files, the kubeconfig and `cluster.json`
(ports and sizes). `up` is idempotent: a running cluster is left alone; a stopped one restarts with its data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import yaml

from phalanx.devcluster import podnetwork, processes
from phalanx.devcluster.agent.volumes import shm_root
from phalanx.devcluster.binaries import (
    DEBIAN_VERSION,
    KUBERNETES_VERSION,
    VERSION_ENV,
    Binaries,
    cache_dir,
    is_legacy,
    kube_version,
    require_binaries,
)
from phalanx.devcluster.pki import Pki, ensure_pki
from phalanx.devcluster.realnode import node as real_node
from phalanx.errors import UserFacingError

COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")
STOP_GRACE_SECONDS = {"node-agent": 30.0}
"""The agent stops every pod it runs before it exits: give it longer than the others."""
FIRST_CLUSTER_OCTET, LAST_CLUSTER_OCTET = 100, 250
FIRST_CLUSTER_OCTET_ENV = "PHALANX_DEV_FIRST_CLUSTER_OCTET"
"""Each cluster owns 127.<octet>.0.0/16 for pod IPs and its DNS server; two clusters never share one."""


def default_state_dir() -> Path:
    override = os.environ.get("PHALANX_DEV_STATE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "phalanx" / "dev"


@dataclass
class ClusterConfig:
    """What `up` chose; kept in cluster.json so that a restart reuses the same ports and addresses."""

    nodes: int
    simulated_nodes: int
    gpus_per_node: int
    cluster_octet: int
    etcd_port: int
    etcd_peer_port: int
    api_port: int
    scheduler_port: int
    controller_manager_port: int
    binaries: dict[str, str] = field(default_factory=dict)
    real_nodes: int = 0
    """Real nodes (containerd + kubelet + kube-proxy on this host): 0 or 1."""
    node_ip: str = ""
    """The host address the apiserver advertises when a real node runs (its pods reach it through it)."""
    kubernetes_version: str = DEBIAN_VERSION
    """The release whose binaries made the cluster (its etcd data is that release's); cluster.json files from
    before this field were all made by 1.20.2, built from Debian."""
    kueue: bool = False
    """Whether Kueue's controller runs with the cluster (`phalanx dev up --kueue`; devcluster/kueue)."""
    pod_prefix: str = ""
    """The first two octets of the pod network, routed to this host for the cluster (devcluster/podnetwork.py);
    empty: 127.<cluster_octet>, which needs no route but cannot go into Endpoints."""
    node_heartbeat_seconds: float = 0.0
    """Seconds between the agent's node heartbeats (each node's Lease), with the node lifecycle's grace period
    four of them, as a kubelet's 10 s and the controller's 40 s: a cluster of thousands of simulated nodes
    (`phalanx bench --only scale`). 0: the short periods the tests want (2 s, a crashed node NotReady in 8 s)."""

    @property
    def pod_network_prefix(self) -> str:
        return self.pod_prefix or podnetwork.loopback_prefix(self.cluster_octet)


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def config_file(self) -> Path:
        return self.root / "cluster.json"

    def pid_file(self, component: str) -> Path:
        return self.pids / f"{component}.pid"

    def log_file(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def kubernetes_version(self) -> str:
        """The release the cluster in this state dir runs (the default one before it was made)."""
        config = self.load_config()
        return config.kubernetes_version if config else KUBERNETES_VERSION

    def load_config(self) -> ClusterConfig | None:
        try:
            return ClusterConfig(**json.loads(self.config_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None


# ---- ports and addresses -------------------------------------------------------------------------


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(exclude: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in exclude:
            exclude.add(port)
            return port


def first_cluster_octet(env: Mapping[str, str] = os.environ) -> int:
    """Where the search for a free octet starts: `PHALANX_DEV_FIRST_CLUSTER_OCTET` when set (two test runs
    started at once search from apart, so that neither takes the octet the other found free a moment ago)."""
    raw = env.get(FIRST_CLUSTER_OCTET_ENV, "")
    if not raw:
        return FIRST_CLUSTER_OCTET
    try:
        octet = int(raw)
    except ValueError:
        octet = 0
    if not FIRST_CLUSTER_OCTET <= octet <= LAST_CLUSTER_OCTET:
        raise UserFacingError(
            f"{FIRST_CLUSTER_OCTET_ENV}={raw!r}: must be a number from {FIRST_CLUSTER_OCTET} to {LAST_CLUSTER_OCTET}"
        )
    return octet


def free_cluster_octet(taken_by_others: set[int]) -> int:
    """The first octet (from `first_cluster_octet`) whose DNS address (127.<octet>.0.1:53) nobody has bound."""
    for octet in range(first_cluster_octet(), LAST_CLUSTER_OCTET + 1):
        if octet in taken_by_others:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind((f"127.{octet}.0.1", 53))
            except OSError:
                continue
        return octet
    raise UserFacingError("no free 127.X.0.0/16 range for pod addresses: stop other local clusters first")


def choose_config(
    previous: ClusterConfig | None,
    nodes: int,
    simulated: int,
    gpus: int,
    binaries: Binaries,
    real_nodes: int = 0,
    node_ip: str = "",
    kubernetes_version: str = KUBERNETES_VERSION,
    kueue: bool = False,
    pod_prefix: str = "",
    node_heartbeat_seconds: float = 0.0,
) -> ClusterConfig:
    used: set[int] = set()

    def reuse(port: int | None) -> int:
        if port and port not in used and port_is_free(port):
            used.add(port)
            return port
        return free_port(used)

    old = previous
    octet = old.cluster_octet if old else free_cluster_octet(set())
    return ClusterConfig(
        nodes=nodes,
        simulated_nodes=simulated,
        gpus_per_node=gpus,
        cluster_octet=octet,
        etcd_port=reuse(old.etcd_port if old else None),
        etcd_peer_port=reuse(old.etcd_peer_port if old else None),
        api_port=reuse(old.api_port if old else None),
        scheduler_port=reuse(old.scheduler_port if old else None),
        controller_manager_port=reuse(old.controller_manager_port if old else None),
        binaries=binaries.as_dict(),
        real_nodes=real_nodes,
        node_ip=node_ip,
        kubernetes_version=kubernetes_version,
        kueue=kueue,
        pod_prefix=pod_prefix,
        node_heartbeat_seconds=node_heartbeat_seconds,
    )


# ---- component command lines ---------------------------------------------------------------------


def node_monitor_flags(node_heartbeat_seconds: float) -> list[str]:
    """The node lifecycle controller's periods for the agent's node heartbeat period (0: the tests' short one)."""
    if not node_heartbeat_seconds:
        return ["--node-monitor-period=2s", "--node-monitor-grace-period=8s"]
    period = min(5.0, node_heartbeat_seconds)
    return [
        f"--node-monitor-period={period:g}s",
        f"--node-monitor-grace-period={4 * node_heartbeat_seconds:g}s",
    ]


def component_argv(name: str, config: ClusterConfig, layout: Layout, pki: Pki) -> list[str]:
    bins = config.binaries
    kubeconfig = str(layout.kubeconfig)
    legacy = is_legacy(config.kubernetes_version)
    # The insecure ports and --pod-eviction-timeout (taint-based eviction replaced it) are gone after 1.20.
    no_insecure_port = (
        ["--port=0"] if legacy else []
    )  # fixed ports (10251, 10252) would collide between clusters
    if name == "etcd":
        return [
            bins["etcd"],
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls=http://127.0.0.1:{config.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{config.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{config.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{config.etcd_peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{config.etcd_peer_port}",
            "--unsafe-no-fsync",  # a throwaway dev cluster: durability of its etcd is not worth the latency
            "--quota-backend-bytes=4294967296",
        ]
    if name == "kube-apiserver":
        # A real node's pods reach the apiserver through the `kubernetes` Service, whose endpoint is the
        # advertised address: the apiserver refuses a loopback one there, so it listens on the host's address.
        bind, advertise = ("0.0.0.0", config.node_ip) if config.real_nodes else ("127.0.0.1", "127.0.0.1")
        # Newer releases refuse to start with a loopback advertise address unless nothing reconciles the
        # `kubernetes` Service's endpoints (1.20 only refused the endpoints); their own test server does this.
        no_reconciler = [] if legacy or config.real_nodes else ["--endpoint-reconciler-type=none"]
        kubelet_client = (
            [
                f"--kubelet-client-certificate={pki.kubelet_client_cert}",
                f"--kubelet-client-key={pki.kubelet_client_key}",
            ]
            if config.real_nodes
            else []
        )
        return [
            bins["kube-apiserver"],
            f"--etcd-servers=http://127.0.0.1:{config.etcd_port}",
            f"--secure-port={config.api_port}",
            f"--bind-address={bind}",
            f"--advertise-address={advertise}",
            *no_reconciler,
            *kubelet_client,
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--token-auth-file={pki.token_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # Node agents advertise only an InternalIP: `kubectl logs` must not try to resolve node names.
            "--kubelet-preferred-address-types=InternalIP",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            "--event-ttl=2h",
        ]
    if name == "kube-controller-manager":
        return [
            bins["kube-controller-manager"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.apiserver_cert}",
            f"--cluster-signing-cert-file={pki.apiserver_cert}",
            f"--cluster-signing-key-file={pki.apiserver_key}",
            f"--secure-port={config.controller_manager_port}",
            "--bind-address=127.0.0.1",
            *no_insecure_port,
            "--controllers=*",
            "--use-service-account-credentials=true",
            # Short node-lifecycle periods: a crashed node is NotReady in seconds, not 40 s.
            *node_monitor_flags(config.node_heartbeat_seconds),
            *(["--pod-eviction-timeout=30s"] if legacy else []),
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--concurrent-replicaset-syncs=10",
            "--concurrent-gc-syncs=40",
        ]
    if name == "kube-scheduler":
        return [
            bins["kube-scheduler"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--secure-port={config.scheduler_port}",
            *no_insecure_port,
            "--bind-address=127.0.0.1",
            "--kube-api-qps=300",
            "--kube-api-burst=600",
        ]
    if name == "node-agent":
        argv = [
            sys.executable, "-m", "phalanx.devcluster.agent",
            f"--kubeconfig={kubeconfig}",
            f"--state-dir={layout.root}",
            f"--nodes={config.nodes}",
            f"--simulated-nodes={config.simulated_nodes}",
            f"--cluster-octet={config.cluster_octet}",
            f"--pod-prefix={config.pod_prefix}",
            f"--api-port={config.api_port}",
            f"--kubelet-version=v{config.kubernetes_version}",
        ]  # fmt: skip
        if config.gpus_per_node:
            argv.append(f"--gpus-per-node={config.gpus_per_node}")
        if config.node_heartbeat_seconds:
            seconds = config.node_heartbeat_seconds
            argv.extend([f"--lease-interval={seconds:g}", f"--status-interval={max(60.0, 6 * seconds):g}"])
        if config.real_nodes:
            argv.append(f"--real-node-dns={config.node_ip}")
        argv.extend(pod_namespaces_flag(os.environ))
        return argv
    raise ValueError(name)


POD_NAMESPACES_ENV = "PHALANX_DEV_POD_NAMESPACES"
"""`off` runs the agent's pods without private mount/UTS namespaces even where `unshare` works, as on a machine
that refuses it (some CI sandboxes); `on` requires them; unset: the agent probes."""


def pod_namespaces_flag(env: Mapping[str, str]) -> list[str]:
    value = env.get(POD_NAMESPACES_ENV, "").strip().lower()
    if value in ("off", "0", "false", "no"):
        return ["--no-namespaces"]
    if value in ("on", "1", "true", "yes"):
        return ["--namespaces"]
    if value:
        raise UserFacingError(f"{POD_NAMESPACES_ENV}={value!r}: use on, off, or leave it unset")
    return []


def write_kubeconfig(layout: Layout, pki: Pki, api_port: int) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "phalanx-dev",
                "cluster": {
                    "server": f"https://127.0.0.1:{api_port}",
                    "certificate-authority": str(pki.apiserver_cert),
                },
            }
        ],
        "users": [{"name": "admin", "user": {"token": pki.admin_token()}}],
        "contexts": [{"name": "phalanx-dev", "context": {"cluster": "phalanx-dev", "user": "admin"}}],
        "current-context": "phalanx-dev",
    }
    layout.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    layout.kubeconfig.chmod(0o600)


# ---- readiness -----------------------------------------------------------------------------------


def http_ok(url: str, token: str | None = None, ca: Path | None = None) -> bool:
    context = None
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _kubectl_output(config: ClusterConfig, layout: Layout, *args: str, timeout: float = 20) -> str | None:
    """kubectl's output, or None when it failed or took longer than `timeout` (a slow answer is no answer
    yet: the readiness wait looks again)."""
    import subprocess

    try:
        result = subprocess.run(
            [config.binaries["kubectl"], f"--kubeconfig={layout.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    return result.stdout if result.returncode == 0 else None


def _kubectl_json(config: ClusterConfig, layout: Layout, *args: str) -> dict | None:
    output = _kubectl_output(config, layout, *args, "-o", "json")
    return json.loads(output) if output is not None else None


def _nodes_ready(config: ClusterConfig, layout: Layout) -> bool:
    # The API server's table, not every Node as JSON: at 12,695 simulated nodes the JSON is tens of megabytes, and
    # decoding it took kubectl past any short timeout on 2 cores, over and over while the nodes registered.
    table = _kubectl_output(config, layout, "get", "nodes", "--no-headers", timeout=NODE_LIST_TIMEOUT_SECONDS)
    return table is not None and count_ready(table) >= config.nodes + config.simulated_nodes


NODE_LIST_TIMEOUT_SECONDS = 60
"""How long one look at the nodes may take (a slow answer is a look that found nothing ready, not a failure)."""


def count_ready(table: str) -> int:
    """Nodes whose STATUS column (`kubectl get nodes --no-headers`) says Ready (cordoned ones too)."""
    ready = 0
    for line in table.splitlines():
        columns = line.split()
        if len(columns) > 1 and "Ready" in columns[1].split(","):
            ready += 1
    return ready


def service_account_ready(secrets: object, kubernetes_version: str) -> bool:
    """Whether pods can be created with a ServiceAccount that exists and has these token Secrets: 1.20's
    admission refuses them until its token Secret is made; later releases make none and give each pod a token
    of its own (TokenRequest) instead."""
    return bool(secrets) or not is_legacy(kubernetes_version)


def _service_accounts_ready(config: ClusterConfig, layout: Layout) -> bool:
    account = _kubectl_json(config, layout, "get", "serviceaccount", "default", "-n", "default")
    return account is not None and service_account_ready(account.get("secrets"), config.kubernetes_version)


def readiness_check(name: str, config: ClusterConfig, layout: Layout, pki: Pki) -> Callable[[], bool]:
    if name == "etcd":
        return lambda: http_ok(f"http://127.0.0.1:{config.etcd_port}/health")
    if name == "kube-apiserver":
        return lambda: http_ok(
            f"https://127.0.0.1:{config.api_port}/readyz", pki.admin_token(), pki.apiserver_cert
        )
    if name == "kube-controller-manager":
        # Pods need their ServiceAccount, whose token the controller-manager makes.
        return lambda: (
            http_ok(f"https://127.0.0.1:{config.controller_manager_port}/healthz")
            and _service_accounts_ready(config, layout)
        )
    if name == "kube-scheduler":
        return lambda: http_ok(f"https://127.0.0.1:{config.scheduler_port}/healthz")
    if name == "node-agent":
        return lambda: _nodes_ready(config, layout)
    raise ValueError(name)


READY_TIMEOUT_SECONDS = {
    "etcd": 60,
    "kube-apiserver": 180,
    "kube-controller-manager": 180,
    "kube-scheduler": 120,
    "node-agent": 180,
}
"""Generous: on a loaded 2-core machine the apiserver alone has taken over a minute to become ready."""
SIMULATED_NODES_PER_SECOND = 25
"""The node agent's registration rate that the wait for it allows beyond its own timeout: thousands of simulated
nodes (the scale benchmark's) take minutes to register on 2 cores."""


def ready_timeout(name: str, config: ClusterConfig) -> float:
    """Seconds `name` has to become ready in a cluster of `config`."""
    if name == "node-agent":
        return READY_TIMEOUT_SECONDS[name] + config.simulated_nodes / SIMULATED_NODES_PER_SECOND
    return READY_TIMEOUT_SECONDS[name]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _explain_failure(name: str, layout: Layout) -> str:
    tail = _log_tail(layout.log_file(name))
    hint = ""
    if "address already in use" in tail:
        hint = " A port it needs is taken by another program; `phalanx dev down` then `up` picks free ports."
    elif "no space left" in tail.lower():
        hint = " The disk is full."
    return f"{name} did not become ready.{hint} Last lines of {layout.log_file(name)}:\n{tail}"


def _wait_ready(
    name: str, record: processes.PidRecord, check: Callable[[], bool], layout: Layout, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not record.alive():
            raise UserFacingError(_explain_failure(name, layout))
        if check():
            return
        time.sleep(0.25)
    raise UserFacingError(_explain_failure(name, layout))


# ---- commands ------------------------------------------------------------------------------------


def running_components(layout: Layout) -> dict[str, processes.PidRecord]:
    running = {}
    for name in COMPONENT_ORDER:
        record = processes.read_pid_file(layout.pid_file(name))
        if record is not None and record.alive():
            running[name] = record
    return running


def usage_text(layout: Layout) -> str:
    return (
        f"export KUBECONFIG={layout.kubeconfig}\n"
        f"export PATH={layout.bin}:$PATH   # kubectl {json.loads(layout.config_file.read_text())['binaries']['kubectl']}"
    )


def _real_node_up(layout: Layout, config: ClusterConfig, pki: Pki, say: Callable[[str], None]) -> None:
    started = time.monotonic()
    real_node.up(
        real_node.settings_for(layout.root, config.node_ip, config.kubernetes_version),
        pki,
        config.api_port,
        config.binaries["kubectl"],
        layout.kubeconfig,
    )
    say(
        f"  {real_node.NODE_NAME:<24} ready in {time.monotonic() - started:.1f} s (containerd, kubelet, kube-proxy)"
    )


def other_version_message(layout: Layout, made_with: str, wanted: str) -> str:
    """A state dir keeps one release's etcd data and config: another release does not start on it."""
    return (
        f"the cluster in {layout.root} was made with Kubernetes {made_with}, not {wanted} (the release "
        f"{VERSION_ENV} picks now): `phalanx dev down --purge --state-dir {layout.root}` removes it with its data, "
        f"or set {VERSION_ENV}={made_with} to use it"
    )


def up(
    state_dir: Path,
    nodes: int = 4,
    simulated_nodes: int = 0,
    gpus_per_node: int = 0,
    quiet: bool = False,
    real_nodes: int = 0,
    kueue: bool | None = None,
    node_heartbeat_seconds: float = 0.0,
) -> Layout:
    """Starts the cluster in `state_dir`. `kueue` True or False starts or stops Kueue with it from now on;
    None keeps what the cluster did before."""
    # Kueue's controller module builds on this one.
    from phalanx.devcluster.kueue import controller as kueue_controller

    layout = Layout(state_dir.resolve())
    say = (lambda *_: None) if quiet else (lambda message: print(message, flush=True))
    previous = layout.load_config()
    with_kueue = bool(previous and previous.kueue) if kueue is None else kueue
    if with_kueue:
        kueue_controller.require_built(cache_dir())
    version = kube_version()
    if previous and previous.kubernetes_version != version:
        raise UserFacingError(other_version_message(layout, previous.kubernetes_version, version))
    running = running_components(layout)
    if previous and len(running) == len(COMPONENT_ORDER):
        sizes = (
            previous.nodes,
            previous.simulated_nodes,
            previous.real_nodes,
            previous.node_heartbeat_seconds,
        )
        if sizes != (nodes, simulated_nodes, real_nodes, node_heartbeat_seconds):
            say(
                f"cluster already running in {layout.root} with {previous.nodes} nodes, "
                f"{previous.simulated_nodes} simulated nodes and {previous.real_nodes} real nodes; "
                "`phalanx dev down` first to change its size"
            )
        else:
            say(f"cluster already running in {layout.root}")
        if previous.real_nodes:  # a daemon of the real node that died is started again
            _real_node_up(layout, previous, ensure_pki(layout.pki), say)
        if with_kueue != previous.kueue:
            previous.kueue = with_kueue
            layout.config_file.write_text(json.dumps(asdict(previous), indent=2))
        if with_kueue:
            kueue_controller.up(layout, say)
        elif kueue is False:  # not when unsaid: a test may have started Kueue on the cluster for itself
            kueue_controller.down(layout, say)
        say(usage_text(layout))
        return layout
    if running:
        say(f"restarting a partly running cluster in {layout.root}")
        down(state_dir, quiet=True)
    if (
        nodes < 0
        or simulated_nodes < 0
        or real_nodes not in (0, 1)
        or nodes + simulated_nodes + real_nodes == 0
    ):
        raise UserFacingError(
            "a cluster needs at least one node (--nodes), simulated node (--simulated-nodes) or real node "
            "(--real-nodes, at most 1: it takes the host's kubelet ports, cni0 and iptables)"
        )

    binaries = require_binaries()
    for directory in (layout.root, layout.logs, layout.pids, layout.bin, layout.etcd_data):
        directory.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(layout.root).free < 512 * 1024**2:
        raise UserFacingError(f"less than 512 MiB free under {layout.root}: free some disk first")
    with starting_alone():
        pki = ensure_pki(layout.pki)
        node_ip = real_node.host_ip() if real_nodes else ""
        if real_nodes:
            real_node.prepare_credentials(pki)
        config = choose_config(
            previous,
            nodes,
            simulated_nodes,
            gpus_per_node,
            binaries,
            real_nodes,
            node_ip,
            kubernetes_version=version,
            kueue=with_kueue,
            pod_prefix=podnetwork.choose_prefix(previous.pod_prefix if previous else ""),
            node_heartbeat_seconds=node_heartbeat_seconds,
        )
        layout.config_file.write_text(json.dumps(asdict(config), indent=2))
        write_kubeconfig(layout, pki, config.api_port)
        kubectl_link = layout.bin / "kubectl"
        kubectl_link.unlink(missing_ok=True)
        kubectl_link.symlink_to(binaries.kubectl)

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "KUBECONFIG": str(layout.kubeconfig)}
        started = time.monotonic()
        try:
            for name in COMPONENT_ORDER:
                record = processes.start_daemon(
                    component_argv(name, config, layout, pki),
                    pid_file=layout.pid_file(name),
                    log_file=layout.log_file(name),
                    env=env,
                )
                _wait_ready(
                    name,
                    record,
                    readiness_check(name, config, layout, pki),
                    layout,
                    ready_timeout(name, config),
                )
                say(f"  {name:<24} ready (pid {record.pid})")
            if real_nodes:
                _real_node_up(layout, config, pki, say)
            if with_kueue:
                kueue_controller.up(layout, say)
        except BaseException:
            down(state_dir, quiet=True)
            raise
    say(
        f"cluster up in {time.monotonic() - started:.1f} s: {nodes} nodes, {simulated_nodes} simulated nodes, "
        f"{real_nodes} real nodes, apiserver https://127.0.0.1:{config.api_port}\n{usage_text(layout)}"
    )
    return layout


@contextlib.contextmanager
def starting_alone() -> Iterator[None]:
    """Held while a cluster chooses its pod network and ports and starts its components, one cluster at a time on
    this host: two brought up at once (the two processes of `make e2e`) would otherwise both find the same pod
    network free, and the second's DNS server could not bind its address."""
    lock = cache_dir() / "cluster-start.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def down(state_dir: Path, purge: bool = False, quiet: bool = False) -> None:
    from phalanx.devcluster.kueue import controller as kueue_controller

    layout = Layout(state_dir.resolve())
    say = (lambda *_: None) if quiet else (lambda message: print(message, flush=True))
    # First, while the apiserver answers: its webhooks go with it.
    kueue_controller.down(layout, say)
    config = layout.load_config()
    if config is not None and config.real_nodes:
        # First, while the apiserver still answers: its pods' containers, mounts and the host's rules go.
        real_node.down(real_node.settings_for(layout.root, config.node_ip), say)
    records = {name: processes.read_pid_file(layout.pid_file(name)) for name in COMPONENT_ORDER}
    # Collect every descendant first: once a parent is gone its children are re-parented and lost from view.
    leftovers: list[psutil.Process] = []
    for record in records.values():
        if record is not None:
            leftovers.extend(processes.descendants(record))
    for name in reversed(COMPONENT_ORDER):
        record = records[name]
        process = record.process() if record else None
        if record is not None and process is not None:
            processes.stop_processes([process], STOP_GRACE_SECONDS.get(name, 10.0))
            say(f"  stopped {name} (pid {record.pid})")
        layout.pid_file(name).unlink(missing_ok=True)
    processes.stop_processes([p for p in leftovers if p.is_running()], 5.0)
    if config is not None and config.pod_prefix:
        podnetwork.release(config.pod_prefix)
    # The pods' /dev/shm lives in memory outside the state dir; nothing runs that could use it any more.
    shutil.rmtree(shm_root(layout.root), ignore_errors=True)
    if purge and layout.root.exists():
        shutil.rmtree(layout.root, ignore_errors=True)
        say(f"removed {layout.root}")
    say("cluster down")


def status(state_dir: Path) -> int:
    from phalanx.devcluster.kueue import controller as kueue_controller

    layout = Layout(state_dir.resolve())
    config = layout.load_config()
    if config is None:
        print(f"no cluster in {layout.root}")
        return 1
    running = running_components(layout)
    for name in COMPONENT_ORDER:
        record = running.get(name)
        state = f"running (pid {record.pid})" if record else "stopped"
        print(f"  {name:<24} {state}")
    kueue = kueue_controller.running(layout)
    if config.kueue or kueue:
        print(f"  {kueue_controller.COMPONENT:<24} {f'running (pid {kueue.pid})' if kueue else 'stopped'}")
    print(
        f"nodes: {config.nodes} + {config.simulated_nodes} simulated + {config.real_nodes} real; "
        f"pod addresses {podnetwork.network(config.pod_network_prefix)}"
    )
    if config.real_nodes:
        alive = real_node.running(real_node.settings_for(layout.root, config.node_ip))
        for daemon in real_node.DAEMONS:
            state = f"running (pid {alive[daemon].pid})" if daemon in alive else "stopped"
            print(f"  {real_node.NODE_NAME + ' ' + daemon:<24} {state}")
    if len(running) == len(COMPONENT_ORDER):
        print(usage_text(layout))
        return 0
    return 1
