"""Per-pod progress record and the heartbeat Lease payload (pure logic; Kubernetes calls live in lease.py).

Training processes publish their progress into a small JSON file per local rank in a directory the
launcher owns (`PHALANX_STATUS_DIR`, on /dev/shm when it exists). The launcher, the pod's long-lived
process, reads those files and renews the pod's Lease with the annotations of the heartbeat contract
(docs/ARCHITECTURE.md), and serves the same numbers as Prometheus metrics.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phalanx import contract
from phalanx.worker.checkpoint import skipped

Phase = contract.Phase
PHASES = contract.PHASES
# Phases the launcher itself knows better than any training process.
LAUNCHER_PHASES: frozenset[str] = frozenset(
    {contract.PHASE_STARTING, contract.PHASE_RENDEZVOUS, contract.PHASE_STANDBY, contract.PHASE_EXITING}
)

STATUS_DIR_ENV = "PHALANX_STATUS_DIR"
# Set by the launcher for each start of its worker group (1, 2, ...).
GROUP_ATTEMPT_ENV = "PHALANX_GROUP_ATTEMPT"
ANNOTATION_PREFIX = contract.LEASE_ANNOTATION_PREFIX
MAX_MESSAGE = 512
"""The longest text a heartbeat carries in one annotation."""
PREFLIGHT_RESTART_CAUSE = "preflight: restart from its checkpoint"
"""`restart-cause` of the preflight's planned restart (worker/preflight.py): the operator tells it from a
failure's by its `preflight:` start."""


@dataclass(frozen=True)
class TrainingFigures:
    """The measurements a training process reports and a pod publishes. None means "not known yet"."""

    step: int | None = None
    step_at: float | None = None
    """Unix time when this rank reported `step` first: the operator's no-progress clock starts there, not when
    it happened to look."""
    loss: float | None = None
    step_seconds: float | None = None
    samples_per_second: float | None = None
    grad_norm: float | None = None
    checkpoint_step: int | None = None
    checkpoint_stall_seconds: float | None = None
    rank: int | None = None
    world_size: int | None = None
    compute_seconds: float | None = None
    """This rank's own busy time in its last step: the step time less the time spent waiting for peers
    (worker/steptime.py)."""
    checkpoint_save_seconds: float | None = None
    """What a durable save blocks training for: the median of this rank's recent durable saves
    (`Checkpointer.save_seconds`); the operator's automatic interval needs it."""
    checkpoint_interval: int | None = None
    """Steps between durable saves in force on this rank (`Checkpointer.interval_steps`)."""
    preflight: str | None = None
    """running, passed or failed while the job's preflight runs or once it ended (worker/preflight.py)."""
    preflight_reason: str | None = None
    """Why the preflight failed (e.g. `ResumeMismatch`), or `Passed`."""
    preflight_message: str | None = None
    """What the preflight did or found, in words."""


@dataclass(frozen=True)
class RestoreFigures:
    """Where the current worker group resumed from. None means "not known yet"."""

    restored_step: int | None = None
    """The step loaded at start or by the latest restore."""
    restore_source: str | None = None
    """memory, peer, durable or none (a Checkpointer's `disk` is published as `durable`)."""
    resumed_at: float | None = None
    """Unix time when the first step after the latest restore completed."""
    checkpoint_skipped: str | None = None
    """The checkpoints the latest restore passed over (torn, corrupt, of another format), as the heartbeat's
    JSON text (worker/checkpoint/skipped.py `encode`); None: none."""


@dataclass(frozen=True)
class StatusRecord(RestoreFigures, TrainingFigures):
    """What one training process last reported."""

    phase: Phase = "starting"
    phase_since: float | None = None
    """Unix time when this process entered `phase`."""
    attempt: int | None = None
    """The launcher's group attempt that started this process (`PHALANX_GROUP_ATTEMPT`)."""
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
class PodStatus(RestoreFigures, TrainingFigures):
    """The pod's view, assembled from its training processes and the launcher's own phase."""

    phase: Phase
    phase_since: float | None = None
    """Unix time when the pod entered `phase`."""
    group_started: float | None = None
    """Unix time when the launcher started its current worker group; None while none runs."""
    group_restarts: int | None = None
    """Restarts of the worker group by this launcher."""
    restart_cause: str | None = None
    """Why the launcher last restarted its worker group (None: never); the preflight's planned restart is
    `PREFLIGHT_RESTART_CAUSE`."""
    exit_code: int | None = None
    """The launcher's exit code once it is ending on its own (phase `exiting` or `finished`)."""
    fault: str | None = None
    """The launcher's verdict on a training process of its group: `stopped` or `hung` (None: none;
    worker/trainerwatch.py)."""
    fault_rank: int | None = None
    """The global rank the verdict names."""
    fault_since: float | None = None
    """Unix time when the fault began (the stop was first seen; the wait for the next step began)."""
    fault_message: str | None = None
    """The verdict in words."""
    hang_threshold: float | None = None
    """Seconds without a step after which the launcher calls a training rank hung (None: not judged yet)."""
    hang_basis: str | None = None
    """How the hang threshold came about, e.g. `5x p99 of 0.28s over 40 steps`."""


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


def combine(
    records: list[StatusRecord],
    launcher_phase: Phase | None,
    *,
    attempt: int | None = None,
    launcher_since: float | None = None,
) -> PodStatus:
    """One pod status from its ranks' records.

    The launcher's phase (rendezvous, standby, ...) wins while it holds no running worker group. Otherwise
    the lowest local rank speaks for the pod, except that a save or restore anywhere shows, so the operator
    never mistakes it for a hang; the step is the slowest rank's, since that is the pod's real progress,
    and the compute time the busiest rank's, since the pod is as slow as that rank.

    `attempt` is the launcher's current group attempt: records written by the processes of an earlier
    attempt still give the step (until the new processes report one) but neither the phase nor where the
    group resumed from. `launcher_since` is when the launcher entered `launcher_phase`.
    """
    if launcher_phase is not None and launcher_phase in LAUNCHER_PHASES:
        # No group runs: what the last group restored says nothing about the next one.
        records = [replace(record, **_NO_RESTORE) for record in records]
    current = [record for record in records if attempt is None or record.attempt == attempt]
    if not records:
        return PodStatus(phase=launcher_phase or "starting", phase_since=launcher_since)
    speakers = current or [replace(record, **_NO_RESTORE) for record in records]
    leader = min(speakers, key=lambda record: record.rank if record.rank is not None else 1 << 30)
    phase, since = _pod_phase(current, launcher_phase, launcher_since)
    steps = [record.step for record in speakers if record.step is not None]
    if not steps:
        steps = [record.step for record in records if record.step is not None]
    computes = [record.compute_seconds for record in speakers if record.compute_seconds is not None]
    figures = {item.name: getattr(leader, item.name) for item in fields(TrainingFigures)}
    figures.update({item.name: getattr(leader, item.name) for item in fields(RestoreFigures)})
    # The step is the slowest rank's; the compute time the busiest rank's; every other figure the leader's.
    figures["step"] = min(steps) if steps else None
    # The pod reached its step when the last of the slowest ranks did.
    reached = [r.step_at for r in speakers if r.step == figures["step"] and r.step_at is not None]
    figures["step_at"] = max(reached) if reached else None
    figures["compute_seconds"] = max(computes) if computes else None
    # Whichever rank read a checkpoint location names what it passed over (rank 0, or each on a node-local tier).
    figures["checkpoint_skipped"] = skipped.merge(record.checkpoint_skipped for record in speakers)
    return PodStatus(phase=phase, phase_since=since, **figures)


_NO_RESTORE: dict[str, Any] = {item.name: None for item in fields(RestoreFigures)}


def _pod_phase(
    current: list[StatusRecord], launcher_phase: Phase | None, launcher_since: float | None
) -> tuple[Phase, float | None]:
    """The pod's phase and when it was entered, as far as the sources tell."""
    if launcher_phase is not None:
        return launcher_phase, launcher_since
    if not current:
        return "starting", None  # the group's processes are starting and have not reported yet
    leader = min(current, key=lambda record: record.rank if record.rank is not None else 1 << 30)
    phases = {record.phase for record in current}
    phase: Phase = "saving" if "saving" in phases else "restoring" if "restoring" in phases else leader.phase
    entered = [record.phase_since for record in current if record.phase == phase and record.phase_since]
    if not entered:
        return phase, None
    # A save or restore anywhere shows from its first rank on; any other phase once the last rank is in it.
    return phase, min(entered) if phase in ("saving", "restoring") else max(entered)


class PhaseClock:
    """When the pod entered its current phase, as the launcher sees it.

    A change the launcher observes takes its time from the source (the process or the launcher that
    changed phase) when that time is plausible, else the moment of observation. Flips the launcher did
    not observe (a quick saving -> training between two reads) do not move the time.
    """

    def __init__(self) -> None:
        self.phase: str | None = None
        self.since: float | None = None

    def observe(self, phase: str, source_since: float | None, now: float) -> float:
        if phase != self.phase or self.since is None:
            floor = self.since if self.since is not None else -math.inf
            plausible = source_since is not None and floor <= source_since <= now
            self.phase = phase
            self.since = source_since if plausible and source_since is not None else now
        return self.since


# Phases whose start or end the operator measures (rendezvous, standbys, restores, the end): a change to or
# from one of them renews the Lease at once instead of at the next heartbeat.
PROMPT_PHASES: frozenset[str] = frozenset({"rendezvous", "standby", "restoring", "finished"})


class RenewalSchedule:
    """When the launcher renews the Lease: every interval, and promptly (at most every `min_gap` seconds)
    after a change the operator times or acts on: a phase change to or from a `PROMPT_PHASES` phase, a newly
    set `resumed_at`, or a change of the launcher's verdict on its training processes (`fault`). The
    saving <-> training flip of every step does not hurry a renewal."""

    def __init__(self, interval: float, min_gap: float = 0.2) -> None:
        self.interval = interval
        self.min_gap = min_gap
        self._last_renewal = -math.inf
        self._pending = False
        self._phase: str | None = None
        self._resumed_at: float | None = None
        self._fault: str | None = None

    def due(self, now: float, phase: str, resumed_at: float | None, fault: str | None = None) -> bool:
        """Whether to renew now; records the change it sees (call once per look at the status)."""
        if phase != self._phase and (phase in PROMPT_PHASES or self._phase in PROMPT_PHASES):
            self._pending = True
        if resumed_at is not None and resumed_at != self._resumed_at:
            self._pending = True
        if fault != self._fault:
            self._pending = True
        self._phase, self._resumed_at, self._fault = phase, resumed_at, fault
        since = now - self._last_renewal
        return since >= self.interval or (self._pending and since >= self.min_gap)

    def renewed(self, now: float) -> None:
        self._last_renewal = now
        self._pending = False

    def wait_hint(self, now: float) -> float:
        """Seconds until a pending prompt renewal may go out (inf when none is pending)."""
        if not self._pending:
            return math.inf
        return max(0.0, self._last_renewal + self.min_gap - now)


def _format(value: float | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def wall_time(seconds: float | None) -> str:
    """RFC 3339 UTC with microseconds for a Unix time; empty when unknown."""
    return "" if seconds is None else micro_time(datetime.fromtimestamp(seconds, UTC))


RESTORE_SOURCES = {
    "memory": "memory",
    "peer": "peer",
    "disk": "durable",
    "durable": "durable",
    "none": "none",
}


def restore_source_label(source: str | None) -> str:
    """The contract's word for where a group resumed from: memory, peer, durable, none (or empty)."""
    return RESTORE_SOURCES.get(source or "", "")


def lease_annotations(status: PodStatus) -> dict[str, str]:
    """The heartbeat contract's annotations; unknown values are empty strings."""
    values: dict[str, float | int | str | None] = {
        "step": status.step,
        "step-at": wall_time(status.step_at),
        "loss": status.loss,
        "step-seconds": status.step_seconds,
        "samples-per-second": status.samples_per_second,
        "grad-norm": status.grad_norm,
        "checkpoint-step": status.checkpoint_step,
        "rank": status.rank,
        "world-size": status.world_size,
        "phase-since": wall_time(status.phase_since),
        "group-started": wall_time(status.group_started),
        "group-restarts": status.group_restarts,
        "restart-cause": (status.restart_cause or "")[:MAX_MESSAGE],
        "restored-step": status.restored_step,
        "restore-source": restore_source_label(status.restore_source),
        "resumed-at": wall_time(status.resumed_at),
        "checkpoint-skipped": status.checkpoint_skipped or "",
        "compute-seconds": status.compute_seconds,
        "checkpoint-save-seconds": status.checkpoint_save_seconds,
        "checkpoint-interval": status.checkpoint_interval,
        "exit-code": status.exit_code,
        "fault": status.fault,
        "fault-rank": status.fault_rank,
        "fault-since": wall_time(status.fault_since),
        "fault-message": (status.fault_message or "")[:MAX_MESSAGE],
        "hang-threshold": status.hang_threshold,
        "hang-basis": status.hang_basis,
        "preflight": status.preflight,
        "preflight-reason": status.preflight_reason,
        "preflight-message": (status.preflight_message or "")[:MAX_MESSAGE],
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
        "labels": dict(contract.LEASE_LABELS),
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

    A change of `phase` stamps `phase_since`. After `restored(step, source)` the first published step
    beyond the restored one stamps `resumed_at`. Without PHALANX_STATUS_DIR (not under the launcher) it
    only keeps the record in memory.
    """

    def __init__(
        self,
        path: Path | None,
        rank: int | None = None,
        world_size: int | None = None,
        attempt: int | None = None,
    ) -> None:
        self._path = path
        self._record = StatusRecord(
            rank=rank, world_size=world_size, attempt=attempt, pid=os.getpid(), phase_since=time.time()
        )
        self._resume_after: int | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StatusPublisher:
        env = dict(os.environ) if env is None else env
        directory = env.get(STATUS_DIR_ENV)
        rank = int(env["RANK"]) if "RANK" in env else None
        world_size = int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None
        attempt_text = env.get(GROUP_ATTEMPT_ENV, "")
        attempt = int(attempt_text) if attempt_text.isdigit() else None
        if not directory:
            return cls(None, rank, world_size, attempt)
        local_rank = int(env.get("LOCAL_RANK", "0"))
        return cls(status_file(Path(directory), local_rank), rank, world_size, attempt)

    @property
    def record(self) -> StatusRecord:
        return self._record

    def publish(self, **fields: Any) -> None:
        now = time.time()
        if "phase" in fields and fields["phase"] != self._record.phase and "phase_since" not in fields:
            fields["phase_since"] = now
        step = fields.get("step")
        if step is not None and step != self._record.step and "step_at" not in fields:
            fields["step_at"] = now
        if self._resume_after is not None and step is not None and step > self._resume_after:
            fields.setdefault("resumed_at", now)
            self._resume_after = None
        self._record = replace(self._record, updated=now, **fields)
        if self._path is None:
            return
        # Progress reporting must never take training down.
        with contextlib.suppress(OSError):
            write_record(self._path, self._record)

    def restored(
        self,
        step: int,
        source: str,
        phase: Phase = "training",
        skipped_checkpoints: Iterable[skipped.SkippedCheckpoint] = (),
    ) -> None:
        """The state is loaded (at start, or by a later restore): `step` is where training goes on from,
        `source` where it came from (memory, peer, disk/durable, none), `skipped_checkpoints` the newer ones
        the restore passed over (`RestoreInfo.skipped`)."""
        self._resume_after = step
        self.publish(
            phase=phase,
            step=step,
            restored_step=step,
            restore_source=restore_source_label(source) or source,
            resumed_at=None,
            checkpoint_skipped=skipped.encode(skipped_checkpoints) or None,
        )
