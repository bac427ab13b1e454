"""The launcher's own judgment of its training processes: stopped at once, hung against their own step times.

The launcher reads its ranks' status records every ~0.1 s and can look at their processes in /proc, with no
API round trip; the operator sees only what a Lease renewal carries. So the launcher judges, and publishes a
verdict in the heartbeat Lease (`fault`, renewed at once) that the operator acts on at its next reconcile:

- stopped: a training process in the stopped state (`T`, job control: SIGSTOP; `t`, tracing stop) for
  `STOP_CONFIRM_SECONDS`, so a debugger's brief attach is no fault, while a stop is reported within a second.
- hung: a rank in the `training` phase that reached no step for longer than its adaptive threshold,
  `max(floor, factor x p99)` of the recent time it took to reach a step, plus the pod's durable save time
  (a peer's save makes this rank wait in the next collective). Time spent in phases other than `training`
  (saves, restores, rendezvous) never counts, in the samples nor in the wait. A rank judges only once it
  has `MIN_SAMPLES` samples of its current group attempt; before that (a start or restart) only the
  operator's fixed progress timeout applies, which stays the outer bound in every case.

Everything here but `process_state` is pure.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx import contract
from phalanx.worker.heartbeat import StatusRecord

STOPPED = contract.FAULT_STOPPED
HUNG = contract.FAULT_HUNG
STOP_CONFIRM_SECONDS = 0.3
"""How long a training process must stay stopped before the launcher reports it."""
STOPPED_STATES = frozenset({"T", "t"})
MIN_SAMPLES = 10
"""Steps of the current group attempt a rank must have shown before its own step times judge a hang."""
WINDOW = 200
"""The most recent step samples the threshold is computed from, per rank."""
PERCENTILE = 99.0


@dataclass(frozen=True)
class Verdict:
    """A fault of one training process, as the launcher published it."""

    kind: str
    """`stopped` or `hung`."""
    rank: int | None
    """The global rank of the faulty process (None: not known)."""
    since: float
    """Unix time when the fault began: the stop was first seen; the wait for the next step began."""
    message: str


@dataclass(frozen=True)
class HangThreshold:
    """The hang threshold in force for one rank: `seconds` and how it came about (`basis`)."""

    seconds: float
    basis: str


def process_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The state letter of a process (`R`, `S`, `T`, ...) from /proc/<pid>/stat; None when it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may hold spaces and parentheses: the state follows the last ')'.
    rest = text.rpartition(")")[2].split()
    return rest[0] if rest else None


def where_it_waits(pid: int, proc: Path = Path("/proc")) -> str:
    """A process's state and where in the kernel its threads wait, for a log line: `state S, threads:
    futex_wait_queue x3, do_poll x1` (`gone` once it has exited)."""
    state = process_state(pid, proc)
    if state is None:
        return "gone"
    waits: Counter[str] = Counter()
    for thread in (proc / str(pid) / "task").glob("*"):
        try:
            wchan = (thread / "wchan").read_text().strip()
        except OSError:
            continue
        waits["running" if wchan in {"", "0"} else wchan] += 1
    threads = ", ".join(f"{wchan} x{count}" for wchan, count in sorted(waits.items()))
    return f"state {state}, threads: {threads or 'unknown'}"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; values must not be empty."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def hang_threshold(
    samples: Iterable[float], factor: float, floor: float, save_seconds: float | None = None
) -> HangThreshold | None:
    """`max(floor, factor x p99(samples))`, plus `save_seconds` when known; None with fewer than
    `MIN_SAMPLES` samples or a factor of 0 (adaptive judgment off)."""
    values = list(samples)
    if factor <= 0 or len(values) < MIN_SAMPLES:
        return None
    high = percentile(values, PERCENTILE)
    scaled = factor * high
    if scaled >= floor:
        seconds, basis = scaled, f"{factor:g}x p99 of {high:.3g}s over {len(values)} steps"
    else:
        seconds, basis = floor, f"floor {floor:g}s (p99 {high:.3g}s over {len(values)} steps)"
    if save_seconds:
        seconds += save_seconds
        basis += f" + save {save_seconds:.3g}s"
    return HangThreshold(seconds, basis)


class RankClock:
    """One rank's step samples and current wait, fed with its status records in order.

    A sample is the time a step took in `training`: from the previous step (or the group's first record)
    to this one, less the stretches outside `training` in between (saves, restores), per step when several
    steps passed between two looks. The wait is the same measure for the step not reached yet.
    """

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)
        self.attempt: int | None = None
        self.step: int | None = None
        self.start: float | None = None
        """When the current stretch in `training` began (None: none began since the last step)."""
        self.end: float | None = None
        """When that stretch ended by leaving `training` (None: it goes on)."""
        self.banked = 0.0
        """Time in `training` towards the next step from earlier stretches (before a save, say)."""

    def observe(self, record: StatusRecord) -> None:
        if record.attempt != self.attempt:
            # A new group: its first steps (warm-up, restore) say nothing about the old one's pace.
            self.samples.clear()
            self.attempt, self.step = record.attempt, record.step
            self.start, self.end, self.banked = None, None, 0.0
        if record.step is not None and record.step != self.step:
            self._sample(record)
            self.step = record.step
            self.start, self.end, self.banked = None, None, 0.0
        if record.phase != "training":
            if self.start is not None and self.end is None:
                left = record.phase_since if record.phase_since is not None else record.updated
                self.end = max(left, self.start)
            return
        marks = [moment for moment in (record.step_at, record.phase_since) if moment is not None]
        begun = max(marks) if marks else record.updated
        if self.start is None:
            self.start = begun
        elif self.end is not None:
            # Back in training after a save or restore without a new step: the time before it still counts.
            self.banked += self.end - self.start
            self.start, self.end = max(begun, self.end), None

    def _sample(self, record: StatusRecord) -> None:
        if self.step is None or record.step is None or self.start is None:
            return
        finished = self.end if self.end is not None else record.step_at
        steps = record.step - self.step
        if finished is None or steps <= 0 or finished < self.start:
            return
        per_step = (self.banked + finished - self.start) / steps
        self.samples.extend([per_step] * min(steps, WINDOW))

    def waited(self, now: float) -> float | None:
        """Seconds in `training` towards the next step (None: not training now)."""
        if self.start is None or self.end is not None:
            return None
        return self.banked + max(0.0, now - self.start)


class TrainerWatch:
    """The launcher's watch over its current group: `observe` once per look, it returns the verdict to
    publish (None: all well) and keeps `threshold`, the hang threshold in force for the pod (the lowest of
    its ranks', since any one rank past its own is a hang)."""

    def __init__(self, factor: float, floor: float) -> None:
        self.factor = factor
        self.floor = floor
        self.threshold: HangThreshold | None = None
        self._clocks: dict[int, RankClock] = {}
        self._stopped_since: dict[int, float] = {}

    def reset(self) -> None:
        """No group runs: nothing to judge until the next one reports."""
        self._clocks.clear()
        self._stopped_since.clear()
        self.threshold = None

    def observe(
        self,
        records: Mapping[int, StatusRecord],
        states: Mapping[int, str | None],
        ranks: Mapping[int, int | None],
        save_seconds: float | None,
        now: float,
    ) -> Verdict | None:
        """`records`: a key per rank (its global rank) -> its record of the current attempt; `states`:
        pid -> process state of the group's training processes;
        `ranks`: pid -> global rank (None: unknown); `save_seconds`: the pod's durable save time."""
        stopped = self._stopped(states, ranks, now)
        for key in list(self._clocks):
            if key not in records:
                del self._clocks[key]
        worst: tuple[float, int, HangThreshold, float] | None = None
        thresholds: list[HangThreshold] = []
        for key, record in sorted(records.items()):
            clock = self._clocks.setdefault(key, RankClock())
            clock.observe(record)
            threshold = hang_threshold(clock.samples, self.factor, self.floor, save_seconds)
            if threshold is None:
                continue
            thresholds.append(threshold)
            waited = clock.waited(now)
            if waited is None or clock.start is None or waited <= threshold.seconds:
                continue
            over = waited - threshold.seconds
            if worst is None or over > worst[0]:
                rank = record.rank if record.rank is not None else key
                worst = (over, rank, threshold, now - waited)
        self.threshold = min(thresholds, key=lambda item: item.seconds) if thresholds else None
        if stopped is not None:
            return stopped
        if worst is None:
            return None
        _over, rank, threshold, began = worst
        message = (
            f"rank {rank}: no step for {now - began:.2f}s in training "
            f"(hang threshold {threshold.seconds:.2f}s: {threshold.basis})"
        )
        return Verdict(HUNG, rank, began, message)

    def _stopped(
        self, states: Mapping[int, str | None], ranks: Mapping[int, int | None], now: float
    ) -> Verdict | None:
        for pid in list(self._stopped_since):
            if states.get(pid) not in STOPPED_STATES:
                del self._stopped_since[pid]
        for pid, state in sorted(states.items()):
            if state in STOPPED_STATES:
                self._stopped_since.setdefault(pid, now)
        confirmed = [
            (since, pid) for pid, since in self._stopped_since.items() if now - since >= STOP_CONFIRM_SECONDS
        ]
        if not confirmed:
            return None
        since, pid = min(confirmed)
        rank = ranks.get(pid)
        who = f"rank {rank}" if rank is not None else "a training process"
        message = f"{who} (pid {pid}) is stopped (state {states.get(pid)}) since {now - since:.1f}s"
        return Verdict(STOPPED, rank, since, message)
