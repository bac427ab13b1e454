"""The operator's view clock: a pause, a restart or a stalled watch of its own is never taken for silent
workers, and a real silence is still judged once the view is current."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from phalanx import contract
from phalanx.operator import api, detection, viewclock
from phalanx.operator.viewclock import Gap, OperatorView, ViewClock, seen_age, unseen_seconds

MakePod = Callable[..., dict[str, Any]]
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
HEARTBEAT = api.HeartbeatSpec(interval_seconds=1, timeout_seconds=5, progress_timeout_seconds=10)


class FakeClock:
    def __init__(self, start: datetime = T0) -> None:
        self.moment = start

    def __call__(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> datetime:
        self.moment += timedelta(seconds=seconds)
        return self.moment


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def test_gaps_are_left_out_of_an_age() -> None:
    gaps = [Gap(T0 + seconds(10), T0 + seconds(70)), Gap(T0 + seconds(100))]
    assert unseen_seconds(T0, T0 + seconds(110), gaps) == 60 + 10
    assert seen_age(T0 + seconds(5), T0 + seconds(110), gaps) == 105 - 70
    # Only the part of a gap after the moment counts.
    assert seen_age(T0 + seconds(60), T0 + seconds(80), gaps) == 20 - 10
    assert seen_age(None, T0, gaps) is None
    assert seen_age(T0, T0 + seconds(3)) == 3


def test_a_current_view_has_no_gap() -> None:
    clock = FakeClock()
    view = ViewClock(lag_seconds=3, clock=clock)
    for _ in range(10):
        view.saw(clock.advance(1) - seconds(0.2))
    assert view.gaps() == ()


def test_a_paused_operator_sees_a_gap_going_on_then_closed_once_the_canary_arrives() -> None:
    clock = FakeClock()
    view = ViewClock(lag_seconds=3, clock=clock)
    view.saw(clock.advance(1))
    paused_at = clock.moment
    clock.advance(60)  # SIGSTOP: nothing arrives, nothing runs
    (ongoing,) = view.gaps()
    assert ongoing == Gap(paused_at + seconds(3))
    # The backlog arrives: first old renewals (ignored as news), then the canary written after the resume.
    view.saw(paused_at + seconds(0.5))
    clock.advance(0.4)
    view.saw(clock.moment - seconds(0.1))
    (closed,) = view.gaps()
    assert closed == Gap(paused_at + seconds(3), clock.moment)


def test_before_the_first_canary_the_view_is_stale_after_the_lag() -> None:
    clock = FakeClock()
    view = ViewClock(lag_seconds=3, clock=clock)
    assert view.gaps() == ()
    clock.advance(5)
    assert view.gaps() == (Gap(T0 + seconds(3)),)


def test_a_restarted_operator_counts_its_absence_as_a_gap() -> None:
    """The canary listed at start-up is the previous process's last renewal: the time since is a gap."""
    clock = FakeClock()
    last_of_previous = T0 - seconds(40)
    view = ViewClock(lag_seconds=3, clock=clock)
    view.saw(last_of_previous)
    clock.advance(1.2)
    view.saw(clock.moment - seconds(0.1))
    assert view.gaps() == (Gap(last_of_previous + seconds(3), clock.moment),)


def test_a_broken_canary_writer_leaves_the_wall_clock_in_charge() -> None:
    clock = FakeClock()
    view = ViewClock(lag_seconds=3, clock=clock)
    view.saw(clock.moment)
    view.writer_failed("403 Forbidden")
    clock.advance(60)
    assert view.gaps() == ()
    view.writer_failed(None)
    assert view.gaps() == (Gap(T0 + seconds(3)),)


def test_the_view_of_a_job_namespace() -> None:
    cluster = OperatorView(["phalanx-system"], clusterwide=True, lag_seconds=3)
    assert cluster.clocks["phalanx-system"] is not None
    scoped = OperatorView(["team-a"], clusterwide=False, lag_seconds=3)
    scoped.clocks["team-a"] = ViewClock(3, clock=FakeClock(T0 + seconds(10)))
    scoped.clocks["team-a"]._started = T0
    assert scoped.gaps("team-a") == (Gap(T0 + seconds(3)),)
    assert scoped.gaps("team-b") == ()


class Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"{status}")
        self.status = status
        self.reason = "Forbidden" if status == 403 else "busy"


def test_the_canary_writer_marks_only_permanent_refusals_as_broken() -> None:
    view = OperatorView(["phalanx-system"], clusterwide=True)
    written: list[dict[str, Any]] = []
    answers: list[Exception | None] = [None, Refused(503), Refused(403), None]

    def renew(lease: dict[str, Any]) -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        written.append(lease)

    clock = view.clocks["phalanx-system"]
    writer = viewclock.CanaryWriter(view, renew, holder="op-1", operator_name="phalanx", clock=lambda: T0)
    writer.renew_once()
    assert written[0]["metadata"] == {
        "name": viewclock.CANARY_NAME,
        "namespace": "phalanx-system",
        # The operator's Lease watch asks for `LEASE_LABELS` alone: the canary must carry them to be seen.
        "labels": {**contract.LEASE_LABELS, viewclock.CANARY_LABEL: "phalanx"},
    }
    assert written[0]["spec"] == {"holderIdentity": "op-1", "renewTime": "2026-01-01T12:00:00.000000Z"}
    writer.renew_once()  # the API server is busy: the view is stale, not the writer broken
    assert clock._writer_broken is None
    writer.renew_once()
    assert clock._writer_broken is not None and "403" in clock._writer_broken
    writer.renew_once()
    assert clock._writer_broken is None


@pytest.fixture
def paused_view() -> tuple[datetime, tuple[Gap, ...]]:
    """An operator paused for 60 s: the moment it judges on resume and the gap its view clock reports."""
    resumed = T0 + seconds(61)
    return resumed, (Gap(T0 + seconds(3)),)


def lease(renewed: datetime, step: int, **extra: Any) -> dict[str, Any]:
    return {
        "step": str(step),
        "phase": "training",
        "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        **extra,
    }


def judge(
    pods: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    now: datetime,
    tracks: list[api.WorkerTrack],
    gaps: tuple[Gap, ...] = (),
) -> tuple[list[detection.Failure], list[api.WorkerTrack]]:
    known = {(track.pod, track.uid) for track in tracks}
    updated = detection.update_tracks(tracks, pods, leases, HEARTBEAT, "trainer", now)
    nodes = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}
    failures = detection.detect(pods, leases, nodes, updated, known, HEARTBEAT, "trainer", now, gaps)
    return failures, updated


def test_a_paused_operator_judges_no_heartbeat_late_for_its_pause(
    make_pod: MakePod, paused_view: tuple[datetime, tuple[Gap, ...]]
) -> None:
    resumed, gaps = paused_view
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    stale = {pod["metadata"]["name"]: lease(T0, step=50) for pod in pods}
    _, tracks = judge(pods, stale, T0 + seconds(0.5), [])
    # Without the gap the stale view reads as 61 s of silence and 61 s at one step on every worker.
    assert {f.cause for f in judge(pods, stale, resumed, tracks)[0]} == {"HeartbeatTimeout"}
    assert judge(pods, stale, resumed, tracks, gaps)[0] == []
    assert detection.next_heartbeat_deadline(pods, stale, tracks, HEARTBEAT, resumed, gaps) == pytest.approx(
        2
    )


def test_a_real_silence_is_still_judged_after_the_gap(
    make_pod: MakePod, paused_view: tuple[datetime, tuple[Gap, ...]]
) -> None:
    resumed, _ = paused_view
    pods = [make_pod("demo-worker-0")]
    _, tracks = judge(pods, {"demo-worker-0": lease(T0, step=50)}, T0 + seconds(0.5), [])
    closed = (Gap(T0 + seconds(3), resumed),)
    # The worker really fell silent at T0: 3 s before the gap, then 6 s after it exceeds the 5 s timeout.
    later = resumed + seconds(2.5)
    (failure,), _ = judge(pods, {"demo-worker-0": lease(T0, step=50)}, later, tracks, closed)
    assert failure.cause == "HeartbeatTimeout"
    assert judge(pods, {"demo-worker-0": lease(T0, step=50)}, resumed + seconds(1.5), tracks, closed)[0] == []


def test_no_progress_is_not_judged_over_a_gap(make_pod: MakePod) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = judge(pods, {"demo-worker-0": lease(T0, step=50)}, T0 + seconds(0.5), [])
    # The Lease keeps being renewed (the launcher lives) but the index shows the step of before the pause.
    renewed = {"demo-worker-0": lease(T0 + seconds(60.5), step=50)}
    assert [f.cause for f in judge(pods, renewed, T0 + seconds(61), tracks)[0]] == ["NoProgress"]
    assert judge(pods, renewed, T0 + seconds(61), tracks, (Gap(T0 + seconds(3)),))[0] == []


def unreachable(since: datetime, heard: datetime) -> dict[str, Any]:
    return {
        "labels": {},
        "ready": "Unknown",
        "readySince": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "readyHeartbeat": heard.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "noExecute": ["node.kubernetes.io/unreachable"],
        "noExecuteSince": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def test_a_crashed_node_is_believed_at_once(make_pod: MakePod) -> None:
    pods = [make_pod("demo-worker-0", node="node-a")]
    nodes = {"node-a": unreachable(since=T0, heard=T0 - seconds(8))}
    leases = {"demo-worker-0": lease(T0 - seconds(8), step=50)}
    confirmed = detection.confirmed_nodes(nodes, pods, leases, T0 + seconds(0.5))
    assert confirmed is not None and detection.node_problem("node-a", confirmed) == "Unreachable"


def test_nodes_the_control_plane_called_lost_after_its_own_outage_are_not_believed(make_pod: MakePod) -> None:
    """etcd hung for 20 s: every node is unreachable when it comes back, and so is the operator's view."""
    pods = [make_pod("demo-worker-0", node="node-a")]
    nodes = {"node-a": unreachable(since=T0 + seconds(21), heard=T0)}
    leases = {"demo-worker-0": lease(T0, step=50)}
    outage = (Gap(T0 + seconds(3), T0 + seconds(20.5)),)
    now = T0 + seconds(21.5)
    assert detection.node_problem("node-a", detection.confirmed_nodes(nodes, pods, leases, now)) is not None
    held = detection.confirmed_nodes(nodes, pods, leases, now, outage)
    assert detection.node_problem("node-a", held) is None
    assert held is not None and held["node-a"]["unconfirmed"] == "Unreachable"
    # A problem that outlasts the outage is a real one.
    later = T0 + seconds(21 + 18)
    assert detection.node_problem("node-a", detection.confirmed_nodes(nodes, pods, leases, later, outage))


def test_a_node_that_said_ready_after_the_controller_gave_up_on_it_is_not_lost(make_pod: MakePod) -> None:
    """The rendezvous pod sends no heartbeat to vouch for its node: after an outage the node controller's
    silence taint stays a few seconds on a node that already said Ready, and no pod may be replaced for it."""
    pods = [make_pod("demo-worker-2", node="node-a")]  # no Lease given: nothing vouches for node-a
    lifting = {**unreachable(since=T0 + seconds(22), heard=T0 + seconds(23)), "ready": "True"}
    now = T0 + seconds(30)
    confirmed = detection.confirmed_nodes({"node-a": lifting}, pods, {}, now)
    assert detection.node_problem("node-a", confirmed) is None
    assert confirmed is not None and confirmed["node-a"]["unconfirmed"] == "NoExecuteTaint"
    # Before: the same taint believed at once (what replaced the rendezvous pod after an outage).
    assert detection.node_problem("node-a", {"node-a": lifting}) == "NoExecuteTaint"
    # A NoExecute taint of anyone else's (a drain, a maintenance taint) is acted on, Ready or not.
    drained = {**lifting, "noExecute": ["node.kubernetes.io/unreachable", "example.com/maintenance"]}
    assert detection.node_problem("node-a", detection.confirmed_nodes({"node-a": drained}, pods, {}, now))
    # A node still silent (Unknown) is judged as before: at once when the view had no gap.
    silent = unreachable(since=T0 + seconds(22), heard=T0 + seconds(14))
    assert detection.node_problem("node-a", detection.confirmed_nodes({"node-a": silent}, pods, {}, now))


def test_a_pod_that_still_renews_its_heartbeat_vouches_for_its_node(make_pod: MakePod) -> None:
    pods = [make_pod("demo-worker-0", node="node-a")]
    nodes = {"node-a": unreachable(since=T0, heard=T0 - seconds(8))}
    leases = {"demo-worker-0": lease(T0 + seconds(1), step=50)}
    assert (
        detection.node_problem("node-a", detection.confirmed_nodes(nodes, pods, leases, T0 + seconds(2)))
        is None
    )
    gone = detection.confirmed_nodes({}, pods, leases, T0 + seconds(2))
    assert detection.node_problem("node-a", gone) == "Deleted"
