"""Failure detection: each class is detected when it should be, and never when it should not."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from phalanx.operator import api, detection
from phalanx.operator.timeutil import format_time

MakePod = Callable[..., dict[str, Any]]
HEARTBEAT = api.HeartbeatSpec(interval_seconds=1, timeout_seconds=5, progress_timeout_seconds=10)
HEALTHY = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}


def lease(now: datetime, *, step: int = 10, phase: str = "training", age: float = 0.5, **extra: Any) -> dict:
    renewed = (now - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"step": str(step), "phase": phase, "renewTime": renewed, **{k: str(v) for k, v in extra.items()}}


def run(
    pods: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    now: datetime,
    tracks: list[api.WorkerTrack] | None = None,
    nodes: dict[str, dict[str, Any]] | None = None,
    heartbeat: api.HeartbeatSpec = HEARTBEAT,
) -> tuple[list[detection.Failure], list[api.WorkerTrack]]:
    """One reconcile's detection: update the memory, then judge."""
    before = tracks or []
    known = {(track.pod, track.uid) for track in before}
    updated = detection.update_tracks(before, pods, leases, heartbeat, "trainer", now)
    nodes = HEALTHY if nodes is None else nodes
    failures = detection.detect(pods, leases, nodes, updated, known, heartbeat, "trainer", now)
    detection.sync_restarts(updated, pods, "trainer")
    return failures, updated


def test_healthy_workers_yield_nothing(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    leases = {p["metadata"]["name"]: lease(now) for p in pods}
    failures, tracks = run(pods, leases, now)
    assert failures == [] and [t.step for t in tracks] == [10, 10]


def test_heartbeat_timeout_and_not_before(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    fresh, tracks = run(pods, {"demo-worker-0": lease(now, age=4.9)}, now)
    assert fresh == []
    (failure,), _ = run(pods, {"demo-worker-0": lease(now, age=6)}, now, tracks)
    assert failure.cause == "HeartbeatTimeout" and failure.force and failure.alive


def test_a_pod_that_announced_its_exit_waits_for_its_exit_code_not_for_the_heartbeat(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {"demo-worker-0": lease(now)}, now)
    grace = HEARTBEAT.timeout_seconds + detection.EXITING_GRACE_SECONDS
    exiting = lease(now, phase="exiting", age=grace - 1)
    assert run(pods, {"demo-worker-0": exiting}, now, tracks)[0] == []
    # An exit announced but never seen in the pod's status: a frozen pod after all.
    (failure,), _ = run(pods, {"demo-worker-0": lease(now, phase="exiting", age=grace + 1)}, now, tracks)
    assert failure.cause == "HeartbeatTimeout"


def test_a_lease_left_by_an_earlier_pod_of_the_same_name_is_ignored(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0", created="2026-01-01T11:59:58Z")]
    stale = lease(now, age=30)
    assert run(pods, {"demo-worker-0": stale}, now)[0] == []
    other_owner = {**lease(now, age=30), "ownerUid": "someone-else"}
    assert run(pods, {"demo-worker-0": other_owner}, now)[0] == []


def test_no_progress_while_training_is_detected_after_the_timeout(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {"demo-worker-0": lease(now)}, now)
    later = now + timedelta(seconds=9)
    assert run(pods, {"demo-worker-0": lease(later)}, later, tracks)[0] == []
    stuck = now + timedelta(seconds=11)
    (failure,), _ = run(pods, {"demo-worker-0": lease(stuck)}, stuck, tracks)
    assert failure.cause == "NoProgress" and "step 10" in failure.message


def test_a_worker_that_publishes_no_step_is_never_judged_hung(make_pod: MakePod, now: datetime) -> None:
    # A plain script: the launcher says it trains, but no step is ever published (the annotation is empty).
    pods = [make_pod("demo-worker-0")]
    silent = {**lease(now), "step": ""}
    failures, tracks = run(pods, {"demo-worker-0": silent}, now)
    assert failures == [] and tracks[0].since is None and tracks[0].step is None
    much_later = now + timedelta(seconds=HEARTBEAT.progress_timeout_seconds * 10)
    failures, tracks = run(pods, {"demo-worker-0": {**lease(much_later), "step": ""}}, much_later, tracks)
    assert failures == [] and tracks[0].since is None
    # Its heartbeat is still judged.
    (failure,), _ = run(pods, {"demo-worker-0": {**lease(much_later, age=6), "step": ""}}, much_later, tracks)
    assert failure.cause == "HeartbeatTimeout"


def test_the_progress_clock_starts_when_the_worker_reached_its_step(make_pod: MakePod, now: datetime) -> None:
    # The operator first sees step 10 four seconds after the worker reached it (the heartbeat's `step-at`).
    pods = [make_pod("demo-worker-0")]
    reached = (now - timedelta(seconds=4)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    _, tracks = run(pods, {"demo-worker-0": lease(now, **{"step-at": reached})}, now)
    assert tracks[0].since == reached
    stuck = now + timedelta(seconds=6.5)
    (failure,), _ = run(pods, {"demo-worker-0": lease(stuck, **{"step-at": reached})}, stuck, tracks)
    assert failure.cause == "NoProgress"
    # A worker clock ahead of the operator's never starts the clock in the future.
    ahead = (now + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    _, tracks = run(pods, {"demo-worker-0": lease(now, step=11, **{"step-at": ahead})}, now, tracks)
    assert tracks[0].since == now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_the_next_deadline_is_the_first_timeout_that_may_expire(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    leases = {"demo-worker-0": lease(now, age=0.5), "demo-worker-1": lease(now, age=2.0)}
    _, tracks = run(pods, leases, now)
    # Worker 1 renewed 2 s ago: its heartbeat timeout (5 s) may expire in 3 s, before any progress timeout.
    assert detection.next_heartbeat_deadline(pods, leases, tracks, HEARTBEAT, now) == pytest.approx(3.0)
    later = now + timedelta(seconds=8)
    fresh = {name: lease(later, age=0.2) for name in leases}
    _, tracks = run(pods, fresh, later, tracks)
    # Renewed, but still at step 10 since `now`: the progress timeout (10 s) comes first, in 2 s.
    assert detection.next_heartbeat_deadline(pods, fresh, tracks, HEARTBEAT, later) == pytest.approx(2.0)
    idle = {name: lease(later, phase="standby", age=0.2) for name in leases}
    _, tracks = run(pods, idle, later, tracks)
    assert detection.next_heartbeat_deadline(pods, idle, tracks, HEARTBEAT, later) == pytest.approx(4.8)
    assert detection.next_heartbeat_deadline([], {}, [], HEARTBEAT, later) is None
    # A worker already handled, or a deadline already past (judged by this reconcile), wakes nothing.
    for track in tracks:
        track.done = True
    assert detection.next_heartbeat_deadline(pods, idle, tracks, HEARTBEAT, later) is None
    stale = {name: lease(later, phase="standby", age=9) for name in leases}
    _, tracks = run(pods, stale, later)
    assert detection.next_heartbeat_deadline(pods, stale, tracks, HEARTBEAT, later) is None


@pytest.mark.parametrize("phase", ["saving", "rendezvous", "standby", "restoring", "starting"])
def test_a_save_rendezvous_or_restore_is_never_a_hang(make_pod: MakePod, now: datetime, phase: str) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {"demo-worker-0": lease(now)}, now)
    for seconds in (5, 30, 300):
        moment = now + timedelta(seconds=seconds)
        failures, tracks = run(pods, {"demo-worker-0": lease(moment, phase=phase)}, moment, tracks)
        assert failures == []
    # Back to training at the same step: the clock starts again from there.
    back = now + timedelta(seconds=301)
    assert run(pods, {"demo-worker-0": lease(back)}, back, tracks)[0] == []


def test_a_moving_step_is_progress(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    tracks: list[api.WorkerTrack] = []
    for second in range(0, 40, 4):
        moment = now + timedelta(seconds=second)
        failures, tracks = run(pods, {"demo-worker-0": lease(moment, step=second)}, moment, tracks)
        assert failures == []


def test_when_all_stall_one_worker_is_blamed(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    leases = {"demo-worker-0": lease(now, step=7), "demo-worker-1": lease(now, step=6)}
    _, tracks = run(pods, leases, now)
    stuck = now + timedelta(seconds=11)
    leases = {"demo-worker-0": lease(stuck, step=7), "demo-worker-1": lease(stuck, step=6)}
    failures, _ = run(pods, leases, stuck, tracks)
    assert [(f.cause, f.pod) for f in failures] == [("NoProgress", "demo-worker-1")]


def test_straggler_needs_consecutive_slow_heartbeats_and_is_off_at_factor_zero(
    make_pod: MakePod, now: datetime
) -> None:
    spec = api.HeartbeatSpec(straggler_factor=1.5, straggler_heartbeats=3)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)]
    tracks: list[api.WorkerTrack] = []
    found: list[detection.Failure] = []
    for beat in range(3):
        moment = now + timedelta(seconds=beat)
        leases = {
            "demo-worker-0": lease(moment, step=beat, **{"step-seconds": 1.0}),
            "demo-worker-1": lease(moment, step=beat, **{"step-seconds": 1.1}),
            "demo-worker-2": lease(moment, step=beat, **{"step-seconds": 3.0}),
        }
        found, tracks = run(pods, leases, moment, tracks, heartbeat=spec)
        if beat < 2:
            assert found == []
    assert [(f.cause, f.pod, f.force) for f in found] == [("Straggler", "demo-worker-2", False)]
    # One fast heartbeat resets the streak.
    moment = now + timedelta(seconds=3)
    leases["demo-worker-2"] = lease(moment, step=3, **{"step-seconds": 1.0})
    leases = {k: {**v, "renewTime": leases["demo-worker-2"]["renewTime"]} for k, v in leases.items()}
    _, tracks = run(pods, leases, moment, tracks, heartbeat=spec)
    assert next(t for t in tracks if t.pod == "demo-worker-2").slow == 0
    off = api.HeartbeatSpec(straggler_factor=0)
    slow = {f"demo-worker-{i}": lease(now, **{"step-seconds": 1.0 + 5 * i}) for i in range(3)}
    tracks = []
    for _ in range(10):
        found, tracks = run(pods, slow, now, tracks, heartbeat=off)
        assert found == []


@pytest.mark.parametrize(
    ("health", "problem"),
    [
        ({"ready": "False", "noExecute": []}, "NotReady"),
        ({"ready": "Unknown", "noExecute": []}, "Unreachable"),
        ({"ready": "True", "noExecute": ["node.kubernetes.io/unreachable"]}, "NoExecuteTaint"),
        (None, "Deleted"),
    ],
)
def test_node_lost_is_acted_on_at_once(
    make_pod: MakePod, now: datetime, health: dict[str, Any] | None, problem: str
) -> None:
    pods = [make_pod("demo-worker-0")]
    nodes = {} if health is None else {"node-a": {"labels": {}, **health}}
    (failure,), _ = run(pods, {"demo-worker-0": lease(now)}, now, nodes=nodes)
    assert failure.cause == "NodeLost" and failure.node_conditions == {problem} and failure.force


@pytest.mark.parametrize(("code", "cause"), [(137, "Killed"), (143, "Killed"), (1, "ExitCode")])
def test_exit_codes(make_pod: MakePod, now: datetime, code: int, cause: str) -> None:
    pods = [make_pod("demo-worker-0", phase="Failed", exit_code=code)]
    (failure,), _ = run(pods, {}, now)
    assert failure.cause == cause and failure.exit_code == code and not failure.force


def test_oom_kill_is_not_an_outside_kill(make_pod: MakePod, now: datetime) -> None:
    pod = make_pod("demo-worker-0", phase="Failed", exit_code=137)
    pod["status"]["containerStatuses"][0]["terminated"]["reason"] = "OOMKilled"
    (failure,), _ = run([pod], {}, now)
    assert failure.cause == "ExitCode" and "OOMKilled" in failure.pod_conditions


def test_the_launchers_termination_message_says_why(make_pod: MakePod, now: datetime) -> None:
    pod = make_pod("demo-worker-0", phase="Failed", exit_code=2)
    pod["status"]["containerStatuses"][0]["terminated"]["message"] = "the in-memory snapshot does not fit"
    (failure,), _ = run([pod], {}, now)
    assert failure.message == "demo-worker-0 exited with code 2: the in-memory snapshot does not fit"


def test_evicted_and_disruption_target(make_pod: MakePod, now: datetime) -> None:
    evicted = make_pod("demo-worker-0", phase="Failed")
    evicted["status"]["reason"] = "Evicted"
    disrupted = make_pod("demo-worker-1")
    disrupted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
    failures, _ = run([evicted, disrupted], {}, now)
    assert [f.cause for f in failures] == ["Evicted", "DisruptionTarget"]


def test_deleted_by_someone_else_only_when_known_and_not_done(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {}, now)
    terminating = [make_pod("demo-worker-0", terminating=True)]
    (failure,), _ = run(terminating, {}, now, tracks)
    assert failure.cause == "PodDeleted"
    # Never seen before: not ours to judge.
    assert run(terminating, {}, now)[0] == []
    # The operator deleted it itself: no failure.
    done = [t.model_copy(update={"done": True}) for t in tracks]
    assert run(terminating, {}, now, done)[0] == []
    # Gone without a trace (force-deleted by someone): still a deletion.
    (vanished,), _ = run([], {}, now, tracks)
    assert vanished.cause == "PodDeleted" and vanished.pod == "demo-worker-0"


def test_container_restart_counts_only_new_restarts(make_pod: MakePod, now: datetime) -> None:
    pod = make_pod("demo-worker-0")
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "ready": True, "restartCount": 2, "lastExitCode": 1}
    ]
    assert run([pod], {}, now)[0] == []  # restarts before the operator knew the pod
    _, tracks = run([pod], {}, now)
    pod["status"]["containerStatuses"][0]["restartCount"] = 3
    (failure,), tracks = run([pod], {}, now, tracks)
    assert failure.cause == "ContainerRestart" and failure.exit_code == 1
    assert run([pod], {}, now, tracks)[0] == []


def test_standby_spare_failure_is_marked_spare(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-2", role="spare")]
    _, tracks = run(pods, {"demo-worker-2": lease(now, phase="standby")}, now)
    later = now + timedelta(seconds=20)
    (failure,), _ = run(pods, {"demo-worker-2": lease(now, phase="standby")}, later, tracks)
    assert failure.cause == "HeartbeatTimeout" and failure.spare


@pytest.mark.parametrize(
    ("phase", "standing_by"),
    [("standby", True), ("starting", True), (None, True), ("rendezvous", False), ("restoring", False)],
)
def test_a_spare_that_left_standby_fails_as_a_worker(
    make_pod: MakePod, now: datetime, phase: str | None, standing_by: bool
) -> None:
    # Its launcher left standby to join a round with room for it (torch is promoting it) before the operator
    # relabelled it: its loss breaks the group being formed.
    pod = make_pod("demo-worker-2", role="spare", phase="Failed", exit_code=137)
    leases = {"demo-worker-2": lease(now, step=0, phase=phase)} if phase else {}
    tracks = run([make_pod("demo-worker-2", role="spare")], leases, now)[1]
    (failure,), _ = run([pod], leases, now, tracks)
    assert failure.cause == "Killed" and failure.spare is standing_by


def test_memory_survives_an_operator_restart(make_pod: MakePod, now: datetime) -> None:
    """The no-progress clock lives in status: a new operator reading it detects on time."""
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {"demo-worker-0": lease(now)}, now)
    stored = api.TrainingJobStatus(tracking=tracks).to_wire()
    restored = api.TrainingJobStatus.model_validate(stored).tracking
    assert restored[0].since == format_time(now)
    stuck = now + timedelta(seconds=11)
    (failure,), _ = run(pods, {"demo-worker-0": lease(stuck)}, stuck, restored)
    assert failure.cause == "NoProgress"


# ------------------------------------------------------------------------------- when failures happened


def test_an_exit_happened_by_the_end_of_its_finish_second(make_pod: MakePod, now: datetime) -> None:
    pod = make_pod("demo-worker-0", phase="Failed", exit_code=137)
    pod["status"]["containerStatuses"][0]["terminated"]["finishedAt"] = "2026-01-01T11:59:57Z"
    (failure,), _ = run([pod], {}, now)
    # finishedAt is written to the second: the exit may have come at any moment of it.
    assert failure.occurred_at == datetime(2026, 1, 1, 11, 59, 57, 999_999, tzinfo=now.tzinfo)
    # Never later than its detection (a stamp of the current second).
    pod["status"]["containerStatuses"][0]["terminated"]["finishedAt"] = "2026-01-01T12:00:00Z"
    (failure,), _ = run([pod], {}, now)
    assert failure.occurred_at == now


def test_a_frozen_worker_failed_at_its_last_heartbeat(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {"demo-worker-0": lease(now)}, now)
    (failure,), _ = run(pods, {"demo-worker-0": lease(now, age=6)}, now, tracks)
    assert failure.cause == "HeartbeatTimeout" and failure.occurred_at == now - timedelta(seconds=6)


def test_a_lost_node_failed_at_the_last_sign_of_life_of_the_node_or_the_pod(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0")]
    silent = {"labels": {}, "ready": "Unknown", "noExecute": [], "readyHeartbeat": "2026-01-01T11:59:40Z"}
    # The pod's heartbeat came after the node's last status: the later one is the closer.
    (failure,), _ = run(pods, {"demo-worker-0": lease(now, age=9)}, now, nodes={"node-a": silent})
    assert failure.occurred_at == now - timedelta(seconds=9)
    (failure,), _ = run(pods, {}, now, nodes={"node-a": silent})
    assert failure.occurred_at == datetime(2026, 1, 1, 11, 59, 40, 999_999, tzinfo=now.tzinfo)
    not_ready = {"labels": {}, "ready": "False", "noExecute": [], "readySince": "2026-01-01T11:59:50Z"}
    (failure,), _ = run(pods, {}, now, nodes={"node-a": not_ready})
    assert failure.occurred_at == datetime(2026, 1, 1, 11, 59, 50, 999_999, tzinfo=now.tzinfo)
    (deleted,), _ = run(pods, {"demo-worker-0": lease(now, age=9)}, now, nodes={})
    assert deleted.occurred_at == now


def test_deletions_and_restarts_have_their_moments(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    _, tracks = run(pods, {}, now)
    (deleted,), _ = run([make_pod("demo-worker-0", terminating=True)], {}, now, tracks)
    (vanished,), _ = run([], {}, now, tracks)
    assert deleted.occurred_at == now and vanished.occurred_at == now
    restarted = make_pod("demo-worker-0")
    restarted["status"]["containerStatuses"] = [
        {
            "name": "trainer",
            "ready": True,
            "restartCount": 1,
            "lastExitCode": 1,
            "lastFinishedAt": "2026-01-01T11:59:30Z",
        }
    ]
    (failure,), _ = run([restarted], {}, now, tracks)
    assert failure.cause == "ContainerRestart"
    assert failure.occurred_at == datetime(2026, 1, 1, 11, 59, 30, 999_999, tzinfo=now.tzinfo)


# ------------------------------------------------------------------------------------------ stragglers


def _synchronous_leases(moment: datetime, step: int, compute: list[float | None]) -> dict[str, dict]:
    """Synchronous data parallelism: every rank's step takes as long as the slowest rank's."""
    leases = {}
    for index, seconds in enumerate(compute):
        extra = (
            {"step-seconds": 3.0} if seconds is None else {"step-seconds": 3.0, "compute-seconds": seconds}
        )
        leases[f"demo-worker-{index}"] = lease(moment, step=step, **extra)
    return leases


def test_under_synchronous_training_the_compute_time_finds_the_straggler(
    make_pod: MakePod, now: datetime
) -> None:
    spec = api.HeartbeatSpec(straggler_factor=1.5, straggler_heartbeats=2)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)]
    tracks: list[api.WorkerTrack] = []
    found: list[detection.Failure] = []
    for beat in range(2):
        moment = now + timedelta(seconds=beat)
        found, tracks = run(
            pods, _synchronous_leases(moment, beat, [1.0, 1.1, 2.9]), moment, tracks, heartbeat=spec
        )
    assert [(f.cause, f.pod, f.force, f.alive) for f in found] == [
        ("Straggler", "demo-worker-2", False, True)
    ]
    assert "compute time" in found[0].message and found[0].occurred_at == now + timedelta(seconds=1)
    # When one worker does not report its compute time, all are compared on the (equal) step time.
    tracks = []
    for beat in range(4):
        moment = now + timedelta(seconds=beat)
        leases = _synchronous_leases(moment, beat, [1.0, None, 2.9])
        found, tracks = run(pods, leases, moment, tracks, heartbeat=spec)
        assert found == []


def test_the_straggler_measure_is_the_compute_time_only_when_everyone_reports_it(now: datetime) -> None:
    both = [lease(now, **{"step-seconds": 2, "compute-seconds": 1}) for _ in range(2)]
    assert detection.straggler_measure(both) == "compute-seconds"
    assert detection.straggler_measure([*both, lease(now, **{"step-seconds": 2})]) == "step-seconds"
    empty = lease(now, **{"step-seconds": 2})
    empty["compute-seconds"] = ""
    assert detection.straggler_measure([*both, empty]) == "step-seconds"
    assert detection.straggler_measure([]) == "step-seconds"


def test_a_renewal_alone_changes_no_track(make_pod: MakePod, now: datetime) -> None:
    spec = api.HeartbeatSpec(straggler_factor=1.5, straggler_heartbeats=3)
    pods = [make_pod(f"demo-worker-{i}") for i in range(2)]
    leases = {p["metadata"]["name"]: lease(now, step=4, **{"step-seconds": 1.0}) for p in pods}
    _, tracks = run(pods, leases, now, heartbeat=spec)
    later = now + timedelta(seconds=2)
    renewed = {p["metadata"]["name"]: lease(later, step=4, **{"step-seconds": 1.0}) for p in pods}
    _, again = run(pods, renewed, later, tracks, heartbeat=spec)
    assert again == tracks


# ------------------------------------------------------------------------------------------ rendezvous

RDZV = api.RendezvousTrack(pod="demo-rdzv", uid="uid-demo-rdzv", node="node-a", restarts=0)


def _rdzv(make_pod: MakePod, **kwargs: Any) -> dict[str, Any]:
    return make_pod("demo-rdzv", role="rendezvous", **kwargs)


def _rdzv_failure(
    pods: list[dict[str, Any]], now: datetime, nodes: dict | None = None
) -> detection.Failure | None:
    return detection.rendezvous_failure(pods, RDZV, HEALTHY if nodes is None else nodes, "rendezvous", now)


def test_the_rendezvous_pod_running_is_no_failure(make_pod: MakePod, now: datetime) -> None:
    assert _rdzv_failure([_rdzv(make_pod)], now) is None
    assert detection.rendezvous_failure([], None, HEALTHY, "rendezvous", now) is None


def test_every_way_to_lose_the_rendezvous(make_pod: MakePod, now: datetime) -> None:
    vanished = _rdzv_failure([], now)
    assert vanished is not None and vanished.cause == "RendezvousLost" and "disappeared" in vanished.message
    failed = _rdzv(make_pod, phase="Failed")
    failed["status"]["containerStatuses"] = [
        {"name": "rendezvous", "terminated": {"exitCode": 1, "finishedAt": "2026-01-01T11:59:58Z"}}
    ]
    ended = _rdzv_failure([failed], now)
    assert ended is not None and ended.exit_code == 1 and "ended" in ended.message
    assert ended.occurred_at == datetime(2026, 1, 1, 11, 59, 58, 999_999, tzinfo=now.tzinfo)
    deleted = _rdzv_failure([_rdzv(make_pod, terminating=True)], now)
    assert deleted is not None and "deleted" in deleted.message and deleted.occurred_at == now
    restarted = _rdzv(make_pod)
    restarted["status"]["containerStatuses"] = [{"name": "rendezvous", "restartCount": 1, "lastExitCode": 2}]
    crashed = _rdzv_failure([restarted], now)
    assert crashed is not None and "restarted" in crashed.message
    lost = _rdzv_failure([_rdzv(make_pod)], now, nodes={})
    assert lost is not None and lost.force and lost.node_conditions == {"Deleted"}
    # A new rendezvous pod (another uid) does not stand for the lost one.
    assert _rdzv_failure([make_pod("demo-rdzv", role="rendezvous", uid="new")], now) is not None


def test_only_a_running_rendezvous_on_a_healthy_node_is_remembered(make_pod: MakePod, now: datetime) -> None:
    running = _rdzv(make_pod)
    running["status"]["containerStatuses"] = [{"name": "rendezvous", "restartCount": 2, "lastExitCode": 1}]
    assert detection.rendezvous_memory([running], HEALTHY, "rendezvous") == RDZV.model_copy(
        update={"restarts": 2}
    )
    assert detection.rendezvous_memory([running], {}, "rendezvous") is None
    assert detection.rendezvous_memory([_rdzv(make_pod, phase="Pending")], HEALTHY, "rendezvous") is None
    assert detection.rendezvous_memory([_rdzv(make_pod, terminating=True)], HEALTHY, "rendezvous") is None
    assert detection.rendezvous_memory([make_pod("demo-worker-0")], HEALTHY, "rendezvous") is None


def test_a_drill_takes_a_node_away_from_its_job_only(make_pod: MakePod, now: datetime) -> None:
    from phalanx.operator import status as observe

    node = {**HEALTHY["node-a"], "drillCrash": "ml/demo"}
    pods = [make_pod("demo-worker-0")]
    for_demo = {"node-a": observe.node_for_job(node, "ml", "demo", drills_allowed=True)}
    (failure,), _ = run(pods, {"demo-worker-0": lease(now)}, now, nodes=for_demo)
    assert failure.cause == "NodeLost" and failure.force
    assert failure.node_conditions == frozenset({"DrillCrash"}) and "drill" in failure.message
    for_other = {"node-a": observe.node_for_job(node, "ml", "other", drills_allowed=True)}
    assert run(pods, {"demo-worker-0": lease(now)}, now, nodes=for_other)[0] == []


def test_a_node_drill_on_a_job_that_does_not_allow_drills_is_ignored(
    make_pod: MakePod, now: datetime
) -> None:
    from phalanx.operator import status as observe

    node = {**HEALTHY["node-a"], "drillCrash": "ml/demo"}
    pods = [make_pod("demo-worker-0")]
    refused = {"node-a": observe.node_for_job(node, "ml", "demo", drills_allowed=False)}
    assert run(pods, {"demo-worker-0": lease(now)}, now, nodes=refused)[0] == []


def micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_trainer_its_launcher_reports_stopped_fails_at_once(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    _, tracks = run(pods, {name: lease(now) for name in ("demo-worker-0", "demo-worker-1")}, now)
    later = now + timedelta(seconds=1)
    stopped_at = now + timedelta(seconds=0.4)
    leases = {
        "demo-worker-0": lease(later),
        "demo-worker-1": lease(
            later,
            fault="stopped",
            **{"fault-since": micro(stopped_at), "fault-message": "rank 1 (pid 7) is stopped (state T)"},
        ),
    }
    (failure,), _ = run(pods, leases, later, tracks)
    assert (failure.cause, failure.pod, failure.force, failure.alive) == (
        "TrainerStopped",
        "demo-worker-1",
        True,
        True,
    )
    assert failure.message == "demo-worker-1: rank 1 (pid 7) is stopped (state T)"
    assert failure.occurred_at == stopped_at


def test_a_hang_its_launcher_reports_is_no_progress_long_before_the_timeout(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0")]
    reached = micro(now)
    _, tracks = run(pods, {"demo-worker-0": lease(now, **{"step-at": reached})}, now)
    later = now + timedelta(seconds=1.6)
    hung = lease(
        later,
        fault="hung",
        **{"step-at": reached, "fault-since": reached, "fault-message": "rank 0: no step for 1.60s"},
    )
    (failure,), _ = run(pods, {"demo-worker-0": hung}, later, tracks)
    assert failure.cause == "NoProgress" and failure.force
    assert failure.message == "demo-worker-0: rank 0: no step for 1.60s"
    # Outside training the verdict is stale: no hang.
    assert run(pods, {"demo-worker-0": {**hung, "phase": "rendezvous"}}, later, tracks)[0] == []


def test_a_survivor_still_waiting_on_a_replaced_rank_is_not_judged_for_that_wait(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0")]
    reached = micro(now)
    _, tracks = run(pods, {"demo-worker-0": lease(now, **{"step-at": reached})}, now)
    incident = now + timedelta(seconds=2)
    detection.restart_clocks(tracks, incident)
    later = incident + timedelta(seconds=0.5)
    waiting = lease(later, fault="hung", **{"step-at": reached, "fault-since": reached})
    assert run(pods, {"demo-worker-0": waiting}, later, tracks)[0] == []


def test_launcher_hangs_keep_the_blame_rule_of_stalled_workers(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    reached = micro(now)
    leases = {name: lease(now, step=7, **{"step-at": reached}) for name in ("demo-worker-0", "demo-worker-1")}
    _, tracks = run(pods, leases, now)
    later = now + timedelta(seconds=2)
    verdict = {"fault": "hung", "step-at": reached, "fault-since": reached}
    both = {name: lease(later, step=7, **verdict) for name in ("demo-worker-0", "demo-worker-1")}
    failures, _ = run(pods, both, later, tracks)
    assert [(f.cause, f.pod) for f in failures] == [("NoProgress", "demo-worker-0")]


def test_a_hang_verdict_waiting_on_its_peers_renewals_is_looked_at_again_when_they_are_due(
    make_pod: MakePod, now: datetime
) -> None:
    """Peers' renewals wake no reconcile: the verdict held until each renewed after it must not wait for the
    periodic reconcile."""
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    reached = micro(now)
    leases = {name: lease(now, step=7, **{"step-at": reached}) for name in ("demo-worker-0", "demo-worker-1")}
    _, tracks = run(pods, leases, now)
    threshold = 1.4
    judged = now + timedelta(seconds=threshold)
    verdict = {"fault": "hung", "step-at": reached, "fault-since": reached, "hang-threshold": threshold}
    peer_before = lease(judged, step=7, age=0.3, **{"step-at": reached})  # renewed just before the verdict
    held = {"demo-worker-0": peer_before, "demo-worker-1": lease(judged, step=7, age=0.0, **verdict)}
    assert run(pods, held, judged, tracks)[0] == []
    due = HEARTBEAT.interval_seconds + detection.VERDICT_RENEWAL_MARGIN_SECONDS
    deadline = detection.next_heartbeat_deadline(pods, held, tracks, HEARTBEAT, judged)
    assert deadline == pytest.approx(due)
    # By then the peer renewed: the verdict is acted on. Were it still held, it is looked at each half interval.
    then = judged + timedelta(seconds=due)
    renewed = {**held, "demo-worker-0": lease(then, step=7, age=0.1, **{"step-at": reached})}
    assert [f.cause for f in run(pods, renewed, then, tracks)[0]] == ["NoProgress"]
    still = judged + timedelta(seconds=due + 0.5)
    assert detection.next_heartbeat_deadline(pods, held, tracks, HEARTBEAT, still) == pytest.approx(
        HEARTBEAT.interval_seconds / 2
    )


def test_a_survivor_waiting_on_a_peer_that_fell_silent_is_not_blamed(
    make_pod: MakePod, now: datetime
) -> None:
    """A frozen pod stops renewing its heartbeat; its peer waits in the next collective and its launcher
    judges that wait a hang first. The silent peer is the culprit: its heartbeat timeout decides."""
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    reached = micro(now)
    leases = {name: lease(now, step=7, **{"step-at": reached}) for name in ("demo-worker-0", "demo-worker-1")}
    _, tracks = run(pods, leases, now)
    later = now + timedelta(seconds=2)
    verdict = {"fault": "hung", "step-at": reached, "fault-since": reached, "hang-threshold": 1.4}
    frozen = lease(later, step=7, age=1.9, **{"step-at": reached})  # last renewed before the verdict
    waiting = {"demo-worker-0": frozen, "demo-worker-1": lease(later, step=7, **verdict)}
    assert run(pods, waiting, later, tracks)[0] == []
    # Once the silent peer is past its heartbeat timeout, it alone is replaced.
    timeout = later + timedelta(seconds=HEARTBEAT.timeout_seconds)
    silent = lease(timeout, step=7, age=HEARTBEAT.timeout_seconds + 1.9, **{"step-at": reached})
    failures, _ = run(
        pods, {"demo-worker-0": silent, "demo-worker-1": lease(timeout, step=7, **verdict)}, timeout, tracks
    )
    assert [(f.cause, f.pod) for f in failures] == [("HeartbeatTimeout", "demo-worker-0")]
    # A peer that renewed after the verdict is alive: the waiting rank's verdict stands (the blame rule).
    alive = {
        "demo-worker-0": lease(later, step=7, age=0.2, **{"step-at": reached}),
        "demo-worker-1": waiting["demo-worker-1"],
    }
    failures, _ = run(pods, alive, later, tracks)
    assert [(f.cause, f.pod) for f in failures] == [("NoProgress", "demo-worker-1")]


class _UnreadLeases(dict[str, dict[str, Any]]):
    """Leases that fail the test when read."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the heartbeats were read")


def test_healthy_nodes_are_confirmed_without_a_pass_over_the_heartbeats(
    make_pod: MakePod, now: datetime
) -> None:
    # At 12,500 pods a pass over every heartbeat per reconcile is a real cost: only a node problem needs one.
    pods = [make_pod("demo-worker-0")]
    assert detection.confirmed_nodes(HEALTHY, pods, _UnreadLeases(), now) == HEALTHY
    unready = {"node-a": {**HEALTHY["node-a"], "ready": "False", "readySince": format_time(now)}}
    with pytest.raises(AssertionError, match="heartbeats were read"):
        detection.confirmed_nodes(unready, pods, _UnreadLeases(), now)


def test_tracks_are_copied_unless_the_caller_hands_them_over(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0")]
    before = [api.WorkerTrack(pod="demo-worker-0", uid=pods[0]["metadata"].get("uid"), step=3)]
    leases = {"demo-worker-0": lease(now, step=4)}
    copied = detection.update_tracks(before, pods, leases, HEARTBEAT, "trainer", now)
    assert before[0].step == 3 and copied[0].step == 4 and copied[0] is not before[0]
    handed = detection.update_tracks(before, pods, leases, HEARTBEAT, "trainer", now, in_place=True)
    assert handed[0] is before[0] and before[0].step == 4
    assert handed[0].model_dump() == copied[0].model_dump()
