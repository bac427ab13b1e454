"""Per-pod progress record and the heartbeat Lease payload (pure logic; Kubernetes calls live in lease.py).

Training processes publish their progress into a small JSON file per local rank in a directory the
launcher owns (`PHALANX_STATUS_DIR`, on /dev/shm when it exists). The launcher, the pod's long-lived
process, reads those files and renews the pod's Lease with the annotations of the heartbeat contract
(docs/ARCHITECTURE.md), and serves the same numbers as Prometheus metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Phase = Literal["starting", "rendezvous", "standby", "training", "saving", "restoring", "finished"]
PHASES: tuple[Phase, ...] = (
    "starting",
    "rendezvous",
    "standby",
    "training",
    "saving",
    "restoring",
    "finished",
)
# Phases the launcher itself knows better than any training process.
LAUNCHER_PHASES: frozenset[str] = frozenset({"starting", "rendezvous", "standby"})

STATUS_DIR_ENV = "PHALANX_STATUS_DIR"
ANNOTATION_PREFIX = "phalanx.dev/"


@dataclass(frozen=True)
class TrainingFigures:
    """The measurements a training process reports and a pod publishes. None means "not known yet"."""

    step: int | None = None
    loss: float | None = None
    step_seconds: float | None = None
    samples_per_second: float | None = None
    grad_norm: float | None = None
    checkpoint_step: int | None = None
    checkpoint_stall_seconds: float | None = None
    rank: int | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class StatusRecord(TrainingFigures):
    """What one training process last reported."""

    phase: Phase = "starting"
    restore_source: str | None = None
    updated: float = field(default_factory=time.time)
    pid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> StatusRecord:
        raw: dict[str, Any] = json.loads(text)
        known = {name: raw[name] for name in cls.__dataclass_fields__ if name in raw}
        return cls(**known)


@dataclass(frozen=True, kw_only=True)
class PodStatus(TrainingFigures):
    """The pod's view, assembled from its training processes and the launcher's own phase."""

    phase: Phase


def status_file(directory: Path, local_rank: int) -> Path:
    return directory / f"rank-{local_rank}.json"


def write_record(path: Path, record: StatusRecord) -> None:
    """Atomic replace, so a reader never sees half a record."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(record.to_json())
    os.replace(temporary, path)


def read_records(directory: Path) -> list[StatusRecord]:
    records = []
    for path in sorted(directory.glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            records.append(StatusRecord.from_json(path.read_text()))
    return records


def combine(records: list[StatusRecord], launcher_phase: Phase | None) -> PodStatus:
    """One pod status from its ranks' records.

    The launcher's phase (rendezvous, standby, ...) wins while it holds no running worker group. Otherwise
    the lowest local rank speaks for the pod, except that a save or restore anywhere shows, so the operator
    never mistakes it for a hang; the step is the slowest rank's, since that is the pod's real progress.
    """
    if not records:
        return PodStatus(phase=launcher_phase or "starting")
    leader = min(records, key=lambda record: record.rank if record.rank is not None else 1 << 30)
    phases = {record.phase for record in records}
    if launcher_phase is not None:
        phase: Phase = launcher_phase
    elif "saving" in phases:
        phase = "saving"
    elif "restoring" in phases:
        phase = "restoring"
    else:
        phase = leader.phase
    steps = [record.step for record in records if record.step is not None]
    figures = {item.name: getattr(leader, item.name) for item in fields(TrainingFigures)}
    # The step is the slowest rank's; every other figure is the leader's.
    figures["step"] = min(steps) if steps else None
    return PodStatus(phase=phase, **figures)


def _format(value: float | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def lease_annotations(status: PodStatus) -> dict[str, str]:
    """The heartbeat contract's annotations; unknown values are empty strings."""
    values: dict[str, float | int | str | None] = {
        "step": status.step,
        "loss": status.loss,
        "step-seconds": status.step_seconds,
        "samples-per-second": status.samples_per_second,
        "grad-norm": status.grad_norm,
        "checkpoint-step": status.checkpoint_step,
        "rank": status.rank,
        "world-size": status.world_size,
    }
    annotations = {
        ANNOTATION_PREFIX + key: value if isinstance(value, str) else _format(value)
        for key, value in values.items()
    }
    annotations[ANNOTATION_PREFIX + "phase"] = status.phase
    return annotations


def micro_time(moment: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    *,
    pod_name: str,
    namespace: str,
    pod_uid: str | None,
    status: PodStatus,
    now: datetime,
    lease_duration_seconds: int,
) -> dict[str, Any]:
    """The full Lease object (used to create it and to renew it)."""
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "annotations": lease_annotations(status),
        "labels": {"app.kubernetes.io/managed-by": "phalanx"},
    }
    if pod_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid, "blockOwnerDeletion": False}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": pod_name,
            "leaseDurationSeconds": lease_duration_seconds,
            "renewTime": micro_time(now),
        },
    }


class StatusPublisher:
    """Training-process side: `publish(step=..., loss=...)` merges fields into this rank's record.

    Without PHALANX_STATUS_DIR (not under the launcher) it does nothing.
    """

    def __init__(self, path: Path | None, rank: int | None = None, world_size: int | None = None) -> None:
        self._path = path
        self._record = StatusRecord(rank=rank, world_size=world_size, pid=os.getpid())

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StatusPublisher:
        env = dict(os.environ) if env is None else env
        directory = env.get(STATUS_DIR_ENV)
        rank = int(env["RANK"]) if "RANK" in env else None
        world_size = int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None
        if not directory:
            return cls(None, rank, world_size)
        local_rank = int(env.get("LOCAL_RANK", "0"))
        return cls(status_file(Path(directory), local_rank), rank, world_size)

    @property
    def record(self) -> StatusRecord:
        return self._record

    def publish(self, **fields: Any) -> None:
        self._record = replace(self._record, updated=time.time(), **fields)
        if self._path is None:
            return
        # Progress reporting must never take training down.
        with contextlib.suppress(OSError):
            write_record(self._path, self._record)
