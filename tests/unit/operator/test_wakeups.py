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


def test_many_pending_wakeups_hold_one_thread() -> None:
    """1,000 jobs near a deadline once meant 1,000 timer threads, beyond the bound on the operator's threads."""
    calls: list[int] = []
    before = threading.active_count()
    wakeups = Wakeups(horizon_seconds=5)
    for job in range(200):
        wakeups.schedule(("ml", f"job-{job}"), 0.2 + job / 1000, lambda job=job: calls.append(job))
    assert threading.active_count() <= before + 1
    deadline = time.monotonic() + 5
    while len(calls) < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls == list(range(200))  # each once, soonest first
    assert wakeups.pending() == 0


def test_a_wakeup_that_raises_leaves_the_others_to_fire() -> None:
    fired = threading.Event()

    def fails() -> None:
        raise RuntimeError("the queue is shut down")

    wakeups = Wakeups(horizon_seconds=5)
    wakeups.schedule(("ml", "broken"), 0.01, fails)
    wakeups.schedule(("ml", "demo"), 0.1, fired.set)
    assert fired.wait(2)


def test_a_sooner_wakeup_is_not_held_behind_a_later_one() -> None:
    fired = threading.Event()
    wakeups = Wakeups(horizon_seconds=10)
    wakeups.schedule(("ml", "late"), 5.0, lambda: None)
    time.sleep(0.05)  # the thread now waits for the late one
    started = time.monotonic()
    wakeups.schedule(("ml", "soon"), 0.05, fired.set)
    assert fired.wait(2)
    assert time.monotonic() - started < 1.0
    assert wakeups.pending() == 1
