"""The launcher's verdicts on its training processes: stopped at once, hung against their own step times."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from phalanx.worker import launch, livegroup, trainerwatch
from phalanx.worker.env import settings_from
from phalanx.worker.heartbeat import (
    PodStatus,
    RenewalSchedule,
    StatusRecord,
    lease_annotations,
    status_file,
    write_record,
)
from phalanx.worker.metrics import PodMetrics
from phalanx.worker.trainerwatch import (
    HUNG,
    MIN_SAMPLES,
    STOP_CONFIRM_SECONDS,
    STOPPED,
    RankClock,
    TrainerWatch,
    hang_threshold,
    percentile,
    process_state,
)


def training(step: int, at: float, attempt: int = 1, rank: int = 0) -> StatusRecord:
    """The record of a rank that just reached `step` (tinygpt publishes phase and step together)."""
    return StatusRecord(
        phase="training",
        phase_since=at,
        step=step,
        step_at=at,
        attempt=attempt,
        rank=rank,
        updated=at,
        pid=100,
    )


def saving(step: int, at: float, since: float, attempt: int = 1) -> StatusRecord:
    return StatusRecord(
        phase="saving",
        phase_since=since,
        step=step,
        step_at=at,
        attempt=attempt,
        rank=0,
        updated=since,
        pid=100,
    )


def test_process_state_reads_the_letter_after_the_command_name(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (python (worker) x) T 1 42 42 0 -1")
    assert process_state(42, tmp_path) == "T"
    assert process_state(43, tmp_path) is None


def test_process_state_of_this_process_is_running_or_sleeping() -> None:
    import os

    assert process_state(os.getpid()) in {"R", "S"}


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 99)


def test_hang_threshold_is_a_multiple_of_the_p99_with_a_floor_and_the_save_time() -> None:
    steps = [0.3] * MIN_SAMPLES
    threshold = hang_threshold(steps, factor=5, floor=1.0)
    assert threshold is not None and threshold.seconds == pytest.approx(1.5)
    assert threshold.basis.startswith("5x p99 of 0.3s")
    fast = hang_threshold([0.05] * MIN_SAMPLES, factor=5, floor=1.0)
    assert fast is not None and fast.seconds == 1.0 and fast.basis.startswith("floor 1s")
    saved = hang_threshold(steps, factor=5, floor=1.0, save_seconds=0.5)
    assert saved is not None and saved.seconds == pytest.approx(2.0) and "save 0.5s" in saved.basis


def test_hang_threshold_waits_for_enough_samples_and_is_off_with_factor_zero() -> None:
    assert hang_threshold([0.3] * (MIN_SAMPLES - 1), factor=5, floor=1.0) is None
    assert hang_threshold([0.3] * MIN_SAMPLES, factor=0, floor=1.0) is None


def test_rank_clock_samples_the_time_to_each_step_without_the_save() -> None:
    clock = RankClock()
    clock.observe(training(1, 100.0))
    # The save of step 2 began at 100.3 and lasted 2 s: only the 0.3 s before it is a sample.
    clock.observe(saving(1, 100.0, since=100.3))
    clock.observe(training(2, 102.3))
    assert list(clock.samples) == [pytest.approx(0.3)]
    # The wait runs from the new step, not from before the save.
    assert clock.waited(102.8) == pytest.approx(0.5)


def test_rank_clock_splits_a_gap_over_the_steps_it_missed_and_stops_outside_training() -> None:
    clock = RankClock()
    clock.observe(training(1, 10.0))
    clock.observe(training(4, 10.6))
    assert list(clock.samples) == [pytest.approx(0.2)] * 3
    clock.observe(saving(4, 10.6, since=10.7))
    assert clock.waited(30.0) is None


def test_rank_clock_starts_over_with_a_new_group_attempt() -> None:
    clock = RankClock()
    for step in range(1, 5):
        clock.observe(training(step, float(step)))
    assert len(clock.samples) == 3
    clock.observe(training(3, 50.0, attempt=2))
    assert len(clock.samples) == 0 and clock.waited(51.0) == pytest.approx(1.0)


def steady(watch: TrainerWatch, steps: int, seconds: float = 0.3) -> float:
    """Feed `steps` regular steps; the time of the last one."""
    at = 1000.0
    for step in range(1, steps + 1):
        at = 1000.0 + step * seconds
        assert watch.observe({0: training(step, at)}, {100: "S"}, {100: 0}, None, at) is None
    return at


def test_a_rank_that_reaches_no_step_past_its_threshold_is_hung() -> None:
    watch = TrainerWatch(factor=5, floor=1.0)
    last = steady(watch, MIN_SAMPLES + 2)
    assert watch.threshold is not None and watch.threshold.seconds == pytest.approx(1.5)
    record = training(MIN_SAMPLES + 2, last)
    assert watch.observe({0: record}, {100: "S"}, {100: 0}, None, last + 1.4) is None
    verdict = watch.observe({0: record}, {100: "S"}, {100: 0}, None, last + 1.6)
    assert verdict is not None and verdict.kind == HUNG and verdict.rank == 0
    assert verdict.since == pytest.approx(last)
    assert "no step for 1.60s in training" in verdict.message and "5x p99 of 0.3s" in verdict.message


def test_a_save_longer_than_the_threshold_is_no_hang() -> None:
    watch = TrainerWatch(factor=5, floor=1.0)
    last = steady(watch, MIN_SAMPLES + 2)
    step = MIN_SAMPLES + 2
    record = saving(step, last, since=last + 0.2)
    assert watch.observe({0: record}, {100: "S"}, {100: 0}, None, last + 30.0) is None


def test_no_hang_is_judged_before_enough_steps_of_the_group() -> None:
    watch = TrainerWatch(factor=5, floor=1.0)
    last = steady(watch, MIN_SAMPLES - 1)
    record = training(MIN_SAMPLES - 1, last)
    assert watch.observe({0: record}, {100: "S"}, {100: 0}, None, last + 60.0) is None
    assert watch.threshold is None


def test_a_stopped_process_is_reported_once_it_stays_stopped() -> None:
    watch = TrainerWatch(factor=5, floor=1.0)
    record = training(1, 10.0, rank=3)
    assert watch.observe({3: record}, {100: "T"}, {100: 3}, None, 11.0) is None
    # A brief tracing stop (a debugger's attach) that ended is forgotten.
    assert watch.observe({3: record}, {100: "S"}, {100: 3}, None, 11.2) is None
    assert watch.observe({3: record}, {100: "t"}, {100: 3}, None, 12.0) is None
    verdict = watch.observe({3: record}, {100: "t"}, {100: 3}, None, 12.0 + STOP_CONFIRM_SECONDS)
    assert verdict is not None and verdict.kind == STOPPED and verdict.rank == 3 and verdict.since == 12.0
    assert "rank 3 (pid 100) is stopped" in verdict.message


def test_reset_forgets_the_group() -> None:
    watch = TrainerWatch(factor=5, floor=1.0)
    steady(watch, MIN_SAMPLES + 2)
    watch.reset()
    assert watch.threshold is None


def test_the_lease_carries_the_verdict_and_the_threshold() -> None:
    status = PodStatus(
        phase="training",
        fault="hung",
        fault_rank=1,
        fault_since=101.5,
        fault_message="rank 1: no step",
        hang_threshold=1.4,
        hang_basis="5x p99 of 0.28s over 40 steps",
    )
    annotations = lease_annotations(status)
    assert annotations["phalanx.dev/fault"] == "hung"
    assert annotations["phalanx.dev/fault-rank"] == "1"
    assert annotations["phalanx.dev/fault-since"].startswith("1970-01-01T00:01:41.5")
    assert annotations["phalanx.dev/hang-threshold"] == "1.4"
    assert annotations["phalanx.dev/hang-basis"] == "5x p99 of 0.28s over 40 steps"
    assert lease_annotations(PodStatus(phase="training"))["phalanx.dev/fault"] == ""


def test_a_new_verdict_renews_the_lease_promptly() -> None:
    schedule = RenewalSchedule(interval=5.0, min_gap=0.2)
    assert schedule.due(0.0, "training", None)
    schedule.renewed(0.0)
    assert not schedule.due(1.0, "training", None)
    assert schedule.due(1.0, "training", None, trainerwatch.STOPPED)
    schedule.renewed(1.0)
    assert not schedule.due(1.5, "training", None, trainerwatch.STOPPED)


def test_time_in_training_before_a_save_without_a_new_step_still_counts() -> None:
    clock = RankClock()
    clock.observe(training(1, 0.0))
    clock.observe(saving(1, 0.0, since=0.4))
    back = StatusRecord(phase="training", phase_since=5.0, step=1, step_at=0.0, attempt=1, updated=5.0)
    clock.observe(back)
    assert clock.waited(5.5) == pytest.approx(0.9)
    clock.observe(training(2, 5.6))
    assert list(clock.samples) == [pytest.approx(1.0)]


def _running_reporter(tmp_path: Path) -> launch.PodReporter:
    env = {"PHALANX_RDZV_ENDPOINT": "rdzv.ns.svc:29400", "PHALANX_JOB_UID": "uid-9", "POD_IP": "127.0.3.4"}
    reporter = launch.PodReporter(
        settings_from(env, {"command": ("python", "train.py")}), tmp_path, PodMetrics()
    )
    reporter.attempt = 1
    reporter.launcher_phase = None  # the group runs
    return reporter


def _judged_after_steady_steps(reporter: launch.PodReporter) -> str | None:
    """The reporter's verdict on a rank that made regular steps long ago and none since."""
    base = time.time() - 100.0
    status = PodStatus(phase="training")
    for step in range(1, MIN_SAMPLES + 3):
        reporter._judge(status, [training(step, base + step * 0.1)])
    return reporter._judge(status, [training(MIN_SAMPLES + 2, base + (MIN_SAMPLES + 2) * 0.1)]).fault


def test_a_launcher_that_stood_still_holds_its_verdict_for_a_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _judged_after_steady_steps(_running_reporter(tmp_path)) == HUNG
    # The same rank seen right after the launcher itself was stopped for a while: its agent looks at the group
    # (re-formed without this node, say) before the training processes are judged.
    stalled = _running_reporter(tmp_path)
    real = time.monotonic
    monkeypatch.setattr(launch.time, "monotonic", lambda: real() + launch.STALL_GAP_SECONDS + 1)
    assert _judged_after_steady_steps(stalled) is None
    monkeypatch.setattr(
        launch.time, "monotonic", lambda: real() + launch.STALL_GAP_SECONDS + 1 + launch.STALL_GRACE_SECONDS
    )
    assert (
        stalled._judge(PodStatus(phase="training"), [training(MIN_SAMPLES + 2, time.time() - 90)]).fault
        == HUNG
    )


def test_a_process_that_left_its_group_waits_for_the_next_one_and_is_not_judged(tmp_path: Path) -> None:
    reporter = _running_reporter(tmp_path)
    livegroup.assign(tmp_path, 0, 1, {})  # any file of the exchange; only the left one counts
    assert _judged_after_steady_steps(reporter) == HUNG
    (tmp_path / "live-left-0.json").write_text('{"attempt": 1, "reason": "a peer left"}')
    assert _judged_after_steady_steps(reporter) is None
    assert reporter.current().phase == "rendezvous"
    # A process that left an earlier group says nothing of this one.
    reporter.attempt = 2
    assert not reporter.group_left()


def _finished(pid: int, since: float, rank: int = 0) -> StatusRecord:
    return StatusRecord(
        phase="finished", phase_since=since, step=30, attempt=1, rank=rank, updated=since, pid=pid
    )


def test_a_group_whose_processes_all_finished_long_ago_but_still_run_is_over(tmp_path: Path) -> None:
    """`finished` comes after a run's last save: processes still there `finished_grace` seconds later hang in a
    teardown (a collective library's, the interpreter's exit), and the launcher ends them. One still training,
    one without a record, or a grace not yet out: the group goes on."""
    env = {"PHALANX_RDZV_ENDPOINT": "rdzv:29400", "PHALANX_FINISHED_GRACE": "30"}
    settings = settings_from(env, {"command": ("python", "train.py"), "nproc_per_node": 2})
    agent = launch.PhalanxAgent.__new__(launch.PhalanxAgent)
    agent._settings = settings
    agent._reporter = launch.PodReporter(settings, tmp_path, PodMetrics())
    pids = [os.getpid(), 1]
    agent.training_pids = lambda: pids  # type: ignore[method-assign]
    write_record(status_file(tmp_path, 0), _finished(pids[0], since=1000.0))
    assert agent._lingering_after_finish(now=1100.0) is None  # rank 1 wrote nothing yet
    write_record(status_file(tmp_path, 1), training(29, at=1000.0, rank=1))
    assert agent._lingering_after_finish(now=1100.0) is None
    write_record(status_file(tmp_path, 1), _finished(pids[1], since=1010.0, rank=1))
    assert agent._lingering_after_finish(now=1039.0) is None  # the last one finished 29 s ago
    why = agent._lingering_after_finish(now=1041.0)
    assert why is not None and why.startswith("every one published 'finished' 31s ago and still runs"), why
    assert f"pid {os.getpid()} state R, threads: " in why, why
    pids.clear()
    assert agent._lingering_after_finish(now=1041.0) is None  # no group runs


def test_where_a_process_waits_names_its_state_and_its_threads_wait_points(tmp_path: Path) -> None:
    task = tmp_path / "41" / "task"
    for thread, wchan in [
        ("41", "do_poll"),
        ("42", "futex_wait_queue"),
        ("43", "futex_wait_queue"),
        ("44", "0"),
    ]:
        (task / thread).mkdir(parents=True)
        (task / thread / "wchan").write_text(wchan)
    (tmp_path / "41" / "stat").write_text("41 (python3 (x)) S 1 2 3")
    assert trainerwatch.where_it_waits(41, tmp_path) == (
        "state S, threads: do_poll x1, futex_wait_queue x2, running x1"
    )
    assert trainerwatch.where_it_waits(99, tmp_path) == "gone"
