"""Changes to the job's store that the launchers must act on, announced, so that an idle launcher need not poll.

A running launcher must learn at once when the operator asks its group to restart (the restart epoch) or when
the group begins to re-form (a member checked in to the next round, or a pod queued to join). Read by polling,
that costs every launcher a few store round trips each monitor interval: at 12,500 pods and 0.2 s, over
60,000 requests a second, all through the job's one store and its gate. Instead each writer of such a change
announces it: it counts the event (`EVENTS_KEY`) and sets that event's marker key. Each launcher keeps one
thread (`StoreEvents`) blocked in the store's own `wait` on the next marker, on a connection of its own, and
looks at the store only when an event came. A look that no event asked for is still made, in case a writer
did not announce (torch's c10d rendezvous, a person with `phalanx restart`), but at most every
`idle_look_interval`: all launchers together look about `IDLE_LOOKS_PER_SECOND` times a second whatever the
job's size, and a job of up to 100 pods looks every monitor interval, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

EVENTS_KEY = "phalanx/events"
"""How many events were announced (a counter: `add`)."""
IDLE_LOOKS_PER_SECOND = 500.0
"""The looks per second that all the launchers of a job make together when no event comes."""
WATCH_SLICE = 30.0
"""The least seconds one wait for the next event lasts before the watcher reads the count again (a writer that
died between counting its event and setting its marker would otherwise hide every later event)."""
RECONNECT_PAUSE = 1.0


def event_key(number: int) -> str:
    return f"{EVENTS_KEY}/{number}"


def announce(store: Any) -> int:
    """Say that the store changed in a way the launchers must look at (after the change is written); returns
    the event's number."""
    number = int(store.add(EVENTS_KEY, 1))
    store.set(event_key(number), "")
    return number


def idle_look_interval(max_nodes: int, monitor_interval: float) -> float:
    """Seconds between two looks at the store that no event asked for."""
    return max(monitor_interval, max_nodes / IDLE_LOOKS_PER_SECOND)


class StoreEvents:
    """One launcher's watcher of the announced events: a daemon thread on its own store connection (a wait
    holds the connection it waits on). `due()` says when the launcher should look at the store."""

    def __init__(self, connect: Callable[[], Any], idle_interval: float) -> None:
        """`connect`: a new connection to the job's store (called again after the store was lost)."""
        self._connect = connect
        self.idle_interval = idle_interval
        self._came = threading.Event()
        self._came.set()  # the first look is due at once
        self._watching = threading.Event()
        self._stopped = threading.Event()
        self._looked_at = -float("inf")
        self._thread = threading.Thread(target=self._watch, name="phalanx-store-events", daemon=True)

    def start(self) -> StoreEvents:
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread.is_alive() or self._stopped.is_set()

    def close(self) -> None:
        """Stop watching (the thread ends after its current wait, at most `WATCH_SLICE` later)."""
        self._stopped.set()

    @property
    def watching(self) -> bool:
        """Whether the watcher waits on the store now (not while it has no connection)."""
        return self._watching.is_set()

    def due(self) -> bool:
        """Whether the launcher should look at the store now: an event came since its last look, the watcher
        cannot watch (every call is due then, as without it), or the idle interval has passed. A True answer
        counts as the look: call it right before looking."""
        now = time.monotonic()
        if self._came.is_set() or not self.watching or now - self._looked_at >= self.idle_interval:
            # Cleared before the look, so an event during the look asks for the next one.
            self._came.clear()
            self._looked_at = now
            return True
        return False

    def _watch(self) -> None:
        store: Any = None
        seen = 0
        while not self._stopped.is_set():
            try:
                if store is None:
                    store = self._connect()
                    seen = int(store.add(EVENTS_KEY, 0))
                    self._came.set()  # anything announced while it had no connection
                    self._watching.set()
                if self._wait(store, event_key(seen + 1)):
                    seen = int(store.add(EVENTS_KEY, 0))
                    self._came.set()
                    continue
                # No event within the slice; the count moves anyway if a writer never set its marker, and
                # falls back if the store restarted empty.
                count = int(store.add(EVENTS_KEY, 0))
                if count != seen:
                    seen = count
                    self._came.set()
            except Exception as error:  # the store is gone or restarting: every look is due until it is back
                if self._watching.is_set():
                    logger.info("store events: not watching (%s); looking at every monitor tick", error)
                self._watching.clear()
                store = None
                self._stopped.wait(RECONNECT_PAUSE)

    def _wait(self, store: Any, key: str) -> bool:
        return wait_for_key(store, key, max(WATCH_SLICE, self.idle_interval))


def wait_for_key(store: Any, key: str, seconds: float) -> bool:
    """Wait in the store until `key` exists; False when `seconds` passed first. Other errors are raised."""
    try:
        store.wait([key], timedelta(seconds=seconds))
    except Exception as error:  # DistStoreError on a timeout; anything else is not ours to hide
        if "timeout" in str(error).lower() or "timed out" in str(error).lower():
            return False
        raise
    return True
