"""The local provisioner's volumes: one hostPath folder per claim, writable by the pods' users."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.provisioner import STORAGE_CLASS, Provisioner


class RecordingKube:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, body: dict[str, Any]) -> None:
        self.created.append((path, body))


def test_a_claims_folder_is_writable_by_non_root_containers(tmp_path: Path) -> None:
    kube = RecordingKube()
    claim = {
        "metadata": {"name": "ckpt", "namespace": "ns", "uid": "u-1"},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteMany"]},
        "status": {"phase": "Pending"},
    }
    Provisioner(kube, tmp_path).handle("ADDED", claim)  # type: ignore[arg-type]
    ((path, volume),) = kube.created
    folder = Path(volume["spec"]["hostPath"]["path"])
    assert path == "/api/v1/persistentvolumes" and folder.parent == tmp_path / "volumes"
    # hostPath volumes get no fsGroup: the worker image's uid 10001 writes there only if everyone may.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777
