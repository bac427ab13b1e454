"""The goodput benchmark's analysis: productive vs lost time, and every lost second attributed."""

from __future__ import annotations

import random

import pytest

from phalanx.bench import faults, goodput
from phalanx.bench.core import BenchResult, Metric, Series, Target
from phalanx.bench.goodput import FailureTimes, Point

T0 = 1_800_000_000.0


def steady_points(first: int, last: int, start: float, step_seconds: float = 1.0) -> list[Point]:
    return [Point(start + (step - first) * step_seconds, step) for step in range(first, last + 1)]


def test_steady_training_is_all_productive() -> None:
    result = goodput.attribute(steady_points(0, 100, T0), [], checkpoint_interval=50)
    assert result.goodput == pytest.approx(1.0)
    assert sum(result.lost.values()) == pytest.approx(0.0)


def test_a_failure_is_split_by_cause_and_the_parts_add_up_to_the_loss() -> None:
    # Steps 0..40 one a second, a kill at 40.5 s, detected at 41, a new group at 46, restored at 52, and
    # the first step after the resume (step 39 again: steps 39 and 40 are replayed) done at 53.
    before = steady_points(0, 40, T0)
    after = steady_points(39, 80, T0 + 53)
    failure = FailureTimes("kill", "w0", T0 + 40.5, detected=T0 + 41, group=T0 + 46, restored=T0 + 52)
    failure.resumed = T0 + 53
    result = goodput.attribute(before + after, [failure], checkpoint_interval=None)
    assert result.step_seconds == pytest.approx(1.0)
    assert result.wall == pytest.approx(53 + 41)
    assert result.steps == 80
    lost = result.lost
    assert lost["detection"] == pytest.approx(0.5)
    assert lost["replacement + rendezvous"] == pytest.approx(5.0)
    assert lost["restore (trainer restart, state load)"] == pytest.approx(6.0)
    assert lost["first step overhead"] == pytest.approx(0.0)
    # Half a step in flight, plus steps 39 and 40 done twice.
    assert lost["step in flight + replayed steps"] == pytest.approx(0.5 + 2.0)
    assert sum(lost.values()) == pytest.approx(result.wall - result.productive)
    assert result.per_failure and result.per_failure[0]["detection"] == pytest.approx(0.5)


def test_checkpoint_stalls_are_the_excess_of_the_steps_that_saved() -> None:
    points = steady_points(0, 10, T0)
    # Step 5 wrote a durable checkpoint and took 1.5 s; later steps shift by half a second.
    points = points[:5] + [Point(p.time + 0.5, p.step) for p in points[5:]]
    result = goodput.attribute(points, [], checkpoint_interval=5)
    assert result.lost["checkpoint stalls"] == pytest.approx(0.5)
    assert result.lost["step-time variation"] == pytest.approx(0.0)
    assert result.goodput == pytest.approx(10 / 10.5)


def test_a_step_finishing_while_the_kill_is_delivered_is_progress_inside_the_failure() -> None:
    # The kill request at 10.9 s; step 11 still completes at 11.0 s and is the one restored.
    before = steady_points(0, 11, T0)
    after = steady_points(12, 20, T0 + 20)
    failure = FailureTimes("kill", "w0", T0 + 10.9, detected=T0 + 11.2, group=T0 + 15, restored=T0 + 19)
    failure.resumed = T0 + 20
    assert goodput.gap_of(before + after, failure) == (10, 12)
    result = goodput.attribute(before + after, [failure], checkpoint_interval=None)
    # 0.9 s of the step in flight went before the kill, and step 11 is not done again: 0.1 s short of a step.
    assert result.lost["step in flight + replayed steps"] == pytest.approx(0.9 - 1.0)
    assert result.lost["detection"] == pytest.approx(0.3)
    assert result.productive == pytest.approx(20.0)
    assert sum(result.lost.values()) == pytest.approx(result.wall - result.productive)


def test_a_step_held_by_a_hung_rank_until_the_detection_is_the_detections_time() -> None:
    # A hang at 10.2 s holds step 11 in flight until the operator acts at 20.2 s; it completes then, and the
    # new group restores it and goes on with step 12 at 23 s.
    points = [*steady_points(0, 10, T0), Point(T0 + 20.2, 11), *steady_points(12, 20, T0 + 23)]
    failure = FailureTimes("hang", "w1", T0 + 10.2, detected=T0 + 20.2, group=T0 + 21, restored=T0 + 22)
    failure.resumed = T0 + 23
    assert goodput.gap_of(points, failure) == (10, 12)
    result = goodput.attribute(points, [failure], checkpoint_interval=None)
    assert result.lost["detection"] == pytest.approx(10.0)
    assert result.lost["step-time variation"] == pytest.approx(0.0)
    assert sum(result.lost.values()) == pytest.approx(result.wall - result.productive)


def test_an_unexplained_step_back_is_an_other_interruption() -> None:
    points = steady_points(0, 10, T0) + steady_points(8, 12, T0 + 15)
    result = goodput.attribute(points, [], checkpoint_interval=None)
    assert result.lost["other interruptions"] == pytest.approx(5 - (8 - 10))
    assert sum(result.lost.values()) == pytest.approx(result.wall - result.productive)


def test_too_few_points_give_no_figures() -> None:
    assert goodput.attribute([Point(T0, 1)], [], None).goodput is None


def test_heartbeat_points_are_rank_zeros_new_steps_in_the_window() -> None:
    def seen(at: float, pod: str, rank: str, step: int, phase: str = "training") -> faults.LeaseSeen:
        values = {"rank": rank, "step": str(step), "phase": phase}
        return faults.LeaseSeen(seen=T0 + at, pod=pod, values=values, renewed=T0 + at - 0.1)

    timeline = [
        seen(1, "a", "0", 5),
        seen(1.1, "b", "1", 5),
        seen(2, "a", "0", 5),
        seen(3, "a", "0", 7),
        seen(4, "a", "0", 7, phase="rendezvous"),
        seen(9, "b", "0", 8),
        seen(99, "b", "0", 50),
    ]
    points = goodput.lease_points(timeline, T0, T0 + 20)
    assert [(round(p.time - T0, 1), p.step) for p in points] == [(0.9, 5), (2.9, 7), (8.9, 8)]


def test_failures_are_drawn_reproducibly_and_spare_the_tail_of_the_window() -> None:
    sizes = goodput.Sizes(seconds=1800, mean_gap=300, kinds=goodput.KINDS, quiet_tail=60)
    first = goodput.failure_schedule(random.Random(7), sizes)
    assert first == goodput.failure_schedule(random.Random(7), sizes)
    assert all(0 < at < 1800 - 60 for at, _ in first)
    assert {kind for _, kind in first} <= set(goodput.KINDS)
    quick = goodput.failure_schedule(random.Random(7), goodput.QUICK)
    assert quick == [(goodput.QUICK.first_at, "kill")] == [(10, "kill")]


def test_failure_marks_rise_from_the_bottom_of_the_chart() -> None:
    xs, ys = goodput.spikes([30.0, 10.0], 1.0, 4.0)
    assert xs == [10.0, 10.0, 10.0, 30.0, 30.0, 30.0]
    assert ys == [1.0, 4.0, 1.0, 1.0, 4.0, 1.0]


def test_the_failure_incident_is_the_victims_first_after_the_injection() -> None:
    failure = FailureTimes("hang", "w1", faults.parse_stamp("2027-01-15T08:00:10.500000Z") or 0.0)
    incidents = [
        {"worker": "w1", "cause": "Killed", "action": "ReplaceWorker", "detectedAt": "2027-01-15T08:00:02Z"},
        {
            "worker": "w0",
            "cause": "NoProgress",
            "action": "ReplaceWorker",
            "detectedAt": "2027-01-15T08:00:21Z",
        },
        {"worker": "w3", "cause": "ExitCode", "action": "Ignore", "detectedAt": "2027-01-15T08:00:20Z"},
    ]
    assert goodput.failure_incident(incidents, failure)["worker"] == "w0"  # the peer was blamed
    incidents.append(
        {
            "worker": "w1",
            "cause": "NoProgress",
            "action": "ReplaceWorker",
            "detectedAt": "2027-01-15T08:00:22Z",
        }
    )
    assert goodput.failure_incident(incidents, failure)["cause"] == "NoProgress"
    assert goodput.failure_incident(incidents, failure)["worker"] == "w1"
    assert goodput.failure_incident(incidents[:1], failure) is None


def test_the_restored_step_reported_after_the_failure_is_not_progress() -> None:
    # Heartbeat samples: step 21 before the kill; the new group reports its restored step 22 at 11.4 s
    # (the old group finished it, unseen), then 23 when its first step is done at 12 s.
    points = [*steady_points(0, 21, T0), Point(T0 + 32.4, 22), Point(T0 + 33, 23), Point(T0 + 34, 24)]
    failure = FailureTimes("kill", "w0", T0 + 21.2, detected=T0 + 21.5, group=T0 + 27, restored=T0 + 32.4)
    failure.resumed = T0 + 33
    assert goodput.gap_of(points, failure) == (21, 23)
    result = goodput.attribute(points, [failure], checkpoint_interval=None, every_step=False)
    assert result.step_seconds == pytest.approx(1.0)
    assert result.wall - result.productive == pytest.approx(34 - 24)


def test_against_the_twins_pace_goodput_is_the_ratio_of_steps_gained() -> None:
    # The twin trains at 1.1 s a step (the machine is busy); the job at the same pace, but loses 10 s to a kill.
    twin = steady_points(0, 100, T0, step_seconds=1.1)
    pace = goodput.pace_of(twin)
    assert pace == pytest.approx(1.1)
    before = steady_points(0, 40, T0, step_seconds=1.1)
    after = steady_points(40, 81, T0 + 44 + 10 - 1.1, step_seconds=1.1)
    failure = FailureTimes("kill", "w0", T0 + 44.2, detected=T0 + 46, group=T0 + 50, restored=T0 + 52)
    failure.resumed = T0 + 52.9
    result = goodput.attribute(before + after, [failure], checkpoint_interval=None, pace=pace)
    assert result.goodput == pytest.approx((81 * 1.1) / (result.wall))
    parts = result.against_pace()
    assert set(parts) == {*goodput.FAILURE_CATEGORIES, goodput.BETWEEN_FAILURES}
    assert parts["detection"] == pytest.approx(1.8)
    assert parts[goodput.BETWEEN_FAILURES] == pytest.approx(0.0, abs=1e-6)
    assert sum(parts.values()) == pytest.approx(result.wall - result.productive)
    # By its own median the job would be judged the same here: no noise between failures.
    alone = goodput.attribute(before + after, [failure], checkpoint_interval=None)
    assert alone.goodput == pytest.approx(result.goodput)


def test_noise_both_runs_share_is_no_loss_against_the_twin() -> None:
    # Every fifth step of both runs takes 2 s instead of 1 s: by its own median a run loses 1 s in five; the
    # job against its twin loses nothing.
    def noisy(start: float) -> list[Point]:
        points, moment = [Point(start, 0)], start
        for step in range(1, 101):
            moment += 2.0 if step % 5 == 0 else 1.0
            points.append(Point(moment, step))
        return points

    twin, job = noisy(T0), noisy(T0 + 0.3)
    alone = goodput.attribute(job, [], checkpoint_interval=None)
    assert alone.goodput == pytest.approx(100 / 120)
    assert alone.lost["step-time variation"] == pytest.approx(20.0)
    against = goodput.attribute(job, [], checkpoint_interval=None, pace=goodput.pace_of(twin))
    assert against.goodput == pytest.approx(1.0)
    assert against.against_pace()[goodput.BETWEEN_FAILURES] == pytest.approx(0.0, abs=1e-6)


def test_a_run_without_progress_has_no_pace() -> None:
    assert goodput.pace_of([Point(T0, 3)]) is None
    assert goodput.pace_of([Point(T0, 3), Point(T0 + 5, 3)]) is None


def test_restarts_between_two_statuses() -> None:
    assert goodput.restarts_between({}, {"restarts": {"total": 2}}) == 2
    assert goodput.restarts_between({"restarts": {"total": 2}}, {"restarts": {"total": 2}}) == 0


def test_the_loss_reason_names_the_largest_parts_and_the_floor_the_timeouts_set() -> None:
    parts = {"detection": 30.0, "replacement + rendezvous": 8.0, "first step overhead": 1.0}
    heartbeat = {"timeoutSeconds": 5, "progressTimeoutSeconds": 10}
    why = goodput.loss_reason(
        parts, ["hang", "hang", "freeze", "kill", "node-crash"], 1800.0, 300.0, heartbeat
    )
    assert why.startswith("39.0 s were lost, most of it detection 30.0 s, replacement + rendezvous 8.0 s;")
    assert "brought 5 failures (6 expected)" in why
    # Two stopped trainers are reported by their launchers within 0.3 s each, a frozen pod and a crashed node
    # wait out 5 s each; a kill is seen at once.
    assert (
        "2 stopped trainers after their launcher's 0.3 s confirmation, 2 frozen pods or crashed nodes" in why
    )
    assert "11 s (0.6% of the window)" in why
    assert goodput.loss_reason({"detection": 0.0}, [], 1800.0, 300.0, heartbeat) == ""


def window_result(seed: int, goodput_percent: float, failures: int) -> BenchResult:
    target = Target(op=">=", value=98.5, stat="min")
    return BenchResult(
        name=goodput.NAME,
        title=goodput.TITLE,
        metrics=[
            Metric(
                name="goodput vs the undisturbed run",
                unit="%",
                samples=[goodput_percent],
                target=target,
                why_missed=f"lost in {seed}",
            ),
            Metric(name="failures drawn", unit="count", samples=[float(failures)]),
        ],
        notes=[f"Failures drawn from seed {seed}."],
        series=[Series(name="steps", x=[0.0], y=[1.0])],
        details={"seed": seed, "failures": [{}] * failures},
    )


def test_two_windows_merge_into_one_sample_each_and_the_worse_window_is_judged() -> None:
    merged = goodput.merge_runs([window_result(1, 99.0, 5), window_result(2, 98.0, 8)])
    metric = merged.metric("goodput vs the undisturbed run")
    assert metric.samples == [99.0, 98.0]
    assert metric.verdict().met is False  # the second window missed, though the median meets the target
    assert metric.why_missed == "window 2 (seed 2): lost in 2"  # only the window that missed explains
    assert merged.metric("failures drawn").samples == [5.0, 8.0]
    assert "window 1 (seed 1): 5 failures drawn, window 2 (seed 2): 8 failures drawn" in merged.notes[0]
    assert "window 2 (seed 2): Failures drawn from seed 2." in merged.notes
    assert [series.name for series in merged.series] == [
        "steps, window 1 (seed 1)",
        "steps, window 2 (seed 2)",
    ]
    assert [window["seed"] for window in merged.details["windows"]] == [1, 2]


def test_one_window_is_reported_as_it_is() -> None:
    single = window_result(1, 99.0, 5)
    assert goodput.merge_runs([single]) is single
