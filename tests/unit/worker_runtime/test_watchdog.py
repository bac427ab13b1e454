"""The collective watchdog fires on a region that outlasts its timeout, and only then."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from phalanx.worker.guards import CollectiveWatchdog, collective_timeout, process_group_timeout


def test_watchdog_fires_on_a_stuck_region_only() -> None:
    fired: list[str] = []
    done = threading.Event()

    def record(label: str, elapsed: float) -> None:
        fired.append(label)
        done.set()

    watchdog = CollectiveWatchdog(
        timeout=0.5, poll_interval=0.05, on_timeout=record, watch_parent=False
    ).start()
    for _ in range(3):
        with watchdog.watch("fast"):
            time.sleep(0.1)
    time.sleep(0.7)  # idle time outside any region never counts
    assert fired == []
    with watchdog.watch("allreduce"):
        assert done.wait(5)
    assert fired == ["allreduce"]


def test_timeouts_come_from_the_environment() -> None:
    assert collective_timeout({"PHALANX_COLLECTIVE_TIMEOUT": "42"}) == 42.0
    assert collective_timeout({"PHALANX_COLLECTIVE_TIMEOUT": "nonsense"}) == 300.0
    assert process_group_timeout({"PHALANX_COLLECTIVE_TIMEOUT": "60"}) == timedelta(seconds=90)
