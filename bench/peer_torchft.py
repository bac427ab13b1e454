"""torchft on this machine: a replica group SIGKILLed mid-training, then the survivors' next committed step.

torchft runs as its documentation describes, without a cluster: its lighthouse (`torchft_lighthouse`), and
three replica groups of one process each (`phalanx.bench.torchft_replica`: the tiny GPT of the recovery
benchmark, torchft's Manager, ProcessGroupGloo, PureDistributedDataParallel and OptimizerWrapper on CPU). Each
trial starts them afresh, waits until all three train in one quorum, lets them run a random number of steps,
SIGKILLs one, and reads from the survivors' step lines how long until every survivor committed a step again
and how many committed steps they rolled back. The report sets that beside Phalanx's hot-spare recovery
(`recovery`) when it ran in the same invocation.

If torchft cannot run here, the result says why (the exception and the version tried) and keeps torchft's
published figure; the bench goes on.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from phalanx.bench import peers
from phalanx.bench.core import BenchResult, Metric, Timeout, Versus

NAME = "peer-torchft"
TITLE = "torchft measured here: replica SIGKILLed -> survivors' next committed step"

REPLICAS = 3
MIN_REPLICAS = 2  # the survivors of one kill still make a quorum, as Phalanx's minReplicas = 2
# The lighthouse as torchft's README starts it (quorum tick, join timeout); heartbeat timeout: its default.
QUORUM_TICK_MS = 100
JOIN_TIMEOUT_MS = 10_000
HEARTBEAT_TIMEOUT_MS = 5_000
# The Manager's and the process group's own defaults, passed explicitly so the report can list them.
MANAGER_TIMEOUT_S = 60.0
QUORUM_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 60.0
MANAGER_HEARTBEAT_S = 0.1
GLOO_TIMEOUT_S = 60.0
# The benchmark's own waits: a trial that exceeds one is recorded as failed.
START_WAIT_S = 180.0
RECOVERY_WAIT_S = 120.0
KILL_AFTER_STEPS = (3, 20)  # the kill comes this many committed steps (at random) after the full quorum

FULL_TRIALS = 20
QUICK_TRIALS = 2


def torchft_version() -> str:
    try:
        return importlib.metadata.version("torchft")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def lighthouse_command() -> list[str]:
    """torchft's console script beside this Python, else the same entry point through the interpreter."""
    script = Path(sys.executable).with_name("torchft_lighthouse")
    head = (
        [str(script)]
        if script.exists()
        else [
            sys.executable,
            "-c",
            "import sys; from torchft._torchft import lighthouse_main; sys.exit(lighthouse_main())",
        ]
    )
    return [
        *head,
        "--bind",
        "[::]:0",
        "--min_replicas",
        str(MIN_REPLICAS),
        "--quorum_tick_ms",
        str(QUORUM_TICK_MS),
        "--join_timeout_ms",
        str(JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms",
        str(HEARTBEAT_TIMEOUT_MS),
    ]


def replica_command(replica_id: str, lighthouse: str, max_seconds: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "phalanx.bench.torchft_replica",
        "--replica-id",
        replica_id,
        "--lighthouse",
        lighthouse,
        "--min-replicas",
        str(MIN_REPLICAS),
        "--timeout",
        str(MANAGER_TIMEOUT_S),
        "--quorum-timeout",
        str(QUORUM_TIMEOUT_S),
        "--connect-timeout",
        str(CONNECT_TIMEOUT_S),
        "--heartbeat-interval",
        str(MANAGER_HEARTBEAT_S),
        "--gloo-timeout",
        str(GLOO_TIMEOUT_S),
        "--max-seconds",
        str(max_seconds),
    ]


@dataclass
class Replica:
    """A replica group's process and the step lines read from it so far."""

    replica_id: str
    process: subprocess.Popen[str]
    lines: list[peers.StepLine] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, stream: IO[str]) -> None:
        for raw in stream:
            line = peers.parse_step(raw)
            if line is not None:
                with self.lock:
                    self.lines.append(line)

    def snapshot(self) -> list[peers.StepLine]:
        with self.lock:
            return list(self.lines)

    def last_committed(self) -> peers.StepLine | None:
        return next((line for line in reversed(self.snapshot()) if line.committed), None)


@dataclass
class Trial:
    number: int
    victim: str
    kill_step: int
    outcome: peers.KillOutcome
    step_seconds: float


class TrialFailed(RuntimeError):
    pass


def log_tail(path: Path, lines: int = 6) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def wait_for(condition: Any, timeout: float, what: str, processes: dict[subprocess.Popen[str], Path]) -> None:
    """Poll `condition` until true; a process that exits meanwhile fails the trial with its log's tail."""
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [(process, log) for process, log in processes.items() if process.poll() is not None]
        if dead:
            process, log = dead[0]
            raise TrialFailed(f"{what}: {log.stem} exited with {process.returncode}: {log_tail(log)}")
        if time.monotonic() > deadline:
            raise TrialFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.02)


def stop(process: subprocess.Popen[str] | None) -> None:
    """SIGKILL a process group started here and reap it (the replicas leave no children behind either)."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def start_lighthouse(folder: Path) -> tuple[subprocess.Popen[str], str]:
    log_path = folder / "lighthouse.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            lighthouse_command(), stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    address: list[str] = []

    def listening() -> bool:
        found = peers.lighthouse_address(log_path.read_text(errors="replace"))
        if found:
            address.append(found)
        return bool(found)

    try:
        wait_for(listening, 30, "lighthouse listening", {process: log_path})
    except TrialFailed:
        stop(process)
        raise
    # The lighthouse names this host by its host name; localhost always reaches it.
    return process, address[0]


def run_trial(number: int, folder: Path, rng: random.Random, log: Any) -> Trial:
    lighthouse: subprocess.Popen[str] | None = None
    replicas: list[Replica] = []
    try:
        lighthouse, address = start_lighthouse(folder)
        for index in range(REPLICAS):
            replica_id = f"replica_{index}"
            with open(folder / f"{replica_id}.log", "w") as errors:
                process = subprocess.Popen(
                    replica_command(replica_id, address, START_WAIT_S + RECOVERY_WAIT_S + 120),
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    text=True,
                    start_new_session=True,
                )
            replica = Replica(replica_id, process)
            assert process.stdout is not None
            threading.Thread(target=replica.read, args=(process.stdout,), daemon=True).start()
            replicas.append(replica)
        logs = {replica.process: folder / f"{replica.replica_id}.log" for replica in replicas}
        processes = {**logs, lighthouse: folder / "lighthouse.log"}

        def full_quorum() -> bool:
            lasts = [replica.last_committed() for replica in replicas]
            return all(last is not None and last.participants == REPLICAS for last in lasts)

        wait_for(full_quorum, START_WAIT_S, "all replicas committing in one quorum", processes)
        start_step = max(last.step for replica in replicas if (last := replica.last_committed()))
        kill_step = start_step + rng.randint(*KILL_AFTER_STEPS)
        victim = rng.choice(replicas)
        wait_for(
            lambda: (last := victim.last_committed()) is not None and last.step >= kill_step,
            RECOVERY_WAIT_S,
            f"{victim.replica_id} reaching step {kill_step}",
            processes,
        )
        kill_time = time.time()
        os.killpg(victim.process.pid, signal.SIGKILL)
        victim.process.wait()
        survivors = [replica for replica in replicas if replica is not victim]
        outcome: list[peers.KillOutcome] = []

        def recovered() -> bool:
            found = peers.kill_outcome(kill_time, REPLICAS, {r.replica_id: r.snapshot() for r in survivors})
            if found is not None:
                outcome.append(found)
            return found is not None

        wait_for(
            recovered,
            RECOVERY_WAIT_S,
            "survivors committing after the kill",
            {process: log for process, log in processes.items() if process is not victim.process},
        )
        before = [line.time for line in survivors[0].snapshot() if line.committed and line.time <= kill_time]
        recent = before[-21:]
        gaps = [later - earlier for earlier, later in itertools.pairwise(recent)]
        trial = Trial(
            number=number,
            victim=victim.replica_id,
            kill_step=kill_step,
            outcome=outcome[0],
            step_seconds=statistics.median(gaps) if gaps else 0.0,
        )
        log(
            f"{NAME} trial {number}: {victim.replica_id} killed at step {kill_step}: "
            f"{trial.outcome.seconds:.2f} s, {trial.outcome.steps_lost} steps lost, "
            f"{trial.outcome.discarded} discarded"
        )
        return trial
    finally:
        for replica in replicas:
            stop(replica.process)
        stop(lighthouse)


def timeouts() -> list[Timeout]:
    lighthouse = "torchft_lighthouse flag, as torchft's README starts it"
    return [
        Timeout(
            name="lighthouse heartbeat timeout (a replica silent this long is dead)",
            seconds=HEARTBEAT_TIMEOUT_MS / 1000,
            source="torchft_lighthouse --heartbeat_timeout_ms (its default)",
        ),
        Timeout(
            name="lighthouse join timeout (waits for stragglers before a quorum)",
            seconds=JOIN_TIMEOUT_MS / 1000,
            source=f"{lighthouse} (--join_timeout_ms)",
        ),
        Timeout(
            name="lighthouse quorum tick",
            seconds=QUORUM_TICK_MS / 1000,
            source=f"{lighthouse} (--quorum_tick_ms)",
        ),
        Timeout(
            name="Manager heartbeat interval (replica -> lighthouse)",
            seconds=MANAGER_HEARTBEAT_S,
            source="torchft Manager heartbeat_interval (its default)",
        ),
        Timeout(
            name="Manager timeout (allreduce, should_commit)",
            seconds=MANAGER_TIMEOUT_S,
            source="torchft Manager timeout (its default)",
        ),
        Timeout(
            name="Manager quorum timeout", seconds=QUORUM_TIMEOUT_S, source="torchft Manager (its default)"
        ),
        Timeout(
            name="Manager connect timeout", seconds=CONNECT_TIMEOUT_S, source="torchft Manager (its default)"
        ),
        Timeout(
            name="ProcessGroupGloo timeout",
            seconds=GLOO_TIMEOUT_S,
            source="torchft ProcessGroupGloo (its default)",
        ),
        Timeout(
            name="benchmark: wait for survivors to commit after the kill",
            seconds=RECOVERY_WAIT_S,
            source="phalanx.bench.peer_torchft",
        ),
    ]


def metrics(trials: list[Trial]) -> list[Metric]:
    return [
        Metric(
            name="torchft: kill -> next committed step",
            unit="s",
            samples=[trial.outcome.seconds for trial in trials],
            description="SIGKILL of one replica group -> every survivor committed a step in a quorum without it",
            baseline=peers.TORCHFT_PUBLISHED,
            versus=Versus(benchmark="recovery", metric="hot-spare: kill -> first step"),
        ),
        Metric(
            name="torchft: steps lost",
            unit="count",
            samples=[float(trial.outcome.steps_lost) for trial in trials],
            description="survivors' highest committed step before the kill + 1 - their first after it",
            versus=Versus(benchmark="recovery", metric="hot-spare: steps lost", stat="max"),
        ),
        Metric(
            name="torchft: discarded step attempts",
            unit="count",
            samples=[float(trial.outcome.discarded) for trial in trials],
            description="survivors' step attempts not committed between the kill and their recovery",
        ),
        Metric(
            name="torchft: step time before the kill",
            unit="ms",
            samples=[trial.step_seconds * 1e3 for trial in trials],
            description="median time between committed steps of a survivor before the kill",
        ),
    ]


def unavailable_result(reason: str, notes: list[str]) -> BenchResult:
    """torchft could not run here: no samples, the published figures kept, the reason in full."""
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics([]),
        timeouts=timeouts(),
        notes=[f"torchft could not run here: {reason}", *notes],
        details={"unavailable": reason, "torchft_version": torchft_version()},
    )


def run(context: Any, quick: bool) -> BenchResult:
    """Harness entry point (`phalanx bench --only peer-torchft`)."""
    version = torchft_version()
    try:
        import torchft  # noqa: F401
    except Exception as error:
        return unavailable_result(f"torchft {version}: import torchft: {type(error).__name__}: {error}", [])
    workdir = context.scratch(NAME)
    rng = random.Random(int(time.time()))
    wanted = QUICK_TRIALS if quick else FULL_TRIALS
    trials: list[Trial] = []
    failures: list[str] = []
    for number in range(1, wanted + 1):
        folder = workdir / f"trial-{number}"
        folder.mkdir()
        try:
            trials.append(run_trial(number, folder, rng, context.log))
        except TrialFailed as error:
            failures.append(f"trial {number}: {error}")
            context.log(f"{NAME} trial {number} failed: {error}")
            if not trials and number >= 2:
                break  # torchft does not come up here at all: say why instead of retrying for an hour
    notes = [
        f"torchft {version}, CPU with gloo, no cluster: one lighthouse and {REPLICAS} replica groups of one "
        f"process each on this machine, min_replicas = {MIN_REPLICAS}; each trial starts them afresh and "
        f"SIGKILLs one replica group {KILL_AFTER_STEPS[0]}-{KILL_AFTER_STEPS[1]} committed steps (at random) "
        "after all three train in one quorum.",
        "The model is the recovery benchmark's tiny GPT (random tokens), one torch thread per replica.",
        "Recovery ends when every survivor committed a step in a quorum without the killed replica (a step "
        "already past its allreduce may still commit in the old quorum); torchft's step counter never rolls "
        "back, so lost work shows as discarded attempts and as the time itself.",
        "torchft's PureDistributedDataParallel, not its DistributedDataParallel: in torchft 0.2.0 the latter's "
        "comm hook asserts on the Manager's dummy future after a failed allreduce (`assert fut._fut`, "
        "torchft/ddp.py), which crashed the survivors here whenever the kill landed in the backward pass.",
        *failures,
    ]
    if trials:
        median = statistics.median(trial.outcome.seconds for trial in trials)
        notes.append(
            f"Kill -> next committed step: median {median:.2f} s, of which {HEARTBEAT_TIMEOUT_MS / 1000:g} s is "
            "the lighthouse's heartbeat timeout: it forms a quorum without the killed replica only once that "
            "replica's heartbeats are that old."
        )
    if not trials:
        return unavailable_result(f"torchft {version}: " + "; ".join(failures), notes[: -len(failures)])
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics(trials),
        timeouts=timeouts(),
        notes=notes,
        details={
            "torchft_version": version,
            "trials": [
                {
                    "trial": trial.number,
                    "victim": trial.victim,
                    "kill_step": trial.kill_step,
                    "seconds": trial.outcome.seconds,
                    "steps_lost": trial.outcome.steps_lost,
                    "discarded": trial.outcome.discarded,
                }
                for trial in trials
            ],
            "failed_trials": len(failures),
        },
    )
