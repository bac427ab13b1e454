"""The operator's per-worker memory in status stays small whatever the gang's size, and loses nothing: a pod
whose track is not written out is still judged when it vanishes, and its no-progress clock still runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator import api, trackmemory
from phalanx.operator.reconcile import Observed, Plan, plan
from phalanx.operator.timeutil import format_micro_time

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]

STATUS_BOUND = 64 * 1024


def _lease(now: datetime, step: int, reached: datetime, phase: str = "training") -> dict[str, Any]:
    return {
        "step": str(step),
        "phase": phase,
        "renewTime": format_micro_time(now - timedelta(seconds=0.2)),
        "step-at": format_micro_time(reached),
        "step-seconds": "0.5",
    }


def _gang(make_pod: MakePod, workers: int, spares: int) -> list[dict[str, Any]]:
    pods = [make_pod(f"demo-worker-{i}", node=f"node-{i}") for i in range(workers)]
    pods += [
        make_pod(f"demo-worker-{i}", role="spare", node=f"node-{i}") for i in range(workers, workers + spares)
    ]
    return [*pods, make_pod("demo-rdzv", role="rendezvous", node="node-0")]


def _leases(
    pods: list[dict[str, Any]], now: datetime, step: int, reached: datetime
) -> dict[str, dict[str, Any]]:
    leases = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        if labels["phalanx.dev/role"] == "worker":
            leases[pod["metadata"]["name"]] = _lease(now, step, reached)
        elif labels["phalanx.dev/role"] == "spare":
            leases[pod["metadata"]["name"]] = _lease(now, 0, reached, phase="standby")
    return leases


def _nodes(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {pod["spec"]["nodeName"]: {"labels": {}, "ready": "True", "noExecute": []} for pod in pods}


def _no_heartbeat(pod: dict[str, Any]) -> dict[str, Any] | None:
    return None


def _next(job: dict[str, Any], result: Plan) -> dict[str, Any]:
    return {**job, "status": result.status}


def _size(result: Plan) -> int:
    return len(json.dumps(result.status, separators=(",", ":")))


def test_ranges_round_trip_and_what_is_not_a_range_is_ignored() -> None:
    assert trackmemory.format_ranges([8, 0, 1, 2, 5, 7, 2]) == ["0-2", "5", "7-8"]
    assert trackmemory.format_ranges([]) == []
    ranges = trackmemory.IndexRanges(["7-8", "0-2", "5", "x", "-3", "9-4", "1-99999999999", "", "1-2"])
    assert list(ranges) == [0, 1, 2, 5, 7, 8]
    assert 8 in ranges and 3 not in ranges and "1" not in ranges


def test_a_12500_pod_job_keeps_its_status_under_64_kib_through_a_failure_and_a_suspension(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    workers, spares = 12_500, 8
    job = make_job(replicas=workers, spares=spares)
    pods = _gang(make_pod, workers, spares)
    nodes = _nodes(pods)
    first = plan(job, Observed(pods=pods, now=now, leases=_leases(pods, now, 10, now), nodes=nodes))
    later = now + timedelta(seconds=2)
    steady = plan(
        _next(job, first),
        Observed(
            pods=pods, now=later, leases=_leases(pods, later, 12, later - timedelta(seconds=0.4)), nodes=nodes
        ),
    )
    assert steady.status["tracking"] == []
    assert steady.status["tracked"]["known"] == [f"0-{workers + spares - 1}"]
    assert len(steady.status["workers"]) == 64 and steady.status["unlistedWorkers"] == workers + spares - 64
    assert _size(steady) < STATUS_BOUND

    failed_at = later + timedelta(seconds=2)
    pods[7] = make_pod("demo-worker-7", node="node-7", phase="Failed", exit_code=137)
    killed = plan(
        _next(job, steady),
        Observed(pods=pods, now=failed_at, leases=_leases(pods, failed_at, 14, failed_at), nodes=nodes),
    )
    assert killed.delete_pods == ["demo-worker-7"]
    # The failed pod and the spares are listed ahead of running workers; the failed one is done, as a range.
    listed = {worker["name"] for worker in killed.status["workers"]}
    assert {"demo-worker-7", *(f"demo-worker-{i}" for i in range(workers, workers + spares))} <= listed
    assert killed.status["tracked"]["done"] == ["7"] and killed.status["tracked"]["clocksSince"]
    assert _size(killed) < STATUS_BOUND

    suspended = plan(
        _next(make_job(replicas=workers, spares=spares, suspend=True), killed),
        Observed(
            pods=pods, now=failed_at + timedelta(seconds=1), leases=_leases(pods, failed_at, 14, failed_at)
        ),
    )
    assert len(suspended.delete_pods) == workers + spares + 1  # the rendezvous goes too
    assert suspended.status["tracked"]["done"] == [f"0-{workers + spares - 1}"]
    assert _size(suspended) < STATUS_BOUND


def test_a_pod_remembered_only_as_a_range_is_judged_when_it_vanishes(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=3, spares=1)
    pods = _gang(make_pod, 3, 1)
    nodes = _nodes(pods)
    steady = plan(job, Observed(pods=pods, now=now, leases=_leases(pods, now, 10, now), nodes=nodes))
    assert steady.status["tracking"] == [] and steady.status["tracked"]["known"] == ["0-3"]

    later = now + timedelta(seconds=2)
    remaining = [pod for pod in pods if pod["metadata"]["name"] != "demo-worker-1"]
    gone = plan(
        _next(job, steady),
        Observed(pods=remaining, now=later, leases=_leases(remaining, later, 11, later), nodes=nodes),
    )
    (incident,) = gone.status["incidents"]
    assert incident["cause"] == "PodDeleted" and incident["worker"] == "demo-worker-1"
    # Handled and gone: nothing of it is left to remember.
    assert gone.status["tracked"]["known"] == ["0", "2-3"] and gone.status["tracked"]["done"] == []


def test_a_clock_rebuilt_from_the_heartbeat_catches_a_hang_on_time_and_starts_no_earlier_than_an_incident(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=2, spares=1, heartbeat={"progressTimeoutSeconds": 60})
    pods = _gang(make_pod, 2, 1)
    nodes = _nodes(pods)
    reached = now - timedelta(seconds=30)
    steady = plan(job, Observed(pods=pods, now=now, leases=_leases(pods, now, 10, reached), nodes=nodes))
    assert steady.status["tracking"] == []

    def at(seconds: float, status_of: Plan) -> Plan:
        moment = reached + timedelta(seconds=seconds)
        leases = _leases(pods, moment, 10, reached)
        return plan(_next(job, status_of), Observed(pods=pods, now=moment, leases=leases, nodes=nodes))

    assert at(59, steady).status["incidents"] == []
    (incident,) = at(61, steady).status["incidents"]
    assert incident["cause"] == "NoProgress"

    # Every clock started over with the incident: a step reached before it no longer counts from then.
    restarted = api.TrainingJobStatus.model_validate(steady.status)
    restarted.tracked = restarted.tracked.model_copy(
        update={"clocks_since": format_micro_time(reached + timedelta(seconds=40))}
    )
    steady.status = restarted.to_wire()
    assert at(99, steady).status["incidents"] == []
    assert at(101, steady).status["incidents"][0]["cause"] == "NoProgress"


def test_what_a_pod_cannot_tell_is_written_out_the_most_needed_first_and_at_most_256(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod(f"demo-worker-{i}", node=f"node-{i}") for i in range(400)]
    tracks = [
        api.WorkerTrack(pod=f"demo-worker-{i}", uid=f"uid-demo-worker-{i}", node=f"node-{i}")
        for i in range(400)
    ]
    for track in tracks[:300]:
        track.slow = 1
    for track in tracks[100:110]:
        track.restarts = 1
    vanished = api.WorkerTrack(pod="demo-worker-500", uid="uid-gone", node="node-500")
    stored, summary = trackmemory.compact([*tracks, vanished], pods, _no_heartbeat, "demo", None, now)
    assert len(stored) == trackmemory.MAX_STORED_TRACKS
    assert vanished in stored and all(track in stored for track in tracks[100:110])
    assert summary is not None and summary.known == ["255-399"]
    rebuilt = trackmemory.expand(
        api.TrainingJobStatus(tracking=stored, tracked=summary), pods, _no_heartbeat, "demo", now
    )
    assert sorted(track.pod for track in rebuilt) == sorted(f"demo-worker-{i}" for i in [*range(400), 500])


def test_the_stored_tracks_give_way_when_the_status_would_outgrow_its_budget(
    make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod(f"demo-worker-{i}", node=f"node-{i}") for i in range(400)]
    tracks = [
        api.WorkerTrack(pod=f"demo-worker-{i}", uid=f"uid-demo-worker-{i}", node=f"node-{i}", slow=1)
        for i in range(400)
    ]
    for track in tracks[200:210]:
        track.restarts = 1
    budget = 8 * 1024
    stored, summary = trackmemory.compact(tracks, pods, _no_heartbeat, "demo", None, now, budget_bytes=budget)
    assert 10 < len(stored) < trackmemory.MAX_STORED_TRACKS
    assert all(track in stored for track in tracks[200:210])  # the most needed are kept
    assert summary is not None
    written = {"tracking": [track.to_wire() for track in stored], "tracked": summary.to_wire()}
    assert len(json.dumps(written, separators=(",", ":"))) <= budget
    # The others are rebuilt from their pods, as those beyond the count are.
    rebuilt = trackmemory.expand(
        api.TrainingJobStatus(tracking=stored, tracked=summary), pods, _no_heartbeat, "demo", now
    )
    assert sorted(track.pod for track in rebuilt) == sorted(f"demo-worker-{i}" for i in range(400))
    everything, _ = trackmemory.compact(tracks, pods, _no_heartbeat, "demo", None, now)
    assert len(everything) == trackmemory.MAX_STORED_TRACKS
