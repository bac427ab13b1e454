"""Reconciles at heartbeat deadlines: a job whose worker may time out in 0.7 s is looked at then, not at
the next periodic reconcile (up to `reconcileIntervalSeconds` later). One pending wake-up per job, all of them
kept by one thread: a wake-up only queues its job's reconcile (operator/jobqueue.py), so it never holds that
thread for long, and 1,000 jobs near a deadline cost one thread, not 1,000 timers' threads."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

LOGGER = logging.getLogger(__name__)

WAKE_MARGIN_SECONDS = 0.05
"""Past the deadline, so the reconcile finds the timeout expired rather than a hair short of it."""

_Key = tuple[str, str]


class Wakeups:
    """Per job, at most one wake-up; scheduling replaces the job's pending one."""

    def __init__(self, horizon_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.horizon_seconds = horizon_seconds
        """Deadlines this far away or more are left to the periodic reconcile."""
        self._clock = clock
        self._pending: dict[_Key, tuple[int, Callable[[], None]]] = {}
        """Per job, the ticket of its pending wake-up and what it calls."""
        self._due: list[tuple[float, int, _Key]] = []
        """(when, ticket, job), soonest first; an entry whose ticket is no longer its job's was replaced."""
        self._tickets = itertools.count()
        self._guard = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, key: _Key, after: float | None, wake: Callable[[], None]) -> bool:
        """Call `wake` in `after` seconds (None, or beyond the horizon: no wake-up); True when one is set."""
        wanted = after is not None and after + WAKE_MARGIN_SECONDS < self.horizon_seconds
        with self._guard:
            if not wanted:
                self._pending.pop(key, None)
                return False
            assert after is not None
            ticket = next(self._tickets)
            self._pending[key] = (ticket, wake)
            heapq.heappush(self._due, (self._clock() + after + WAKE_MARGIN_SECONDS, ticket, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="phalanx-wakeups", daemon=True)
                self._thread.start()
            self._guard.notify()
        return True

    def cancel(self, key: _Key) -> None:
        with self._guard:
            self._pending.pop(key, None)

    def pending(self) -> int:
        with self._guard:
            return len(self._pending)

    def _next_due(self) -> Callable[[], None]:
        """Wait for the soonest wake-up still pending and take it."""
        with self._guard:
            while True:
                # Replaced and cancelled wake-ups leave their entries behind: drop them as they come up.
                while self._due and self._pending.get(self._due[0][2], (None,))[0] != self._due[0][1]:
                    heapq.heappop(self._due)
                if not self._due:
                    self._guard.wait()
                    continue
                when, _, key = self._due[0]
                left = when - self._clock()
                if left > 0:
                    self._guard.wait(left)
                    continue
                heapq.heappop(self._due)
                return self._pending.pop(key)[1]

    def _run(self) -> None:
        while True:
            wake = self._next_due()
            try:
                wake()
            except Exception:  # one job's failed wake-up must not stop the others'
                LOGGER.exception("a heartbeat-deadline wake-up failed")
