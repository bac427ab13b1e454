"""Which rank is slow: each rank's own busy time per step, apart from the time it waits for its peers.

Under synchronous data parallelism every rank's step lasts as long as the slowest rank's, so step times
cannot tell the straggler. A `StepClock` measures how long this rank waits at a sync point: a tiny
all-reduce that every rank enters once it has done its own work and leaves once the last rank arrived.
The fast ranks wait there for the slow one; the slow one passes straight through. So

    compute_seconds = step_seconds - wait_seconds

is high on the slow rank and low on the others, while step_seconds is about the same everywhere.

    clock = StepClock()                 # after init_process_group
    while training:
        clock.start()
        ...                             # data, forward
        clock.sync_point()              # before the backward that all-reduces the gradients
        loss.backward(); opt.step(); ...
        timing = clock.stop()           # timing.compute_seconds -> StatusPublisher.publish(...)

Where to put the sync point: DDP's gradient all-reduce inside `backward()` already makes the fast ranks
wait for a slow one, and that wait cannot be told from work. A sync point right before that backward
takes the wait for everything a slow rank did since the last synchronisation (its data loading, its
forward, the optimizer step and checkpoint save of the step before) out of the fast ranks' busy time;
only slowness inside the backward itself stays hidden. DDP also synchronises at the start of the forward
when it broadcasts module buffers (`broadcast_buffers=True` with buffers present): turn that off when the
buffers are constant, or put a second sync point before the forward. A step may hold several sync points;
their waits add up. On CUDA the clock synchronises the device before and after the all-reduce, so a rank arrives
only when its queued kernels are done (the price of one synchronisation per sync point).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StepTiming:
    """One step as a `StepClock` saw it."""

    step_seconds: float
    """Wall time from `start()` to `stop()`."""
    wait_seconds: float
    """Time spent at sync points waiting for the other ranks."""

    @property
    def compute_seconds(self) -> float:
        """This rank's own busy time: the step less its waits (never negative)."""
        return max(0.0, self.step_seconds - self.wait_seconds)


class StepClock:
    """Times steps and the waits at sync points (see the module docstring).

    `group`: the process group to synchronise over (None: the default group when one is initialised;
    without one, sync points wait for nobody). `device`: where the all-reduce tensor lives (the rank's
    CUDA device under NCCL; CPU under gloo). `now` and `all_reduce` are replaceable for tests.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        now: Callable[[], float] = time.perf_counter,
        all_reduce: Callable[[], None] | None = None,
    ) -> None:
        self._now = now
        self._group = group
        self._device = torch.device(device) if device is not None else None
        self._all_reduce = all_reduce if all_reduce is not None else self._default_all_reduce
        self._started: float | None = None
        self._wait = 0.0
        self.last: StepTiming | None = None
        """The last finished step's timing."""

    def start(self) -> None:
        """A step begins (also drops the waits of an unfinished one)."""
        self._started = self._now()
        self._wait = 0.0

    def sync_point(self) -> float:
        """Wait for every rank here; returns (and adds to the step) the seconds this rank waited."""
        if self._started is None:
            self.start()
        self._settle()  # this rank's own queued device work is not waiting
        arrived = self._now()
        self._all_reduce()
        waited = self._now() - arrived
        self._wait += waited
        return waited

    def stop(self) -> StepTiming:
        """The step ends: its timing (also kept in `last`)."""
        if self._started is None:
            raise RuntimeError("StepClock.stop() without start()")
        timing = StepTiming(step_seconds=self._now() - self._started, wait_seconds=self._wait)
        self._started = None
        self._wait = 0.0
        self.last = timing
        return timing

    def _on_cuda(self) -> bool:
        return self._device is not None and self._device.type == "cuda"

    def _settle(self) -> None:
        if self._on_cuda():
            torch.cuda.synchronize(self._device)

    def _default_all_reduce(self) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size(self._group) <= 1:
            return
        token = torch.zeros(1, device=self._device or torch.device("cpu"))
        dist.all_reduce(token, group=self._group)
        if self._on_cuda():
            torch.cuda.synchronize(self._device)  # the all-reduce is done, not merely queued
