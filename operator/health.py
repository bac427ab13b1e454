"""Training-health signals from the workers' heartbeats (pure logic, no Kubernetes calls).

Every heartbeat Lease carries the pod's step, loss, gradient norm and step time. The operator does not
reconcile on a mere renewal, so the Lease handler feeds each heartbeat into a small in-memory history per job
(`HealthMonitor`) and wakes the job's reconcile only when a signal changes state. `evaluate` turns a history
and the job's `spec.health` into one `Verdict` per signal; the reconcile turns those into the `Healthy`
condition, `status.health`, Events and actions.

The history keeps one sample per step (several pods reporting the same step are merged: the loss is the
newest report, the gradient norm and step time the highest, since the job moves at its slowest pod's pace).
A pod whose step goes back (its group restored an earlier checkpoint) drops the samples after that step: the
history follows the run that goes on. After an operator restart it refills from new heartbeats; the step-time
baseline comes back from `status.health`.
"""

from __future__ import annotations

import bisect
import math
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from phalanx import contract
from phalanx.operator import api
from phalanx.operator.timeutil import format_micro_time, parse_time

# Signal names: the `Healthy` condition's reasons and the Events' reasons.
NON_FINITE_LOSS = "NonFiniteLoss"
LOSS_DIVERGING = "LossDiverging"
GRAD_NORM_SPIKE = "GradNormSpike"
STEP_TIME_DRIFT = "StepTimeDrift"
LOSS_STAGNATING = "LossStagnating"
# Most urgent first: the condition's reason is the first active signal in this order.
SIGNALS = (NON_FINITE_LOSS, LOSS_DIVERGING, GRAD_NORM_SPIKE, STEP_TIME_DRIFT, LOSS_STAGNATING)
# Heartbeat phases whose figures describe the step they report.
SAMPLED_PHASES = (contract.PHASE_TRAINING, contract.PHASE_SAVING)
MAX_SAMPLES = 4096

State = Literal["active", "clear", "unknown"]


@dataclass(frozen=True)
class Sample:
    """What the heartbeats said about one training step (None: not reported)."""

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    step_seconds: float | None = None


def _number(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def sample_from_lease(summary: dict[str, Any]) -> Sample | None:
    """The sample a heartbeat summary (`status.summarize_lease`) carries, if it describes a trained step.

    A heartbeat at the step its group restored (`restored-step`) still shows the figures of the step before
    the restore: it is no sample."""
    if summary.get("phase") not in SAMPLED_PHASES:
        return None
    step = _number(summary.get("step"))
    if step is None or not math.isfinite(step):
        return None
    restored = _number(summary.get("restored-step"))
    if restored is not None and step <= restored:
        return None
    sample = Sample(
        step=int(step),
        loss=_number(summary.get("loss")),
        grad_norm=_number(summary.get("grad-norm")),
        step_seconds=_number(summary.get("step-seconds")),
    )
    if sample.loss is None and sample.grad_norm is None and sample.step_seconds is None:
        return None
    return sample


def _highest(a: float | None, b: float | None) -> float | None:
    """The higher of two figures; a non-finite one wins (it must not hide)."""
    if a is None or b is None:
        return b if a is None else a
    if not math.isfinite(a) or not math.isfinite(b):
        return a if not math.isfinite(a) else b
    return max(a, b)


def _merge(old: Sample, new: Sample) -> Sample:
    return Sample(
        step=old.step,
        loss=new.loss if new.loss is not None else old.loss,
        grad_norm=_highest(old.grad_norm, new.grad_norm),
        step_seconds=_highest(old.step_seconds, new.step_seconds),
    )


@dataclass
class History:
    """One job's samples, one per step, in step order."""

    samples: list[Sample] = field(default_factory=list)
    first_step: int | None = None
    """The first step seen: the step-time warm-up counts from here."""
    pod_steps: dict[str, int] = field(default_factory=dict)
    """The last step each pod reported (a step going back means a restore)."""
    max_samples: int = MAX_SAMPLES

    def add(self, pod: str, sample: Sample) -> bool:
        """Record a pod's sample; True when the history changed."""
        previous = self.pod_steps.get(pod)
        self.pod_steps[pod] = sample.step
        changed = False
        if previous is not None and sample.step < previous:
            # The pod's group restored an earlier checkpoint: what came after it is no longer the run.
            kept = [s for s in self.samples if s.step < sample.step]
            changed = len(kept) != len(self.samples)
            self.samples = kept
        if self.first_step is None or sample.step < self.first_step:
            self.first_step = sample.step
        at = bisect.bisect_left(self.samples, sample.step, key=_sample_step)
        if at < len(self.samples) and self.samples[at].step == sample.step:
            merged = _merge(self.samples[at], sample)
            changed = changed or merged != self.samples[at]
            self.samples[at] = merged
        else:
            self.samples.insert(at, sample)
            changed = True
        if len(self.samples) > self.max_samples:
            del self.samples[: len(self.samples) - self.max_samples]
        return changed

    def copy(self) -> History:
        return replace(self, samples=list(self.samples), pod_steps=dict(self.pod_steps))


@dataclass(frozen=True)
class Baseline:
    """The run's own step time: the median over an early window after the warm-up."""

    seconds: float
    first_step: int
    last_step: int

    @property
    def steps(self) -> str:
        return f"{self.first_step}-{self.last_step}"


@dataclass(frozen=True)
class Verdict:
    """One signal's state: `unknown` while its windows hold too few samples."""

    signal: str
    state: State
    message: str = ""
    since_step: int | None = None
    """Where the anomaly shows first: the first step of the window that shows it."""


@dataclass(frozen=True)
class Assessment:
    """Every enabled signal's verdict, and the step-time baseline (known or found now)."""

    verdicts: tuple[Verdict, ...] = ()
    baseline: Baseline | None = None

    @property
    def active(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.state == "active"]

    @property
    def judged(self) -> bool:
        """Whether at least one signal had enough data to be judged."""
        return any(verdict.state != "unknown" for verdict in self.verdicts)

    @property
    def key(self) -> tuple[tuple[str, State], ...]:
        """The states alone: a change of it wakes the job's reconcile."""
        return tuple((verdict.signal, verdict.state) for verdict in self.verdicts)


# ------------------------------------------------------------------------------------------- windows


def _finite(values: Sequence[tuple[int, float | None]]) -> list[tuple[int, float]]:
    return [(step, value) for step, value in values if value is not None and math.isfinite(value)]


def _step(point: tuple[int, float]) -> int:
    return point[0]


def _sample_step(sample: Sample) -> int:
    return sample.step


def _window(points: list[tuple[int, float]], after: int, upto: int) -> list[tuple[int, float]]:
    """Points (in step order) with `after < step <= upto`."""
    low = bisect.bisect_right(points, after, key=_step)
    return points[low : bisect.bisect_right(points, upto, lo=low, key=_step)]


def _mean(points: list[tuple[int, float]]) -> float:
    return statistics.fmean(value for _, value in points)


def _median(points: list[tuple[int, float]]) -> float:
    return statistics.median(value for _, value in points)


def _span(points: list[tuple[int, float]]) -> str:
    return f"{points[0][0]}-{points[-1][0]}"


def _exceeds(value: float, reference: float, factor: float) -> bool:
    """`value` above `reference` by more than `factor - 1` times the reference's magnitude."""
    return value > reference + (factor - 1) * abs(reference)


# ------------------------------------------------------------------------------------------- signals


def non_finite_loss(samples: Sequence[Sample]) -> Verdict:
    """Active while the newest reported loss is NaN or infinite."""
    reported = (sample for sample in reversed(samples) if sample.loss is not None)
    newest = next(reported, None)
    if newest is None or newest.loss is None:
        return Verdict(NON_FINITE_LOSS, "unknown")
    if math.isfinite(newest.loss):
        return Verdict(NON_FINITE_LOSS, "clear")
    first = newest
    for sample in reported:
        if sample.loss is not None and math.isfinite(sample.loss):
            break
        first = sample
    since = f" since step {first.step}" if first.step != newest.step else ""
    return Verdict(NON_FINITE_LOSS, "active", f"loss {newest.loss} at step {newest.step}{since}", first.step)


def loss_divergence(samples: Sequence[Sample], spec: api.LossDivergenceSpec, min_samples: int) -> Verdict:
    """Active while the mean loss of the recent window is far above the mean of the window before it."""
    points = _finite([(sample.step, sample.loss) for sample in samples])
    if not points:
        return Verdict(LOSS_DIVERGING, "unknown")
    newest = points[-1][0]
    recent = _window(points, newest - spec.recent_steps, newest)
    start = newest - spec.recent_steps
    reference = _window(points, start - spec.reference_steps, start)
    if len(recent) < min_samples or len(reference) < min_samples:
        return Verdict(LOSS_DIVERGING, "unknown")
    recent_mean, reference_mean = _mean(recent), _mean(reference)
    if not _exceeds(recent_mean, reference_mean, spec.factor):
        return Verdict(LOSS_DIVERGING, "clear")
    message = (
        f"mean loss {recent_mean:.2f} over steps {_span(recent)} vs {reference_mean:.2f} over steps "
        f"{_span(reference)} (threshold {spec.factor:g}x)"
    )
    return Verdict(LOSS_DIVERGING, "active", message, recent[0][0])


def loss_stagnation(samples: Sequence[Sample], spec: api.LossStagnationSpec, min_samples: int) -> Verdict:
    """Active while the mean loss of the window's newest fifth is not `minImprovement` below that of its
    oldest fifth."""
    points = _finite([(sample.step, sample.loss) for sample in samples])
    if not points:
        return Verdict(LOSS_STAGNATING, "unknown")
    newest = points[-1][0]
    part = max(spec.window_steps // 5, 1)
    start = newest - spec.window_steps
    oldest = _window(points, start, start + part)
    latest = _window(points, newest - part, newest)
    if len(oldest) < min_samples or len(latest) < min_samples:
        return Verdict(LOSS_STAGNATING, "unknown")
    before, now = _mean(oldest), _mean(latest)
    if before == 0:
        return Verdict(LOSS_STAGNATING, "unknown")
    improvement = (before - now) / abs(before)
    if improvement > spec.min_improvement:
        return Verdict(LOSS_STAGNATING, "clear")
    message = (
        f"mean loss {now:.4g} over steps {_span(latest)} vs {before:.4g} over steps {_span(oldest)}: "
        f"{improvement:.2%} better, under {spec.min_improvement:.2%}"
    )
    return Verdict(LOSS_STAGNATING, "active", message, oldest[0][0])


def grad_norm_spike(samples: Sequence[Sample], spec: api.GradNormSpikeSpec, min_samples: int) -> Verdict:
    """Active while a gradient norm within `recentSteps` of the newest step is above `factor` x the median of
    the `windowSteps` before it (the largest such spike is reported)."""
    points = _finite([(sample.step, sample.grad_norm) for sample in samples])
    if not points:
        return Verdict(GRAD_NORM_SPIKE, "unknown")
    newest = points[-1][0]
    judged = False
    worst: tuple[float, int, float, list[tuple[int, float]]] | None = None
    for step, value in _window(points, newest - spec.recent_steps, newest):
        before = _window(points, step - spec.window_steps - 1, step - 1)
        if len(before) < min_samples:
            continue
        judged = True
        median = _median(before)
        if median > 0 and value > spec.factor * median:
            ratio = value / median
            if worst is None or ratio > worst[0]:
                worst = (ratio, step, value, before)
    if worst is None:
        return Verdict(GRAD_NORM_SPIKE, "clear" if judged else "unknown")
    ratio, step, value, before = worst
    message = (
        f"gradient norm {value:.3g} at step {step}, {ratio:.1f}x the median {_median(before):.3g} of steps "
        f"{_span(before)} (threshold {spec.factor:g}x)"
    )
    return Verdict(GRAD_NORM_SPIKE, "active", message, step)


def step_time_baseline(
    samples: Sequence[Sample], first_step: int | None, spec: api.StepTimeDriftSpec, min_samples: int
) -> Baseline | None:
    """The median step time over `baselineSteps` steps after the warm-up, once that window is complete (when
    it holds fewer than `minSamples` samples: the first `minSamples` samples after the warm-up)."""
    points = _finite([(sample.step, sample.step_seconds) for sample in samples])
    if first_step is None or not points:
        return None
    start = first_step + spec.warmup_steps
    end = start + spec.baseline_steps
    if points[-1][0] <= end:
        return None
    window = _window(points, start, end)
    if len(window) < min_samples:
        window = [point for point in points if point[0] > start][:min_samples]
        if len(window) < min_samples:
            return None
    return Baseline(seconds=_median(window), first_step=window[0][0], last_step=window[-1][0])


def step_time_drift(
    samples: Sequence[Sample], baseline: Baseline | None, spec: api.StepTimeDriftSpec, min_samples: int
) -> Verdict:
    """Active while the median step time of the recent window is `slowdown` or more above the baseline."""
    points = _finite([(sample.step, sample.step_seconds) for sample in samples])
    if baseline is None or not points or baseline.seconds <= 0:
        return Verdict(STEP_TIME_DRIFT, "unknown")
    newest = points[-1][0]
    recent = _window(points, max(newest - spec.window_steps, baseline.last_step), newest)
    if len(recent) < min_samples:
        return Verdict(STEP_TIME_DRIFT, "unknown")
    median = _median(recent)
    slower = median / baseline.seconds - 1
    if median < baseline.seconds * (1 + spec.slowdown):
        return Verdict(STEP_TIME_DRIFT, "clear")
    message = (
        f"median step time {median:.3g} s over steps {_span(recent)} vs baseline {baseline.seconds:.3g} s "
        f"(steps {baseline.steps}): {slower:.0%} slower, threshold {spec.slowdown:.0%}"
    )
    return Verdict(STEP_TIME_DRIFT, "active", message, recent[0][0])


def evaluate(history: History, spec: api.HealthSpec, baseline: Baseline | None = None) -> Assessment:
    """Every enabled signal's verdict for `history`; `baseline` is the one already known (from the status),
    else it is measured from the history once its window is complete."""
    samples, least = history.samples, spec.min_samples
    verdicts: list[Verdict] = []
    drift, divergence, spike = spec.step_time_drift, spec.loss_divergence, spec.grad_norm_spike
    if drift.enabled and baseline is None:
        baseline = step_time_baseline(samples, history.first_step, drift, least)

    def tail(steps: int) -> list[Sample]:
        """The samples of the newest `steps` steps (and one more): each signal reads only its windows."""
        if not samples:
            return []
        return samples[bisect.bisect_right(samples, samples[-1].step - steps - 1, key=_sample_step) :]

    checks: dict[str, tuple[bool, Callable[[], Verdict]]] = {
        NON_FINITE_LOSS: (spec.non_finite_loss.enabled, lambda: non_finite_loss(samples)),
        LOSS_DIVERGING: (
            divergence.enabled,
            lambda: loss_divergence(
                tail(divergence.recent_steps + divergence.reference_steps), divergence, least
            ),
        ),
        GRAD_NORM_SPIKE: (
            spike.enabled,
            lambda: grad_norm_spike(tail(spike.recent_steps + spike.window_steps), spike, least),
        ),
        STEP_TIME_DRIFT: (
            drift.enabled,
            lambda: step_time_drift(tail(drift.window_steps), baseline, drift, least),
        ),
        LOSS_STAGNATING: (
            spec.loss_stagnation.enabled,
            lambda: loss_stagnation(tail(spec.loss_stagnation.window_steps), spec.loss_stagnation, least),
        ),
    }
    for signal in SIGNALS:
        enabled, check = checks[signal]
        if enabled:
            verdicts.append(check())
    return Assessment(tuple(verdicts), baseline if drift.enabled else None)


def action_of(spec: api.HealthSpec, signal: str) -> api.HealthAction:
    """The action `spec` asks for when `signal` starts."""
    specs: dict[str, api.HealthSignalSpec] = {
        NON_FINITE_LOSS: spec.non_finite_loss,
        LOSS_DIVERGING: spec.loss_divergence,
        GRAD_NORM_SPIKE: spec.grad_norm_spike,
        STEP_TIME_DRIFT: spec.step_time_drift,
        LOSS_STAGNATING: spec.loss_stagnation,
    }
    return specs[signal].action


# ------------------------------------------------------------------------------------------- rollback


def rollback_bound(since_step: int | None, steps_seen: Sequence[int], step: int | None) -> int:
    """The step a rollback restores at or before: the one before the last step the heartbeats showed
    normal before the anomaly (`sinceStep`).

    Heartbeats sample steps (one per interval), so the anomaly began somewhere after the last normal step
    seen, `p`, not necessarily at `sinceStep`; and the state after `p` steps already holds step `p`'s
    update, whose gradients the heartbeat did not judge: `p - 1` is the newest state known to be trained
    only from normal steps. Without an earlier sample, the step before `sinceStep`; without a `sinceStep`,
    the job's step."""
    if since_step is None:
        return max(step or 0, 0)
    before = [seen for seen in steps_seen if seen < since_step]
    return max((max(before) if before else since_step) - 1, 0)


@dataclass(frozen=True)
class RollbackDecision:
    """What a signal whose action is `Rollback` does when it starts."""

    action: Literal["Rollback", "Pause"]
    """`Pause` once the budget is spent."""
    event: str
    """The `HealthRollback` (or `HealthPause`) Event's message."""
    request: api.RollbackRequest | None = None
    """The request to the launchers (`status.rollback`), for `Rollback`."""
    record: api.HealthRollback | None = None
    """`status.health.lastRollback`, for `Rollback`."""


def decide_rollback(
    spec: api.HealthSpec,
    health_status: api.HealthStatus,
    previous: api.RollbackRequest | None,
    signal: api.HealthSignal,
    step: int | None,
    now: datetime,
    steps_seen: Sequence[int] = (),
) -> RollbackDecision:
    """A rollback for `signal` while the budget (`spec.rollback.maxRollbacks`) lasts, else a pause.
    `steps_seen`: the steps of the history the signal was judged on (see `rollback_bound`)."""
    budget = spec.rollback.max_rollbacks
    done = health_status.rollbacks or 0
    if done >= budget:
        return RollbackDecision(
            "Pause",
            f"suspending the job after {signal.reason}: its action is Rollback but the rollback budget is spent "
            f"({done} of {budget}); the workers save a checkpoint and stop; set spec.suspend "
            "to false to resume",
        )
    epoch = (previous.epoch if previous is not None else 0) + 1
    bound = rollback_bound(signal.since_step, steps_seen, step)
    reason = f"{signal.reason}: {signal.message}" if signal.message else signal.reason
    requested = format_micro_time(now)
    request = api.RollbackRequest(
        epoch=epoch,
        at_or_before_step=bound,
        skip_batches=spec.rollback.skip_batches,
        from_step=step,
        reason=reason[:256],
        requested_at=requested,
    )
    record = api.HealthRollback(
        epoch=epoch,
        signal=signal.reason,
        message=signal.message,
        requested_at=requested,
        from_step=step,
        at_or_before_step=bound,
    )
    began = (
        f"the heartbeats showed it from step {signal.since_step}"
        if signal.since_step is not None
        else "no start step known"
    )
    skip = spec.rollback.skip_batches
    skipping = (
        "; the batches the abandoned run trained on after that checkpoint are skipped"
        if skip == api.SKIP_SEEN
        else f"; {skip} batches are skipped after it"
        if skip
        else ""
    )
    at = f", the job was at step {step}" if step is not None else ""
    event = (
        f"rolling back after {signal.reason} (action Rollback, {done + 1} of {budget}): every "
        f"worker restarts from the newest checkpoint at or before step {bound} ({began}{at}){skipping}"
    )
    return RollbackDecision("Rollback", event, request, record)


@dataclass(frozen=True)
class RestoreReport:
    """A heartbeat's word on where its worker group restored from."""

    group_started: datetime | None
    restored_step: int | None
    restored_from: str | None


def rollback_outcome(
    record: api.HealthRollback, reports: list[RestoreReport], now: datetime
) -> tuple[api.HealthRollback, str, bool] | None:
    """Once a worker group started after the rollback was asked for reports its restore: the record with
    where it restored, the Event's message, and whether it is a warning (nothing at or before the bound
    existed: training started from scratch). None while no such report exists."""
    if record.restored_step is not None:
        return None
    asked = parse_time(record.requested_at)
    done = [
        report
        for report in reports
        if report.restored_step is not None
        and report.group_started is not None
        and (asked is None or report.group_started > asked)
    ]
    if not done:
        return None
    report = min(done, key=lambda report: report.restored_step or 0)
    step, source = report.restored_step, report.restored_from or "none"
    updated = record.model_copy(
        update={"restored_step": step, "restored_from": source, "resumed_at": format_micro_time(now)}
    )
    if step == 0 and source == "none" and record.at_or_before_step > 0:
        message = (
            f"rollback {record.epoch} after {record.signal}: no checkpoint at or before step "
            f"{record.at_or_before_step} was found in memory, at a peer or on disk: training started again "
            "from scratch (the abandoned run's checkpoints are under rolled-back/ in the checkpoint directory)"
        )
        return updated, message, True
    message = (
        f"rollback {record.epoch} after {record.signal}: the workers restored step {step} from {source} "
        f"(at or before step {record.at_or_before_step}; the job had reached step {record.from_step}) and "
        "train on"
    )
    return updated, message, False


def baseline_from_status(status: api.HealthStatus | None) -> Baseline | None:
    """The baseline a previous reconcile stored (so an operator restart keeps it)."""
    if status is None or status.baseline_step_seconds is None:
        return None
    first, _, last = (status.baseline_steps or "").partition("-")
    try:
        return Baseline(status.baseline_step_seconds, int(first), int(last))
    except ValueError:
        return Baseline(status.baseline_step_seconds, 0, 0)


# ------------------------------------------------------------------------------------------- monitor


@dataclass
class _Job:
    history: History = field(default_factory=History)
    spec: api.HealthSpec | None = None
    baseline: Baseline | None = None
    key: tuple[tuple[str, State], ...] | None = None
    since: datetime | None = None
    """Heartbeats of worker groups started before this moment are of a run a rollback abandoned."""


def abandoned_group(summary: dict[str, Any], since: datetime | None) -> bool:
    """Whether a heartbeat comes from a worker group started before `since` (a rollback's request): its
    figures describe the abandoned run. A heartbeat that does not say when its group started is taken."""
    if since is None:
        return False
    started = parse_time(summary.get("group-started"))
    return started is not None and started < since


class HealthMonitor:
    """Per-job histories fed by heartbeat events (thread-safe). `observe` says when a job's signals change
    state; the reconcile reads a copy (`snapshot`) and tells back what it decided with (`settle`)."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._lock = threading.Lock()
        self._max_samples = max_samples

    def _job(self, job: tuple[str, str]) -> _Job:
        return self._jobs.setdefault(job, _Job(history=History(max_samples=self._max_samples)))

    def observe(self, job: tuple[str, str], pod: str, summary: dict[str, Any]) -> bool:
        """Record a heartbeat of `pod`; True when it changed the state of one of the job's signals (judged
        with the spec and baseline of the job's last reconcile; before any, nothing is judged)."""
        sample = sample_from_lease(summary)
        if sample is None:
            return False
        with self._lock:
            entry = self._job(job)
            if abandoned_group(summary, entry.since):
                return False
            if not entry.history.add(pod, sample) or entry.spec is None:
                return False
            key = evaluate(entry.history, entry.spec, entry.baseline).key
            flipped = key != entry.key
            entry.key = key
            return flipped

    def snapshot(self, job: tuple[str, str]) -> History:
        with self._lock:
            return self._job(job).history.copy()

    def settle(
        self,
        job: tuple[str, str],
        spec: api.HealthSpec,
        assessment: Assessment,
        since: datetime | None = None,
    ) -> None:
        """Remember what the job's reconcile judged with, what it judged, and since when heartbeats count
        (the latest rollback's request: so an operator restart keeps ignoring the abandoned run)."""
        with self._lock:
            entry = self._job(job)
            entry.spec, entry.baseline, entry.key = spec, assessment.baseline, assessment.key
            entry.since = since

    def reset(self, job: tuple[str, str], since: datetime | None = None) -> None:
        """Start the job's history afresh (it was suspended, or rolled back: the run that goes on is judged
        on its own data); with `since`, heartbeats of worker groups started before it are ignored from now
        on (the run a rollback abandoned)."""
        with self._lock:
            entry = self._job(job) if since is not None else self._jobs.get(job)
            if entry is not None:
                entry.history = History(max_samples=self._max_samples)
                entry.key = None
                entry.since = since or entry.since

    def forget(self, job: tuple[str, str]) -> None:
        with self._lock:
            self._jobs.pop(job, None)
