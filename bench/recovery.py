"""Recovery from a killed worker: time from the kill to the first completed step after resume, by stage.

Four variants run in the same benchmark, each as one long TrainingJob of the tiny GPT (2 active workers,
`minReplicas` = 2 so training never goes on short-handed) killed again and again, one SIGKILL per trial:

- `hot-spare`: one spare pod, already running and standing by in the rendezvous (the operator refills it
  after each promotion, before the next trial);
- `hot-spare-rounds`: the same, with the rendezvous rounds decided in the store (`rendezvous.protocol: rounds`,
  worker/storerounds.py) instead of torch's c10d rendezvous;
- `new-pod`: no spare: the operator creates a replacement pod and the survivors wait for it;
- `restart-job`: what other operators do: a failure-policy rule sends the kill (exit code 137) to
  `RestartJob`, so every pod is deleted and recreated and training restarts from the last durable
  checkpoint. The steps replayed since that checkpoint count as lost.

Every variant writes durable checkpoints every `CHECKPOINT_INTERVAL` steps to a PersistentVolumeClaim that
all its pods share (a host folder here), so only the recovery path differs. Between trials the benchmark
waits until the job is steady again (every worker training in one group, the spare standing by, no open
incident). Each trial records, on this machine's clock (the pods are local processes):

    kill ─ detect ─ replace ─ trainer start-up ─ state load ─ first step
         (detectedAt) (new group's  (its processes   (load      (resumed-at)
                      group-started) started, torch  seconds)
                                      imported, group
                                      joined)

plus `rendezvous` (from the moment the survivors left training to the new group's start, which overlaps
`replace`), the steps lost, where the state came from, and the operator's own `secondsToRecover`.
Stages come from the heartbeat Leases (`group-started`, `resumed-at`, `phase-since`), the incident in the
job's status, and the tiny GPT's step log (on the shared claim: each rank's restore time and load seconds,
rank 0's completed steps), which is also the ground truth for steps lost.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx.bench import faults
from phalanx.bench.cluster import BenchCluster, BenchError, wait_for
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Versus

NAME = "recovery"
TITLE = "Worker killed -> training resumed (hot spare, new pod, restart from a durable checkpoint)"

REPLICAS = 2
STEP_DELAY = 0.25
CHECKPOINT_INTERVAL = 20
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 5, "progressTimeoutSeconds": 10}
SETTLE_STEPS = 5
"""Steps every worker must complete after a recovery before the next kill."""
STEADY_TIMEOUT = 300.0
TRIAL_TIMEOUT = 240.0
FULL_TRIALS = 20
QUICK_TRIALS = 1
SEED = 20240607
STAGES = ("detect", "replace", "rendezvous", "trainer start-up", "state load", "first step")
REPLACEMENTS_PER_HOUR = 100
"""The operator's `replacements.freePerHour` and `maxPerHour` for this benchmark: it kills a job's pods 20 times
within minutes, and the default pacing (10 replacements an hour at once, then a doubling back-off, against a
crash loop) would measure the back-off, not the recovery."""
SLOW_FACTOR = 1.5
"""A trial slower than this multiple of its variant's median (and 3 s more) is analysed as a stall."""


@dataclass(frozen=True)
class Variant:
    name: str
    title: str
    spares: int
    restart_job: bool = False
    protocol: str = "c10d"
    """The job's `rendezvous.protocol`."""


VARIANTS = (
    Variant("hot-spare", "hot spare (spares=1)", spares=1),
    Variant("new-pod", "no spare: a new pod replaces the worker (spares=0)", spares=0),
    Variant(
        "restart-job", "baseline: RestartJob, resume from the durable checkpoint", spares=0, restart_job=True
    ),
    Variant(
        "hot-spare-rounds",
        "hot spare, rounds decided in the store (rendezvous.protocol=rounds)",
        spares=1,
        protocol="rounds",
    ),
)
RESTART_RULE = {
    "name": "restart-on-kill",
    "match": {"exitCodes": [137]},
    "action": "RestartJob",
    "countsTowardMaxRestarts": False,
}


# ---------------------------------------------------------------------------------------------- analysis


@dataclass
class Trial:
    """One kill and what followed; seconds relative to the kill unless said otherwise (None: not seen)."""

    variant: str
    number: int
    victim: str
    victim_rank: int | None
    kill: float
    """Unix time right before the kill request."""
    detect: float | None = None
    replace: float | None = None
    rendezvous: float | None = None
    startup: float | None = None
    load: float | None = None
    first_step: float | None = None
    total: float | None = None
    steps_lost: int | None = None
    """The incident's `stepsLost` (operator)."""
    steps_lost_log: int | None = None
    """Highest step completed before the restore minus the step restored (step log)."""
    steps_since_periodic: int | None = None
    """Steps completed since the last periodic durable checkpoint: what a resume from it replays (an
    emergency save on SIGTERM can make the real loss smaller)."""
    restored_step: int | None = None
    restore_sources: list[str] = field(default_factory=list)
    operator_seconds: float | None = None
    """The incident's `secondsToRecover` (measured by the operator from `occurredAt`)."""
    kill_delivered: float | None = None
    """The incident's `occurredAt` (the container's finish) after the kill request."""
    milestones: dict[str, float | None] = field(default_factory=dict)
    """Seconds after the kill: detected, survivors left, group started, restored, resumed."""
    error: str | None = None
    launcher_lines: list[str] = field(default_factory=list)

    def stage(self, name: str) -> float | None:
        return {
            "detect": self.detect,
            "replace": self.replace,
            "rendezvous": self.rendezvous,
            "trainer start-up": self.startup,
            "state load": self.load,
            "first step": self.first_step,
        }[name]


def restores_between(log: faults.StepLog, start: float, end: float) -> list[faults.RestoreLine]:
    return [line for line in log.restores if start <= line.time <= end]


def analyse(
    trial: Trial,
    timeline: list[faults.LeaseSeen],
    survivors: list[str],
    incident: dict[str, Any] | None,
    incident_seen: float | None,
    log: faults.StepLog,
    group_size: int,
    checkpoint_interval: int = CHECKPOINT_INTERVAL,
) -> Trial:
    """Fill the trial's stages from what was recorded (pure)."""
    kill = trial.kill
    incident = incident or {}
    detected = faults.detection_moment(incident.get("detectedAt"), incident_seen)
    occurred = faults.parse_stamp(incident.get("occurredAt"))
    starts = faults.group_starts(timeline, kill)
    if len(starts) < group_size:
        trial.error = trial.error or f"only {len(starts)} of {group_size} workers showed a new group"
    group = max(starts.values()) if starts else None
    resumed_by_pod = faults.resumed_times(timeline, starts)
    resumed = max(resumed_by_pod.values()) if len(resumed_by_pod) >= min(group_size, len(starts)) else None
    left = faults.left_training(timeline, survivors, kill)
    restores = restores_between(log, min(starts.values()), resumed) if starts and resumed else []
    restored: float | None
    if restores:
        restored = max(line.time for line in restores)
        load = max(line.seconds for line in restores)
    else:
        since = faults.training_since(timeline, starts)
        restored = max(since.values()) if since else None
        load = None
    trial.detect = _minus(detected, kill)
    trial.replace = _minus(group, detected)
    trial.rendezvous = _minus(group, left)
    trial.startup = _minus(None if restored is None else restored - (load or 0.0), group)
    trial.load = load
    trial.first_step = _minus(resumed, restored)
    trial.total = _minus(resumed, kill)
    trial.kill_delivered = _minus(occurred, kill)
    trial.operator_seconds = incident.get("secondsToRecover")
    trial.steps_lost = incident.get("stepsLost")
    trial.restored_step = incident.get("restoredStep")
    if restores:
        trial.restored_step = min(line.step for line in restores)
        trial.restore_sources = sorted({line.source for line in restores})
    elif incident.get("restoredFrom"):
        trial.restore_sources = [str(incident["restoredFrom"])]
    # The old group's last steps: logged after its own restore, before the kill took it down.
    reached = faults.highest_step_before(log, min(starts.values())) if starts else None
    if reached is not None and trial.restored_step is not None:
        trial.steps_lost_log = max(reached - trial.restored_step, 0)
    if reached is not None:
        trial.steps_since_periodic = reached % checkpoint_interval
    trial.milestones = {
        "detected": _minus(detected, kill),
        "survivors left training": _minus(left, kill),
        "group started": _minus(group, kill),
        "state restored": _minus(restored, kill),
        "first step": _minus(resumed, kill),
    }
    return trial


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def values(trials: list[Trial], name: str) -> list[float]:
    return [v for t in trials if t.error is None and (v := getattr(t, name)) is not None]


def stage_values(trials: list[Trial], stage: str) -> list[float]:
    return [v for t in trials if t.error is None and (v := t.stage(stage)) is not None]


def stalls(trials: list[Trial]) -> list[str]:
    """Trials much slower than their variant's median, each with the stage that holds the excess."""
    totals = values(trials, "total")
    if len(totals) < 3:
        return []
    median = statistics.median(totals)
    medians = {stage: statistics.median(stage_values(trials, stage) or [0.0]) for stage in STAGES}
    found = []
    for trial in trials:
        if trial.error is not None or trial.total is None:
            continue
        if trial.total < max(median * SLOW_FACTOR, median + 3.0):
            continue
        excess = {
            stage: value - medians[stage]
            for stage in STAGES
            if stage != "rendezvous" and (value := trial.stage(stage)) is not None
        }
        worst = max(excess, key=lambda stage: excess[stage]) if excess else "unknown"
        found.append(
            f"{trial.variant} trial {trial.number} (victim {trial.victim}, rank {trial.victim_rank}): "
            f"{trial.total:.1f} s vs median {median:.1f} s; the excess is in {worst} "
            f"({trial.stage(worst) if worst != 'unknown' else 0:.1f} s vs median {medians.get(worst, 0.0):.1f} s)"
        )
    return found


def metrics_for(variant: Variant, trials: list[Trial]) -> list[Metric]:
    name = variant.name
    spare = variant.name in ("hot-spare", "hot-spare-rounds")
    replaced = variant.name in ("hot-spare", "hot-spare-rounds", "new-pod")
    total_target = {
        "hot-spare": Target(op="<=", value=2, stat="p50", text="p50 <= 2 s with a hot spare"),
        "hot-spare-rounds": Target(op="<=", value=2, stat="p50", text="p50 <= 2 s with a hot spare"),
        "new-pod": Target(op="<=", value=5, stat="p50", text="p50 <= 5 s with a new pod (no spare)"),
    }.get(name)
    # The restart-everything baseline is a peer of its own, and the rounds protocol is measured against torch's
    # c10d: the report sets each beside the hot spare.
    peer = variant.restart_job or variant.protocol != "c10d"
    total = Metric(
        name=f"{name}: kill -> first step",
        unit="s",
        samples=values(trials, "total"),
        description=f"{variant.title}: kill request to the end of the first step after the resume",
        target=total_target,
        baseline=Baseline(text="HyperPod < 2 min; DLRover ~2 min pod relaunch; Ray+torchft ~5 s", value=5.0),
        versus=Versus(benchmark=NAME, metric="hot-spare: kill -> first step") if peer else None,
    )
    found = [total]
    if spare:
        found.append(
            total.model_copy(
                update={
                    "name": f"{name}: kill -> first step (p99)",
                    "target": Target(op="<=", value=5, stat="p99", text="p99 <= 5 s with a hot spare"),
                    "baseline": None,
                }
            )
        )
    descriptions = {
        "detect": "kill -> incident detectedAt (bounded by the end of its second and by when it was seen)",
        "replace": "detection -> the new worker group's group-started (promotion or new pod, rendezvous)",
        "rendezvous": "survivors left training -> the new group's group-started (overlaps replace)",
        "trainer start-up": (
            "group-started -> restore begins: survivors' training processes join the new process group "
            "(live regroup: kept), a spare's or a new pod's start (torch imported beforehand)"
        ),
        "state load": "seconds the restore itself took (slowest rank, step log)",
        "first step": "restore done -> the first step after it completed (resumed-at)",
    }
    for stage in STAGES:
        found.append(
            Metric(
                name=f"{name}: {stage}",
                unit="s",
                samples=stage_values(trials, stage),
                description=descriptions[stage],
            )
        )
    found.append(
        Metric(
            name=f"{name}: steps lost",
            unit="count",
            samples=[float(v) for v in values(trials, "steps_lost_log")],
            description="highest step completed before the restore - restored step (replayed steps)",
            target=Target(op="<=", value=0, stat="max", text="0 steps lost") if replaced else None,
            versus=Versus(benchmark=NAME, metric="hot-spare: steps lost", stat="max") if peer else None,
        )
    )
    found.append(
        Metric(
            name=f"{name}: operator secondsToRecover",
            unit="s",
            samples=values(trials, "operator_seconds"),
            description="the incident's own secondsToRecover (from occurredAt to resumedAt)",
        )
    )
    return found


def milestone_series(variant: Variant, trials: list[Trial]) -> list[Series]:
    """Per trial, seconds from the kill to each milestone (one chart per variant)."""
    done = [trial for trial in trials if trial.error is None]
    names = ("detected", "group started", "state restored", "first step")
    series = []
    for milestone in names:
        points = [(t.number, seconds) for t in done if (seconds := t.milestones.get(milestone)) is not None]
        if points:
            series.append(
                Series(
                    name=milestone,
                    x=[float(x) for x, _ in points],
                    y=[float(y) for _, y in points],
                    x_label="trial",
                    y_label="s after the kill",
                    chart=f"{variant.name}: milestones per trial",
                )
            )
    return series


# ---------------------------------------------------------------------------------------------- running


class RunningJob:
    """One variant's TrainingJob (`faults.TrainingRun`) and its trials."""

    def __init__(self, cluster: BenchCluster, variant: Variant) -> None:
        self.variant = variant
        job = faults.endless_job(
            "rec",
            replicas=REPLICAS,
            checkpoint_interval=CHECKPOINT_INTERVAL,
            spares=variant.spares,
            step_delay=STEP_DELAY,
            heartbeat=HEARTBEAT,
            failure_rules=[RESTART_RULE] if variant.restart_job else None,
        )
        job["spec"].setdefault("rendezvous", {})["protocol"] = variant.protocol
        self.run = faults.TrainingRun(cluster, f"bench-recovery-{variant.name}", job)
        # The first kill comes after the first durable checkpoint, so the baseline has one to resume from.
        self.settled_step = CHECKPOINT_INTERVAL

    def trial(self, number: int, rng: random.Random) -> Trial:
        run = self.run
        workers = run.wait_steady(self.settled_step + SETTLE_STEPS, STEADY_TIMEOUT)
        # Kill at a random point of the checkpoint interval, so the baseline's replayed steps are fair.
        target = run.lowest_step(w.pod for w in workers) + rng.randrange(CHECKPOINT_INTERVAL)
        run.wait_step([w.pod for w in workers], target, STEADY_TIMEOUT)
        workers = run.steady() or workers
        victim = rng.choice(workers)
        survivors = [w.pod for w in workers if w.pod != victim.pod]
        kill = faults.kill_pod(run.cluster, run.namespace, victim.pod)
        trial = Trial(self.variant.name, number, victim.pod, victim.rank, kill)

        def mine(incident: dict[str, Any]) -> bool:
            return incident.get("podUid") == victim.uid

        def recovered() -> bool:
            return bool((run.incident(mine)[1] or {}).get("resumedAt")) and run.resumed_after(kill)

        try:
            wait_for(recovered, TRIAL_TIMEOUT, interval=0.5, message="the recovery")
        except BenchError as error:
            trial.error = str(error)
        seen, incident = run.incident(mine)
        timeline = run.timeline()
        trial = analyse(trial, timeline, survivors, incident, seen, run.step_log(), REPLICAS)
        members = list(faults.group_starts(timeline, kill))
        trial.launcher_lines = run.launcher_lines(kill - 1.0, sorted(set(members + survivors)))
        self.settled_step = run.highest_step()
        return trial


def run_variant(
    cluster: BenchCluster, variant: Variant, trials: int, log: Any
) -> tuple[list[Trial], dict[str, Any]]:
    """Run a variant's trials; a trial that cannot start (the job never steady again) ends the variant,
    keeping the trials done and what the job looked like."""
    job = RunningJob(cluster, variant)
    rng = random.Random(f"{SEED}-{variant.name}")
    done: list[Trial] = []
    started = time.monotonic()
    info: dict[str, Any] = {"spec": job.run.job["spec"]}
    try:
        job.run.start()
        for number in range(1, trials + 1):
            try:
                trial = job.trial(number, rng)
            except BenchError as error:
                info["error"] = f"trial {number} could not start: {error}"
                info["diagnosis"] = job.run.diagnose()
                log(f"recovery {variant.name}: {info['error']}")
                break
            done.append(trial)
            outcome = (
                f"failed: {trial.error}" if trial.error else f"{trial.total} s, lost {trial.steps_lost_log}"
            )
            log(f"recovery {variant.name} trial {number}/{trials}: {outcome}")
    finally:
        job.run.close()
    info["seconds"] = round(time.monotonic() - started, 1)
    return done, info


def run(context: Any, quick: bool) -> BenchResult:
    cluster = context.cluster()
    cluster.upgrade_operator(
        {"replacements": {"freePerHour": REPLACEMENTS_PER_HOUR, "maxPerHour": REPLACEMENTS_PER_HOUR}},
        {"PHALANX_OPERATOR_FREE_REPLACEMENTS_PER_HOUR": str(REPLACEMENTS_PER_HOUR)},
    )
    operator = cluster.ensure_operator()
    variants = VARIANTS[:1] if quick else VARIANTS
    trials = QUICK_TRIALS if quick else FULL_TRIALS
    result = BenchResult(name=NAME, title=TITLE)
    all_trials: dict[str, list[Trial]] = {}
    spec: dict[str, Any] = {}
    errors: list[str] = []
    diagnoses: dict[str, Any] = {}
    for variant in variants:
        try:
            done, info = run_variant(cluster, variant, trials, context.log)
        except Exception as error:  # one variant failing must not hide the others' numbers
            errors.append(f"{variant.name}: {type(error).__name__}: {error}")
            context.log(f"recovery {variant.name} failed: {error}")
            continue
        spec = spec or info["spec"]
        if info.get("error"):
            errors.append(f"{variant.name}: {info['error']}")
            diagnoses[variant.name] = info.get("diagnosis")
        all_trials[variant.name] = done
        result.metrics += metrics_for(variant, done)
        result.series += milestone_series(variant, done)
    every = [trial for done in all_trials.values() for trial in done]
    if not every:
        result.error = "; ".join(errors) or "no trial ran"
        return result
    result.timeouts = faults.timeouts_in_force(spec, operator.reconcile_interval)
    slow = stalls_by_variant(all_trials)
    result.notes = notes(all_trials, slow, errors)
    result.details = {
        "trials": {name: [summary(trial, keep_lines=_is_slow(trial, slow)) for trial in done]
                   for name, done in all_trials.items()},
        "stalls": slow,
        "stuck": diagnoses,
        "checkpoint interval steps": CHECKPOINT_INTERVAL,
        "step delay seconds": STEP_DELAY,
    }  # fmt: skip
    failed = [t for t in every if t.error]
    if failed and len(failed) == len(every):
        result.error = f"every trial failed; first: {failed[0].error}"
    return result


def stalls_by_variant(all_trials: dict[str, list[Trial]]) -> list[str]:
    return [line for done in all_trials.values() for line in stalls(done)]


def _is_slow(trial: Trial, slow: list[str]) -> bool:
    return trial.error is not None or any(f"{trial.variant} trial {trial.number} " in line for line in slow)


def summary(trial: Trial, keep_lines: bool) -> dict[str, Any]:
    record = asdict(trial)
    if not keep_lines:
        record.pop("launcher_lines")
    return record


def notes(all_trials: dict[str, list[Trial]], slow: list[str], errors: list[str]) -> list[str]:
    lines = [
        f"Each variant is one TrainingJob of the tiny GPT ({REPLICAS} workers, minReplicas {REPLICAS}, "
        f"{STEP_DELAY} s sleep per step) killed once per trial: SIGKILL of every process of a random active "
        "worker (the node agent's kill annotation, and the training processes signalled directly, since "
        "torchrun starts them outside the container's process group); the next kill waits until every "
        f"worker trains again, {SETTLE_STEPS} more steps plus a random part of the checkpoint interval, "
        "and the spare is refilled.",
        "The tiny GPT runs its groups through livegroup.run_groups, so in the hot-spare and new-pod variants "
        "the survivors keep their training processes (live regroup: the launcher hands them the new group and "
        "they restore from their own memory); the restart-job baseline deletes every pod.",
        f"Durable checkpoints every {CHECKPOINT_INTERVAL} steps on a claim all pods share, in every variant; "
        "the restart-job baseline resumes from it, the others from in-memory snapshots and peers.",
        "Clocks: the kill time is taken on this machine right before the request; the pods are processes "
        "of the same machine, so Lease stamps and the step log share its clock. detectedAt is written to "
        "the second: detect uses the end of that second or when the incident was seen here, if earlier.",
        f"The operator runs with replacements.freePerHour and maxPerHour {REPLACEMENTS_PER_HOUR}: its default "
        "pacing (10 replacements an hour at once, then a back-off) would delay the refilled spare of later "
        "trials.",
        "hot-spare-rounds runs the hot spare with rendezvous.protocol rounds (store-decided rounds, "
        "worker/storerounds.py); the others run torch's c10d rendezvous, the default for a job this size.",
    ]
    for name, done in all_trials.items():
        ok = [t for t in done if t.error is None]
        sources = sorted({"+".join(t.restore_sources) for t in ok if t.restore_sources})
        lines.append(
            f"{name}: {len(ok)} of {len(done)} trials recovered; restored from {', '.join(sources) or '-'}; "
            f"kill request -> container finished (agent delivery) median "
            f"{_median(values(ok, 'kill_delivered'))} s."
        )
        durable = [t for t in ok if "disk" in t.restore_sources or "durable" in t.restore_sources]
        emergency = [
            t for t in durable if t.restored_step is not None and t.restored_step % CHECKPOINT_INTERVAL
        ]
        if durable:
            lines.append(
                f"{name}: {len(emergency)} of {len(durable)} resumes from disk loaded an emergency save (written on "
                "SIGTERM by a surviving rank 0, so not a multiple of the interval); from the last periodic "
                f"checkpoint they would have replayed a median {_median(values(durable, 'steps_since_periodic'))} "
                f"steps (measured: {_median([float(v) for v in values(durable, 'steps_lost_log')])})."
            )
        for trial in done:
            if trial.error:
                lines.append(
                    f"{name} trial {trial.number} (victim {trial.victim}) did not recover: {trial.error}"
                )
    lines += [f"Stall: {line}" for line in slow]
    lines += [f"Variant failed: {error}" for error in errors]
    return lines


def _median(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f}" if samples else "-"
