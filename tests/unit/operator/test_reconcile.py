"""One reconcile as a pure function: observed state -> pods to create/delete, one status, Events."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from phalanx.operator import policy
from phalanx.operator.reconcile import REGROUP_CLOCK_MARGIN, SUSPECT_NODE_SECONDS, Observed, Plan, plan
from phalanx.operator.timeutil import format_micro_time, format_time
from phalanx.operator.topology import avoided_nodes

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
    assert {child["kind"] for child in result.ensure} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
    }
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
    # Not Suspended while its pods stop (each worker saves a checkpoint on SIGTERM): who waits for the condition
    # reads the checkpoint next.
    stopping = _condition(suspended, "Suspended")
    assert stopping["status"] == "False" and stopping["reason"] == "Suspending", stopping
    assert "4 of its pods still stopping" in stopping["message"]
    terminating = [
        {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "t"}} for pod in _running_gang(make_pod)
    ]
    still = plan(_with_status(make_job(suspend=True), suspended), Observed(pods=terminating, now=now))
    assert _condition(still, "Suspended")["reason"] == "Suspending" and not still.delete_pods
    gone = plan(_with_status(make_job(suspend=True), still), Observed(pods=[], now=now))
    assert _condition(gone, "Suspended")["status"] == "True"
    assert [event.reason for event in gone.events] == ["Suspended"]
    resumed = plan(_with_status(make_job(suspend=False), gone), Observed(pods=[], now=now))
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
    assert first.status["restarts"] == {
        "total": 1,
        "byCause": {"ExitCode": 1},
        "counted": 1,
        "byRule": {"default": 1},
    }
    (incident,) = first.status["incidents"]
    assert incident["worker"] == "demo-worker-1" and incident["podUid"] == "uid-demo-worker-1"
    # The failed pod is still visible at the next reconcile: the same failure is not counted again.
    second = plan(_with_status(make_job(), first), Observed(pods=pods, now=now))
    assert second.status["restarts"]["total"] == 1 and second.delete_pods == ["demo-worker-1"]


def test_the_exits_judged_are_those_of_the_chosen_trainer_container(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(trainerContainer="main")
    containers = job["spec"]["template"]["spec"]["containers"]
    containers[0]["name"] = "main"
    containers.append({"name": "trainer", "image": "busybox", "command": ["sleep", "inf"]})
    pods = _running_gang(make_pod)
    # A sidecar called `trainer` that ended says nothing about training; `main` failing does.
    pods[0]["status"]["containerStatuses"] = [
        {"name": "trainer", "ready": False, "terminated": {"exitCode": 0}}
    ]
    pods[1] = make_pod("demo-worker-1", phase="Failed", exit_code=3, container="main")
    result = plan(job, Observed(pods=pods, now=now))
    (incident,) = result.status["incidents"]
    assert incident["worker"] == "demo-worker-1" and incident["cause"] == "ExitCode"
    assert "code 3" in incident["message"], incident
    assert result.status["replicas"]["active"] == 1 and result.delete_pods == ["demo-worker-1"]


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


def test_progress_is_unknown_while_the_workers_train_without_publishing_steps(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)
    started = format_micro_time(now - timedelta(seconds=121))
    silent = {"phase": "training", "step": "", "group-started": started}
    leases = {"demo-worker-0": silent, "demo-worker-1": silent, "demo-worker-2": {"phase": "standby"}}
    job = make_job(heartbeat={"progressTimeoutSeconds": 120})
    result = plan(job, Observed(pods=pods, now=now, leases=leases))
    assert result.status["progress"] == "Unknown" and result.status.get("step") is None
    assert [e.reason for e in result.events].count("ProgressUnknown") == 1
    assert "trained for 120s" in next(e.message for e in result.events if e.reason == "ProgressUnknown")
    # Said once, not at every reconcile.
    again = plan(_with_status(job, result), Observed(pods=pods, now=now, leases=leases))
    assert again.status["progress"] == "Unknown"
    assert "ProgressUnknown" not in [e.reason for e in again.events]
    # A script that publishes steps reports its progress.
    stepping = {**leases, "demo-worker-0": {"phase": "training", "step": "3"}}
    reported = plan(_with_status(job, again), Observed(pods=pods, now=now, leases=stepping))
    assert reported.status["progress"] == "Reported" and reported.status["step"] == 3


def test_progress_is_not_called_unknown_before_the_progress_timeout(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # The group started a minute ago and its first step is still being computed (a model built, compiled).
    pods = _running_gang(make_pod)
    job = make_job(heartbeat={"progressTimeoutSeconds": 120})
    started = {
        "phase": "training",
        "step": "",
        "group-started": format_micro_time(now - timedelta(seconds=60)),
    }
    leases = {"demo-worker-0": started, "demo-worker-1": started, "demo-worker-2": {"phase": "standby"}}
    early = plan(job, Observed(pods=pods, now=now, leases=leases))
    assert early.status.get("progress") is None
    assert "ProgressUnknown" not in [e.reason for e in early.events]
    # Its first step arrives: progress was known all along.
    stepping = {**leases, "demo-worker-0": {**started, "step": "1"}}
    later = now + timedelta(seconds=30)
    first = plan(_with_status(job, early), Observed(pods=pods, now=later, leases=stepping))
    assert first.status["progress"] == "Reported"
    assert "ProgressUnknown" not in [e.reason for e in first.events]
    # Past the window without a step, it is unknown (judged by the periodic reconcile).
    silent_long = plan(
        _with_status(job, early), Observed(pods=pods, now=now + timedelta(seconds=61), leases=leases)
    )
    assert silent_long.status["progress"] == "Unknown"
    assert [e.reason for e in silent_long.events].count("ProgressUnknown") == 1


# ------------------------------------------------------------------------------------- fault tolerance

HEALTHY_NODES = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}


def _lease(now: datetime, step: int, phase: str = "training", age: float = 0.2) -> dict[str, Any]:
    renewed = (now - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"step": str(step), "phase": phase, "renewTime": renewed, "step-seconds": "0.5"}


def _gang_leases(now: datetime, step: int) -> dict[str, dict[str, Any]]:
    return {
        "demo-worker-0": _lease(now, step),
        "demo-worker-1": _lease(now, step),
        "demo-worker-2": _lease(now, 0, phase="standby"),
    }


def test_a_killed_worker_is_swapped_for_the_spare_without_spending_the_budget(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(failurePolicy={"maxRestarts": 0}, heartbeat={"intervalSeconds": 1})
    pods = _running_gang(make_pod)
    steady = plan(job, Observed(pods=pods, now=now, leases=_gang_leases(now, 10), nodes=HEALTHY_NODES))
    assert steady.status["incidents"] == [] and _condition(steady, "Recovering")["status"] == "False"
    steady.status["startTime"] = "2026-01-01T11:59:00Z"

    later = now + timedelta(seconds=2)
    pods[1] = make_pod("demo-worker-1", phase="Failed", exit_code=137)
    leases = _gang_leases(later, 12)
    killed = plan(
        _with_status(job, steady), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES)
    )
    assert killed.delete_pods == ["demo-worker-1"] and _condition(killed, "Failed")["status"] == "False"
    # The standby spare takes the slot: the pool is refilled with a new spare, not a new worker.
    assert [
        (p["metadata"]["name"], p["metadata"]["labels"]["phalanx.dev/role"]) for p in killed.create_pods
    ] == [("demo-worker-3", "spare")]
    (incident,) = killed.status["incidents"]
    assert incident["cause"] == "Killed" and incident["detectedStep"] == 12 and incident["resumeStep"] == 14
    assert killed.status["restarts"]["byCause"] == {"Killed": 1} and killed.status["restarts"]["counted"] == 0
    assert _condition(killed, "Recovering")["status"] == "True"
    assert _condition(killed, "Recovering")["reason"] == "Killed"
    assert [e.reason for e in killed.events if e.type == "Warning"] == ["Killed"]
    assert [i.cause for i in killed.detected] == ["Killed"]

    # torch promoted the spare (its heartbeat trains): the operator relabels it; training passes step 14.
    resumed_at = later + timedelta(seconds=3)
    pods = [p for p in pods if p["metadata"]["name"] != "demo-worker-1"]
    pods.append(make_pod("demo-worker-3", role="spare"))
    leases = {
        "demo-worker-0": _lease(resumed_at, 15),
        "demo-worker-2": _lease(resumed_at, 15),
        "demo-worker-3": _lease(resumed_at, 0, phase="standby"),
    }
    resumed = plan(
        _with_status(job, killed), Observed(pods=pods, now=resumed_at, leases=leases, nodes=HEALTHY_NODES)
    )
    assert resumed.relabel_pods == {"demo-worker-2": "worker"} and resumed.spare_swaps == 1
    assert resumed.create_pods == [] and resumed.delete_pods == []
    (incident,) = resumed.status["incidents"]
    assert incident["resumedAt"] and incident["secondsToRecover"] == 3.0
    assert _condition(resumed, "Recovering")["reason"] == "Recovered"
    reasons = [e.reason for e in resumed.events]
    assert "SparePromoted" in reasons and "Recovered" in reasons
    assert resumed.status["goodput"] == round(1 - 3 / 65, 2)  # percent while the job runs


def test_a_lost_node_force_deletes_its_pods_at_once(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", node="node-b")
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", node="node-b")
    nodes = {**HEALTHY_NODES, "node-b": {"labels": {}, "ready": "Unknown", "noExecute": []}}
    result = plan(make_job(), Observed(pods=pods, now=now, leases=_gang_leases(now, 5), nodes=nodes))
    assert sorted(result.force_delete_pods) == ["demo-rdzv", "demo-worker-0"] and result.delete_pods == []
    (incident,) = result.status["incidents"]
    assert incident["cause"] == "NodeLost" and incident["node"] == "node-b"


def _avoided(pod: dict[str, Any]) -> frozenset[str]:
    return avoided_nodes(pod["spec"])


def test_pods_replacing_a_lost_node_stay_off_it_while_the_scheduler_may_not_know(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", node="node-b")
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", node="node-b")
    nodes = {**HEALTHY_NODES, "node-b": {"labels": {}, "ready": "Unknown", "noExecute": []}}
    lost = plan(job, Observed(pods=pods, now=now, leases=_gang_leases(now, 5), nodes=nodes))
    (refill,) = lost.create_pods
    assert _avoided(refill) == {"node-b"}
    # Its pods are gone, so node-b is no longer observed: the open incident still keeps new pods off it.
    survivors = [pods[1], pods[2], make_pod("demo-worker-3", role="spare", node=None)]
    later = now + timedelta(seconds=2)
    observed = Observed(pods=survivors, now=later, leases=_gang_leases(later, 5), nodes=HEALTHY_NODES)
    after = plan(_with_status(job, lost), observed)
    (rendezvous,) = after.create_pods
    assert rendezvous["metadata"]["name"] == "demo-rdzv" and _avoided(rendezvous) == {"node-b"}
    # Long after, the node controller has marked the node itself: no suspicion of the operator's own.
    much_later = now + timedelta(seconds=SUSPECT_NODE_SECONDS + 1)
    observed = Observed(
        pods=survivors, now=much_later, leases=_gang_leases(much_later, 5), nodes=HEALTHY_NODES
    )
    (rendezvous,) = plan(_with_status(job, lost), observed).create_pods
    assert _avoided(rendezvous) == frozenset()


def test_a_lost_status_write_does_not_lose_the_start_time(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # The pods were created, the status saying so was not written: the start time comes from the pods.
    pods = _running_gang(make_pod)
    pods[1]["metadata"]["creationTimestamp"] = "2026-01-01T11:58:30Z"
    result = plan(make_job(), Observed(pods=pods, now=now, leases=_gang_leases(now, 5), nodes=HEALTHY_NODES))
    assert result.status["startTime"] == "2026-01-01T11:58:30Z"


def test_a_new_spare_stays_off_a_node_whose_pods_went_quiet(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # torch promoted the spare (worker-0's node died a moment ago, nobody has said so yet): the refill spare
    # must not go where worker-0's heartbeat stopped.
    job = make_job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 30})
    pods = [
        make_pod("demo-worker-0", node="node-b"),
        make_pod("demo-worker-1"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    nodes = {**HEALTHY_NODES, "node-b": {"labels": {}, "ready": "True", "noExecute": []}}
    for age, avoided in ((3.0, {"node-b"}), (0.5, set())):
        leases = {"demo-worker-0": _lease(now, 5, age=age), "demo-worker-1": _lease(now, 5)}
        (spare,) = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=nodes)).create_pods
        assert spare["metadata"]["labels"]["phalanx.dev/role"] == "spare"
        assert _avoided(spare) == avoided


def test_an_unschedulable_pod_kept_off_a_node_no_longer_lost_is_created_again(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _running_gang(make_pod)
    pods[2] = make_pod("demo-worker-2", role="spare", node=None, phase="Pending")
    pods[2]["spec"]["avoidNodes"] = ["node-b"]
    waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    leases = {name: lease for name, lease in _gang_leases(now, 5).items() if name != "demo-worker-2"}
    pending = plan(make_job(), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    assert pending.delete_pods == []  # the scheduler has not said it cannot place it
    pods[2]["status"]["conditions"] = [waiting]
    stuck = plan(make_job(), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    assert stuck.delete_pods == ["demo-worker-2"]
    pods[0] = make_pod("demo-worker-0", node="node-b")
    nodes = {**HEALTHY_NODES, "node-b": {"labels": {}, "ready": "False", "noExecute": []}}
    still_lost = plan(make_job(), Observed(pods=pods, now=now, leases=leases, nodes=nodes))
    assert "demo-worker-2" not in still_lost.delete_pods + still_lost.force_delete_pods


def test_a_frozen_worker_is_deleted_with_grace_zero(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 5})
    pods = _running_gang(make_pod)
    first = plan(job, Observed(pods=pods, now=now, leases=_gang_leases(now, 5), nodes=HEALTHY_NODES))
    later = now + timedelta(seconds=7)
    leases = {**_gang_leases(later, 9), "demo-worker-0": _lease(now, 5)}
    frozen = plan(
        _with_status(job, first), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES)
    )
    assert frozen.force_delete_pods == ["demo-worker-0"]
    assert frozen.status["incidents"][0]["cause"] == "HeartbeatTimeout"
    # Replayed (an operator restart before the pod is gone): nothing is counted or created twice.
    again = plan(
        _with_status(job, frozen), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES)
    )
    assert len(again.status["incidents"]) == 1 and again.status["restarts"]["total"] == 1
    assert _created(again) == _created(frozen)  # the same deterministic name, created once by the API


def test_no_spare_left_shrinks_then_waits_below_min(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=3, minReplicas=2, spares=0)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)] + [make_pod("demo-rdzv", role="rendezvous")]
    leases = {f"demo-worker-{i}": _lease(now, 4) for i in range(3)}
    first = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    pods[2] = make_pod("demo-worker-2", phase="Failed", exit_code=137)
    shrunk = plan(_with_status(job, first), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    assert [p["metadata"]["labels"]["phalanx.dev/role"] for p in shrunk.create_pods] == ["worker"]
    assert _condition(shrunk, "Degraded")["reason"] == "Shrunk"
    pods[1] = make_pod("demo-worker-1", phase="Failed", exit_code=137)
    below = plan(_with_status(job, shrunk), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    degraded = _condition(below, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "BelowMinReplicas"
    assert "at least 2" in degraded["message"] and _condition(below, "Failed")["status"] == "False"


def test_restart_job_rule_deletes_every_trainer(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    rules = [{"name": "all", "match": {"exitCodes": [1]}, "action": "RestartJob"}]
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=1)
    result = plan(make_job(failurePolicy={"rules": rules}), Observed(pods=pods, now=now, nodes=HEALTHY_NODES))
    assert sorted(result.delete_pods) == ["demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert result.status["restarts"]["byRule"] == {"all": 1}


def test_a_checkpoint_save_is_not_a_hang(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    job = make_job(heartbeat={"progressTimeoutSeconds": 10})
    pods = _running_gang(make_pod)
    result = plan(job, Observed(pods=pods, now=now, leases=_gang_leases(now, 8), nodes=HEALTHY_NODES))
    for seconds in (5, 15, 60):
        moment = now + timedelta(seconds=seconds)
        leases = {**_gang_leases(moment, 8), "demo-worker-0": _lease(moment, 8, phase="saving")}
        leases["demo-worker-1"] = _lease(moment, 8, phase="saving")
        result = plan(
            _with_status(job, result), Observed(pods=pods, now=moment, leases=leases, nodes=HEALTHY_NODES)
        )
        assert result.status["incidents"] == [] and result.delete_pods == []


def test_operator_deletions_are_not_failures(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    job = make_job(replicas=3, maxReplicas=3, spares=0)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)] + [make_pod("demo-rdzv", role="rendezvous")]
    first = plan(job, Observed(pods=pods, now=now, nodes=HEALTHY_NODES))
    smaller = make_job(replicas=2, maxReplicas=3, spares=0)
    down = plan(_with_status(smaller, first), Observed(pods=pods, now=now, nodes=HEALTHY_NODES))
    assert down.delete_pods == ["demo-worker-2"]
    pods[2] = make_pod("demo-worker-2", terminating=True)
    after = plan(_with_status(smaller, down), Observed(pods=pods, now=now, nodes=HEALTHY_NODES))
    gone = plan(
        _with_status(smaller, after), Observed(pods=pods[:2] + pods[3:], now=now, nodes=HEALTHY_NODES)
    )
    assert gone.status["incidents"] == [] and gone.status["restarts"]["total"] == 0


# ------------------------------------------------------------------------------------- regroup requests


def _exited(make_pod: MakePod, name: str, code: int, finished: str) -> dict[str, Any]:
    pod = make_pod(name, phase="Failed", exit_code=code)
    pod["status"]["containerStatuses"][0]["terminated"]["finishedAt"] = finished
    return pod


def _steady(job: dict[str, Any], pods: list[dict[str, Any]], now: datetime, step: int = 10) -> Plan:
    return plan(job, Observed(pods=pods, now=now, leases=_gang_leases(now, step), nodes=HEALTHY_NODES))


def test_a_failed_worker_asks_its_group_to_re_form_from_when_it_failed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 5})
    pods = _running_gang(make_pod)
    steady = _steady(job, pods, now)
    assert "regroup" not in steady.status
    later = now + timedelta(seconds=2)
    pods[1] = _exited(make_pod, "demo-worker-1", 137, "2026-01-01T12:00:01Z")
    killed = plan(
        _with_status(job, steady),
        Observed(pods=pods, now=later, leases=_gang_leases(later, 12), nodes=HEALTHY_NODES),
    )
    # The exit is known to the second: the request covers the whole of it (and a margin for clocks).
    assert killed.status["regroup"] == {
        "before": "2026-01-01T12:00:02.249999Z",
        "epoch": 1,
        "reason": "Killed of demo-worker-1",
        "departed": ["demo-worker-1"],
        "departedUids": ["uid-demo-worker-1"],
    }
    assert killed.status["incidents"][0]["occurredAt"] == "2026-01-01T12:00:01.999999Z"
    # The operator's configured clock skew replaces the default margin.
    skewed = plan(
        _with_status(job, steady),
        Observed(
            pods=pods,
            now=later,
            leases=_gang_leases(later, 12),
            nodes=HEALTHY_NODES,
            clock_margin=timedelta(seconds=2),
        ),
    )
    assert skewed.status["regroup"]["before"] == "2026-01-01T12:00:03.999999Z"
    # Unchanged while nothing else fails.
    again = plan(
        _with_status(job, killed),
        Observed(pods=pods, now=later, leases=_gang_leases(later, 12), nodes=HEALTHY_NODES),
    )
    assert again.status["regroup"] == killed.status["regroup"]
    # The next failure (a frozen worker) is the next epoch, from its last heartbeat.
    frozen_at = later + timedelta(seconds=10)
    leases = {**_gang_leases(frozen_at, 20), "demo-worker-0": _lease(frozen_at, 15, age=6)}
    frozen = plan(
        _with_status(job, again),
        Observed(pods=pods, now=frozen_at, leases=leases, nodes=HEALTHY_NODES),
    )
    assert frozen.status["regroup"] == {
        "before": format_micro_time(frozen_at - timedelta(seconds=6) + REGROUP_CLOCK_MARGIN),
        "epoch": 2,
        "reason": "HeartbeatTimeout of demo-worker-0",
        "departed": ["demo-worker-0"],
        "departedUids": ["uid-demo-worker-0"],
    }


def test_several_failures_make_one_request_from_the_latest(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=3, spares=0)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)] + [make_pod("demo-rdzv", role="rendezvous")]
    leases = {f"demo-worker-{i}": _lease(now, 10) for i in range(3)}
    steady = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    pods[0] = _exited(make_pod, "demo-worker-0", 137, "2026-01-01T11:59:58Z")
    pods[1] = _exited(make_pod, "demo-worker-1", 1, "2026-01-01T11:59:59Z")
    both = plan(_with_status(job, steady), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    assert len(both.status["incidents"]) == 2
    assert both.status["regroup"] == {
        "before": "2026-01-01T12:00:00.249999Z",
        "epoch": 1,
        "reason": "Killed of demo-worker-0; ExitCode of demo-worker-1",
        "departed": ["demo-worker-0", "demo-worker-1"],
        "departedUids": ["uid-demo-worker-0", "uid-demo-worker-1"],
    }


def test_no_request_when_no_running_group_lost_a_worker(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # A standby spare's failure.
    pods = _running_gang(make_pod)
    job = make_job()
    steady = _steady(job, pods, now)
    pods[2] = _exited(make_pod, "demo-worker-2", 137, "2026-01-01T11:59:59Z")
    pods[2]["metadata"]["labels"]["phalanx.dev/role"] = "spare"
    spare = plan(
        _with_status(job, steady),
        Observed(pods=pods, now=now, leases=_gang_leases(now, 10), nodes=HEALTHY_NODES),
    )
    assert spare.status["incidents"] == [] and "regroup" not in spare.status
    assert "SpareReplaced" in [e.reason for e in spare.events]
    # A worker that never joined a group (still in the rendezvous) exits: no group lost it, but the round it
    # joins must not wait for its keep-alive to lapse, so the launchers are told to drop it (the request names
    # it; a launcher restarts only a group it belongs to, worker/regroup.py).
    pods = _running_gang(make_pod)
    leases = {**_gang_leases(now, 10), "demo-worker-1": _lease(now, 0, phase="rendezvous")}
    steady = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    pods[1] = _exited(make_pod, "demo-worker-1", 1, "2026-01-01T11:59:59Z")
    joining = plan(
        _with_status(job, steady), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES)
    )
    assert joining.status["incidents"] and joining.status["regroup"]["departed"] == ["demo-worker-1"]
    # A failure the policy ignores.
    rules = [{"match": {"exitCodes": [1]}, "action": "Ignore"}]
    ignoring = make_job(failurePolicy={"rules": rules})
    pods = _running_gang(make_pod)
    steady = _steady(ignoring, pods, now)
    pods[1] = _exited(make_pod, "demo-worker-1", 1, "2026-01-01T11:59:59Z")
    ignored = plan(
        _with_status(ignoring, steady),
        Observed(pods=pods, now=now, leases=_gang_leases(now, 10), nodes=HEALTHY_NODES),
    )
    assert ignored.status["incidents"][0]["action"] == "Ignore" and "regroup" not in ignored.status


def test_removing_a_training_worker_on_scale_down_asks_for_a_regroup(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=3, maxReplicas=3, spares=0)
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)] + [make_pod("demo-rdzv", role="rendezvous")]
    leases = {f"demo-worker-{i}": _lease(now, 10) for i in range(3)}
    steady = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    smaller = make_job(replicas=2, maxReplicas=3, spares=0)
    down = plan(
        _with_status(smaller, steady), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES)
    )
    assert down.delete_pods == ["demo-worker-2"]
    assert down.status["regroup"] == {
        "before": "2026-01-01T12:00:00.250000Z",
        "epoch": 1,
        "reason": "scale-down removed demo-worker-2",
        "departed": ["demo-worker-2"],
        "departedUids": ["uid-demo-worker-2"],
    }


def test_a_spare_torch_promoted_over_a_lapsed_member_is_not_scaled_down(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # worker-0's rendezvous keep-alive lapsed (a stall shorter than the heartbeat timeout): torch promoted the
    # spare, and worker-0 still reports training until it rejoins as the standby. Three pods report training
    # in a gang of three: a role swap, not a scale-down; the spare that took the slot must stay.
    job = make_job(replicas=2, spares=1, heartbeat={"intervalSeconds": 1, "timeoutSeconds": 10})
    pods = _running_gang(make_pod)
    steady = _steady(job, pods, now)
    leases = {
        "demo-worker-0": _lease(now, 10, age=3.0),
        "demo-worker-1": _lease(now, 10),
        "demo-worker-2": _lease(now, 10, phase="restoring"),
    }
    swapped = plan(
        _with_status(job, steady), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES)
    )
    assert swapped.delete_pods == [] and swapped.force_delete_pods == [] and swapped.create_pods == []
    assert swapped.relabel_pods == {"demo-worker-2": "worker"}
    assert "regroup" not in swapped.status
    # A real scale-down of that gang still removes a worker.
    smaller = make_job(
        replicas=1, minReplicas=1, spares=1, heartbeat={"intervalSeconds": 1, "timeoutSeconds": 10}
    )
    down = plan(
        _with_status(smaller, steady), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES)
    )
    assert down.delete_pods == ["demo-worker-2"] and down.create_pods == []


def test_a_straggler_is_removed_with_its_grace_period_and_its_group_re_forms(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=3, spares=0, heartbeat={"stragglerFactor": 1.5, "stragglerHeartbeats": 1})
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)] + [make_pod("demo-rdzv", role="rendezvous")]
    leases = {
        f"demo-worker-{i}": {**_lease(now, 10), "step-seconds": "3.0", "compute-seconds": seconds}
        for i, seconds in enumerate(["1.0", "1.1", "2.8"])
    }
    result = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    (incident,) = result.status["incidents"]
    assert (incident["cause"], incident["worker"], incident["rule"]) == (
        "Straggler",
        "demo-worker-2",
        "default-infrastructure",
    )
    # Deleted with its grace period (it saves on the way out), not forced.
    assert result.delete_pods == ["demo-worker-2"] and result.force_delete_pods == []
    assert result.status["restarts"]["byCause"] == {"Straggler": 1}
    assert result.status["regroup"]["reason"] == "Straggler of demo-worker-2"
    assert result.status["regroup"]["departed"] == ["demo-worker-2"]  # dropped from the rendezvous at once
    assert result.status["regroup"]["before"] == "2026-01-01T12:00:00.250000Z"


# ---------------------------------------------------------------------------- one permanent failure only


def test_a_permanent_failure_is_the_only_incident_of_its_reconcile(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    """Both workers diverge (exit 5). A reconcile that planned from a status older than the one stored
    last failed the job and deleted worker-0 while it still ran; the next one sees worker-0 going, without
    an exit code, and worker-1's exit 5. It once recorded worker-0 as deleted by someone else as well."""
    rules = [{"name": "diverged", "match": {"exitCodes": [5]}, "action": "FailJob"}]
    job = make_job(failurePolicy={"maxRestarts": 3, "rules": rules})
    pods = _running_gang(make_pod)
    steady = _steady(job, pods, now)
    later = now + timedelta(seconds=1)
    pods = [
        make_pod("demo-worker-0", terminating=True),
        _exited(make_pod, "demo-worker-1", 5, "2026-01-01T12:00:00Z"),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    leases = _gang_leases(later, 10)
    failed = plan(
        _with_status(job, steady), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES)
    )
    assert [(i["cause"], i["worker"], i["action"]) for i in failed.status["incidents"]] == [
        ("ExitCode", "demo-worker-1", "FailJob")
    ]
    assert failed.status["restarts"]["total"] == 0 and failed.status["state"] == "Failed"
    assert "regroup" not in failed.status
    assert [e.reason for e in failed.events if e.type == "Warning"] == ["ExitCode", "PermanentFailure"]
    # Afterwards nothing more is recorded, whatever the pods do.
    ended = [
        _exited(make_pod, "demo-worker-0", 5, "2026-01-01T12:00:01Z"),
        _exited(make_pod, "demo-worker-1", 5, "2026-01-01T12:00:00Z"),
    ]
    for seen in (ended, ended[1:], []):
        after = plan(
            _with_status(job, failed), Observed(pods=seen, now=later, leases=leases, nodes=HEALTHY_NODES)
        )
        assert after.status["incidents"] == failed.status["incidents"] and after.detected == []


# --------------------------------------------------------------------------------- exact incident figures


def _steady_gang_at_step_10(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> tuple[dict[str, Any], list[dict[str, Any]], str, Plan]:
    """Two workers and a standby spare training at step 10 in one group: the job, its pods, the group's start
    and the plan that saw it."""
    job = make_job(heartbeat={"intervalSeconds": 1})
    pods = _running_gang(make_pod)
    group = "2026-01-01T11:50:00.000000Z"
    leases = {name: {**lease, "group-started": group} for name, lease in _gang_leases(now, 10).items()}
    return job, pods, group, plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))


def test_the_incident_takes_its_figures_from_the_group_that_resumed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job, pods, group, steady = _steady_gang_at_step_10(make_job, make_pod, now)
    later = now + timedelta(seconds=2)
    pods[1] = _exited(make_pod, "demo-worker-1", 137, "2026-01-01T12:00:01Z")
    leases = {
        "demo-worker-0": {**_lease(later, 12), "group-started": group},
        "demo-worker-1": {**_lease(later, 12), "group-started": group},
        "demo-worker-2": _lease(later, 0, phase="standby"),
    }
    killed = plan(
        _with_status(job, steady), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES)
    )
    # A late report of the failed group: worker-0 had reached step 13 before the group broke.
    leases["demo-worker-0"] = {**_lease(later, 13), "group-started": group}
    late = plan(_with_status(job, killed), Observed(pods=pods, now=later, leases=leases, nodes=HEALTHY_NODES))
    assert late.status["incidents"][0]["detectedStep"] == 13
    # The new group (worker-0 and the promoted spare) restored step 10 from a peer and resumed.
    pods = [p for p in pods if p["metadata"]["name"] != "demo-worker-1"]
    resumed_at = later + timedelta(seconds=4)
    new_group = {
        "group-started": "2026-01-01T12:00:03.000000Z",
        "resumed-at": "2026-01-01T12:00:04.250000Z",
        "restored-step": "10",
        "restore-source": "peer",
    }
    leases = {
        "demo-worker-0": {**_lease(resumed_at, 12), **new_group},
        "demo-worker-2": {**_lease(resumed_at, 12), **new_group},
    }
    resumed = plan(
        _with_status(job, late), Observed(pods=pods, now=resumed_at, leases=leases, nodes=HEALTHY_NODES)
    )
    (incident,) = resumed.status["incidents"]
    assert incident["resumedAt"] == "2026-01-01T12:00:04.250000Z"
    assert incident["secondsToRecover"] == 2.3  # from 12:00:01.999999, the end of the exit's second
    assert (incident["stepsLost"], incident["restoredStep"], incident["restoredFrom"]) == (3, 10, "peer")
    assert _condition(resumed, "Recovering")["reason"] == "Recovered"


@pytest.mark.parametrize("spare_seen", ["rendezvous", "standby"])
def test_a_spare_killed_while_taking_the_slot_is_an_incident_of_its_own_until_training_resumes(
    make_job: MakeJob, make_pod: MakePod, now: datetime, spare_seen: str
) -> None:
    # worker-1 is killed at step 13; the spare leaves standby to take its slot and is killed 0.8 s later,
    # before the group it joins trains a step. worker-0 keeps the newest state (step 13) and re-forms with the
    # spare refilling the pool; the group restores step 13 and trains on. The spare's last Lease says it was
    # joining, or (renewed a moment after each change, and read later still) that it stood by.
    job, pods, group, steady = _steady_gang_at_step_10(make_job, make_pod, now)
    first = now + timedelta(seconds=2)
    pods[1] = _exited(make_pod, "demo-worker-1", 137, "2026-01-01T12:00:01Z")
    leases = {
        "demo-worker-0": {**_lease(first, 11), "group-started": group},  # its Lease lags its step
        "demo-worker-1": {**_lease(first, 11), "group-started": group},
        "demo-worker-2": _lease(first, 0, phase="standby"),
    }
    killed = plan(
        _with_status(job, steady), Observed(pods=pods, now=first, leases=leases, nodes=HEALTHY_NODES)
    )
    assert killed.status["incidents"][0]["detectedStep"] == 11
    assert [p["metadata"]["name"] for p in killed.create_pods] == ["demo-worker-3"]

    second = first + timedelta(seconds=1)
    pods = [p for p in pods if p["metadata"]["name"] != "demo-worker-1"]
    pods[1] = _exited(make_pod, "demo-worker-2", 137, "2026-01-01T12:00:02Z")
    pods[1]["metadata"]["labels"]["phalanx.dev/role"] = "spare"  # not relabelled: it never trained
    pods.append(make_pod("demo-worker-3", role="spare", node=None, phase="Pending"))
    leases = {
        # worker-0 left its group: it says at once the step that group stopped at.
        "demo-worker-0": _lease(second, 13, phase="rendezvous"),
        "demo-worker-2": _lease(second, 0, phase=spare_seen),
    }
    both = plan(
        _with_status(job, killed), Observed(pods=pods, now=second, leases=leases, nodes=HEALTHY_NODES)
    )
    first_incident, spare_incident = both.status["incidents"]
    assert first_incident["detectedStep"] == 13 and first_incident.get("resumedAt") is None
    assert spare_incident["worker"] == "demo-worker-2" and spare_incident["cause"] == "Killed"
    assert spare_incident.get("resumedAt") is None and spare_incident["detectedStep"] == 13
    # The round being formed must not wait for the spare's keep-alive to lapse.
    assert both.status["regroup"]["departed"] == ["demo-worker-2"]
    assert _condition(both, "Recovering")["status"] == "True"
    assert both.delete_pods == ["demo-worker-2"]

    resumed_at = second + timedelta(seconds=4)
    pods = [pods[0], make_pod("demo-worker-3", role="spare"), make_pod("demo-worker-4", role="spare")]
    pods.append(make_pod("demo-rdzv", role="rendezvous"))
    new_group = {
        "group-started": "2026-01-01T12:00:05.000000Z",
        "resumed-at": "2026-01-01T12:00:06.500000Z",
        "restored-step": "13",
    }
    leases = {
        "demo-worker-0": {**_lease(resumed_at, 14), **new_group, "restore-source": "memory"},
        "demo-worker-3": {**_lease(resumed_at, 14), **new_group, "restore-source": "peer"},
        "demo-worker-4": _lease(resumed_at, 0, phase="standby"),
    }
    resumed = plan(
        _with_status(job, both), Observed(pods=pods, now=resumed_at, leases=leases, nodes=HEALTHY_NODES)
    )
    first_incident, spare_incident = resumed.status["incidents"]
    for incident in (first_incident, spare_incident):
        assert incident["resumedAt"] == "2026-01-01T12:00:06.500000Z"
        assert (incident["stepsLost"], incident["restoredStep"]) == (0, 13)
    # Each from its own failure: 12:00:01.999999 and 12:00:02.999999, the ends of the exits' seconds.
    assert (first_incident["secondsToRecover"], spare_incident["secondsToRecover"]) == (4.5, 3.5)
    assert _condition(resumed, "Recovering")["reason"] == "Recovered"


# ------------------------------------------------------------------------- the refill spare's placement


def _zoned_nodes(*zones: tuple[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    labels = {node: {"topology.kubernetes.io/zone": zone, "rack": f"rack-{zone}"} for node, zone in zones}
    health = {node: {"labels": labels[node], "ready": "True", "noExecute": []} for node in labels}
    return labels, health


def _preferred_domains(pod: dict[str, Any]) -> list[dict[str, Any]]:
    node_affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    return [expression for term in terms for expression in term["preference"]["matchExpressions"]]


def test_the_spare_refilling_the_pool_prefers_the_failed_workers_domain(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    labels, health = _zoned_nodes(("node-a", "z1"), ("node-b", "z2"))
    for job, key, domain in (
        (make_job(), "topology.kubernetes.io/zone", "z2"),
        (make_job(topology={"key": "rack", "policy": "Spread"}), "rack", "rack-z2"),
    ):
        pods = _running_gang(make_pod)
        pods[1] = make_pod("demo-worker-1", node="node-b")
        observed = Observed(
            pods=pods, now=now, leases=_gang_leases(now, 10), node_labels=labels, nodes=health
        )
        steady = plan(job, observed)
        pods[1] = _exited(make_pod, "demo-worker-1", 137, "2026-01-01T11:59:59Z")
        pods[1]["spec"]["nodeName"] = "node-b"
        killed = plan(
            _with_status(job, steady),
            Observed(pods=pods, now=now, leases=_gang_leases(now, 10), node_labels=labels, nodes=health),
        )
        (spare,) = killed.create_pods
        assert spare["metadata"]["labels"]["phalanx.dev/role"] == "spare"
        assert _preferred_domains(spare) == [{"key": key, "operator": "In", "values": [domain]}]


def test_a_lost_nodes_domain_comes_from_the_last_status(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    labels, health = _zoned_nodes(("node-a", "z1"), ("node-b", "z2"))
    job = make_job()
    pods = _running_gang(make_pod)
    pods[1] = make_pod("demo-worker-1", node="node-b")
    steady = plan(
        job, Observed(pods=pods, now=now, leases=_gang_leases(now, 10), node_labels=labels, nodes=health)
    )
    # node-b was deleted: it is no longer observed, its zone is remembered in status.workers.
    gone = Observed(
        pods=pods,
        now=now,
        leases=_gang_leases(now, 10),
        node_labels={"node-a": labels["node-a"]},
        nodes={"node-a": health["node-a"]},
    )
    lost = plan(_with_status(job, steady), gone)
    assert lost.status["incidents"][0]["cause"] == "NodeLost"
    (spare,) = lost.create_pods
    assert _preferred_domains(spare) == [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z2"]}
    ]


def test_new_workers_and_first_spares_have_no_domain_preference(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    created = plan(make_job(), Observed(pods=[], now=now))
    assert all(_preferred_domains(pod) == [] for pod in created.create_pods)


# ------------------------------------------------------------------------------------- rendezvous loss


def test_a_lost_rendezvous_is_an_incident_recreated_and_closed_when_training_advances(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(failurePolicy={"maxRestarts": 0}, heartbeat={"intervalSeconds": 1})
    pods = _running_gang(make_pod)
    steady = _steady(job, pods, now)
    assert steady.status["rendezvous"] == {
        "pod": "demo-rdzv",
        "uid": "uid-demo-rdzv",
        "node": "node-a",
        "restarts": 0,
    }
    later = now + timedelta(seconds=1)
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", phase="Failed")
    lost = plan(
        _with_status(job, steady),
        Observed(pods=pods, now=later, leases=_gang_leases(later, 12), nodes=HEALTHY_NODES),
    )
    (incident,) = lost.status["incidents"]
    assert (incident["cause"], incident["worker"], incident["action"]) == (
        "RendezvousLost",
        "demo-rdzv",
        "ReplaceRendezvous",
    )
    assert "rule" not in incident and "resumedAt" not in incident
    # Never charged to the user's budget (0 here: the job goes on).
    restarts = lost.status["restarts"]
    assert restarts["counted"] == 0 and restarts["byCause"] == {"RendezvousLost": 1}
    assert _condition(lost, "Failed")["status"] == "False"
    assert lost.delete_pods == ["demo-rdzv"] and "regroup" not in lost.status
    assert _condition(lost, "Recovering")["reason"] == "RendezvousLost"
    # Gone: recreated, nothing counted again.
    gone = plan(
        _with_status(job, lost),
        Observed(pods=pods[:-1], now=later, leases=_gang_leases(later, 12), nodes=HEALTHY_NODES),
    )
    assert _created(gone) == ["demo-rdzv"] and len(gone.status["incidents"]) == 1
    # The new store runs and training passes the step it was lost at: closed.
    back_at = later + timedelta(seconds=3)
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", uid="uid-new-rdzv")
    back = plan(
        _with_status(job, gone),
        Observed(pods=pods, now=back_at, leases=_gang_leases(back_at, 15), nodes=HEALTHY_NODES),
    )
    (incident,) = back.status["incidents"]
    assert incident["resumedAt"] and incident["secondsToRecover"] == 3.0
    assert back.status["rendezvous"]["uid"] == "uid-new-rdzv"
    assert _condition(back, "Recovering")["reason"] == "Recovered"


def test_a_rendezvous_lost_with_its_node_is_dated_no_earlier_than_the_group_it_served(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    """The rendezvous pod's node goes silent; its last Ready heartbeat is minutes old, older than the job's one
    group. That group formed through this rendezvous, so the loss came after it: the incident stays open until
    training moves past its step, and is never closed by the group that was training all along."""
    job = make_job(heartbeat={"intervalSeconds": 1})
    pods = _running_gang(make_pod)
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", node="node-b")
    group = "2026-01-01T11:59:30.000000Z"
    first_group = {
        "group-started": group,
        "resumed-at": "2026-01-01T11:59:31.000000Z",
        "restored-step": "0",
        "restore-source": "none",
    }

    def leases(moment: datetime, step: int) -> dict[str, dict[str, Any]]:
        return {name: {**lease, **first_group} for name, lease in _gang_leases(moment, step).items()}

    both = {**HEALTHY_NODES, "node-b": HEALTHY_NODES["node-a"]}
    steady = plan(job, Observed(pods=pods, now=now, leases=leases(now, 10), nodes=both))
    assert steady.status["rendezvous"]["node"] == "node-b"
    later = now + timedelta(seconds=2)
    silent = {"labels": {}, "ready": "Unknown", "noExecute": [], "readyHeartbeat": "2026-01-01T11:55:00Z"}
    lost = plan(
        _with_status(job, steady),
        Observed(pods=pods, now=later, leases=leases(later, 12), nodes={**both, "node-b": silent}),
    )
    (incident,) = lost.status["incidents"]
    assert incident["cause"] == "RendezvousLost" and incident["occurredAt"] == group, incident
    assert "resumedAt" not in incident and "restoredFrom" not in incident, incident


def test_a_heartbeat_from_the_lost_rendezvous_node_dates_its_loss_later_still(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    """The standby spare shared the rendezvous pod's node: its last heartbeat says the node was up then."""
    job = make_job(heartbeat={"intervalSeconds": 1})
    pods = _running_gang(make_pod)
    pods[-2] = make_pod("demo-worker-2", role="spare", node="node-b")
    pods[-1] = make_pod("demo-rdzv", role="rendezvous", node="node-b")
    group = {"group-started": "2026-01-01T11:59:30.000000Z"}
    both = {**HEALTHY_NODES, "node-b": HEALTHY_NODES["node-a"]}
    steady_leases = {name: {**lease, **group} for name, lease in _gang_leases(now, 10).items()}
    steady = plan(job, Observed(pods=pods, now=now, leases=steady_leases, nodes=both))
    later = now + timedelta(seconds=2)
    leases = {name: {**lease, **group} for name, lease in _gang_leases(later, 12).items()}
    last_word = "2026-01-01T12:00:00.500000Z"
    leases["demo-worker-2"] = {**_lease(later, 0, phase="standby"), "renewTime": last_word}
    silent = {"labels": {}, "ready": "Unknown", "noExecute": [], "readyHeartbeat": "2026-01-01T11:55:00Z"}
    lost = plan(
        _with_status(job, steady),
        Observed(pods=pods, now=later, leases=leases, nodes={**both, "node-b": silent}),
    )
    (incident,) = [i for i in lost.status["incidents"] if i["cause"] == "RendezvousLost"]
    assert incident["occurredAt"] == last_word, incident


def test_a_rendezvous_not_yet_running_or_of_a_suspended_job_is_no_incident(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    created = plan(job, Observed(pods=[], now=now))
    assert "rendezvous" not in created.status
    again = plan(_with_status(job, created), Observed(pods=[], now=now))
    assert again.status["incidents"] == []
    steady = _steady(job, _running_gang(make_pod), now)
    suspended = plan(_with_status(make_job(suspend=True), steady), Observed(pods=[], now=now))
    resumed = plan(_with_status(make_job(), suspended), Observed(pods=[], now=now))
    assert suspended.status["incidents"] == [] and resumed.status["incidents"] == []


# ------------------------------------------------------------------------------------ no heartbeat churn


def test_a_heartbeat_renewal_alone_changes_nothing_in_status(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(heartbeat={"stragglerFactor": 2.0})
    pods = _running_gang(make_pod)
    first = _steady(job, pods, now)
    renewed = _steady(_with_status(job, first), pods, now + timedelta(seconds=3))
    assert renewed.status == first.status and renewed.events == []


def test_a_spare_ending_after_training_finished_is_no_incident(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # One worker finished, the other still writes its last checkpoint; the standby spare's rendezvous closed.
    pods = [
        make_pod("demo-worker-0", phase="Succeeded", exit_code=0),
        make_pod("demo-worker-1"),
        _exited(make_pod, "demo-worker-2", 3, "2026-01-01T11:59:59Z"),
    ]
    pods[2]["metadata"]["labels"]["phalanx.dev/role"] = "spare"
    result = plan(make_job(), Observed(pods=pods, now=now, nodes=HEALTHY_NODES))
    assert result.status.get("incidents", []) == [] and result.detected == []
    assert result.status["restarts"]["total"] == 0 and result.status["state"] == "Finishing"


def test_a_silent_spare_once_training_finished_is_no_incident(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # The workers report `finished` and write their last checkpoint; the spare's heartbeat went quiet.
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-worker-2", role="spare")]
    leases = {
        "demo-worker-0": _lease(now, 40, phase="finished"),
        "demo-worker-1": _lease(now, 40, phase="finished"),
        "demo-worker-2": _lease(now, 40, phase="standby", age=60),
    }
    result = plan(make_job(), Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))
    assert result.detected == [] and result.status.get("incidents", []) == []


def test_a_group_torch_re_formed_before_the_loss_was_seen_counts_no_steps_lost(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # worker-0's node went silent at 12:00:00 at step 21. Its keep-alive lapsed first: torch promoted the
    # spare, and the new group restored step 21 and trained on to step 26 before the node was seen lost.
    job = make_job(heartbeat={"intervalSeconds": 1, "timeoutSeconds": 30})
    pods = _running_gang(make_pod)
    pods[0] = make_pod("demo-worker-0", node="node-b")
    old_group = "2026-01-01T11:50:00.000000Z"
    leases = {name: {**lease, "group-started": old_group} for name, lease in _gang_leases(now, 21).items()}
    nodes = {**HEALTHY_NODES, "node-b": {"labels": {}, "ready": "True", "noExecute": []}}
    steady = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=nodes))
    later = now + timedelta(seconds=8)
    new_group = {
        "group-started": "2026-01-01T12:00:05.000000Z",
        "resumed-at": "2026-01-01T12:00:05.400000Z",
        "restored-step": "21",
        "restore-source": "memory",
    }
    leases = {
        "demo-worker-0": {**_lease(later, 21, age=8.0), "group-started": old_group},
        "demo-worker-1": {**_lease(later, 26), **new_group},
        "demo-worker-2": {**_lease(later, 26), **new_group},
    }
    lost = {**nodes, "node-b": {"labels": {}, "ready": "Unknown", "noExecute": []}}
    seen = plan(_with_status(job, steady), Observed(pods=pods, now=later, leases=leases, nodes=lost))
    (incident,) = seen.status["incidents"]
    assert incident["cause"] == "NodeLost" and incident["detectedStep"] == 21
    pods = pods[1:]
    del leases["demo-worker-0"]
    closed = plan(_with_status(job, seen), Observed(pods=pods, now=later, leases=leases, nodes=lost))
    (incident,) = closed.status["incidents"]
    assert incident["resumedAt"] == "2026-01-01T12:00:05.400000Z"
    assert (incident["stepsLost"], incident["restoredStep"]) == (0, 21)


PACING = policy.ReplacementPacing(
    free_per_hour=1, backoff_seconds=10, max_backoff_seconds=600, cap_per_hour=3
)


def test_uncounted_replacements_past_the_free_ones_wait_for_the_back_off(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=2, spares=0)
    pods = [make_pod(f"demo-worker-{i}") for i in range(2)] + [make_pod("demo-rdzv", role="rendezvous")]
    leases = {f"demo-worker-{i}": _lease(now, 4) for i in range(2)}

    def step(previous: Plan, at: datetime) -> Plan:
        observed = Observed(pods=pods, now=at, leases=leases, nodes=HEALTHY_NODES, pacing=PACING)
        return plan(_with_status(job, previous), observed)

    steady = plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES, pacing=PACING))
    pods[1] = make_pod("demo-worker-1", phase="Failed", exit_code=143)
    first = step(steady, now)
    assert _created(first) == ["demo-worker-2"], "the hour's free replacement goes at once"
    assert first.status["restarts"]["counted"] == 0 and len(first.status["restarts"]["uncountedTimes"]) == 1

    pods[1] = make_pod("demo-worker-2")
    leases["demo-worker-2"] = _lease(now, 4)
    second_at = now + timedelta(seconds=3)
    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=143)
    held = step(first, second_at)
    assert held.delete_pods == ["demo-worker-0"] and held.create_pods == []
    degraded = _condition(held, "Degraded")
    assert (
        degraded["reason"] == "ReplacementBackoff"
        and "2 replacements in the last hour" in degraded["message"]
    )
    assert [e.reason for e in held.events if e.reason == "ReplacementBackoff"] == ["ReplacementBackoff"]
    assert held.wake_after == pytest.approx(7.0)

    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=143, terminating=True)
    still = step(held, second_at + timedelta(seconds=6))
    assert still.create_pods == [] and not [e for e in still.events if e.reason == "ReplacementBackoff"]
    due = step(still, now + timedelta(seconds=10))
    assert len(due.create_pods) == 1 and _condition(due, "Degraded")["reason"] != "ReplacementBackoff"


def test_pacing_backs_off_doubling_and_caps_the_hour(now: datetime) -> None:
    pacing = policy.ReplacementPacing(
        free_per_hour=2, backoff_seconds=10, max_backoff_seconds=25, cap_per_hour=5
    )
    times: list[str] = []
    for seconds in (0, 1, 2, 3, 4):
        times = policy.record_uncounted(times, now + timedelta(seconds=seconds), pacing)
    assert policy.next_replacement_at(times[:2], now + timedelta(seconds=1), pacing) is None
    # The third waits 10 s after the second, the fourth 20 s after the third, the fifth 25 s (the longest).
    assert policy.next_replacement_at(times[:3], now, pacing) == now + timedelta(seconds=11)
    assert policy.next_replacement_at(times[:4], now, pacing) == now + timedelta(seconds=22)
    assert policy.next_replacement_at(times, now, pacing) == now + timedelta(seconds=28)
    # The sixth is past the cap: it waits until the first of the hour is an hour old.
    capped = policy.record_uncounted(times, now + timedelta(seconds=5), pacing)
    assert policy.next_replacement_at(capped, now + timedelta(seconds=5), pacing) == now + timedelta(hours=1)
    # The list never holds more than the cap needs, and forgets what is over an hour old.
    many = capped
    for seconds in range(6, 40):
        many = policy.record_uncounted(many, now + timedelta(seconds=seconds), pacing)
    assert len(many) == pacing.cap_per_hour + 1
    assert policy.record_uncounted(many, now + timedelta(hours=2), pacing) == [
        format_time(now + timedelta(hours=2))
    ]
    assert policy.next_replacement_at(many, now + timedelta(hours=2), pacing) is None


def test_an_active_deadline_fails_the_job_and_removes_its_pods_once_passed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(activeDeadlineSeconds=600)
    started = plan(job, Observed(pods=_running_gang(make_pod), now=now))
    assert started.status["startTime"]
    # Before the deadline: nothing happens, and a reconcile is planned for the moment it passes.
    early = plan(
        _with_status(job, started), Observed(pods=_running_gang(make_pod), now=now + timedelta(seconds=60))
    )
    assert early.status["state"] == "Running" and early.delete_pods == []
    assert early.wake_after is not None and early.wake_after <= 600 - 60 + 60  # from the first pod's creation
    late = plan(
        _with_status(job, started), Observed(pods=_running_gang(make_pod), now=now + timedelta(seconds=700))
    )
    assert late.status["state"] == "Failed"
    failed = _condition(late, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "DeadlineExceeded", failed
    assert "activeDeadlineSeconds (600 s)" in failed["message"]
    # The workers get SIGTERM (a graceful delete: each saves), the spare and the rendezvous go.
    assert sorted(late.delete_pods) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert late.create_pods == []
    assert "DeadlineExceeded" in {event.reason for event in late.events}


def test_time_suspended_does_not_count_against_the_active_deadline(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(activeDeadlineSeconds=600)
    running = plan(job, Observed(pods=_running_gang(make_pod), now=now))
    suspended = plan(
        _with_status(make_job(activeDeadlineSeconds=600, suspend=True), running),
        Observed(pods=_running_gang(make_pod), now=now + timedelta(seconds=300)),
    )
    resumed_at = now + timedelta(seconds=3000)
    resumed = plan(_with_status(job, suspended), Observed(pods=[], now=resumed_at))
    assert resumed.status["state"] != "Failed" and resumed.create_pods
    # 500 s after the resume: within the deadline, though 3,500 s after the start.
    later = plan(
        _with_status(job, resumed),
        Observed(pods=_running_gang(make_pod), now=resumed_at + timedelta(seconds=500)),
    )
    assert later.status["state"] == "Running"
    past = plan(
        _with_status(job, resumed),
        Observed(pods=_running_gang(make_pod), now=resumed_at + timedelta(seconds=601)),
    )
    assert _condition(past, "Failed")["reason"] == "DeadlineExceeded"


def test_a_finished_job_is_deleted_once_its_ttl_has_passed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = [
        make_pod("demo-worker-0", phase="Succeeded", exit_code=0),
        make_pod("demo-worker-1", phase="Succeeded", exit_code=0),
    ]
    job = make_job(ttlSecondsAfterFinished=100)
    finished = plan(job, Observed(pods=pods, now=now))
    assert finished.status["state"] == "Succeeded" and not finished.delete_job
    kept = plan(_with_status(job, finished), Observed(pods=pods, now=now + timedelta(seconds=40)))
    assert not kept.delete_job and kept.wake_after == pytest.approx(60)
    gone = plan(_with_status(job, finished), Observed(pods=pods, now=now + timedelta(seconds=100)))
    assert gone.delete_job
    # Without a TTL a finished job stays; an invalid one is never deleted for it (it can still be fixed).
    assert not plan(
        _with_status(make_job(), finished), Observed(pods=pods, now=now + timedelta(days=9))
    ).delete_job
    invalid = plan(make_job(replicas=-1, ttlSecondsAfterFinished=0), Observed(pods=[], now=now))
    assert invalid.status["state"] == "Invalid"
    again = plan(
        _with_status(make_job(replicas=-1, ttlSecondsAfterFinished=0), invalid), Observed(pods=[], now=now)
    )
    assert not again.delete_job


def test_a_refused_creation_is_the_forming_gangs_condition_until_creations_succeed(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    refused = 'pod demo-rdzv refused: 403 Forbidden: pods "demo-rdzv" is forbidden: exceeded quota: q'
    workers = [make_pod(f"demo-worker-{i}", node=None) for i in range(2)] + [
        make_pod("demo-worker-2", role="spare", node=None)
    ]
    held = plan(make_job(), Observed(pods=workers, now=now, create_refused=refused))
    condition = _condition(held, "GangScheduled")
    assert (condition["status"], condition["reason"]) == ("False", "CreateRefused")
    assert refused in condition["message"]
    assert held.status["state"] == "Scheduling"
    # The refused pod is asked for again (the handler sends it once the back-off ends).
    assert _created(held) == ["demo-rdzv"]
    again = plan(_with_status(make_job(), held), Observed(pods=workers, now=now))
    assert _condition(again, "GangScheduled")["reason"] == "Scheduling"
