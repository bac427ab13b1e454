"""Guards of a training process: non-finite loss rollback and a watchdog for stuck collectives.

NonFiniteLossGuard: every rank checks the loss before the optimizer step; the decision is collective, so
all ranks roll back together to the last in-memory snapshot, skip the bad batch, and go on; after
`max_rollbacks` the process exits with TrainerExit.NON_FINITE_LOSS, which the launcher does not retry.

CollectiveWatchdog: a thread that ends the process (TrainerExit.COLLECTIVE_TIMEOUT) when one collective
lasts longer than PHALANX_COLLECTIVE_TIMEOUT, or when the launcher that started it is gone. Gloo would wait
30 minutes; the launcher then restarts the group from in-memory snapshots.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from phalanx.worker.data import ElasticSampler
from phalanx.worker.devices import collective_device
from phalanx.worker.exitcodes import TrainerExit

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_ENV = "PHALANX_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 300.0


def collective_timeout(env: dict[str, str] | None = None) -> float:
    env = dict(os.environ) if env is None else env
    raw = env.get(COLLECTIVE_TIMEOUT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_COLLECTIVE_TIMEOUT
    return value if value > 0 else DEFAULT_COLLECTIVE_TIMEOUT


def process_group_timeout(env: dict[str, str] | None = None) -> timedelta:
    """Timeout for `init_process_group`: a little above the watchdog's, so the watchdog speaks first."""
    return timedelta(seconds=collective_timeout(env) + 30.0)


class NonFiniteLossError(RuntimeError):
    """The loss stayed non-finite after the allowed number of rollbacks."""


class Restorable(Protocol):
    def load(self) -> int: ...


def all_ranks_finite(value: torch.Tensor) -> bool:
    """True when `value` is finite on every rank (one tiny all-reduce; local check without a group)."""
    bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach()).all()) else 1.0])
    if dist.is_available() and dist.is_initialized():
        bad = bad.to(collective_device())
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return float(bad.item()) == 0.0


class NonFiniteLossGuard:
    """Roll back to the last good snapshot and skip the batch that produced a NaN/Inf loss.

    if not guard.loss_is_finite(loss):        # collective: call it on every rank
        step = guard.rollback()               # restores state, marks the batch as bad
        continue
    """

    def __init__(self, checkpointer: Restorable, sampler: ElasticSampler, max_rollbacks: int = 3) -> None:
        self.checkpointer = checkpointer
        self.sampler = sampler
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        self._bad: set[tuple[int, int]] = set()

    def loss_is_finite(self, loss: torch.Tensor) -> bool:
        return all_ranks_finite(loss)

    def rollback(self) -> int:
        """Restore the newest in-memory state; returns its step. Raises after too many rollbacks."""
        self.rollbacks += 1
        self._bad.add(self.sampler.mark_last_batch_bad())
        if self.rollbacks > self.max_rollbacks:
            raise NonFiniteLossError(
                f"loss was not finite {self.rollbacks} times (limit {self.max_rollbacks}); giving up"
            )
        step = self.checkpointer.load()
        # The snapshot predates the bad batch: keep skipping it after the restore.
        self.sampler.bad_batches |= self._bad
        logger.warning("non-finite loss: rolled back to step %d and skipped the batch", step)
        return step


def exit_on_non_finite(function: Callable[[], Any]) -> Any:
    """Run `function`; turn NonFiniteLossError into the exit code the launcher will not retry."""
    try:
        return function()
    except NonFiniteLossError as error:
        print(f"phalanx: {error}", file=sys.stderr, flush=True)
        sys.exit(int(TrainerExit.NON_FINITE_LOSS))


class CollectiveWatchdog:
    """Ends the process when a watched region outlasts the timeout or the parent launcher is gone.

    watchdog = CollectiveWatchdog().start()
    with watchdog.watch("step"):
        loss.backward()          # DDP all-reduce inside
    """

    def __init__(
        self,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        on_timeout: Callable[[str, float], None] | None = None,
        watch_parent: bool = True,
    ) -> None:
        self.timeout = collective_timeout() if timeout is None else timeout
        self.poll_interval = min(poll_interval, max(self.timeout / 4, 0.05))
        self._on_timeout = on_timeout or _exit_collective_timeout
        self._parent = os.getppid() if watch_parent else None
        self._lock = threading.Lock()
        self._label: str | None = None
        self._since = math.inf
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phalanx-watchdog", daemon=True)

    def start(self) -> CollectiveWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @contextlib.contextmanager
    def watch(self, label: str) -> Iterator[None]:
        self.arm(label)
        try:
            yield
        finally:
            self.disarm()

    def arm(self, label: str) -> None:
        """Watch from now until `disarm` or the next `arm`: a region that spans calls (a session's step)."""
        with self._lock:
            self._label, self._since = label, time.monotonic()

    def disarm(self) -> None:
        with self._lock:
            self._label, self._since = None, math.inf

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            if self._parent is not None and os.getppid() != self._parent:
                print("phalanx: the launcher is gone; stopping", file=sys.stderr, flush=True)
                os._exit(int(TrainerExit.ORPHANED))
            with self._lock:
                label, elapsed = self._label, time.monotonic() - self._since
            if label is not None and elapsed > self.timeout:
                self._on_timeout(label, elapsed)
                return


def _exit_collective_timeout(label: str, elapsed: float) -> None:
    print(
        f"phalanx: rank stuck in {label!r} for {elapsed:.1f}s (> {COLLECTIVE_TIMEOUT_ENV}); exiting",
        file=sys.stderr,
        flush=True,
    )
    os._exit(int(TrainerExit.COLLECTIVE_TIMEOUT))


def global_mean_loss(local_loss_sum: torch.Tensor) -> float:
    """Sum of every rank's scaled loss divided by the world size: the global batch's mean loss.

    One all-reduce that doubles as the finiteness check: NaN or Inf on any rank makes the result
    non-finite on every rank, so all ranks take the same rollback decision.
    """
    total = local_loss_sum.detach().reshape(1).to(torch.float64).clone()
    world_size = 1
    if dist.is_available() and dist.is_initialized():
        total = total.to(collective_device())
        dist.all_reduce(total)
        world_size = dist.get_world_size()
    return float(total.item()) / world_size
