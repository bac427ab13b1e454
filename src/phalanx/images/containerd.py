"""Loads image archives into a node's containerd, in the namespace the kubelet's CRI reads (`k8s.io`)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from phalanx.errors import UserFacingError

SOCKET = Path("/run/containerd/containerd.sock")
NAMESPACE = "k8s.io"


def import_command(archive: Path, socket: Path = SOCKET) -> list[str]:
    return ["ctr", "--address", str(socket), "--namespace", NAMESPACE, "images", "import", str(archive)]


def import_archive(archive: Path, socket: Path = SOCKET) -> None:
    """`image: phalanx:0.1.0` in a pod then resolves to this image without any pull."""
    if shutil.which("ctr") is None:
        raise UserFacingError(
            f"containerd runs at {socket} but `ctr` is missing: install the containerd package"
        )
    started = time.monotonic()
    result = subprocess.run(import_command(archive, socket), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = " ".join(result.stderr.split())
        raise UserFacingError(
            f"ctr images import {archive} failed ({detail}); the archive itself is complete"
        )
    print(f"{archive.name}: imported into containerd ({NAMESPACE}) in {time.monotonic() - started:.0f} s")


def imported(reference: str, socket: Path = SOCKET) -> bool:
    """Whether an image of that exact name is in the node's containerd already."""
    listed = subprocess.run(
        ["ctr", "--address", str(socket), "--namespace", NAMESPACE, "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    return reference in listed.stdout.split()
