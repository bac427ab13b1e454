"""The number of active nodes, followed while the job runs (`kubectl scale` within the job's bounds).

The value in force lives in the rendezvous store under `phalanx/max-nodes`, the single source for every
launcher of a round: the first launcher seeds it with its `PHALANX_MAX_NODES`, every launcher reads it
before it joins a round, and the rendezvous handler reads it live (`LiveRendezvousSettings`), so a node
waiting as a standby sees a larger group as room to join.

Each launcher follows the desired count: its TrainingJob, watched (worker/jobwatch.py), or a file, and
looks again every heartbeat interval. When it differs from the store's, the launcher replaces the store's value with compare-and-set: of many launchers
noticing the same change, one wins and acts, the others see the new value and do nothing.
- Growing needs no restart by itself: a standby (or a pod arriving later) finds the group short of the new
  count and enters the wait list, which is the membership change that makes the group re-form once.
- Shrinking restarts the group (the restart epoch), so that it re-forms with fewer active nodes and the
  extra ones stand by.
Spares are not counted: the count is of active nodes only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from phalanx.worker import rendezvous
from phalanx.worker.jobwatch import JobView, Ticker

logger = logging.getLogger("phalanx.launch")

DesiredNodesSource = Callable[[], int | None]
"""Returns the desired number of active nodes, or None when it is not known right now."""


@dataclass(frozen=True)
class MaxNodesChange:
    """What a launcher does when the desired count differs from the one in force."""

    value: int
    """The new number of active nodes."""
    restart: bool
    """Whether the group must re-form now (a shrink); growth re-forms when the new nodes ask to join."""


def plan_max_nodes_change(desired: int | None, in_force: int, min_nodes: int) -> MaxNodesChange | None:
    """The change to publish, or None: unknown desired count, no difference, or below the group's minimum."""
    if desired is None or desired == in_force or desired < min_nodes:
        return None
    return MaxNodesChange(value=desired, restart=desired < in_force)


class StoreMaxNodes:
    """The `max_nodes` in force, read from the store (at most every `ttl` seconds) and kept on errors."""

    def __init__(self, store: Callable[[], dist.Store], initial: int, ttl: float = 0.5) -> None:
        self._store = store
        self._value = initial
        self._raw = str(initial)
        self._read_at = -float("inf")
        self._ttl = ttl
        self._lock = threading.Lock()

    @property
    def raw(self) -> str:
        """The store's value as last read (what a compare-and-set must expect)."""
        return self._raw

    def store(self) -> dist.Store:
        return self._store()

    def refresh(self) -> int:
        """Read the store now (seeding an absent key with the value in force); raises on store errors."""
        raw = rendezvous.read_max_nodes(self._store(), seed=self._value)
        with self._lock:
            parsed = rendezvous.parse_max_nodes(raw)
            if parsed is None:
                logger.warning("ignoring a malformed %r in the rendezvous store", raw)
            else:
                self._value, self._raw = parsed, raw
            self._read_at = time.monotonic()
            return self._value

    def current(self) -> int:
        """The value in force, re-read when the last read is older than the ttl; the last one on errors."""
        if time.monotonic() - self._read_at >= self._ttl:
            try:
                return self.refresh()
            except Exception:  # the rendezvous's own store calls report store trouble
                self._read_at = time.monotonic()
        return self._value


class LiveRendezvousSettings:
    """torch's `RendezvousSettings` with `max_nodes` read from the store on every use.

    torch's join logic compares the participant count with `settings.max_nodes` each time it looks at
    the shared state, so a standby notices a larger group without being restarted.
    """

    def __init__(self, base: Any, max_nodes: Callable[[], int]) -> None:
        self._base = base
        self._max_nodes = max_nodes

    @property
    def max_nodes(self) -> int:
        return self._max_nodes()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def install_live_settings(handler: Any, max_nodes: Callable[[], int]) -> None:
    """Make a `DynamicRendezvousHandler` and the parts that hold its settings read `max_nodes` live."""
    from phalanx.worker import torch_elastic

    live = LiveRendezvousSettings(torch_elastic.handler_settings(handler), max_nodes)
    torch_elastic.replace_handler_settings(handler, live)


class FileDesiredNodes:
    """The desired count from a file holding one integer (running without Kubernetes)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def __call__(self) -> int | None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and int(text) > 0 else None


class MaxNodesFollower(Ticker):
    """Publishes a change of the desired count to the store (one launcher of many wins).

    It looks when woken (a new TrainingJob object) and every `interval` seconds.
    """

    thread_name = "phalanx-max-nodes"
    failure = "cannot follow the desired number of active nodes"

    def __init__(
        self,
        source: DesiredNodesSource,
        in_force: StoreMaxNodes,
        min_nodes: int,
        writer: str,
        interval: float,
    ) -> None:
        super().__init__(interval)
        self.source = source
        self.in_force = in_force
        self.min_nodes = min_nodes
        self.writer = writer

    def tick(self) -> MaxNodesChange | None:
        """One look; returns the change this launcher published, or None."""
        desired = self.source()
        in_force = self.in_force.refresh()
        change = plan_max_nodes_change(desired, in_force, self.min_nodes)
        if change is None:
            if desired is not None and desired < self.min_nodes and desired != in_force:
                self._report(f"desired {desired} active nodes is below the minimum {self.min_nodes}: ignored")
            else:
                self._clear_problem()
            return None
        store = self.in_force.store()
        if not rendezvous.publish_max_nodes(store, self.in_force.raw, change.value, self.writer):
            self.in_force.refresh()  # another launcher published first
            return None
        self.in_force.refresh()
        self._clear_problem()
        logger.info(
            "active nodes %d -> %d%s",
            in_force,
            change.value,
            ": restarting the group" if change.restart else "",
        )
        if change.restart:
            rendezvous.request_restart(store)
        return change

    def start(self) -> MaxNodesFollower:
        super().start()
        return self


def desired_nodes_source(max_nodes_file: str, view: JobView | None) -> DesiredNodesSource | None:
    """Where the desired count comes from: the file if given, else the followed TrainingJob (`view`);
    None: not followed."""
    if max_nodes_file:
        return FileDesiredNodes(max_nodes_file)
    if view is None:
        return None
    from phalanx.worker.lease import desired_replicas_of

    return lambda: desired_replicas_of(view.current() or {})
