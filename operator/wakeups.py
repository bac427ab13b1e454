"""Reconciles at heartbeat deadlines: a job whose worker may time out in 0.7 s is looked at then, not at
the next periodic reconcile (up to `reconcileIntervalSeconds` later). One pending wake-up per job."""

from __future__ import annotations

import threading
from collections.abc import Callable

WAKE_MARGIN_SECONDS = 0.05
"""Past the deadline, so the reconcile finds the timeout expired rather than a hair short of it."""


class Wakeups:
    """Per job, at most one timer; scheduling replaces the job's pending one."""

    def __init__(self, horizon_seconds: float) -> None:
        self.horizon_seconds = horizon_seconds
        """Deadlines this far away or more are left to the periodic reconcile."""
        self._timers: dict[tuple[str, str], threading.Timer] = {}
        self._guard = threading.Lock()

    def schedule(self, key: tuple[str, str], after: float | None, wake: Callable[[], None]) -> bool:
        """Call `wake` in `after` seconds (None, or beyond the horizon: no wake-up); True when one is set."""
        timer = None
        if after is not None and after + WAKE_MARGIN_SECONDS < self.horizon_seconds:
            timer = threading.Timer(after + WAKE_MARGIN_SECONDS, self._fire, args=(key, wake))
            timer.daemon = True
        with self._guard:
            previous = self._timers.pop(key, None)
            if timer is not None:
                self._timers[key] = timer
        if previous is not None:
            previous.cancel()
        if timer is not None:
            timer.start()
        return timer is not None

    def _fire(self, key: tuple[str, str], wake: Callable[[], None]) -> None:
        with self._guard:
            if self._timers.get(key) is threading.current_thread():
                del self._timers[key]
        wake()

    def cancel(self, key: tuple[str, str]) -> None:
        with self._guard:
            timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def pending(self) -> int:
        with self._guard:
            return len(self._timers)
