"""Live regroup (worker/livegroup.py): survivors keep their training processes across a recovery."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from localjob import LocalJob, wait_for

from phalanx.worker import livegroup

EXAMPLE = ["--steps", "45", "--step-delay", "0.1", "--global-batch", "16"]


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_survivor_keeps_its_training_process_when_the_spare_replaces_a_killed_node(job: LocalJob) -> None:
    job.start_pair_with_spare(EXAMPLE, trained=12)
    survivor_pids = [process.pid for process in job.trainers("a")]
    assert len(survivor_pids) == 1

    step_before_kill = job.last_step()
    job.kill_node("b")
    wait_for(lambda: job.last_step() > step_before_kill + 2, 90, "training to go on after the kill")
    assert [process.pid for process in job.trainers("a")] == survivor_pids, job.node_output("a")
    job.assert_spare_finished_from_memory(45, step_before_kill)
    assert "training processes kept" in job.node_output("a")


def test_without_live_regroup_the_survivor_restarts_its_training_process(job: LocalJob) -> None:
    job.start_node("a", EXAMPLE, launcher_args=["--no-live-regroup"])
    job.start_node("b", EXAMPLE, launcher_args=["--no-live-regroup"])
    wait_for(lambda: job.last_step() >= 8, 90, "the group to train")
    survivor_pids = [process.pid for process in job.trainers("a")]
    victim = job.trainers("b")
    victim[0].kill()
    step_before_kill = job.last_step()
    wait_for(lambda: job.last_step() > step_before_kill + 2, 90, "training to go on after the kill")
    assert [process.pid for process in job.trainers("a")] != survivor_pids
    assert job.wait_node("a", 120) == 0, job.node_output("a")
    assert job.wait_node("b", 120) == 0, job.node_output("b")
    assert "training processes kept" not in job.node_output("a")


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_a_new_node_joins_a_running_group_without_restarting_it(job: LocalJob) -> None:
    # Steps enough for the second node to start and import torch on a busy machine before the first is done.
    example = ["--steps", "150", "--step-delay", "0.1", "--global-batch", "16"]
    job.start_node("a", example, nnodes="1:2")
    wait_for(lambda: job.last_step() >= 5, 90, "the first node to train alone")
    first_pids = [process.pid for process in job.trainers("a")]
    job.start_node("b", example, nnodes="1:2")

    def grown() -> bool:
        assert job.nodes["a"].poll() is None, "the first node finished alone:\n" + job.node_output("b")
        return any(record.get("world_size") == 2 for record in job.steps())

    wait_for(grown, 90, "the group to grow to two")
    # The running process left its group at a step boundary and joined the bigger one.
    assert [process.pid for process in job.trainers("a")] == first_pids, job.node_output("a")
    assert job.wait_node("a", 120) == 0, job.node_output("a")
    assert job.wait_node("b", 120) == 0, job.node_output("b")
    assert job.any_summary()["final_step"] == 150


def test_leave_is_asked_once_per_group(tmp_path: Path) -> None:
    member = livegroup.LiveGroup(tmp_path, local_rank=0, attempt=3)
    assert not member.leave_requested()
    livegroup.request_leave(tmp_path, 2)  # an older group's request
    assert not member.leave_requested()
    os.utime(livegroup.leave_file(tmp_path), (1, 1))  # a change of the file, whatever the clock's grain
    livegroup.request_leave(tmp_path, 3)
    assert member.leave_requested()
    assert not member.leave_requested()  # seen: the next step does not leave again


def test_a_member_that_left_waits_for_a_later_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_GROUP_ATTEMPT", "4")
    member = livegroup.LiveGroup(tmp_path, local_rank=1, attempt=4, assign_timeout=0.2)
    livegroup.assign(tmp_path, 1, 4, {"RANK": "0"})  # the group it left: not the next one
    with pytest.raises(TimeoutError, match="after leaving group 4"):
        member.next_assignment()
    livegroup.assign(tmp_path, 1, 5, {"RANK": "1", "PHALANX_GROUP_ATTEMPT": "5"})
    assert member.next_assignment() == {"RANK": "1", "PHALANX_GROUP_ATTEMPT": "5"}


def test_the_launcher_reads_what_its_processes_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PHALANX_GROUP_ATTEMPT", "2")
    member = livegroup.LiveGroup(tmp_path, local_rank=0)
    member.join(timeout=timedelta(seconds=5))  # no group named: it joins none
    assert livegroup.joined_attempt(tmp_path, 0) == 2
    assert livegroup.left_attempt(tmp_path, 0) is None
    member.leave("Connection closed by peer")
    assert livegroup.left_attempt(tmp_path, 0) == 2
    assert livegroup.left_reason(tmp_path, 0) == "Connection closed by peer"
    livegroup.clear(tmp_path)
    assert livegroup.joined_attempt(tmp_path, 0) is None


def test_only_a_lost_peer_is_a_reason_to_regroup() -> None:
    assert livegroup.peer_lost(RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234"))
    assert livegroup.peer_lost(RuntimeError("Connection reset by peer"))
    assert not livegroup.peer_lost(RuntimeError("CUDA out of memory"))
    assert not livegroup.peer_lost(ValueError("shape mismatch"))


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_a_survivor_stuck_with_a_frozen_peer_is_restarted_at_once(job: LocalJob) -> None:
    job.start_pair_with_spare(EXAMPLE, trained=8)
    frozen = [
        psutil.Process(job.nodes["b"].pid),
        *psutil.Process(job.nodes["b"].pid).children(recursive=True),
    ]
    for process in frozen:
        process.send_signal(signal.SIGSTOP)
    try:
        step = job.last_step()
        time.sleep(2.0)  # the survivor waits in a collective for its frozen peer
        store = dist.TCPStore("127.0.0.1", job.port, is_master=False, timeout=timedelta(seconds=10))
        store.add("phalanx/restart-epoch", 1)  # what the operator's regroup request leads to
        wait_for(lambda: job.last_step() > step + 2, 90, "training to go on without the frozen node")
        output = job.node_output("a")
        # The survivor's own rank is the one it names: its trainer is the one left waiting in the step.
        survivor_rank = re.search(r"group attempt 1 \(start\): rank (\d+) of", output)
        assert survivor_rank is not None, output
        expected = f"training processes restarted, not kept: rank {survivor_rank.group(1)} has been in step"
        assert expected in output, output
        assert "did not leave group" not in output  # no leave timeout was waited out
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)


class StuckGroup:
    """A group of an NCCL-like backend whose collective waits for a peer that is gone: only an abort ends it
    before its timeout."""

    _device_types = [torch.device("cuda")]

    def __init__(self) -> None:
        self.aborts = 0
        self._aborted = threading.Event()

    def abort(self) -> None:
        self.aborts += 1
        self._aborted.set()

    def all_reduce(self) -> None:
        if not self._aborted.wait(60):
            raise TimeoutError("the collective's timeout")
        raise RuntimeError("NCCL communicator was aborted on rank 0")


def _stuck_collective(group: StuckGroup) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            group.all_reduce()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def test_a_collective_stuck_on_a_lost_peer_is_released_by_the_abort_when_the_launcher_asks(
    tmp_path: Path,
) -> None:
    group = StuckGroup()
    releaser = livegroup.Releaser(tmp_path, attempt=3, process_group=group)
    releaser.start()
    stuck, raised = _stuck_collective(group)
    livegroup.request_leave(tmp_path, 2)  # an older group's request: not this one's
    time.sleep(5 * livegroup.RELEASE_POLL_SECONDS)
    assert group.aborts == 0 and stuck.is_alive()

    livegroup.request_leave(tmp_path, 3)
    stuck.join(30)
    assert not stuck.is_alive() and releaser.aborted and group.aborts == 1
    assert isinstance(raised[0], RuntimeError) and livegroup.peer_lost(raised[0]), raised
    releaser.join(5)


def test_leaving_tells_the_launcher_before_the_teardown_and_aborts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = StuckGroup()
    member = livegroup.LiveGroup(tmp_path, local_rank=0, attempt=3)
    releaser = livegroup.Releaser(tmp_path, attempt=3, process_group=group)
    member._releaser = releaser
    releaser.start()
    livegroup.request_leave(tmp_path, 3)
    stuck, _ = _stuck_collective(group)
    stuck.join(30)
    left_when_torn_down: list[int | None] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: group)
    monkeypatch.setattr(
        dist, "destroy_process_group", lambda: left_when_torn_down.append(livegroup.left_attempt(tmp_path, 0))
    )
    member.leave("a peer was lost")
    # The launcher forms the next group while the old one is torn down; the releaser's abort is not repeated.
    assert left_when_torn_down == [3] and group.aborts == 1


def test_only_groups_that_take_cuda_tensors_are_released_by_abort_or_bound_to_a_device() -> None:
    assert livegroup.releases_by_abort(StuckGroup())
    assert not livegroup.releases_by_abort(type("GlooGroup", (), {"_device_types": [torch.device("cpu")]})())
    assert livegroup.eager_device("gloo", 0) is None
    if not torch.cuda.is_available():
        assert livegroup.eager_device("nccl", 0) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_nccl_group_is_bound_to_the_processs_gpu() -> None:
    assert livegroup.eager_device("nccl", 0) == torch.device("cuda", 0)
    assert livegroup.eager_device("cpu:gloo,cuda:nccl", 0) == torch.device("cuda", 0)
