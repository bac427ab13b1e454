"""What a real node changes on the host, and how `down` puts it back.

kubelet and kube-proxy change sysctls (kernel.panic*, vm.overcommit_memory, route_localnet, conntrack
timeouts), add KUBE-*/CNI-* chains to iptables, mount under /var/lib/kubelet, /run/containerd and
/run/netns, and create the cni0 bridge. `up` saves the sysctls before anything runs; `down` restores them
and removes exactly the node's chains, mounts, link and directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from phalanx.devcluster.realnode import config
from phalanx.errors import UserFacingError

PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "containernetworking-plugins": f"{config.CNI_BIN_DIR}/bridge",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "ebtables": "ebtables",
    "socat": "socat",
    "gcc": "gcc",
    "libc6-dev": "/usr/lib/x86_64-linux-gnu/libc.a",
    "busybox-static": "/bin/busybox",
}
"""Debian packages a real node needs (package -> a command or file that shows it is there); gcc and libc6-dev
build the static pause binary; busybox-static makes the small image the node's own checks run."""
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
MOUNT_ROOTS = (config.KUBELET_ROOT, config.CONTAINERD_STATE, config.CONTAINERD_ROOT, Path("/run/netns"))
STATE_DIRS = (config.KUBELET_ROOT, config.CONTAINERD_ROOT, Path("/var/lib/cni"), config.CONTAINERD_STATE)
CHAIN_PREFIXES = ("KUBE-", "CNI-")


def _present(probe: str) -> bool:
    return Path(probe).exists() if probe.startswith("/") else shutil.which(probe) is not None


def missing_packages() -> list[str]:
    return [package for package, probe in PACKAGES.items() if not _present(probe)]


def ensure_packages() -> None:
    """Installs what is missing with apt-get when root; otherwise one line saying what to install."""
    missing = missing_packages()
    if not missing:
        return
    command = ["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=300", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise UserFacingError(
            f"a real node needs these Debian packages: `apt-get install {' '.join(missing)}`"
        )
    print(f"[phalanx dev] installing Debian packages: {' '.join(missing)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise UserFacingError(
            f"installing {' '.join(missing)} failed: {result.stderr.strip()[-400:]} "
            f"(try `apt-get update && apt-get install {' '.join(missing)}`)"
        )


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserFacingError("a real node runs containerd, kubelet and kube-proxy as root: run as root")


def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", *name.split(".")).write_text(value)


def save_sysctls(path: Path) -> None:
    """Once per node lifetime: a second `up` must not save the values the node itself set."""
    if path.exists():
        return
    values = {name: value for name in SYSCTLS if (value := read_sysctl(name)) is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=2))


def restore_sysctls(path: Path) -> None:
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for name, value in values.items():
        write_sysctl(name, value)
    path.unlink(missing_ok=True)


def node_mounts(mounts_text: str, roots: Iterable[Path] = MOUNT_ROOTS) -> list[str]:
    """Mount points under the node's directories, deepest first (the order to unmount them in)."""
    prefixes = [str(root) for root in roots]
    points = []
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        point = fields[1].replace("\\040", " ")
        if any(point == prefix or point.startswith(prefix + "/") for prefix in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda point: (-point.count("/"), point))


def unmount_all() -> None:
    for _ in range(3):  # a mount can hide another at the same point
        points = node_mounts(Path("/proc/mounts").read_text())
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def without_node_chains(saved: str) -> str:
    """iptables-save output less every KUBE-*/CNI-* chain and every rule that names one."""
    kept = []
    for line in saved.splitlines():
        if any(prefix in line for prefix in CHAIN_PREFIXES):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def remove_chains() -> None:
    for save, restore in (("iptables-save", "iptables-restore"), ("ip6tables-save", "ip6tables-restore")):
        if shutil.which(save) is None:
            continue
        saved = subprocess.run([save], capture_output=True, text=True, check=False).stdout
        if not any(prefix in saved for prefix in CHAIN_PREFIXES):
            continue
        subprocess.run(
            [restore], input=without_node_chains(saved), text=True, capture_output=True, check=False
        )


def remove_bridge() -> None:
    subprocess.run(["ip", "link", "delete", config.BRIDGE], capture_output=True, check=False)


def remove_state() -> None:
    for directory in STATE_DIRS:
        shutil.rmtree(directory, ignore_errors=True)
    (config.CNI_CONF_DIR / config.CNI_CONF_NAME).unlink(missing_ok=True)
    (config.CNI_CONF_DIR / "cni.lock").unlink(missing_ok=True)  # the plugins' own lock file
    for directory in (config.CNI_CONF_DIR, config.CNI_CONF_DIR.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty: another network setup's files stay
