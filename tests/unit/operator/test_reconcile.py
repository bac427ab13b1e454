"""One reconcile as a pure function: observed state -> pods to create/delete, one status, Events."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator.reconcile import Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]


def _created(result: Plan) -> list[str]:
    return [pod["metadata"]["name"] for pod in result.create_pods]


def _condition(result: Plan, condition_type: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == condition_type)


def _running_gang(make_pod: MakePod, workers: int = 2, spares: int = 1) -> list[dict[str, Any]]:
    pods = [make_pod(f"demo-worker-{i}") for i in range(workers)]
    pods += [make_pod(f"demo-worker-{workers + i}", role="spare") for i in range(spares)]
    return [*pods, make_pod("demo-rdzv", role="rendezvous")]


def _with_status(job: dict[str, Any], result: Plan) -> dict[str, Any]:
    return {**job, "status": result.status}


def test_a_new_job_creates_the_rendezvous_workers_and_spares(make_job: MakeJob, now: datetime) -> None:
    result = plan(make_job(), Observed(pods=[], now=now))
    assert _created(result) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    roles = [pod["metadata"]["labels"]["phalanx.dev/role"] for pod in result.create_pods]
    assert roles == ["rendezvous", "worker", "worker", "spare"]
    assert {child["kind"] for child in result.ensure} == {"ServiceAccount", "Role", "RoleBinding", "Service"}
    status = result.status
    assert status["state"] == "Scheduling" and status["startTime"] == "2026-01-01T12:00:00Z"
    assert status["readyWorkers"] == "0/2" and status["observedGeneration"] == 1
    assert status["selector"] == "phalanx.dev/job-name=demo,phalanx.dev/role=worker"
    assert _condition(result, "GangScheduled")["status"] == "False"
    assert [event.reason for event in result.events] == ["CreatedPods"]


def test_replaying_with_a_stale_view_asks_for_the_same_names(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    first = plan(make_job(), Observed(pods=[], now=now))
    again = plan(_with_status(make_job(), first), Observed(pods=[], now=now + timedelta(seconds=1)))
    assert _created(again) == _created(first)
    # Seeing one of them already, only the others are asked for, under their own names.
    partial = plan(make_job(), Observed(pods=[make_pod("demo-worker-0", node=None)], now=now))
    assert _created(partial) == ["demo-rdzv", "demo-worker-1", "demo-worker-2"]


def test_a_scheduled_running_gang_is_running(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    leases = {"demo-worker-0": {"step": "41", "rank": "0"}, "demo-worker-1": {"step": "42", "rank": "1"}}
    nodes = {"node-a": {"topology.kubernetes.io/zone": "zone-1"}}
    result = plan(
        make_job(), Observed(pods=_running_gang(make_pod), now=now, leases=leases, node_labels=nodes)
    )
    assert result.create_pods == [] and result.delete_pods == []
    status = result.status
    assert status["state"] == "Running"
    assert status["replicas"] == {"desired": 2, "active": 2, "ready": 2, "spares": 1}
    assert status["readyWorkers"] == "2/2" and status["step"] == 42
    assert _condition(result, "GangScheduled")["status"] == "True"
    assert _condition(result, "Running")["status"] == "True"
    workers = {w["name"]: w for w in status["workers"]}
    assert workers["demo-worker-1"] == {
        "name": "demo-worker-1",
        "node": "node-a",
        "zone": "zone-1",
        "rank": 1,
        "role": "worker",
        "phase": "Running",
    }
    assert workers["demo-worker-2"]["role"] == "spare"
    assert {event.reason for event in result.events} == {"AllScheduled", "Training"}
    # Nothing changed: the next reconcile writes the same status and posts no Event.
    again = plan(
        _with_status(make_job(), result),
        Observed(pods=_running_gang(make_pod), now=now, leases=leases, node_labels=nodes),
    )
    assert again.status == result.status and again.events == []


def test_invalid_spec_fails_with_the_field_and_creates_nothing(make_job: MakeJob, now: datetime) -> None:
    result = plan(make_job(minReplicas=3, maxReplicas=2), Observed(pods=[], now=now))
    assert result.create_pods == [] and result.ensure == []
    failed = _condition(result, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.minReplicas" in failed["message"]
    assert result.status["state"] == "Invalid"
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]
    assert "spec.minReplicas" in result.events[0].message
    # Fixing the spec clears Failed and starts the job.
    fixed = plan(_with_status(make_job(), result), Observed(pods=[], now=now))
    assert _condition(fixed, "Failed")["status"] == "False" and len(fixed.create_pods) == 4


def test_scale_outside_bounds_on_a_running_job_is_refused_and_pods_stay(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    running = plan(make_job(maxReplicas=3), Observed(pods=_running_gang(make_pod), now=now))
    job = _with_status(make_job(replicas=5, maxReplicas=3), running)
    result = plan(job, Observed(pods=_running_gang(make_pod), now=now))
    assert result.create_pods == [] and result.delete_pods == []
    spec_valid = _condition(result, "SpecValid")
    assert spec_valid["status"] == "False" and "spec.replicas" in spec_valid["message"]
    assert _condition(result, "Failed")["status"] == "False"
    assert result.status["replicas"]["desired"] == 2 and result.status["state"] == "Running"


def test_scale_up_and_down_within_bounds(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    up = plan(make_job(replicas=3, maxReplicas=4), Observed(pods=_running_gang(make_pod), now=now))
    assert _created(up) == ["demo-worker-3"]
    assert up.create_pods[0]["metadata"]["labels"]["phalanx.dev/role"] == "worker"
    down = plan(make_job(replicas=1, minReplicas=1), Observed(pods=_running_gang(make_pod), now=now))
    assert down.delete_pods == ["demo-worker-1"] and down.create_pods == []


def test_suspend_removes_pods_and_keeps_status_then_resume_recreates(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    leases = {"demo-worker-0": {"step": "17"}}
    running = plan(make_job(), Observed(pods=_running_gang(make_pod), now=now, leases=leases))
    suspended = plan(
        _with_status(make_job(suspend=True), running), Observed(pods=_running_gang(make_pod), now=now)
    )
    assert sorted(suspended.delete_pods) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert suspended.create_pods == []
    assert suspended.status["state"] == "Suspended" and suspended.status["step"] == 17
    assert _condition(suspended, "Suspended")["status"] == "True"
    resumed = plan(_with_status(make_job(suspend=False), suspended), Observed(pods=[], now=now))
    assert len(resumed.create_pods) == 4
    assert _condition(resumed, "Suspended")["reason"] == "Resumed"
    assert "Resumed" in {event.reason for event in resumed.events}


def test_workers_exiting_zero_succeed_the_job_and_remove_spares(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = [
        make_pod("demo-worker-0", phase="Succeeded", exit_code=0),
        make_pod("demo-worker-1", phase="Succeeded", exit_code=0),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    result = plan(make_job(), Observed(pods=pods, now=now))
    assert sorted(result.delete_pods) == ["demo-rdzv", "demo-worker-2"] and result.create_pods == []
    assert _condition(result, "Succeeded")["status"] == "True"
    assert result.status["state"] == "Succeeded" and result.status["completionTime"] == "2026-01-01T12:00:00Z"
    # Done is done: nothing is recreated afterwards.
    after = plan(_with_status(make_job(), result), Observed(pods=pods[:2], now=now))
    assert after.create_pods == [] and after.status["state"] == "Succeeded"


def test_one_worker_done_and_one_still_running_creates_nothing(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0", phase="Succeeded", exit_code=0), make_pod("demo-worker-1")]
    result = plan(make_job(spares=0), Observed(pods=pods, now=now))
    assert result.create_pods == [] and result.status["state"] == "Finishing"


def test_a_failed_worker_is_replaced_once_and_counted_once(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)
    pods[1] = make_pod("demo-worker-1", phase="Failed", exit_code=1)
    first = plan(make_job(), Observed(pods=pods, now=now))
    assert first.delete_pods == ["demo-worker-1"]
    assert _created(first) == ["demo-worker-3"]  # demo-worker-1 is still taken until it is gone
    assert first.status["restarts"] == {"total": 1, "byCause": {"ExitCode": 1}}
    (incident,) = first.status["incidents"]
    assert incident["worker"] == "demo-worker-1" and incident["podUid"] == "uid-demo-worker-1"
    # The failed pod is still visible at the next reconcile: the same failure is not counted again.
    second = plan(_with_status(make_job(), first), Observed(pods=pods, now=now))
    assert second.status["restarts"]["total"] == 1 and second.delete_pods == ["demo-worker-1"]


def test_a_permanent_exit_code_fails_the_job(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    rules = [{"name": "bad-config", "match": {"exitCodes": [3]}, "action": "FailJob"}]
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=3)
    result = plan(make_job(failurePolicy={"rules": rules}), Observed(pods=pods, now=now))
    failed = _condition(result, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "PermanentFailure"
    assert "code 3" in failed["message"] and "bad-config" in failed["message"]
    assert result.status["restarts"]["total"] == 0 and result.create_pods == []
    assert "demo-rdzv" in result.delete_pods and "demo-worker-1" in result.delete_pods


def test_spent_restart_budget_fails_the_job(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=1)
    result = plan(make_job(failurePolicy={"maxRestarts": 0}), Observed(pods=pods, now=now))
    assert _condition(result, "Failed")["reason"] == "MaxRestartsExceeded"
    assert result.status["state"] == "Failed"


def test_gang_timeout_deletes_all_then_backs_off_then_retries(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(gang={"scheduleTimeoutSeconds": 30, "backoffSeconds": 20})
    created = plan(job, Observed(pods=[], now=now))
    pods = [
        make_pod("demo-worker-0", created="2026-01-01T12:00:00Z"),
        make_pod("demo-worker-1", node=None, phase="Pending", created="2026-01-01T12:00:00Z"),
        make_pod("demo-worker-2", role="spare", node=None, phase="Pending", created="2026-01-01T12:00:00Z"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    later = now + timedelta(seconds=31)
    timed_out = plan(_with_status(job, created), Observed(pods=pods, now=later))
    assert sorted(timed_out.delete_pods) == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]
    gang = _condition(timed_out, "GangScheduled")
    assert gang["reason"] == "ScheduleTimeout" and "1 of 3" in gang["message"]
    assert timed_out.status["gang"]["attempts"] == 1 and timed_out.create_pods == []
    assert "ScheduleTimeout" in {event.reason for event in timed_out.events}
    rendezvous_only = pods[3:]
    waiting = plan(
        _with_status(job, timed_out), Observed(pods=rendezvous_only, now=later + timedelta(seconds=5))
    )
    assert waiting.create_pods == [] and waiting.status["state"] == "Backoff"
    held = _condition(waiting, "GangScheduled")
    assert (
        held["reason"] == "ScheduleTimeout"
        and "1 of 3" in held["message"]
        and "next attempt (2)" in held["message"]
    )
    assert waiting.events == []
    retry = plan(
        _with_status(job, waiting), Observed(pods=rendezvous_only, now=later + timedelta(seconds=21))
    )
    assert _created(retry) == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]


def test_lost_rendezvous_pod_is_recreated_and_a_dead_one_removed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)[:-1]
    assert _created(plan(make_job(), Observed(pods=pods, now=now))) == ["demo-rdzv"]
    dead = [*pods, make_pod("demo-rdzv", role="rendezvous", phase="Failed")]
    assert plan(make_job(), Observed(pods=dead, now=now)).delete_pods == ["demo-rdzv"]


def test_terminating_pods_are_not_counted_but_keep_their_names(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", terminating=True)
    result = plan(make_job(), Observed(pods=pods, now=now))
    assert _created(result) == ["demo-worker-3"] and result.delete_pods == []


def test_status_shows_the_role_the_heartbeat_reports(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # torch promoted the spare (index 2) after worker-1 was replaced by worker-3, which now stands by.
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-2", role="spare"), make_pod("demo-worker-3")]
    pods.append(make_pod("demo-rdzv", role="rendezvous"))
    leases = {
        "demo-worker-0": {"phase": "training"},
        "demo-worker-2": {"phase": "training"},
        "demo-worker-3": {"phase": "standby"},
    }
    result = plan(make_job(), Observed(pods=pods, now=now, leases=leases))
    roles = {worker["name"]: worker["role"] for worker in result.status["workers"]}
    assert roles == {"demo-worker-0": "worker", "demo-worker-2": "worker", "demo-worker-3": "spare"}
    assert result.create_pods == [] and result.delete_pods == []
