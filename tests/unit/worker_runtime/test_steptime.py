"""The straggler signal (worker/steptime.py): compute time is the step less the wait for peers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from localjob import free_port

from phalanx.worker.heartbeat import StatusRecord, read_records
from phalanx.worker.steptime import StepClock, StepTiming


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waits_at_sync_points_are_taken_out_of_the_step() -> None:
    time = FakeTime()
    waits = iter([0.75, 0.05])

    def all_reduce() -> None:
        time.now += next(waits)

    clock = StepClock(now=time, all_reduce=all_reduce)
    clock.start()
    time.now += 0.2  # own work
    assert clock.sync_point() == pytest.approx(0.75)
    time.now += 0.1
    assert clock.sync_point() == pytest.approx(0.05)
    time.now += 0.3
    timing = clock.stop()
    assert timing.step_seconds == pytest.approx(1.4)
    assert timing.wait_seconds == pytest.approx(0.8)
    assert timing.compute_seconds == pytest.approx(0.6)
    assert clock.last == timing

    # A new step starts from nothing; waits of an unfinished step are dropped.
    clock.start()
    time.now += 0.5
    assert clock.stop() == StepTiming(step_seconds=pytest.approx(0.5), wait_seconds=0.0)


def test_compute_time_is_never_negative_and_stop_needs_a_start() -> None:
    assert StepTiming(step_seconds=1.0, wait_seconds=1.2).compute_seconds == 0.0
    with pytest.raises(RuntimeError):
        StepClock(now=FakeTime(), all_reduce=lambda: None).stop()


def test_without_a_process_group_a_sync_point_waits_for_nobody() -> None:
    clock = StepClock()
    clock.start()
    assert clock.sync_point() >= 0.0
    assert clock.stop().wait_seconds < 1.0


def test_the_slowed_pod_shows_more_compute_while_step_times_are_alike(tmp_path: Path) -> None:
    """Three real gloo processes of the example, one slowed through the pod template's variables."""
    world, slow = 3, 0.6
    port = free_port()
    processes = []
    for rank in range(world):
        status = tmp_path / f"status-{rank}"
        status.mkdir()
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "OMP_NUM_THREADS": "1",
            "POD_NAME": f"pod-{rank}",
            "PHALANX_STATUS_DIR": str(status),
            "PHALANX_SNAPSHOT_DIR": str(tmp_path / f"shm-{rank}"),
            "PHALANX_EXAMPLE_SLOW_POD": "pod-1",
            "PHALANX_EXAMPLE_SLOW_SECONDS": str(slow),
        }
        command = [
            sys.executable,
            "-m",
            "phalanx.worker.examples.tinygpt",
            "--steps",
            "6",
            "--global-batch",
            "12",
            "--checkpoint-interval",
            "1000",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
        output = open(tmp_path / f"rank-{rank}.log", "wb")  # noqa: SIM115 - closed below
        processes.append(subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT))
        output.close()
    for rank, process in enumerate(processes):
        try:
            code = process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert code == 0, (tmp_path / f"rank-{rank}.log").read_text()[-3000:]

    records: list[StatusRecord] = [read_records(tmp_path / f"status-{rank}")[0] for rank in range(world)]
    assert all(record.step == 6 and record.phase == "finished" for record in records)
    assert all((record.restored_step, record.restore_source) == (0, "none") for record in records)
    assert all(record.resumed_at is not None for record in records)
    computes = [record.compute_seconds or 0.0 for record in records]
    steps = [record.step_seconds or 0.0 for record in records]
    # The slowed pod worked `slow` seconds more; the others waited about as long for it.
    assert computes[1] >= slow, records
    assert max(computes[0], computes[2]) < computes[1] - slow / 2, records
    assert max(steps) - min(steps) < slow / 2, records
