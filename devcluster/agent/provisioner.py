"""A local volume provisioner: the default StorageClass `local` and a hostPath PV for every pending claim.

PVs are created with `claimRef` set so the real PV controller binds them; their data lives under
`<state dir>/volumes/<pv name>` and outlives pods. When a claim is deleted its PV and data are deleted too.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

STORAGE_CLASS = "local"
PROVISIONER = "phalanx.dev/local"


def storage_class_object() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: dict[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def wants_volume(claim: dict[str, Any]) -> bool:
    spec = claim.get("spec") or {}
    return (
        (claim.get("status") or {}).get("phase", "Pending") == "Pending"
        and not spec.get("volumeName")
        and spec.get("storageClassName") == STORAGE_CLASS
        and not claim["metadata"].get("deletionTimestamp")
    )


def persistent_volume_object(claim: dict[str, Any], volumes_dir: Path) -> dict[str, Any]:
    meta, spec = claim["metadata"], claim["spec"]
    name = volume_name(claim)
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "hostPath": {"path": str(volumes_dir / name), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


class Provisioner:
    def __init__(self, kube: KubeClient, state_dir: Path) -> None:
        self.kube = kube
        self.volumes_dir = state_dir / "volumes"

    def ensure_storage_class(self) -> None:
        try:
            self.kube.create("/apis/storage.k8s.io/v1/storageclasses", storage_class_object())
        except ApiError as error:
            if error.status != 409:
                raise

    def handle(self, kind: str, claim: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._release(claim)
            return
        if not wants_volume(claim):
            return
        body = persistent_volume_object(claim, self.volumes_dir)
        directory = Path(body["spec"]["hostPath"]["path"])
        directory.mkdir(parents=True, exist_ok=True)
        # Writable by every user, as local-path provisioners make theirs: a hostPath volume gets no fsGroup,
        # and containers of non-root images (the worker runs as uid 10001) must write their checkpoints.
        directory.chmod(0o777)
        try:
            self.kube.create("/api/v1/persistentvolumes", body)
            log.info("provisioned %s for %s/%s", body["metadata"]["name"], *self._ref(claim))
        except ApiError as error:
            if error.status != 409:
                raise

    @staticmethod
    def _ref(claim: dict[str, Any]) -> tuple[str, str]:
        return claim["metadata"]["namespace"], claim["metadata"]["name"]

    def _release(self, claim: dict[str, Any]) -> None:
        name = (claim.get("spec") or {}).get("volumeName") or volume_name(claim)
        volume = self.kube.get_or_none(f"/api/v1/persistentvolumes/{name}")
        if (
            volume is None
            or volume["metadata"].get("annotations", {}).get("pv.kubernetes.io/provisioned-by") != PROVISIONER
        ):
            return
        try:
            self.kube.delete(f"/api/v1/persistentvolumes/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
        shutil.rmtree(self.volumes_dir / name, ignore_errors=True)
        log.info("deleted %s (claim %s/%s gone)", name, *self._ref(claim))
