"""The collective watchdog fires on a region that outlasts its timeout, and only then."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from phalanx.worker.exitcodes import TrainerExit
from phalanx.worker.guards import CollectiveWatchdog, collective_timeout, process_group_timeout

STUCK_COLLECTIVE = Path(__file__).with_name("stuck_collective.py")


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


def test_watchdog_ends_a_rank_whose_peer_stopped_taking_part(tmp_path: Path) -> None:
    timeout = 2.0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PHALANX_COLLECTIVE_TIMEOUT": str(timeout),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        output = open(tmp_path / f"rank-{rank}.log", "wb")  # noqa: SIM115 - closed with the process
        ranks.append(
            subprocess.Popen(
                [sys.executable, str(STUCK_COLLECTIVE)], env=env, stdout=output, stderr=subprocess.STDOUT
            )
        )
        output.close()
    try:
        # The group's own timeout is the watchdog's plus 30 s (gloo's default is 30 minutes): the rank
        # must be gone well before that, and with the watchdog's exit code, not a gloo error.
        code = ranks[0].wait(timeout=60)
        output = (tmp_path / "rank-0.log").read_text()
        assert code == TrainerExit.COLLECTIVE_TIMEOUT, output
        assert "rank 0 enters all_reduce" in output and "all_reduce returned" not in output
        stuck = re.search(r"stuck in 'all_reduce' for ([0-9.]+)s", output)
        assert stuck, output
        group_timeout = process_group_timeout({"PHALANX_COLLECTIVE_TIMEOUT": str(timeout)})
        assert timeout <= float(stuck.group(1)) < group_timeout.total_seconds()
        assert ranks[1].poll() is None, "the silent rank should still be sleeping"
    finally:
        for process in ranks:
            process.kill()
            process.wait(timeout=10)
