"""`phalanx dev up --real-nodes 1`: start, check and stop the real node's daemons.

containerd, kubelet and kube-proxy run as daemons with pid files in the cluster's state dir, as the control
plane does (no systemd is assumed). `up` is idempotent and restarts whichever daemon died; pods on the node
survive a containerd or kubelet restart, as they do on any node.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

from phalanx.devcluster import binaries, processes
from phalanx.devcluster.pki import Pki
from phalanx.devcluster.realnode import config, host, images
from phalanx.errors import UserFacingError
from phalanx.images import containerd

NODE_NAME = "real-node-0"
DAEMONS = ("containerd", "kubelet", "kube-proxy")
NODE_USER = f"system:node:{NODE_NAME}"
PROXY_USER = "system:kube-proxy"
READY_TIMEOUT_SECONDS = 180.0
STOP_GRACE_SECONDS = 10.0


def host_ip() -> str:
    """The address other hosts reach this one by: the source address of the default route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 9))  # no packet is sent: this only picks a route
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        raise UserFacingError("a real node needs a non-loopback IPv4 address on this host; none was found")
    return str(address)


def settings_for(
    state_dir: Path, node_ip: str, kubernetes_version: str = binaries.KUBERNETES_VERSION
) -> config.NodeSettings:
    return config.NodeSettings(
        name=NODE_NAME, node_ip=node_ip, state_dir=state_dir, kubernetes_version=kubernetes_version
    )


def prepare_credentials(pki: Pki) -> None:
    """Before the apiserver starts (it reads its token file once): the node's and kube-proxy's tokens, and
    the apiserver's client certificate towards the kubelet."""
    pki.ensure_token(NODE_USER, NODE_NAME, "system:nodes")
    pki.ensure_token(PROXY_USER, "kube-proxy")
    pki.ensure_kubelet_client_cert()


def _put(path: Path, text: str) -> None:
    """Write only what changed: kube-proxy exits when its config file is rewritten, even unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    partial.chmod(0o600)
    partial.replace(path)


def write_configs(settings: config.NodeSettings, pki: Pki, api_port: int) -> None:
    server = f"https://127.0.0.1:{api_port}"
    _put(
        settings.containerd_config,
        config.containerd_toml(images.pause_reference(settings.kubernetes_version)),
    )
    _put(config.CNI_CONF_DIR / config.CNI_CONF_NAME, config.cni_conflist())
    _put(
        settings.kubelet_config,
        config.kubelet_yaml(pki.apiserver_cert, settings.node_ip, settings.kubernetes_version),
    )
    _put(settings.proxy_config, config.kube_proxy_yaml(settings))
    for path, user in ((settings.kubelet_kubeconfig, NODE_USER), (settings.proxy_kubeconfig, PROXY_USER)):
        token = pki.token_of(user)
        assert token is not None, f"{user} has no token: prepare_credentials() runs before the apiserver"
        _put(path, config.kubeconfig(server, pki.apiserver_cert, token, user))


def _pid_file(settings: config.NodeSettings, daemon: str) -> Path:
    return settings.root / "pids" / f"{daemon}.pid"


def _log_file(settings: config.NodeSettings, daemon: str) -> Path:
    return settings.root / "logs" / f"{daemon}.log"


def running(settings: config.NodeSettings) -> dict[str, processes.PidRecord]:
    found = {}
    for daemon in DAEMONS:
        record = processes.read_pid_file(_pid_file(settings, daemon))
        if record is not None and record.alive():
            found[daemon] = record
    return found


def _argv(daemon: str, settings: config.NodeSettings, node_binaries: dict[str, Path]) -> list[str]:
    if daemon == "containerd":
        return ["containerd", "--config", str(settings.containerd_config)]
    if daemon == "kubelet":
        return config.kubelet_argv(str(node_binaries["kubelet"]), settings)
    return [str(node_binaries["kube-proxy"]), f"--config={settings.proxy_config}"]


def _wait(what: str, check: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
    raise UserFacingError(f"{what} not ready after {timeout:.0f} s. Last lines of {log}:\n{tail}")


def _containerd_answers() -> bool:
    result = subprocess.run(
        ["ctr", "--address", str(config.CONTAINERD_SOCKET), "version"], capture_output=True, check=False
    )
    return result.returncode == 0


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def node_ready(kubectl: str, kubeconfig: Path) -> bool:
    result = subprocess.run(
        [kubectl, f"--kubeconfig={kubeconfig}", "get", "node", NODE_NAME, "-o",
         "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"],
        capture_output=True, text=True, check=False, timeout=20,
    )  # fmt: skip
    return result.stdout.strip() == "True"


def require_host() -> dict[str, Path]:
    """What a real node needs of this host, each missing piece one line: root, the Debian packages (installed
    when root can) and kubelet with kube-proxy. Commands that do long work first (the demo's image build) call
    it before that work, not only when the node starts. Returns the node's binaries."""
    host.require_root()
    host.ensure_packages()
    node_binaries, missing = binaries.find_node_binaries()
    if missing:
        raise UserFacingError(
            f"the real node needs {', '.join(missing)}: {binaries.node_install_hint(binaries.kube_version())}"
        )
    return node_binaries


def up(settings: config.NodeSettings, pki: Pki, api_port: int, kubectl: str, kubeconfig: Path) -> None:
    """Starts whatever of containerd, kubelet and kube-proxy is not running, then waits for Ready."""
    node_binaries = require_host()
    host.save_sysctls(settings.saved_sysctls)
    host.write_sysctl("net.ipv4.ip_forward", "1")
    host.write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
    write_configs(settings, pki, api_port)
    alive = running(settings)
    env = {**os.environ, "PATH": f"/usr/sbin:/usr/bin:/sbin:/bin:{os.environ.get('PATH', '')}"}
    for daemon in DAEMONS:
        if daemon in alive:
            continue
        processes.start_daemon(
            _argv(daemon, settings, node_binaries),
            pid_file=_pid_file(settings, daemon),
            log_file=_log_file(settings, daemon),
            env=env,
        )
        if daemon == "containerd":
            _wait("containerd", _containerd_answers, 30, _log_file(settings, daemon))
            for reference, archive in (
                (
                    images.pause_reference(settings.kubernetes_version),
                    lambda: images.pause_archive(settings.kubernetes_version),
                ),
                (images.BUSYBOX_IMAGE, images.busybox_archive),
            ):
                if not containerd.imported(reference):
                    containerd.import_archive(archive())
    # The node's Ready condition can be left over from before a restart: the daemons must answer too
    # (kubelet's API is what `kubectl logs/exec` reach).
    _wait(
        f"node {settings.name}",
        lambda: (
            _healthy(config.KUBELET_HEALTHZ_PORT)
            and _listening(settings.node_ip, config.KUBELET_PORT)
            and _healthy(config.PROXY_HEALTHZ_PORT)
            and node_ready(kubectl, kubeconfig)
        ),
        READY_TIMEOUT_SECONDS,
        _log_file(settings, "kubelet"),
    )


def _container_processes() -> list[psutil.Process]:
    """containerd's shims for the node's namespace (each holds one pod's containers), with their children."""
    shims = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if cmdline and "containerd-shim" in os.path.basename(cmdline[0]) and "k8s.io" in cmdline:
            shims.append(process)
    found = list(shims)
    for shim in shims:
        try:
            found.extend(shim.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def down(settings: config.NodeSettings, say: Callable[[str], None] = print) -> None:
    """Stops the daemons and every container, and puts the host back as it was before `up`."""
    records = {daemon: processes.read_pid_file(_pid_file(settings, daemon)) for daemon in DAEMONS}
    for daemon in ("kube-proxy", "kubelet"):
        record = records[daemon]
        process = record.process() if record else None
        if process is not None:
            processes.stop_processes([process], STOP_GRACE_SECONDS)
            say(f"  stopped {daemon} (pid {process.pid})")
    containers = _container_processes()
    if containers:
        processes.stop_processes([p for p in containers if p.is_running()], 2.0)
        say(f"  stopped {len(containers)} container processes")
    record = records["containerd"]
    process = record.process() if record else None
    if process is not None:
        processes.stop_processes([process], STOP_GRACE_SECONDS)
        say(f"  stopped containerd (pid {process.pid})")
    for daemon in DAEMONS:
        _pid_file(settings, daemon).unlink(missing_ok=True)
    host.unmount_all()
    host.remove_chains()
    host.remove_bridge()
    host.remove_state()
    host.restore_sysctls(settings.saved_sysctls)
