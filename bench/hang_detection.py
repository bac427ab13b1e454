"""Hang detection: a frozen pod, a stopped trainer, a hung trainer, and false alarms while checkpoints are
saved often.

One TrainingJob of the tiny GPT (2 workers, 1 spare, a durable checkpoint every `CHECKPOINT_INTERVAL`
steps on a claim the pods share) goes through four parts, in this order:

1. quiet: it trains undisturbed for `quiet_seconds` while saving every 2 steps; every incident the
   operator opens in that window is a false alarm (the target is none);
2. frozen pod: every process of a random active worker, its launcher first, is stopped (SIGSTOP, and the
   node agent's `phalanx.dev/freeze`), so its Lease stops being renewed; latency = freeze -> the incident's
   detection, judged against the heartbeat timeout (3 s here, renewals every second);
3. stopped trainer: SIGSTOP to that worker's training processes only (found by `POD_NAME` in their
   environment): the launcher sees them stopped and says so in its Lease at once (`TrainerStopped`);
   latency = stop -> detection, judged against one second;
4. hung trainer: SIGUSR1 to the training processes, on which the tiny GPT hangs inside its step, alive and
   not stopped: the launcher judges the wait for the next step against the job's own step times (the hang
   threshold, e.g. 5x p99 with a 1 s floor, published in its Lease); latency = signal -> detection, judged
   against the fixed progress timeout (10 s) it must beat. Whether the operator blamed the hung pod (its
   healthy peer stalls in the same collective) is recorded too.

Each latency is reported next to the threshold in force for it (`Fault.threshold`).

After each fault the benchmark waits for the recovery (the spare takes over, a new spare is made) before
the next one. `detectedAt` is written to the second: detection uses the end of that second, or the moment
the incident reached this process when earlier (see `faults.detection_moment`).
"""

from __future__ import annotations

import random
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx.bench import faults
from phalanx.bench.cluster import BenchCluster, BenchError, wait_for
from phalanx.bench.core import Baseline, BenchResult, Metric, Target
from phalanx.worker import trainerwatch
from phalanx.worker.trainerwatch import STOP_CONFIRM_SECONDS

NAME = "hang-detection"
TITLE = "Hang detection: frozen pod, hung trainer, no false alarm during frequent saves"

REPLICAS = 2
SPARES = 1
STEP_DELAY = 0.25
CHECKPOINT_INTERVAL = 2
WIDTH, LAYERS = 128, 2
"""A model somewhat larger than the recovery benchmark's, so that each save has some work to do."""
HEARTBEAT = {"intervalSeconds": 0.5, "timeoutSeconds": 2, "progressTimeoutSeconds": 10}
"""Renewals every 0.5 s and a heartbeat timeout of 2 s catch a frozen pod within 3 s, detection included,
while three renewals in a row may be late before a false alarm; the defaults (5 s, 30 s) stay safe for jobs on
overloaded nodes and busy API servers. The hang threshold is the default (`hangFactor` 5, `hangFloorSeconds`
1)."""
FROZEN_POD_TARGET = 3.0
"""Seconds a frozen pod may take to be detected."""
STOP_REPORT_TARGET = 1.0
"""Seconds a stopped trainer may take to be detected (its launcher confirms a stop for
`trainerwatch.STOP_CONFIRM_SECONDS`)."""
SETTLE_STEPS = 5
DETECT_TIMEOUT = 120.0
RECOVER_TIMEOUT = 240.0
SEED = 20240608


@dataclass(frozen=True)
class Sizes:
    quiet_seconds: float
    freezes: int
    stops: int
    hangs: int


FULL = Sizes(quiet_seconds=600, freezes=10, stops=10, hangs=10)
QUICK = Sizes(quiet_seconds=10, freezes=1, stops=1, hangs=1)

FROZEN, STOPPED, HUNG = "frozen pod", "stopped trainer", "hung trainer"


@dataclass
class Fault:
    """One injected hang and its detection; seconds after the injection (None: not seen)."""

    kind: str
    """`frozen pod`, `stopped trainer` or `hung trainer`."""
    number: int
    victim: str
    injected: float
    """Unix time right before the injection."""
    victim_phase: str = ""
    """The victim's heartbeat phase when it was stopped."""
    detect: float | None = None
    since_last_heartbeat: float | None = None
    """Detection after the victim's last Lease renewal before the injection (where the operator's clock
    starts for a frozen pod)."""
    cause: str | None = None
    blamed: str | None = None
    """The worker the incident names."""
    recovered: float | None = None
    """Seconds until a new group completed its first step."""
    message: str | None = None
    threshold: str = ""
    """The threshold in force for this detection, in words (the heartbeat timeout, the stop confirmation,
    or the launcher's hang threshold as its incident states it)."""
    error: str | None = None


def threshold_of(kind: str, message: str | None) -> str:
    """The threshold a detection of `kind` ran against; for a hang, the one its launcher published."""
    if kind == FROZEN:
        return f"heartbeat timeout {HEARTBEAT['timeoutSeconds']} s, renewals every {HEARTBEAT['intervalSeconds']} s"
    if kind == STOPPED:
        return f"stop confirmed for {STOP_CONFIRM_SECONDS:g} s by the launcher"
    found = re.search(r"hang threshold ([^)]*)\)", message or "")
    if found:
        return f"hang threshold {found.group(1)}"
    return f"progress timeout {HEARTBEAT['progressTimeoutSeconds']} s"


def new_incidents(before: set[tuple[str, str, str]], incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Incidents not in `before` (keyed by pod uid, cause and detection time)."""
    return [incident for incident in incidents if incident_key(incident) not in before]


def incident_key(incident: dict[str, Any]) -> tuple[str, str, str]:
    return (incident.get("podUid") or "", incident.get("cause") or "", incident.get("detectedAt") or "")


def incidents_seen_between(records: list[faults.Record], start: float, end: float) -> list[dict[str, Any]]:
    """Distinct incidents that appeared in the job's status between `start` and `end` (this process's
    clock), whatever happened to them afterwards."""
    known: set[tuple[str, str, str]] = set()
    found: list[dict[str, Any]] = []
    for seen, _kind, raw in records:
        for incident in (raw.get("status") or {}).get("incidents") or []:
            key = incident_key(incident)
            if key in known:
                continue
            known.add(key)
            if start <= seen <= end:
                found.append(incident)
    return found


def judge_detection(
    fault: Fault, incident: dict[str, Any] | None, seen: float | None, last_renewal: float | None
) -> Fault:
    """Fill the detection figures of `fault` from its incident (pure)."""
    if incident is None:
        fault.error = fault.error or "no incident"
        return fault
    moment = faults.detection_moment(incident.get("detectedAt"), seen)
    fault.detect = None if moment is None else round(moment - fault.injected, 3)
    if moment is not None and last_renewal is not None:
        fault.since_last_heartbeat = round(moment - last_renewal, 3)
    fault.cause = incident.get("cause")
    fault.blamed = incident.get("worker")
    fault.message = incident.get("message")
    fault.threshold = threshold_of(fault.kind, fault.message)
    return fault


@dataclass
class Quiet:
    seconds: float = 0.0
    false_alarms: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    saves: int = 0
    """Durable checkpoints the steps imply (`steps / interval`)."""
    checkpoint_steps_seen: int = 0
    """Distinct `checkpoint-step` values the heartbeats showed (durable saves reported)."""
    saving_versions: int = 0
    """Lease versions that showed the `saving` phase."""


class HangRun:
    def __init__(self, cluster: BenchCluster, log: Any) -> None:
        job = faults.endless_job(
            "hang",
            replicas=REPLICAS,
            checkpoint_interval=CHECKPOINT_INTERVAL,
            spares=SPARES,
            step_delay=STEP_DELAY,
            heartbeat=HEARTBEAT,
            width=WIDTH,
            layers=LAYERS,
        )
        self.run = faults.TrainingRun(cluster, "bench-hang", job)
        self.log = log
        self.settled = 0

    def quiet(self, seconds: float) -> Quiet:
        run = self.run
        workers = run.wait_steady(SETTLE_STEPS)
        pods = [w.pod for w in workers]
        start, first_step = time.time(), run.lowest_step(pods)
        time.sleep(seconds)
        end = time.time()
        timeline = [item for item in run.timeline() if start <= item.seen <= end]
        result = Quiet(seconds=round(end - start, 1))
        result.false_alarms = incidents_seen_between(run.jobs.events(), start, end)
        result.steps = run.lowest_step(pods) - first_step
        result.saves = result.steps // CHECKPOINT_INTERVAL
        result.checkpoint_steps_seen = len({item.text("checkpoint-step") for item in timeline} - {""})
        result.saving_versions = sum(1 for item in timeline if item.phase == "saving")
        self.settled = run.highest_step()
        return result

    def _prepare(
        self, rng: random.Random, steps: int = SETTLE_STEPS
    ) -> tuple[faults.Worker, set[tuple[str, str, str]], faults.LeaseSeen | None]:
        run = self.run
        workers = run.wait_steady(self.settled + steps)
        victim = rng.choice(workers)
        before = {incident_key(i) for i in run.status().get("incidents") or []}
        return victim, before, faults.latest(run.timeline()).get(victim.pod)

    def _finish(self, fault: Fault) -> Fault:
        run = self.run
        try:
            wait_for(lambda: run.resumed_after(fault.injected), RECOVER_TIMEOUT, message="the recovery")
            timeline = run.timeline()
            resumed = faults.resumed_times(timeline, faults.group_starts(timeline, fault.injected))
            fault.recovered = round(max(resumed.values()) - fault.injected, 3) if resumed else None
        except BenchError as error:
            fault.error = fault.error or f"no recovery: {error}"
        self.settled = run.highest_step()
        return fault

    def freeze(self, number: int, rng: random.Random) -> Fault:
        run = self.run
        victim, _before, beat = self._prepare(rng)
        injected = faults.freeze_pod(run.cluster, run.namespace, victim.pod)
        fault = Fault(FROZEN, number, victim.pod, injected, victim_phase=beat.phase if beat else "")

        def mine(incident: dict[str, Any]) -> bool:
            return incident.get("podUid") == victim.uid

        try:
            wait_for(lambda: run.incident(mine)[1], DETECT_TIMEOUT, interval=0.2, message="the incident")
        except BenchError as error:
            fault.error = str(error)
        seen, incident = run.incident(mine)
        last = max(
            (b.renewed or 0.0 for b in faults.versions_of(run.timeline(), victim.pod) if b.seen <= injected),
            default=None,
        )
        judge_detection(fault, incident, seen, last or None)
        if incident is None:  # leave nothing stopped behind
            faults.freeze_pod(run.cluster, run.namespace, victim.pod, frozen=False)
            return fault
        return self._finish(fault)

    def stop(self, number: int, rng: random.Random) -> Fault:
        """SIGSTOP to a worker's training processes (its launcher lives on)."""
        return self._trainer_fault(STOPPED, signal.SIGSTOP, number, rng)

    def hang(self, number: int, rng: random.Random) -> Fault:
        """SIGUSR1 to a worker's training processes: the tiny GPT hangs inside its step."""
        return self._trainer_fault(HUNG, signal.SIGUSR1, number, rng)

    def _trainer_fault(self, kind: str, signum: int, number: int, rng: random.Random) -> Fault:
        run = self.run
        # A hang is judged against the step times of the group now running, once it has shown enough of them.
        victim, before, beat = self._prepare(rng, SETTLE_STEPS + trainerwatch.MIN_SAMPLES)
        pids = faults.trainer_processes(victim.pod, run.namespace)
        injected = time.time()
        pids = faults.signal_all(pids, signum)
        fault = Fault(kind, number, victim.pod, injected, victim_phase=beat.phase if beat else "")
        if not pids:
            fault.error = f"no training process of {victim.pod} found"
            return fault
        faulty_phase = ""

        def detected() -> dict[str, Any] | None:
            nonlocal faulty_phase
            now = faults.latest(run.timeline()).get(victim.pod)
            faulty_phase = faulty_phase or (now.phase if now and now.seen > injected + 2 else "")
            return next(iter(new_incidents(before, run.status().get("incidents") or [])), None)

        try:
            wait_for(detected, DETECT_TIMEOUT, interval=0.2, message="an incident")
        except BenchError as error:
            fault.error = str(error)
        fresh = new_incidents(before, run.status().get("incidents") or [])
        incident = fresh[0] if fresh else None
        seen = None
        if incident is not None:
            seen, _ = run.incident(lambda i: incident_key(i) == incident_key(incident))
        judge_detection(fault, incident, seen, None)
        fault.victim_phase = faulty_phase or fault.victim_phase
        if signum == signal.SIGSTOP:
            # The stopped processes are the launcher's to end when the group re-forms; never leave them stopped.
            faults.signal_all(pids, signal.SIGCONT)
        return self._finish(fault) if incident is not None else fault


def run(context: Any, quick: bool) -> BenchResult:
    cluster = context.cluster()
    operator = cluster.ensure_operator()
    sizes = QUICK if quick else FULL
    rng = random.Random(SEED)
    hang = HangRun(cluster, context.log)
    faults_done: list[Fault] = []
    quiet = Quiet()
    stuck: dict[str, Any] = {}
    plan = [(FROZEN, n, sizes.freezes) for n in range(1, sizes.freezes + 1)]
    plan += [(STOPPED, n, sizes.stops) for n in range(1, sizes.stops + 1)]
    plan += [(HUNG, n, sizes.hangs) for n in range(1, sizes.hangs + 1)]
    injections = {FROZEN: hang.freeze, STOPPED: hang.stop, HUNG: hang.hang}
    try:
        hang.run.start()
        context.log(
            f"hang-detection: {sizes.quiet_seconds:.0f} s of training with a save every {CHECKPOINT_INTERVAL} steps"
        )
        quiet = hang.quiet(sizes.quiet_seconds)
        for kind, number, count in plan:
            try:
                faults_done.append(injections[kind](number, rng))
            except BenchError as error:  # the job never got steady again: keep what was measured
                stuck = {"error": f"{kind} {number} could not start: {error}", **hang.run.diagnose()}
                context.log(f"hang-detection: {stuck['error']}")
                break
            context.log(f"hang-detection {kind} {number}/{count}: {_line(faults_done[-1])}")
    finally:
        hang.run.close()
    result = result_of(quiet, faults_done, hang.run.job["spec"], operator.reconcile_interval)
    if stuck:
        result.notes.append(f"Stopped early: {stuck['error']} (details: stuck)")
        result.details["stuck"] = stuck
    return result


def _line(fault: Fault) -> str:
    if fault.error:
        return f"failed: {fault.error}"
    return (
        f"{fault.cause} of {fault.blamed} after {fault.detect} s (victim {fault.victim}, phase "
        f"{fault.victim_phase}; {fault.threshold})"
    )


def result_of(quiet: Quiet, done: list[Fault], spec: dict[str, Any], reconcile: float) -> BenchResult:
    interval = HEARTBEAT["intervalSeconds"]
    frozen = [f for f in done if f.kind == FROZEN and f.detect is not None]
    stopped = [f for f in done if f.kind == STOPPED and f.detect is not None]
    hung = [f for f in done if f.kind == HUNG and f.detect is not None]
    heartbeat_bound = FROZEN_POD_TARGET
    progress_bound = HEARTBEAT["progressTimeoutSeconds"]
    metrics = [
        Metric(
            name="frozen pod: freeze -> detected",
            unit="s",
            samples=[f.detect for f in frozen if f.detect is not None],
            description="SIGSTOP of every process of a worker, its launcher first -> the operator's incident "
            f"(HeartbeatTimeout; timeout {HEARTBEAT['timeoutSeconds']} s, a renewal every {interval} s)",
            target=Target(
                op="<=",
                value=heartbeat_bound,
                stat="max",
                text=f"<= {heartbeat_bound:g} s",
            ),
            baseline=Baseline(text="NCCL 10 min, gloo 30 min, DLRover 600 s, torchft 5 s"),
        ),
        Metric(
            name="frozen pod: last heartbeat -> detected",
            unit="s",
            samples=[f.since_last_heartbeat for f in frozen if f.since_last_heartbeat is not None],
            description="the victim's last Lease renewal before the freeze -> detection (the operator's clock)",
        ),
        Metric(
            name="stopped trainer: stop -> detected",
            unit="s",
            samples=[f.detect for f in stopped if f.detect is not None],
            description="SIGSTOP of the training processes only -> incident (TrainerStopped: the launcher "
            f"sees the stopped state, confirms it for {STOP_CONFIRM_SECONDS:g} s and renews its Lease at once)",
            target=Target(op="<=", value=STOP_REPORT_TARGET, stat="max", text=f"<= {STOP_REPORT_TARGET:g} s"),
        ),
        Metric(
            name="stopped trainer: the stopped pod was blamed",
            unit="count",
            samples=[1.0 if f.blamed == f.victim else 0.0 for f in stopped],
            description="1 when the incident names the pod whose trainer was stopped",
        ),
        Metric(
            name="hung trainer: hang -> detected",
            unit="s",
            samples=[f.detect for f in hung if f.detect is not None],
            description="the training processes hang inside a step (alive, not stopped) -> incident "
            "(NoProgress against the launcher's hang threshold: see each fault's `threshold`)",
            target=Target(
                op="<=",
                value=progress_bound,
                stat="max",
                text=f"within the fixed progress timeout ({progress_bound} s) it must beat",
            ),
            baseline=Baseline(text="NCCL 10 min, gloo 30 min, DLRover 600 s, torchft 5 s"),
        ),
        Metric(
            name="hung trainer: the hung pod was blamed",
            unit="count",
            samples=[1.0 if f.blamed == f.victim else 0.0 for f in hung],
            description="1 when the incident names the pod whose trainer hung, 0 when it names its peer",
        ),
        Metric(
            name="fault -> training resumed",
            unit="s",
            samples=[f.recovered for f in done if f.recovered is not None],
            description="injection -> first step of the group formed after it (both kinds)",
        ),
        Metric(
            name="false alarms during frequent saves",
            unit="count",
            samples=[float(len(quiet.false_alarms))],
            description=f"incidents opened in {quiet.seconds:.0f} s of undisturbed training with a durable "
            f"save every {CHECKPOINT_INTERVAL} steps",
            target=Target(op="<=", value=0, stat="max", text="0 false alarms during saves"),
        ),
    ]
    notes = [
        f"One TrainingJob of the tiny GPT (width {WIDTH}, {LAYERS} layers, {REPLICAS} workers + {SPARES} spare, "
        f"{STEP_DELAY} s sleep per step), a durable checkpoint every {CHECKPOINT_INTERVAL} steps on a shared claim.",
        f"Quiet window: {quiet.seconds:.0f} s, {quiet.steps} steps, {quiet.saves} durable saves implied, "
        f"{quiet.checkpoint_steps_seen} distinct checkpoint-step values in the heartbeats, {quiet.saving_versions} "
        f"heartbeats seen in the saving phase; incidents opened: {len(quiet.false_alarms)}"
        + (f" ({'; '.join(str(i.get('message')) for i in quiet.false_alarms)})" if quiet.false_alarms else "")
        + ".",
        f"The operator judges heartbeats when it reconciles: at each job, pod or heartbeat-phase change, at a "
        f"launcher's verdict on its training processes (stopped, hung), at the job's next heartbeat or progress "
        f"deadline (a wake-up), and every {reconcile:g} s otherwise (chart default); the fixed no-progress clock "
        "starts at the heartbeat's step-at, when the worker reached its step.",
        "Clocks: injection times are taken on this machine right before the request or signal; detectedAt is "
        "written to the second, so detection uses the end of that second or the moment the incident reached "
        "this process, whichever is earlier.",
    ]
    for fault in done:
        if fault.error:
            notes.append(f"{fault.kind} {fault.number} (victim {fault.victim}): {fault.error}")
            continue
        notes.append(
            f"{fault.kind} {fault.number}: {fault.cause} after {fault.detect} s against {fault.threshold}."
        )
        if fault.kind in (STOPPED, HUNG) and fault.blamed != fault.victim:
            notes.append(
                f"{fault.kind} {fault.number}: the operator blamed {fault.blamed} ({fault.cause}) while "
                f"{fault.victim}'s trainer was the faulty one (its heartbeat phase: {fault.victim_phase or '-'})."
            )
    result = BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics,
        timeouts=faults.timeouts_in_force(spec, reconcile),
        notes=notes,
        details={"faults": [asdict(fault) for fault in done], "quiet": asdict(quiet)},
    )
    if not done and quiet.seconds == 0:
        result.error = "nothing ran"
    return result
