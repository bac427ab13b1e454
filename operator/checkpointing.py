"""The durable-checkpoint interval: the spec's number, or chosen by Young/Daly (`intervalSteps: auto`). Pure.

Young/Daly: the interval that loses the least time to saves plus the work redone after a failure is
`sqrt(2 x save cost x MTBF)` (seconds), turned into steps with the step time. The inputs:

- save cost: what a durable save blocks training for, measured by each worker's Checkpointer (the median of
  its recent durable saves) and published in its heartbeat (`phalanx.dev/checkpoint-save-seconds`); the
  job is as slow as its slowest worker, so the highest one counts;
- step time: the median of the recent steps' times (the training-health history of the heartbeats, else the
  heartbeats' `step-seconds`);
- MTBF: the job's own failures (`status.restarts.total`) over its running time (since `status.startTime`),
  combined with a prior of `priorFailures` failures in `priorFailures x priorMtbfSeconds` seconds:
  `(priorFailures x priorMtbfSeconds + running) / (priorFailures + failures)`. The prior keeps one early
  failure from swinging the interval wildly; the job's own history takes over as it grows. With
  `clusterHistory` the cluster's other TrainingJobs add their evidence: their infrastructure failures (restarts
  not charged to their users: a user's bug says nothing about this job) over their workers' running time,
  which a job of W workers would live through in `worker-seconds / W` seconds. Failures strike per worker, so
  a job of many workers fails more often than the same cluster's small jobs.

The interval in seconds is kept within `[minIntervalSeconds, maxIntervalSeconds]`, then rounded to steps
(at least 1). Until a save cost has been measured the workers save every `BOOTSTRAP_STEPS` steps (the first
durable save measures it). The status changes only when the chosen interval moves by more than
`CHANGE_THRESHOLD` of the one in force (a fifth), so noisy figures cause no status writes and no Events.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from phalanx.operator import api
from phalanx.operator.timeutil import parse_time

BOOTSTRAP_STEPS = 10
"""Steps between durable saves under `auto` before the operator has chosen (the workers' own default too:
worker/autointerval.py): the first durable save measures the save cost."""
CHANGE_THRESHOLD = 0.2
"""A newly computed interval replaces the one in force only when it differs by more than this fraction."""
RECENT_STEPS = 20
"""Steps of the health history whose median step time is the step time."""
REASON_CHECKPOINT_INTERVAL = "CheckpointInterval"
"""The Event reason of a changed interval."""
REASON_CHECKPOINT_SKIPPED = "CheckpointSkipped"
"""The Warning Event naming checkpoints a restore passed over that the status did not name yet."""
MAX_EVENT_MESSAGE = 1024


@dataclass(frozen=True)
class JobHistory:
    """What one TrainingJob's status tells of the failures its infrastructure caused (`job_history`)."""

    uid: str
    failures: int
    """Infrastructure failures: restarts not charged to the user's budget (`restarts.total - counted`)."""
    workers: int
    """Active workers (the job's size while it ran)."""
    started: datetime | None
    """`status.startTime` (None: never started)."""
    ended: datetime | None
    """`status.completionTime` (None: still running)."""

    def worker_seconds(self, now: datetime) -> float:
        if self.started is None:
            return 0.0
        return max(((self.ended or now) - self.started).total_seconds(), 0.0) * self.workers


@dataclass(frozen=True)
class ClusterHistory:
    """The evidence of the cluster's other jobs (`cluster_history`)."""

    failures: int
    """Their infrastructure failures."""
    worker_seconds: float
    """The running time of their workers."""
    jobs: int
    """How many jobs had run."""


def job_history(job: Mapping[str, Any]) -> JobHistory | None:
    """A TrainingJob's failure history from its stored object (None: not one Phalanx ran)."""
    metadata, spec, status = (job.get(key) or {} for key in ("metadata", "spec", "status"))
    uid = metadata.get("uid")
    if not uid or not api.managed_here(spec):
        return None
    restarts = status.get("restarts") or {}
    failures = int(restarts.get("total") or 0) - int(restarts.get("counted") or 0)
    workers = int((status.get("replicas") or {}).get("desired") or spec.get("replicas") or 0)
    return JobHistory(
        uid=str(uid),
        failures=max(failures, 0),
        workers=max(workers, 0),
        started=parse_time(status.get("startTime")),
        ended=parse_time(status.get("completionTime")),
    )


def cluster_history(
    histories: Iterable[JobHistory | None], exclude_uid: str | None, now: datetime
) -> ClusterHistory:
    """The other jobs' evidence, summed (the job `exclude_uid` itself left out)."""
    others = [h for h in histories if h is not None and h.uid != exclude_uid and h.started is not None]
    return ClusterHistory(
        failures=sum(h.failures for h in others),
        worker_seconds=sum(h.worker_seconds(now) for h in others),
        jobs=len(others),
    )


@dataclass(frozen=True)
class Measurements:
    """What the operator observed for one decision (None: not known now)."""

    save_seconds: float | None
    """The slowest active worker's blocking cost of a durable save."""
    step_seconds: float | None
    """Seconds per step (median of the recent steps)."""
    failures: int
    """Failures over the job's life (`restarts.total`)."""
    running_seconds: float
    """Seconds since the job's pods were first created."""
    workers: int = 1
    """The job's active workers."""
    cluster: ClusterHistory | None = None
    """The cluster's other jobs (None: not observed)."""


@dataclass(frozen=True)
class Decision:
    """The interval in force after one reconcile, and the Event text when it changed."""

    status: api.CheckpointStatus
    event: str | None = None


def mtbf_seconds(
    failures: int,
    running_seconds: float,
    prior_mtbf_seconds: float,
    prior_failures: float,
    cluster: ClusterHistory | None = None,
    workers: int = 1,
) -> float:
    """Mean time between failures of a job of `workers` workers: the prior's pseudo-failures and pseudo-time
    added to the job's own, and the cluster's other jobs' failures with their worker-time in this job's
    seconds."""
    evidence_seconds = prior_failures * prior_mtbf_seconds + max(running_seconds, 0.0)
    evidence_failures = prior_failures + max(failures, 0)
    if cluster is not None:
        evidence_seconds += cluster.worker_seconds / max(workers, 1)
        evidence_failures += cluster.failures
    return evidence_seconds / evidence_failures


def young_daly_seconds(save_seconds: float, mtbf: float) -> float:
    """The optimal time between checkpoints, sqrt(2 x save cost x MTBF) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * max(save_seconds, 0.0) * max(mtbf, 0.0))


def steps_for(interval_seconds: float, step_seconds: float) -> int:
    """Seconds of training as whole steps, at least one."""
    if step_seconds <= 0:
        return 1
    return max(1, round(interval_seconds / step_seconds))


def clamp_seconds(seconds: float, spec: api.AutoIntervalSpec) -> tuple[float, str]:
    """The interval within the spec's bounds, and what a bound did to it (empty when none did)."""
    low, high = spec.min_interval_seconds, max(spec.max_interval_seconds, spec.min_interval_seconds)
    if seconds < low:
        return low, f"raised to minIntervalSeconds {_figure(low)} s"
    if seconds > high:
        return high, f"lowered to maxIntervalSeconds {_figure(high)} s"
    return seconds, ""


def is_meaningful_change(current: int, candidate: int, threshold: float = CHANGE_THRESHOLD) -> bool:
    """Whether `candidate` differs from the interval in force by more than `threshold` of it."""
    return abs(candidate - current) > threshold * current


def step_seconds_from(recent: Sequence[float | None], heartbeats: Sequence[float | None]) -> float | None:
    """The step time: the median of the recent steps' times, else of the heartbeats' last step times."""
    for source in (recent, heartbeats):
        known = [value for value in source if value is not None and math.isfinite(value) and value > 0]
        if known:
            return float(statistics.median(known))
    return None


def save_seconds_from(reports: Sequence[float | None]) -> float | None:
    """The save cost of the job: the slowest worker's (every rank waits for it at a durable save)."""
    known = [value for value in reports if value is not None and math.isfinite(value) and value >= 0]
    return max(known) if known else None


def _either(value: float | None, fallback: float | None) -> float | None:
    return value if value is not None else fallback


def _figure(value: float) -> str:
    return f"{value:.3g}"


def _rounded(value: float) -> float:
    """Four significant digits: enough to read, few enough to stay stable in the status."""
    return float(f"{value:.4g}")


def bootstrap(reason: str = "") -> api.CheckpointStatus:
    """The interval before any save cost was measured."""
    return api.CheckpointStatus(
        mode="auto",
        interval_steps=BOOTSTRAP_STEPS,
        reason=reason
        or f"bootstrap: a durable save every {BOOTSTRAP_STEPS} steps until the first one's cost is measured",
    )


def _inputs_changed(previous: api.CheckpointStatus, new: api.CheckpointStatus) -> str:
    """Which inputs moved since the interval in force was chosen, as `name old -> new` phrases."""
    parts = []
    for label, unit, old, value in (
        ("MTBF", " s", previous.mtbf_seconds, new.mtbf_seconds),
        ("save", " s", previous.save_seconds, new.save_seconds),
        ("step", " s", previous.step_seconds, new.step_seconds),
    ):
        if value is None:
            continue
        if old is None or old == value:
            parts.append(f"{label} {_figure(value)}{unit}")
        else:
            parts.append(f"{label} {_figure(old)}{unit} -> {_figure(value)}{unit}")
    if previous.failures_seen is not None and new.failures_seen != previous.failures_seen:
        parts.append(f"failures {previous.failures_seen} -> {new.failures_seen}")
    if new.cluster_failures_seen is not None and new.cluster_failures_seen != previous.cluster_failures_seen:
        parts.append(
            f"other jobs' failures {previous.cluster_failures_seen or 0} -> {new.cluster_failures_seen}"
        )
    return ", ".join(parts)


def choose(
    spec: api.CheckpointSpec, previous: api.CheckpointStatus | None, measured: Measurements
) -> Decision:
    """The interval in force after this reconcile (see the module docstring)."""
    if spec.interval_steps != api.AUTO_INTERVAL:
        fixed = api.CheckpointStatus(
            mode="fixed", interval_steps=int(spec.interval_steps), reason="spec.checkpoint.intervalSteps"
        )
        if previous is None or previous == fixed:
            return Decision(fixed)
        return Decision(fixed, f"checkpoint interval {fixed.interval_steps} steps (fixed by the spec)")
    auto = previous if previous is not None and previous.mode == "auto" else None
    # A figure not observed now (no worker reports it at this moment: a group re-forming) keeps the last one.
    save = _either(measured.save_seconds, auto.save_seconds if auto is not None else None)
    step = _either(measured.step_seconds, auto.step_seconds if auto is not None else None)
    if save is None or step is None:
        return Decision(auto or bootstrap())
    settings = spec.auto_interval
    cluster = (
        measured.cluster if settings.cluster_history and measured.cluster and measured.cluster.jobs else None
    )
    mtbf = mtbf_seconds(
        measured.failures,
        measured.running_seconds,
        settings.prior_mtbf_seconds,
        settings.prior_failures,
        cluster,
        measured.workers,
    )
    ideal = young_daly_seconds(save, mtbf)
    seconds, bound = clamp_seconds(ideal, settings)
    steps = steps_for(seconds, step)
    hours = cluster.worker_seconds / 3600 if cluster is not None else None
    evidence = (
        f" (the job's {measured.failures} failures and its other jobs' {cluster.failures} in "
        f"{_figure(hours or 0.0)} worker-hours)"
        if cluster is not None
        else ""
    )
    reason = (
        f"Young/Daly: sqrt(2 x {_figure(save)} s save x {_figure(mtbf)} s MTBF{evidence}) = {_figure(ideal)} s"
        + (f", {bound}" if bound else "")
        + f", / {_figure(step)} s per step = {steps} steps"
    )
    candidate = api.CheckpointStatus(
        mode="auto",
        interval_steps=steps,
        save_seconds=_rounded(save),
        step_seconds=_rounded(step),
        mtbf_seconds=_rounded(mtbf),
        failures_seen=measured.failures,
        cluster_failures_seen=cluster.failures if cluster is not None else None,
        cluster_worker_hours=_rounded(hours) if hours is not None else None,
        reason=reason,
    )
    if auto is None or auto.save_seconds is None:
        was = f"{auto.interval_steps} (bootstrap)" if auto is not None else "unset"
        return Decision(candidate, f"checkpoint interval {was} -> {steps} steps: {reason}")
    if not is_meaningful_change(auto.interval_steps, steps):
        return Decision(auto)
    why = _inputs_changed(auto, candidate)
    return Decision(
        candidate, f"checkpoint interval {auto.interval_steps} -> {steps} steps ({why}): {reason}"
    )


# ------------------------------------------------------------------------------ checkpoints passed over
def skipped_key(entry: api.SkippedCheckpoint) -> tuple[int, str, str, str | None]:
    """What makes two reports one checkpoint: its step, tier and reason (the workers of a job share every tier
    but a node's own, where the same step on two nodes is two checkpoints)."""
    return (entry.step, entry.tier, entry.reason, entry.pod if entry.tier == "local" else None)


@dataclass(frozen=True)
class Skipped:
    """The checkpoints passed over that the status names after one reconcile, and the Event text when the
    reconcile found any it did not name yet."""

    entries: list[api.SkippedCheckpoint] | None
    event: str | None = None


def follow_skipped(
    previous: Sequence[api.SkippedCheckpoint] | None, reported: Iterable[api.SkippedCheckpoint]
) -> Skipped:
    """`previous` and what the workers' heartbeats report now, each checkpoint once (the first report of it
    is kept), the newest `api.MAX_SKIPPED_CHECKPOINTS` steps. A report the status already names, or one too
    old to be kept, brings no Event: a worker repeats its report in every heartbeat until its next restore,
    and every restore that passes a checkpoint over again reports it again."""
    known = {skipped_key(entry): entry for entry in previous or []}
    fresh: dict[tuple[int, str, str, str | None], api.SkippedCheckpoint] = {}
    for entry in reported:
        key = skipped_key(entry)
        if key not in known:
            fresh.setdefault(key, entry)
    merged = sorted(
        [*known.values(), *fresh.values()], key=lambda entry: (-entry.step, entry.tier, entry.pod or "")
    )[: api.MAX_SKIPPED_CHECKPOINTS]
    new = [entry for entry in merged if skipped_key(entry) in fresh]
    if not merged:
        return Skipped(None)
    return Skipped(merged, skipped_event(new) if new else None)


def skipped_event(entries: Sequence[api.SkippedCheckpoint]) -> str:
    """The Warning Event's text: each checkpoint, where it was, who passed it over and why."""
    parts = [
        f"step {entry.step} on the {entry.tier} tier ({entry.reason}"
        + (f": {entry.message}" if entry.message else "")
        + ")"
        + (f" by {entry.pod}" if entry.pod else "")
        for entry in entries
    ]
    count = f"{len(entries)} checkpoint{'s' if len(entries) != 1 else ''}"
    text = f"a restore passed over {count} newer than the state it restored: " + "; ".join(parts)
    return text if len(text) <= MAX_EVENT_MESSAGE else text[: MAX_EVENT_MESSAGE - 3] + "..."
