"""Goodput under random failures: productive time over wall time, and where every lost second went.

One TrainingJob of the tiny GPT (2 workers, 1 spare, steps of about one second, a durable checkpoint
every `CHECKPOINT_INTERVAL` steps on a shared claim) trains for `seconds` while failures arrive at random,
a mean of `mean_gap` seconds apart (exponential gaps, drawn with a fixed seed): a killed worker, a frozen
pod, a stopped trainer (its training processes stopped, its launcher still renewing and reporting them,
kind `hang`), or a crashed node (one
that runs an active worker but neither the operator nor the job's rendezvous pod). A failure is injected
no sooner than the previous one was recovered from and the spare refilled, so each loss is one failure's.
The full run has two such windows, one after the other, each with a fresh job, its own twin and its own
seed: one draw of failures can be lucky, so each window is reported and the target holds for the worse.

An undisturbed twin of the job (same spec, no failure injected, on the operator's node so no node crash
reaches it) trains side by side over the same window: it is the baseline. On a shared machine the steps of
both slow down and speed up together, so their ratio, not either run's own figure, says what the failures
cost.

Goodput is computed four ways over the same window:
- against the undisturbed run (the target's figure): the steps the job gained over the steps its twin
  gained, i.e. productive time = steps gained x the twin's mean step time, over the wall time. Every lost
  second is attributed: per failure, the step in flight and the steps replayed, detection, replacement and
  rendezvous, restore (trainer restart and state load), the first step's overhead; between failures, how
  much slower (or faster) the job's steps ran than its twin's. The parts add up to the loss exactly;
- from the step log alone (rank 0's completed steps on the shared claim, this machine's clock): productive
  time = steps gained in the window x the job's own median step time, so between failures durable-checkpoint
  stalls (the excess time of steps that wrote one) and all other step-time variation count as lost too. The
  twin's figure by the same method shows how much of that the machine's noise alone costs;
- from the job's own figures: `status.recoverySeconds` gained in the window over the window (and
  `status.goodput`, which counts from the job's start);
- from the heartbeat Lease timeline: the steps the workers reported, same method as the step log.
"""

from __future__ import annotations

import math
import random
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx.bench import faults
from phalanx.bench.cluster import OPERATOR_NAMESPACE, BenchCluster, BenchError, wait_for
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target
from phalanx.bench.kubeobjects import node_of
from phalanx.worker.trainerwatch import STOP_CONFIRM_SECONDS

NAME = "goodput"
TITLE = "Goodput with a random failure every few minutes (kills, hangs, node crashes)"

REPLICAS = 2
SPARES = 1
STEP_DELAY = 0.9
"""With the tiny model's own compute, steps of about one second (the targets table's setting)."""
CHECKPOINT_INTERVAL = 50
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 3, "progressTimeoutSeconds": 10}
KINDS = ("kill", "freeze", "hang", "node-crash")
RECOVER_TIMEOUT = 300.0
NODE_DOWN_SECONDS = 30.0
"""How long a crashed node stays down (it comes back after the recovery, at the earliest)."""
SEEDS = (20240609, 20240610)
"""One window per seed: the full run draws its failures twice, from different seeds, and reports both."""

FAILURE_CATEGORIES = (
    "step in flight + replayed steps",
    "detection",
    "replacement + rendezvous",
    "restore (trainer restart, state load)",
    "first step overhead",
)
"""What one failure's interruption costs, stage by stage."""
CATEGORIES = (*FAILURE_CATEGORIES, "checkpoint stalls", "step-time variation", "other interruptions")
BETWEEN_FAILURES = "steps between failures vs the undisturbed run"
"""Against the twin: the time the job's steps between failures took beyond the twin's pace (negative: less)."""


@dataclass(frozen=True)
class Sizes:
    seconds: float
    mean_gap: float
    kinds: tuple[str, ...]
    quiet_tail: float
    """No failure is injected in the last seconds of the window, so every loss is seen through."""
    first_at: float | None = None
    """Seconds into the window of the first failure (None: drawn like the others)."""
    seeds: tuple[int, ...] = SEEDS[:1]
    """The seeds of the windows run one after the other, each with its own draw of failures."""


FULL = Sizes(seconds=1800, mean_gap=300, kinds=KINDS, quiet_tail=60, seeds=SEEDS)
QUICK = Sizes(seconds=40, mean_gap=300, kinds=("kill",), quiet_tail=20, first_at=10)


# ---------------------------------------------------------------------------------------------- analysis


@dataclass
class FailureTimes:
    """One injected failure and its recovery milestones (Unix times; None: not seen)."""

    kind: str
    victim: str
    injected: float
    detected: float | None = None
    group: float | None = None
    restored: float | None = None
    resumed: float | None = None
    cause: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Point:
    """A completed step at a moment."""

    time: float
    step: int


@dataclass
class Attribution:
    wall: float = 0.0
    productive: float = 0.0
    step_seconds: float = 0.0
    """The median step time (the productive time of one step)."""
    steps: int = 0
    """Steps gained over the window."""
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    per_failure: list[dict[str, float]] = field(default_factory=list)

    @property
    def goodput(self) -> float | None:
        return self.productive / self.wall if self.wall > 0 else None

    def against_pace(self) -> dict[str, float]:
        """The loss by failure stage, and the rest (between failures) as one part: what the loss means when
        the step time is another run's pace, whose own checkpoint stalls and variation are in that pace."""
        parts = {name: self.lost[name] for name in FAILURE_CATEGORIES}
        parts[BETWEEN_FAILURES] = sum(
            self.lost[name] for name in CATEGORIES if name not in FAILURE_CATEGORIES
        )
        return parts


def pace_of(points: list[Point]) -> float | None:
    """The mean seconds per step of an uninterrupted run (None: fewer than two steps apart)."""
    if len(points) < 2 or points[-1].step <= points[0].step:
        return None
    return (points[-1].time - points[0].time) / (points[-1].step - points[0].step)


def gap_of(points: list[Point], failure: FailureTimes) -> tuple[int, int] | None:
    """Indexes (i, j) of the points that bracket the interruption `failure` caused: i the last step completed
    before the injection, j the first step completed after the resume (after the injection when the resume
    is unknown).

    A step completed between the two is still progress (the step numbers count it), but its time is the
    failure's: a hung or frozen rank holds the step in flight until the operator acts on it, so that step
    completes only at the detection, and a heartbeat can report the restored step of the new group."""
    after = failure.resumed if failure.resumed is not None else failure.injected
    last = next((i for i in range(len(points) - 1, -1, -1) if points[i].time <= failure.injected), 0)
    first = next(
        (
            j
            for j in range(last + 1, len(points))
            if points[j].time > failure.injected and points[j].time >= after - 0.05
        ),
        None,
    )
    if first is None:
        return None
    return last, first


def _clamped(moments: list[float | None], low: float, high: float) -> list[float]:
    """The milestones in order, each inside [low, high] and not before the previous one (unknown ones
    take the previous value, so their stage counts as zero)."""
    result, floor = [], low
    for moment in moments:
        value = floor if moment is None else min(max(moment, floor), high)
        result.append(value)
        floor = value
    return result


def split_gap(a: Point, b: Point, failure: FailureTimes, step_seconds: float) -> dict[str, float]:
    """The seconds an interruption from step `a` to step `b` cost, by cause. With `r` the step restored
    (b.step - 1), the steps a.step - r are done twice: they cost their productive time again. The parts add
    up to (b.time - a.time) - step_seconds x (b.step - a.step), the interval's excess over its progress."""
    start, inject, detect, group, restore = _clamped(
        [a.time, failure.injected, failure.detected, failure.group, failure.restored], a.time, b.time
    )
    replayed = step_seconds * (a.step - (b.step - 1))
    return {
        "step in flight + replayed steps": (inject - start) + replayed,
        "detection": detect - inject,
        "replacement + rendezvous": group - detect,
        "restore (trainer restart, state load)": restore - group,
        "first step overhead": (b.time - restore) - step_seconds,
    }


def attribute(
    points: list[Point],
    failures: list[FailureTimes],
    checkpoint_interval: int | None,
    every_step: bool = True,
    pace: float | None = None,
) -> Attribution:
    """Productive and lost time over the span of `points` (completed steps in time order), the loss split
    by cause. `checkpoint_interval`: steps that wrote a durable checkpoint (None: not told apart).

    The productive time of a step is `pace` when given (an undisturbed run's mean step time), else the
    median step time when `points` has every step (the step log), else (samples, as the heartbeats are) the
    mean over the uninterrupted intervals."""
    result = Attribution()
    if len(points) < 3:
        return result
    spans: dict[int, tuple[int, FailureTimes]] = {}
    for failure in failures:
        found = gap_of(points, failure)
        if found is not None and found[0] not in spans:
            spans[found[0]] = (found[1], failure)
    intervals: list[tuple[Point, Point, FailureTimes | None]] = []
    index = 0
    while index < len(points) - 1:
        end, interrupted_by = spans.get(index, (index + 1, None))
        intervals.append((points[index], points[end], interrupted_by))
        index = end
    normal = [(p, q) for p, q, interrupted_by in intervals if interrupted_by is None and q.step > p.step]
    if not normal:
        return result
    if pace is not None:
        m = pace
    elif every_step:
        m = statistics.median((q.time - p.time) / (q.step - p.step) for p, q in normal)
    else:
        m = sum(q.time - p.time for p, q in normal) / sum(q.step - p.step for p, q in normal)
    result.step_seconds = m
    result.wall = points[-1].time - points[0].time
    result.steps = points[-1].step - points[0].step
    result.productive = result.steps * m
    for p, q, interrupted_by in intervals:
        if interrupted_by is not None:
            parts = split_gap(p, q, interrupted_by, m)
            for key, value in parts.items():
                result.lost[key] += value
            result.per_failure.append({"injected": interrupted_by.injected, **parts})
            continue
        excess = (q.time - p.time) - m * (q.step - p.step)
        if q.step <= p.step:
            result.lost["other interruptions"] += excess
        elif checkpoint_interval and q.step // checkpoint_interval > p.step // checkpoint_interval:
            result.lost["checkpoint stalls"] += excess
        else:
            result.lost["step-time variation"] += excess
    return result


def failure_incident(incidents: list[dict[str, Any]], failure: FailureTimes) -> dict[str, Any] | None:
    """The incident a failure caused: the victim's first one detected after the injection, else the first
    one of any worker (a hung trainer's healthy peer may be blamed; failures come one at a time)."""
    after = [
        incident
        for incident in incidents
        if (faults.parse_stamp(incident.get("detectedAt")) or 0.0) >= math.floor(failure.injected)
        and incident.get("action") in faults.RECOVERING_ACTIONS
    ]
    after.sort(key=lambda incident: incident.get("detectedAt") or "")
    mine = [incident for incident in after if incident.get("worker") == failure.victim]
    found = mine or after
    return found[0] if found else None


def log_points(log: faults.StepLog, start: float, end: float) -> list[Point]:
    return [Point(line.time, line.step) for line in log.steps if start <= line.time <= end]


def lease_points(timeline: list[faults.LeaseSeen], start: float, end: float) -> list[Point]:
    """The job's step as the heartbeats told it: each new step reported by an active worker, at its
    Lease's renewal time."""
    points: list[Point] = []
    for item in sorted(timeline, key=lambda beat: beat.renewed or beat.seen):
        moment = item.renewed or item.seen
        step = item.step
        if (
            item.deleted
            or step is None
            or item.phase not in ("training", "saving")
            or not start <= moment <= end
        ):
            continue
        if points and step == points[-1].step:
            continue
        points.append(Point(moment, step))
    return points


def failure_schedule(rng: random.Random, sizes: Sizes) -> list[tuple[float, str]]:
    """(seconds into the window, kind) of the failures: exponential gaps of mean `mean_gap`."""
    found: list[tuple[float, str]] = []
    moment = sizes.first_at if sizes.first_at is not None else rng.expovariate(1 / sizes.mean_gap)
    while moment < sizes.seconds - sizes.quiet_tail:
        found.append((moment, rng.choice(sizes.kinds)))
        moment += rng.expovariate(1 / sizes.mean_gap)
    return found


def spikes(moments: list[float], low: float, high: float) -> tuple[list[float], list[float]]:
    """A line that runs along `low` and rises to `high` at each moment (failure marks on a line plot)."""
    xs: list[float] = []
    ys: list[float] = []
    for moment in sorted(moments):
        xs += [moment, moment, moment]
        ys += [low, high, low]
    return xs, ys


# ---------------------------------------------------------------------------------------------- running


def goodput_job(name: str, node: str | None = None) -> dict[str, Any]:
    """The benchmark's TrainingJob (on `node` only, when given)."""
    job = faults.endless_job(
        name,
        replicas=REPLICAS,
        checkpoint_interval=CHECKPOINT_INTERVAL,
        spares=SPARES,
        step_delay=STEP_DELAY,
        heartbeat=HEARTBEAT,
    )
    if node is not None:
        job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return job


class GoodputRun:
    def __init__(self, cluster: BenchCluster, log: Any) -> None:
        self.cluster = cluster
        self.run = faults.TrainingRun(cluster, "bench-goodput", goodput_job("goodput"))
        self.twin = faults.TrainingRun(
            cluster, "bench-goodput-twin", goodput_job("undisturbed", self.operator_node())
        )
        """The undisturbed twin: no failure is injected into it, and it runs where no node crash reaches."""
        self.log = log
        self.notes: list[str] = []
        self.stuck: dict[str, Any] = {}
        """What the job looked like when it never got steady again (empty: it always did)."""

    def operator_node(self) -> str | None:
        from kubernetes import client

        core = client.CoreV1Api(self.cluster.api)
        return next((node_of(pod) for pod in core.list_namespaced_pod(OPERATOR_NAMESPACE).items), None)

    def protected_nodes(self) -> set[str]:
        """Nodes whose crash would take down more than a worker: the operator's, the rendezvous pod's and the
        undisturbed twin's."""
        from kubernetes import client

        core = client.CoreV1Api(self.cluster.api)
        nodes = {node_of(pod) for pod in core.list_namespaced_pod(OPERATOR_NAMESPACE).items}
        rendezvous = core.list_namespaced_pod(
            self.run.namespace, label_selector="phalanx.dev/role=rendezvous"
        )
        nodes |= {node_of(pod) for pod in rendezvous.items}
        nodes |= {node_of(pod) for pod in self.twin.pods()}
        return {node for node in nodes if node}

    def inject(self, kind: str, rng: random.Random) -> tuple[FailureTimes, Any]:
        """Inject one failure into a random active worker; returns it and what undoes it (or None)."""
        run = self.run
        workers = run.wait_steady(timeout=RECOVER_TIMEOUT)
        victim = rng.choice(workers)
        if kind == "node-crash":
            protected = self.protected_nodes()
            candidates = [w for w in workers if w.node and w.node not in protected]
            if not candidates:
                self.notes.append("a node crash fell back to a kill: every worker shared a node with the "
                                  "operator or the rendezvous pod")  # fmt: skip
                kind = "kill"
            else:
                victim = rng.choice(candidates)
        if kind == "hang":
            moment, pids = faults.hang_trainer(run.namespace, victim.pod)
            if pids:
                return FailureTimes(kind, victim.pod, moment), lambda: faults.signal_all(pids, signal.SIGCONT)
            self.notes.append(f"a hang fell back to a kill: no training process of {victim.pod} was found")
            kind = "kill"
        if kind == "kill":
            return FailureTimes(
                kind, victim.pod, faults.kill_pod(run.cluster, run.namespace, victim.pod)
            ), None
        if kind == "freeze":
            return FailureTimes(
                kind, victim.pod, faults.freeze_pod(run.cluster, run.namespace, victim.pod)
            ), None
        node = victim.node or ""
        on_node = [(run.namespace, pod.metadata.name) for pod in run.pods() if pod.spec.node_name == node]
        moment = faults.crash_node(run.cluster, node, pods=on_node)
        failure = FailureTimes(kind, victim.pod, moment, note=f"node {node}")
        return failure, lambda: faults.crash_node(run.cluster, node, crashed=False)

    def follow(self, failure: FailureTimes, undo: Any) -> None:
        """Wait for the recovery from `failure` and fill its milestones."""
        run = self.run
        try:
            wait_for(lambda: run.resumed_after(failure.injected), RECOVER_TIMEOUT, message="the recovery")
        except BenchError as error:
            failure.note += f" no recovery: {error}"
        finally:
            if undo is not None:
                if failure.kind == "node-crash":
                    time.sleep(max(0.0, failure.injected + NODE_DOWN_SECONDS - time.time()))
                undo()
        incident = failure_incident(run.status().get("incidents") or [], failure)
        if incident is not None:
            key = (incident.get("podUid"), incident.get("cause"), incident.get("detectedAt"))
            seen, _ = run.incident(lambda i: (i.get("podUid"), i.get("cause"), i.get("detectedAt")) == key)
            failure.cause = incident.get("cause")
            failure.detected = faults.detection_moment(incident.get("detectedAt"), seen)
        timeline = run.timeline()
        starts = faults.group_starts(timeline, failure.injected)
        resumed = faults.resumed_times(timeline, starts)
        failure.group = max(starts.values()) if starts else None
        failure.resumed = max(resumed.values()) if resumed else None
        log = run.step_log()
        restores = [
            line
            for line in log.restores
            if failure.group is not None and failure.group <= line.time <= (failure.resumed or math.inf)
        ]
        failure.restored = max((line.time for line in restores), default=None)


def run(context: Any, quick: bool) -> BenchResult:
    sizes = QUICK if quick else FULL
    return merge_runs([run_window(context, sizes, seed) for seed in sizes.seeds])


def run_window(context: Any, sizes: Sizes, seed: int) -> BenchResult:
    """One window: the job and its twin started afresh, failures drawn from `seed`."""
    cluster = context.cluster()
    operator = cluster.ensure_operator()
    rng = random.Random(seed)
    schedule = failure_schedule(rng, sizes)
    goodput = GoodputRun(cluster, context.log)
    failures: list[FailureTimes] = []
    run_, twin = goodput.run, goodput.twin
    try:
        twin.start()
        run_.start()
        twin.wait_steady(min_step=5)
        run_.wait_steady(min_step=5)
        start = time.time()
        status_start = run_.status()
        twin_status_start = twin.status()
        context.log(f"goodput: {sizes.seconds:.0f} s window, seed {seed}, {len(schedule)} failures scheduled")
        for offset, kind in schedule:
            time.sleep(max(0.0, start + offset - time.time()))
            if time.time() > start + sizes.seconds - sizes.quiet_tail:
                goodput.notes.append(f"a {kind} scheduled at {offset:.0f} s was skipped: recoveries ran late")
                continue
            try:
                failure, undo = goodput.inject(kind, rng)
            except BenchError as error:  # the job never got steady again: the window ends here
                goodput.notes.append(f"Stopped early: a {kind} could not be injected: {error}")
                goodput.stuck = run_.diagnose()
                break
            goodput.follow(failure, undo)
            failures.append(failure)
            context.log(
                f"goodput: {failure.kind} of {failure.victim} at {failure.injected - start:.0f} s "
                f"({failure.cause}), resumed after "
                + (f"{failure.resumed - failure.injected:.1f} s" if failure.resumed else "-")
            )
        if not goodput.stuck:
            time.sleep(max(0.0, start + sizes.seconds - time.time()))
        end = time.time()
        status_end = run_.status()
        log = run_.step_log()
        timeline = run_.timeline()
        twin_log = twin.step_log()
        twin_restarts = restarts_between(twin_status_start, twin.status())
    finally:
        run_.close()
        twin.close()
    if twin_restarts:
        goodput.notes.append(
            f"The undisturbed twin itself restarted {twin_restarts} times in the window: its pace is not "
            "an undisturbed one, so the figures against it understate the job's goodput."
        )
    result = result_of(sizes, start, end, failures, log, timeline, status_start, status_end, goodput.notes,
                       run_.job["spec"], operator.reconcile_interval, twin_log)  # fmt: skip
    result.details["seed"] = seed
    result.notes.insert(0, f"Failures drawn from seed {seed}.")
    if goodput.stuck:
        result.details["stuck"] = goodput.stuck
    return result


def merge_runs(runs: list[BenchResult]) -> BenchResult:
    """The windows as one result: each metric holds one sample per window (a target judged on the worst
    window), each note and detail says which window (seed, failures drawn) it belongs to."""
    if len(runs) == 1:
        return runs[0]
    merged = runs[0].model_copy(deep=True)
    by_name = {metric.name: metric for metric in merged.metrics}
    labels = [f"window {index} (seed {run.details['seed']})" for index, run in enumerate(runs, 1)]
    whys: dict[str, list[str]] = {name: [] for name in by_name}
    for label, run in zip(labels, runs, strict=True):
        for metric in run.metrics:
            if metric.why_missed and metric.verdict().met is False:
                whys[metric.name].append(f"{label}: {metric.why_missed}")
    for run in runs[1:]:
        for metric in run.metrics:
            by_name[metric.name].samples.extend(metric.samples)
    for name, metric in by_name.items():
        metric.why_missed = "; ".join(whys[name])
    merged.notes = [
        f"{len(runs)} windows, one after the other, each with a fresh job and twin and its own draw: "
        + ", ".join(
            f"{label}: {run.metric('failures drawn').summary().max or 0:.0f} failures drawn"
            for label, run in zip(labels, runs, strict=True)
        )
        + ". Every metric holds one sample per window; a target is judged on the worse window."
    ]
    merged.notes += [
        f"{label}: {note}" for label, run in zip(labels, runs, strict=True) for note in run.notes
    ]
    merged.series = [
        series.model_copy(update={"name": f"{series.name}, {label}"})
        for label, run in zip(labels, runs, strict=True)
        for series in run.series
    ]
    merged.details = {"windows": [run.details for run in runs]}
    return merged


def loss_reason(
    parts: dict[str, float], kinds: list[str], window: float, mean_gap: float, heartbeat: dict[str, Any]
) -> str:
    """Why the goodput is what it is: the largest parts of the loss, and the detection floor that the
    configured timeouts set for the failures the random draw brought."""
    lost = sum(parts.values())
    if lost <= 0:
        return ""
    largest = sorted(parts.items(), key=lambda item: -item[1])[:2]
    share = ", ".join(f"{name} {value:.1f} s" for name, value in largest)
    hangs = kinds.count("hang")
    silent = kinds.count("freeze") + kinds.count("node-crash")
    floor = hangs * STOP_CONFIRM_SECONDS + silent * float(heartbeat["timeoutSeconds"])
    expected = window / mean_gap if mean_gap > 0 else 0.0
    return (
        f"{lost:.1f} s were lost, most of it {share}; the random draw brought {len(kinds)} failures "
        f"({expected:.0f} expected), and a failure is seen only when its threshold runs out: {hangs} stopped "
        f"trainers after their launcher's {STOP_CONFIRM_SECONDS:g} s confirmation, {silent} frozen pods or "
        f"crashed nodes after the heartbeat timeout ({heartbeat['timeoutSeconds']} s), {floor:.0f} s "
        f"({100 * floor / window:.1f}% of the window) before any recovery could start; a shorter heartbeat "
        "timeout lowers that floor"
    )


def percent(fraction: float | None) -> list[float]:
    """A fraction as the one sample of a percent metric (none when unknown)."""
    return [] if fraction is None else [round(100 * float(fraction), 2)]


def restarts_between(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Failures a job counted between two of its statuses."""
    total = [int((status.get("restarts") or {}).get("total") or 0) for status in (before, after)]
    return total[1] - total[0]


def result_of(
    sizes: Sizes,
    start: float,
    end: float,
    failures: list[FailureTimes],
    log: faults.StepLog,
    timeline: list[faults.LeaseSeen],
    status_start: dict[str, Any],
    status_end: dict[str, Any],
    extra_notes: list[str],
    spec: dict[str, Any],
    reconcile: float,
    twin_log: faults.StepLog,
) -> BenchResult:
    points = log_points(log, start, end)
    twin_points = log_points(twin_log, start, end)
    pace = pace_of(twin_points)
    by_log = attribute(points, failures, CHECKPOINT_INTERVAL)
    by_twin = attribute(points, failures, CHECKPOINT_INTERVAL, pace=pace) if pace else Attribution()
    twin_alone = attribute(twin_points, [], CHECKPOINT_INTERVAL)
    by_lease = attribute(lease_points(timeline, start, end), failures, None, every_step=False)
    recovery = float(status_end.get("recoverySeconds") or 0.0) - float(
        status_start.get("recoverySeconds") or 0.0
    )
    window = end - start
    job_window = 1.0 - recovery / window if window > 0 else None
    target = Target(
        op=">=",
        value=98.5,
        stat="min",
        text="goodput >= 98.5% with a failure every 5 min, ~1 s steps, in each of two windows",
    )
    baseline = Baseline(text="DLRover 95%, HyperPod up to 95%, Llama 3 > 90%", value=95)
    noise = (
        f"the undisturbed twin, training side by side with no failure, scores {100 * twin_alone.goodput:.1f}% by "
        "this method: between failures it counts every step slower than the median as lost, and on this "
        "shared machine that is noise (and checkpoint stalls) the twin pays as well; the figure against the "
        "twin takes that out"
        if twin_alone.goodput is not None
        else ""
    )
    metrics = [
        Metric(
            name="goodput vs the undisturbed run",
            unit="%",
            samples=percent(by_twin.goodput),
            description="steps gained / the undisturbed twin's steps gained in the same window (steps gained x "
            "the twin's mean step time / wall time)",
            target=target,
            baseline=baseline,
            why_missed=loss_reason(
                by_twin.against_pace(), [f.kind for f in failures], window, sizes.mean_gap, HEARTBEAT
            ),
        ),
        Metric(
            name="goodput (step log)",
            unit="%",
            samples=percent(by_log.goodput),
            description="steps gained x the job's own median step time / wall time (rank 0's step log)",
            target=target,
            why_missed=noise,
        ),
        Metric(
            name="undisturbed twin: goodput (step log)",
            unit="%",
            samples=percent(twin_alone.goodput),
            description="the same method on the twin, which no failure touched: what noise and checkpoint "
            "stalls alone cost by it",
        ),
        Metric(
            name="goodput (job status, window)",
            unit="%",
            samples=percent(job_window),
            description="1 - status.recoverySeconds gained in the window / the window",
            target=target,
        ),
        Metric(
            name="goodput (job status, since start)",
            unit="%",
            samples=percent(status_end.get("goodput")),
            description="status.goodput at the end (counted by the operator from the job's start)",
        ),
        Metric(
            name="goodput (Lease timeline)",
            unit="%",
            samples=percent(by_lease.goodput),
            description="the same method on the steps the heartbeats reported",
        ),
        Metric(
            name="failures drawn",
            unit="count",
            samples=[float(len(failures))],
            description=f"failures injected in the window ({sizes.seconds / sizes.mean_gap:.0f} expected)",
        ),
        Metric(
            name="failure -> first step",
            unit="s",
            samples=[round(f.resumed - f.injected, 3) for f in failures if f.resumed is not None],
            description="each failure's injection -> the first step of the group formed after it",
        ),
    ]
    for category, seconds in by_twin.against_pace().items():
        metrics.append(
            Metric(
                name=f"lost: {category}",
                unit="s",
                samples=[round(seconds, 2)],
                description="seconds of the window lost to this cause, at the undisturbed twin's pace",
            )
        )
    for category in CATEGORIES:
        metrics.append(
            Metric(
                name=f"lost (step log): {category}",
                unit="s",
                samples=[round(by_log.lost[category], 2)],
                description="seconds of the window lost to this cause, at the job's own median step time",
            )
        )
    series = loss_series(log, start, end, failures) + progress_series(points, twin_points, start)
    notes = [
        f"One TrainingJob of the tiny GPT ({REPLICAS} workers + {SPARES} spare, {STEP_DELAY} s sleep per step, "
        f"median step {by_log.step_seconds:.2f} s), a durable checkpoint every {CHECKPOINT_INTERVAL} steps on a "
        f"shared claim; window {window:.0f} s, {len(failures)} failures ("
        + ", ".join(f"{f.kind} at {f.injected - start:.0f} s" for f in failures)
        + f"), drawn with mean gap {sizes.mean_gap:.0f} s and injected only once the previous recovery ended.",
        f"Against the undisturbed twin: it gained {twin_alone.steps} steps in the window at "
        f"{pace or 0:.3f} s per step, the job {by_twin.steps}; productive {by_twin.productive:.0f} s of "
        f"{by_twin.wall:.0f} s, lost {by_twin.wall - by_twin.productive:.1f} s = "
        + " + ".join(
            f"{value:.1f} ({name})" for name, value in by_twin.against_pace().items() if abs(value) >= 0.05
        )
        + ". The twin runs on the operator's node, which no node crash strikes; it shares this machine's "
        "cores with the job, so the CPU a recovery takes (a new pod's imports) slows both.",
        f"Step log: {by_log.steps} steps gained, productive {by_log.productive:.0f} s of {by_log.wall:.0f} s, "
        f"lost {by_log.wall - by_log.productive:.1f} s = "
        + " + ".join(f"{value:.1f} ({name})" for name, value in by_log.lost.items() if abs(value) >= 0.05)
        + ".",
        f"Job status: recoverySeconds +{recovery:.1f} s in the window; the operator counts a recovery from the "
        "failure to the first step after it, not the replayed steps nor checkpoint stalls.",
        "Clocks: every time here (injections, Lease stamps, the step log) is this machine's clock.",
        *extra_notes,
    ]
    for failure in failures:
        if failure.note.strip():
            notes.append(f"{failure.kind} of {failure.victim}: {failure.note.strip()}")
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics,
        timeouts=faults.timeouts_in_force(spec, reconcile),
        notes=notes,
        series=series,
        details={
            "failures": [asdict(f) for f in failures],
            "per_failure_loss": by_log.per_failure,
            "lost_seconds": by_log.lost,
            "lost_seconds_vs_twin": by_twin.against_pace(),
            "twin": {"steps": twin_alone.steps, "pace": pace, "lost_seconds": twin_alone.lost},
            "lease_timeline": {"productive": by_lease.productive, "wall": by_lease.wall},
            "status_end": {key: status_end.get(key) for key in ("goodput", "recoverySeconds", "restarts")},
        },
    )


def loss_series(log: faults.StepLog, start: float, end: float, failures: list[FailureTimes]) -> list[Series]:
    lines = [line for line in log.steps if start <= line.time <= end and math.isfinite(line.loss)]
    if not lines:
        return []
    chart = "training loss (failures marked)"
    series = [
        Series(
            name="loss",
            x=[round(line.time - start, 2) for line in lines],
            y=[round(line.loss, 4) for line in lines],
            x_label="seconds",
            y_label="loss",
            chart=chart,
        )
    ]
    low, high = min(line.loss for line in lines), max(line.loss for line in lines)
    for kind in sorted({f.kind for f in failures}):
        xs, ys = spikes([f.injected - start for f in failures if f.kind == kind], low, high)
        series.append(Series(name=kind, x=xs, y=ys, x_label="seconds", y_label="loss", chart=chart))
    return series


def progress_series(points: list[Point], twin_points: list[Point], start: float) -> list[Series]:
    """Steps gained over the window by the job and by its undisturbed twin, on one chart."""
    chart = "steps gained (job vs undisturbed twin)"
    series = []
    for name, run_points in (("job", points), ("undisturbed twin", twin_points)):
        if run_points:
            first = run_points[0].step
            series.append(
                Series(
                    name=name,
                    x=[round(point.time - start, 2) for point in run_points],
                    y=[point.step - first for point in run_points],
                    x_label="seconds",
                    y_label="steps gained",
                    chart=chart,
                )
            )
    return series
