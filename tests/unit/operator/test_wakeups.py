"""Wake-ups at heartbeat deadlines: one per job, replaced by the next reconcile's, left to the periodic
reconcile beyond its interval."""

from __future__ import annotations

import threading
import time

from phalanx.operator.wakeups import Wakeups


def test_a_wakeup_fires_once_after_its_delay() -> None:
    fired = threading.Event()
    wakeups = Wakeups(horizon_seconds=5)
    started = time.monotonic()
    assert wakeups.schedule(("ml", "demo"), 0.1, fired.set)
    assert fired.wait(2)
    assert time.monotonic() - started >= 0.1
    time.sleep(0.05)
    assert wakeups.pending() == 0


def test_the_next_schedule_replaces_the_pending_one() -> None:
    calls: list[str] = []
    wakeups = Wakeups(horizon_seconds=5)
    wakeups.schedule(("ml", "demo"), 0.2, lambda: calls.append("first"))
    wakeups.schedule(("ml", "demo"), 0.05, lambda: calls.append("second"))
    wakeups.schedule(("ml", "other"), 0.05, lambda: calls.append("other job"))
    time.sleep(0.5)
    assert sorted(calls) == ["other job", "second"]


def test_far_or_no_deadlines_are_left_to_the_periodic_reconcile() -> None:
    calls: list[str] = []
    wakeups = Wakeups(horizon_seconds=1)
    wakeups.schedule(("ml", "demo"), 0.1, lambda: calls.append("near"))
    assert not wakeups.schedule(("ml", "demo"), 2.0, lambda: calls.append("far"))
    assert not wakeups.schedule(("ml", "other"), None, lambda: calls.append("none"))
    wakeups.schedule(("ml", "gone"), 0.1, lambda: calls.append("gone"))
    wakeups.cancel(("ml", "gone"))
    time.sleep(0.3)
    assert calls == [] and wakeups.pending() == 0
