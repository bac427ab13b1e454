"""Kill during save: SIGKILL the checkpoint saver at a random moment of a durable save, then load.

Each trial advances a deterministic training state to the next step, saves it durably
(`Checkpointer.save`, which hands the snapshot to the saver process), sleeps a random time drawn over the
whole span of a save (saver start-up, write, fsync, commit, and a little after), SIGKILLs the saver, and
loads the newest checkpoint from disk in a fresh `Checkpointer` the way a replacement pod would. The load
must give exactly the state of the step it reports (a torn checkpoint that loads is a corrupt load), and a
checkpoint that was complete before must never disappear. No cluster: the worker library in-process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from phalanx.bench.core import Baseline, BenchResult, Metric, Target

NAME = "kill-during-save"
TITLE = "Kill during checkpoint save"
TRIALS = 200
QUICK_TRIALS = 5
WIDTH = 1024
"""Two 1024x1024 float32 layers plus momentum: about 16 MB, so a kill often lands inside the write."""
QUICK_WIDTH = 256
SEED = 20240601


class Cursor:
    """A data position that must survive restarts, like the sampler's."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def build_state(width: int) -> Any:
    from phalanx.worker import TrainState

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TrainState(model=model, optimizer=optimizer, data_cursor=Cursor())


def advance_to(state: Any, step: int) -> None:
    """Put `state` in the exact state it has after `step` (a pure function of the step)."""
    with torch.no_grad():
        for index, parameter in enumerate(state.model.parameters()):
            values = torch.arange(parameter.numel(), dtype=parameter.dtype).reshape(parameter.shape)
            parameter.copy_(values * 1e-6 + step + index)
    for parameter in state.model.parameters():
        parameter.grad = torch.full_like(parameter, float(step))
    state.optimizer.state.clear()
    state.optimizer.step()
    state.data_cursor.position = step * 8
    state.step = step


def fingerprint(state: Any) -> str:
    """A digest of everything saved: parameters, momentum buffers and the data position."""
    digest = hashlib.sha256()
    for tensor in state.model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    for parameter in state.model.parameters():
        buffer = state.optimizer.state.get(parameter, {}).get("momentum_buffer")
        if buffer is not None:
            digest.update(buffer.contiguous().numpy().tobytes())
    digest.update(str(state.data_cursor.position).encode())
    return digest.hexdigest()


def expected_fingerprint(width: int, step: int, cache: dict[int, str]) -> str:
    if step not in cache:
        state = build_state(width)
        advance_to(state, step)
        cache[step] = fingerprint(state)
    return cache[step]


def kill_and_reap_wait(pid: int, timeout: float = 10.0) -> bool:
    """SIGKILL `pid` and wait until it no longer runs (a zombie writes nothing); False if it was gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.002)
    raise RuntimeError(f"the saver (pid {pid}) did not die within {timeout} s of SIGKILL")


@dataclass(frozen=True)
class LoadOutcome:
    step: int
    source: str
    seconds: float
    matches: bool
    error: str | None = None


def load_from_disk(directory: Path, width: int, cache: dict[int, str]) -> LoadOutcome:
    """Load the newest checkpoint as a replacement pod would (no snapshot in memory) and check it."""
    from phalanx.worker import Checkpointer, cleanup_snapshots

    state = build_state(width)
    namespace = f"bench-load-{uuid.uuid4().hex[:8]}"
    loader = Checkpointer(state, directory, interval_steps=0, keep=0, snapshot_every=0, namespace=namespace)
    started = time.perf_counter()
    try:
        step = loader.load()
        seconds = time.perf_counter() - started
        source = loader.last_restore.source if loader.last_restore else "?"
        matches = source == "none" or fingerprint(state) == expected_fingerprint(width, step, cache)
        return LoadOutcome(step, source, seconds, matches)
    except Exception as error:  # a load that raises on a torn file is as bad as a wrong state
        return LoadOutcome(
            -1, "error", time.perf_counter() - started, False, f"{type(error).__name__}: {error}"
        )
    finally:
        loader.close()
        cleanup_snapshots(namespace=namespace)


def calibrate_window(ckpt: Any, state: Any, step: int) -> tuple[float, int]:
    """Seconds of one save from a cold saver (start-up included) to its commit; returns (window, next step)."""
    spans = []
    for _ in range(2):
        pid = ckpt.saver_pid
        if pid is not None:
            kill_and_reap_wait(pid)
        step += 1
        advance_to(state, step)
        started = time.perf_counter()
        ckpt.save(step)
        ckpt.wait()
        spans.append(time.perf_counter() - started)
    return 1.25 * max(spans), step


@contextlib.contextmanager
def quiet_checkpoint_warnings() -> Any:
    """Each kill makes the checkpointer warn that the save failed: expected here, so not printed."""
    logger = logging.getLogger("phalanx.worker.checkpoint")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def run(context: Any, quick: bool) -> BenchResult:
    with quiet_checkpoint_warnings():
        return trials_run(quick, context.scratch(NAME) / "ckpt")


def trials_run(quick: bool, directory: Path) -> BenchResult:
    from phalanx.worker import Checkpointer, cleanup_snapshots

    trials = QUICK_TRIALS if quick else TRIALS
    width = QUICK_WIDTH if quick else WIDTH
    rng = random.Random(SEED)
    torch.set_num_threads(1)
    cache: dict[int, str] = {}
    state = build_state(width)
    ckpt = Checkpointer(state, directory, interval_steps=1, keep=3, snapshot_every=1)
    corrupt, lost, load_seconds, rollback, delays = [], [], [], [], []
    outcomes = {"committed": 0, "previous": 0, "none": 0}
    problems: list[str] = []
    try:
        step = 0
        advance_to(state, step)
        ckpt.save(step)
        ckpt.wait()
        window, step = calibrate_window(ckpt, state, step)
        newest_committed = step
        for _ in range(trials):
            step += 1
            advance_to(state, step)
            ckpt.save(step)
            delay = rng.uniform(0.0, window)
            time.sleep(delay)
            pid = ckpt.saver_pid
            if pid is not None:
                kill_and_reap_wait(pid)
            delays.append(delay * 1e3)
            outcome = load_from_disk(directory, width, cache)
            load_seconds.append(outcome.seconds)
            bad = not outcome.matches or outcome.step > step
            corrupt.append(1.0 if bad else 0.0)
            lost.append(1.0 if outcome.source == "none" or 0 <= outcome.step < newest_committed else 0.0)
            if bad or lost[-1]:
                problems.append(
                    f"step {step}: loaded step {outcome.step} from {outcome.source}"
                    + (f" ({outcome.error})" if outcome.error else "")
                    + (" with the wrong content" if not outcome.matches else "")
                )
            if outcome.source == "none":
                outcomes["none"] += 1
            elif outcome.step == step:
                outcomes["committed"] += 1
            else:
                outcomes["previous"] += 1
            if outcome.step >= 0:
                rollback.append(float(step - outcome.step))
                newest_committed = max(newest_committed, outcome.step)
        size_mb = ckpt.stats["last_snapshot_bytes"] / 2**20
        restarts = ckpt.stats["saver_restarts_total"]
    finally:
        ckpt.close()
        cleanup_snapshots(namespace=ckpt.namespace)
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[
            Metric(
                name="corrupt loads",
                unit="count",
                samples=corrupt,
                description="1 when the load after a kill gave a state other than the one of its step, or raised",
                target=Target(op="<=", value=0, stat="max", text="0 corrupt loads in 200 trials"),
                baseline=Baseline(text="must never load a torn checkpoint"),
            ),
            Metric(
                name="committed checkpoints lost",
                unit="count",
                samples=lost,
                description="1 when the load fell behind a checkpoint an earlier load had found complete",
                target=Target(op="<=", value=0, stat="max", text="a complete checkpoint never disappears"),
            ),
            Metric(
                name="load after a kill",
                unit="s",
                samples=load_seconds,
                description="verify (sha256) and load the newest complete checkpoint from disk",
            ),
            Metric(
                name="steps rolled back",
                unit="steps",
                samples=rollback,
                description="step being saved minus the step loaded (0: the save had committed)",
            ),
            Metric(
                name="kill delay after save()",
                unit="ms",
                samples=delays,
                description="time from the save call to the SIGKILL, uniform over the span of a save",
            ),
        ],
        notes=[
            f"{trials} trials with a {size_mb:.1f} MB state (model, momentum, data position); a durable save "
            f"every step, keep 3; kill delays uniform over 0-{window * 1e3:.0f} ms (1.25x a save from a cold "
            "saver to its commit).",
            f"Outcomes: the save had committed in {outcomes['committed']} trials, the load fell back to the "
            f"previous checkpoint in {outcomes['previous']}, nothing was on disk yet in {outcomes['none']}; "
            f"the saver was restarted {restarts:.0f} times.",
            "Loads use a fresh Checkpointer with no in-memory snapshot, so every load comes from disk and is "
            "compared with the state recomputed for the step it reports.",
            "No timeouts are involved.",
            *(f"Problem: {problem}" for problem in problems[:20]),
        ],
        details={"outcomes": outcomes, "window_ms": window * 1e3, "state_mb": size_mb, "problems": problems},
    )
