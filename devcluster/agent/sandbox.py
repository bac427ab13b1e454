"""Runs inside a pod's private mount + UTS namespaces: hostname, bind mounts, /etc files, then exec.

`python -m phalanx.devcluster.agent.sandbox SPEC.json` (started by the agent under
`unshare -m -u --propagation private`). Without namespaces (`"namespaced": false`) nothing is mounted or linked:
the hostname is left alone, the agent has already rewritten the container's mount paths to its volumes
(`sharedfs`), each volume is also reachable through `$PHALANX_VOLUME_<NAME>`, and the pod's /etc/hosts and
resolv.conf are not applied.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384

EXIT_SETUP_FAILED = 128


def _libc_mount(source: str, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def bind(source: str, target: str, read_only: bool) -> None:
    src = Path(source)
    dst = Path(target)
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
    elif not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.touch()
    _libc_mount(source, target, MS_BIND | MS_REC)
    if read_only:
        _libc_mount(source, target, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)


def enter(spec: dict[str, Any]) -> None:
    """Set up the pod's view of the machine, then replace this process with the container's command."""
    if spec.get("namespaced"):
        socket.sethostname(spec["hostname"])
        # Every pod has its own /dev/shm, kept across container restarts, as a kubelet's pod sandbox does,
        # unless it mounts a volume there (as on a node). That one is mounted last: its source may lie under
        # the machine's /dev/shm, which a mount on /dev/shm would hide.
        mounts = spec.get("mounts") or []
        on_shm = [m for m in mounts if os.path.normpath(m["target"]) == "/dev/shm"]
        for mount in mounts:
            if mount not in on_shm:
                bind(mount["source"], mount["target"], bool(mount.get("read_only")))
        if on_shm:
            bind(on_shm[-1]["source"], "/dev/shm", bool(on_shm[-1].get("read_only")))
        elif spec.get("shm_dir") and os.path.isdir("/dev/shm"):
            _libc_mount(spec["shm_dir"], "/dev/shm", MS_BIND)
        for source, target in (
            (spec.get("hosts_file"), "/etc/hosts"),
            (spec.get("resolv_file"), "/etc/resolv.conf"),
        ):
            if source and os.path.exists(target):
                _libc_mount(source, os.path.realpath(target), MS_BIND)
    if spec.get("working_dir"):
        Path(spec["working_dir"]).mkdir(parents=True, exist_ok=True)
        os.chdir(spec["working_dir"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except FileNotFoundError:
        print(f'phalanx sandbox: exec: "{argv[0]}": executable file not found in $PATH', file=sys.stderr)
        sys.exit(127)
    except PermissionError:
        print(f'phalanx sandbox: exec: "{argv[0]}": permission denied', file=sys.stderr)
        sys.exit(126)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    try:
        enter(spec)
    except OSError as error:
        print(f"phalanx sandbox: container setup failed: {error}", file=sys.stderr)
        sys.exit(EXIT_SETUP_FAILED)


if __name__ == "__main__":
    main()
