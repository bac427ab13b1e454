"""A snapshot's device-to-host copies, issued so that the next step's compute hides them.

A snapshot is taken after the optimizer's step. What the next step changes first decides where each copy runs:
- the parameters and the optimizer's state change only at the next optimizer step, so their copies run on a
  side stream of their own, ordered after the work already queued, while the next forward and backward run;
  the optimizer waits for them in a step pre-hook (`hold_until_copied`) with a wait on the device, never on the
  host;
- everything else (a module's buffers, which a forward updates; an EMA) is copied on the training's own stream,
  where the kernels that will change it queue behind the copy.
The snapshot is committed once every copy is done (`Snapshot.done`), by the store's committer thread.

The accelerator's runtime is an object (`CudaRuntime`), so that the order of streams, events and waits is
tested on the host with a runtime whose copies wait until something waits for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class Runtime(Protocol):
    """The few stream and event operations an overlapped copy needs."""

    def current_stream(self, device: torch.device) -> Any: ...

    def new_stream(self, device: torch.device) -> Any: ...

    def new_event(self, device: torch.device) -> Any: ...

    def record(self, event: Any, stream: Any) -> None: ...

    def wait(self, stream: Any, event: Any) -> None:
        """Work queued on `stream` from now on starts after `event` (the host does not wait)."""

    def synchronize(self, event: Any) -> None:
        """The host waits until `event` has happened."""

    def copy(self, target: torch.Tensor, source: torch.Tensor, stream: Any) -> None:
        """Queue a non-blocking copy of `source` into `target` on `stream`."""


class CudaRuntime:
    """`Runtime` on torch.cuda."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def new_event(self, device: torch.device) -> Any:
        return torch.cuda.Event()

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def copy(self, target: torch.Tensor, source: torch.Tensor, stream: Any) -> None:
        with torch.cuda.stream(stream):
            target.copy_(source, non_blocking=True)
            # The source may be a temporary (a non-contiguous tensor made contiguous): the allocator must not
            # hand its memory out again before the side stream has read it.
            source.record_stream(stream)


CopyPair = tuple[torch.Tensor, torch.Tensor]
"""(host target, device source) of one tensor of a snapshot."""


@dataclass
class Snapshot:
    """The copies of one snapshot in flight: an event per device that happens once all of its copies are done."""

    done: list[tuple[Any, Any]] = field(default_factory=list)
    """(device, event) pairs."""
    keep_alive: list[torch.Tensor] = field(default_factory=list)


class DeviceCopier:
    """Issues and tracks the device-to-host copies of snapshots (see the module's docstring)."""

    def __init__(self, runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime or CudaRuntime()
        self._side: dict[torch.device, Any] = {}
        self.in_flight: Snapshot | None = None
        """The newest snapshot whose copies may not be done; the optimizer's pre-hook waits for it."""

    def takes(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is copied through this copier (it lives on an accelerator)."""
        return tensor.device.type != "cpu"

    def start(self, pairs: Sequence[CopyPair], deferrable: Callable[[torch.Tensor], bool]) -> Snapshot:
        """Queue the copies of `pairs`: those `deferrable` takes (the optimizer changes them next) on the side
        stream of their device, the others on the training's stream. Returns at once."""
        snapshot = Snapshot(keep_alive=[source for _, source in pairs])
        for device, on_device in _by_device(pairs).items():
            current = self.runtime.current_stream(device)
            side = self._side.get(device)
            if side is None:
                side = self._side[device] = self.runtime.new_stream(device)
            for target, source in on_device:
                if not deferrable(source):
                    self.runtime.copy(target, source, current)
            # The side stream starts after everything the training queued so far, in-stream copies included.
            queued = self.runtime.new_event(device)
            self.runtime.record(queued, current)
            self.runtime.wait(side, queued)
            for target, source in on_device:
                if deferrable(source):
                    self.runtime.copy(target, source, side)
            done = self.runtime.new_event(device)
            self.runtime.record(done, side)
            snapshot.done.append((device, done))
        self.in_flight = snapshot
        return snapshot

    def hold_until_copied(self) -> None:
        """Before the state is next changed (the optimizer's step): the training's streams wait on the device for
        the snapshot's copies; the host goes on at once."""
        snapshot = self.in_flight
        if snapshot is None:
            return
        for device, done in snapshot.done:
            self.runtime.wait(self.runtime.current_stream(device), done)

    def wait_done(self, snapshot: Snapshot) -> None:
        """The host waits for every copy of `snapshot` (the committer, before it commits)."""
        for _, done in snapshot.done:
            self.runtime.synchronize(done)
        snapshot.keep_alive.clear()
        if self.in_flight is snapshot:
            self.in_flight = None


def _by_device(pairs: Iterable[CopyPair]) -> dict[torch.device, list[CopyPair]]:
    grouped: dict[torch.device, list[CopyPair]] = {}
    for target, source in pairs:
        grouped.setdefault(source.device, []).append((target, source))
    return grouped
