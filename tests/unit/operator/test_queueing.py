"""Kueue's job contract for a queued TrainingJob: the Workload, admission, eviction, scale and finish."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from phalanx.operator import api, queueing
from phalanx.operator.reconcile import Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]
STAMP = "2026-01-01T12:00:00Z"
FLAVORS = {
    "on-demand": {
        "nodeLabels": {"pool": "on-demand"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
}


def _queued(job: dict[str, Any], queue: str = "team-a") -> dict[str, Any]:
    job["metadata"]["labels"] = {queueing.QUEUE_LABEL: queue}
    return job


def _workload(
    job: dict[str, Any],
    *,
    workers: int = 3,
    reserved: bool = False,
    admitted: bool = False,
    evicted: str | None = None,
    pending: str | None = None,
    active: bool = True,
    finished: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {"conditions": conditions}

    def condition(kind: str, value: bool, reason: str, message: str) -> None:
        conditions.append(
            {
                "type": kind,
                "status": str(value),
                "reason": reason,
                "message": message,
                "lastTransitionTime": STAMP,
            }
        )

    if reserved:
        condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue cq")
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "workers", "flavors": {"cpu": "on-demand"}, "count": workers},
                {"name": "rendezvous", "flavors": {"cpu": "on-demand"}, "count": 1},
            ],
        }
    elif pending:
        condition("QuotaReserved", False, "Pending", pending)
    if admitted:
        condition("Admitted", True, "Admitted", "The workload is admitted")
    if evicted:
        condition("Evicted", True, evicted, f"{evicted} to accommodate a workload")
    if finished:
        condition("Finished", True, "Succeeded", "done")
    metadata: dict[str, Any] = {
        "name": queueing.workload_name(job),
        "namespace": "ml",
        "resourceVersion": "41",
        "finalizers": [queueing.FINALIZER],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": queueing.WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": metadata,
        "spec": {
            "active": active,
            "queueName": "team-a",
            "podSets": [
                {**ps, "count": workers if ps["name"] == "workers" else 1}
                for ps in queueing.pod_sets(job, make_job_spec(job))
            ],
        },
        "status": status,
    }


def make_job_spec(job: dict[str, Any]) -> api.TrainingJobSpec:
    return api.TrainingJobSpec.model_validate(job["spec"])


def _condition(result: Plan, kind: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == kind)


def _ops(result: Plan) -> list[str]:
    return [op.kind for op in result.workload_ops]


def test_the_workload_name_is_kueues(make_job: MakeJob) -> None:
    # Kueue's GetWorkloadNameForOwnerWithGVK: lower-cased kind, name, and 5 hex of sha1(kind, group, name, uid).
    digest = hashlib.sha1(b"TrainingJob\nphalanx.dev\ndemo\nuid-123").hexdigest()[:5]
    assert queueing.workload_name(make_job()) == f"trainingjob-demo-{digest}"
    long = make_job()
    long["metadata"]["name"] = "x" * 300
    assert len(queueing.workload_name(long)) == 253


def test_a_queued_job_without_a_workload_creates_one_and_no_pod(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    result = plan(
        job, Observed(pods=[], now=now, priority=queueing.Priority(100, "WorkloadPriorityClass", "low"))
    )
    assert result.create_pods == []
    assert _ops(result) == ["create"]
    workload = result.workload_ops[0].body
    assert workload["metadata"]["name"] == queueing.workload_name(job)
    assert workload["metadata"]["finalizers"] == [queueing.FINALIZER]
    assert workload["metadata"]["labels"] == {queueing.JOB_UID_LABEL: "uid-123"}
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "TrainingJob",
        "demo",
        "uid-123",
        True,
    )
    spec = workload["spec"]
    assert spec["queueName"] == "team-a" and spec["active"] is True
    assert spec["priority"] == 100
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "low",
    }
    assert [(ps["name"], ps["count"]) for ps in spec["podSets"]] == [("workers", 3), ("rendezvous", 1)]
    worker_template = spec["podSets"][0]["template"]
    assert "hostname" not in worker_template["spec"]
    assert worker_template["spec"]["containers"][0]["image"] == "phalanx:dev"
    assert result.status["state"] == "Queued"
    assert _condition(result, "Suspended")["status"] == "True"
    assert _condition(result, "Admitted")["status"] == "False"
    assert result.status["queue"] == {"workload": queueing.workload_name(job)}


def test_an_unlabelled_job_has_no_workload_and_no_admitted_condition(
    make_job: MakeJob, now: datetime
) -> None:
    result = plan(make_job(), Observed(pods=[], now=now))
    assert result.workload_ops == [] and len(result.create_pods) == 4
    assert all(c["type"] != "Admitted" for c in result.status["conditions"])
    assert "queue" not in result.status


def test_kueues_reason_for_pending_is_the_jobs(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    why = "couldn't assign flavors to pod set workers: insufficient quota for cpu in flavor on-demand, 6 more needed"
    result = plan(job, Observed(pods=[], now=now, workload=_workload(job, pending=why)))
    assert result.create_pods == [] and result.workload_ops == []
    admitted = _condition(result, "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "Pending" and why in admitted["message"]


def test_an_admitted_job_runs_on_its_flavor(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    workload = _workload(job, reserved=True, admitted=True)
    result = plan(job, Observed(pods=[], now=now, workload=workload, flavors=FLAVORS))
    assert len(result.create_pods) == 4
    for pod in result.create_pods:
        assert pod["spec"]["nodeSelector"]["pool"] == "on-demand"
        assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        expected = "rendezvous" if pod["metadata"]["name"].endswith("rdzv") else "workers"
        assert pod["metadata"]["labels"][queueing.PODSET_LABEL] == expected
    admitted = _condition(result, "Admitted")
    assert admitted["status"] == "True" and "ClusterQueue cq" in admitted["message"]
    assert result.status["queue"] == {
        "workload": workload["metadata"]["name"],
        "clusterQueue": "cq",
        "admittedWorkers": 2,
    }
    assert any(event.reason == "Admitted" for event in result.events)


def test_a_template_node_selector_wins_over_the_flavors(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    job["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "mine", "zone": "a"}
    result = plan(
        job,
        Observed(pods=[], now=now, workload=_workload(job, reserved=True, admitted=True), flavors=FLAVORS),
    )
    assert all(pod["spec"]["nodeSelector"] == {"pool": "mine", "zone": "a"} for pod in result.create_pods)


def test_quota_reserved_but_not_admitted_waits_for_the_checks(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    result = plan(job, Observed(pods=[], now=now, workload=_workload(job, reserved=True), flavors=FLAVORS))
    assert result.create_pods == []
    assert _condition(result, "Admitted")["reason"] == queueing.REASON_ADMISSION_CHECKS


def test_a_scale_up_past_the_admission_runs_the_admitted_size_and_says_why(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = _queued(make_job(replicas=4))
    workload = _workload(job, workers=3, reserved=True, admitted=True)
    result = plan(job, Observed(pods=[], now=now, workload=workload, flavors=FLAVORS))
    workers = [p for p in result.create_pods if p["metadata"]["labels"]["phalanx.dev/role"] == "worker"]
    spares = [p for p in result.create_pods if p["metadata"]["labels"]["phalanx.dev/role"] == "spare"]
    assert (len(workers), len(spares)) == (2, 1)
    admitted = _condition(result, "Admitted")
    assert admitted["status"] == "True" and admitted["reason"] == queueing.REASON_SCALE_NOT_ADMITTED
    assert "spec.replicas 4" in admitted["message"]
    assert any(e.type == "Warning" and e.reason == queueing.REASON_SCALE_NOT_ADMITTED for e in result.events)
    assert result.workload_ops == []  # an admitted Workload's pod sets are immutable


def test_a_scale_while_pending_updates_the_pod_sets(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job(replicas=4))
    result = plan(job, Observed(pods=[], now=now, workload=_workload(job, workers=3, pending="no quota")))
    assert _ops(result) == ["pod_sets"]
    assert [ps["count"] for ps in result.workload_ops[0].body["podSets"]] == [5, 1]
    assert result.workload_ops[0].target["resourceVersion"] == "41"


def test_eviction_stops_the_gang_then_gives_the_quota_back(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = _queued(make_job())
    workload = _workload(job, reserved=True, admitted=True, evicted="Preempted")
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-worker-2", role="spare")]
    pods.append(make_pod("demo-rdzv", role="rendezvous"))
    stopping = plan(job, Observed(pods=pods, now=now, workload=workload, flavors=FLAVORS))
    assert sorted(stopping.delete_pods) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert stopping.force_delete_pods == []  # graceful: the workers save on SIGTERM
    assert stopping.workload_ops == []  # the pods still hold the quota
    assert _condition(stopping, "Admitted")["reason"] == queueing.REASON_EVICTED
    assert any(e.type == "Warning" and e.reason == queueing.REASON_EVICTED for e in stopping.events)
    terminating = [make_pod("demo-worker-0", terminating=True)]
    assert plan(job, Observed(pods=terminating, now=now, workload=workload)).workload_ops == []
    gone = plan(job, Observed(pods=[], now=now, workload=workload))
    assert _ops(gone) == ["release_quota"]
    conditions = {c["type"]: c for c in gone.workload_ops[0].body["conditions"]}
    assert conditions["QuotaReserved"]["status"] == "False"
    assert conditions["Admitted"]["status"] == "False"
    assert conditions["Requeued"]["status"] == "True" and conditions["Requeued"]["reason"] == "Preempted"
    assert conditions["Evicted"]["status"] == "True"


def test_suspending_a_queued_job_deactivates_its_workload_and_resuming_activates_it(
    make_job: MakeJob, now: datetime
) -> None:
    job = _queued(make_job(suspend=True))
    suspended = plan(job, Observed(pods=[], now=now, workload=_workload(job, reserved=True, admitted=True)))
    assert _ops(suspended) == ["deactivate"] and suspended.create_pods == []
    assert suspended.status["state"] == "Suspended"
    resumed_job = _queued(make_job())
    ours = _workload(resumed_job, active=False, annotations={queueing.DEACTIVATED_ANNOTATION: "true"})
    assert _ops(plan(resumed_job, Observed(pods=[], now=now, workload=ours))) == ["activate"]
    # A Workload someone else deactivated stays so.
    theirs = plan(resumed_job, Observed(pods=[], now=now, workload=_workload(resumed_job, active=False)))
    assert (
        theirs.workload_ops == [] and _condition(theirs, "Admitted")["reason"] == queueing.REASON_DEACTIVATED
    )


def test_a_finished_job_finishes_its_workload_then_drops_the_finalizer(
    make_job: MakeJob, now: datetime
) -> None:
    job = _queued(make_job())
    job["status"] = {
        "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "TrainingFinished", "message": "every worker finished",
             "lastTransitionTime": STAMP},
        ],
        "state": "Succeeded",
    }  # fmt: skip
    running = _workload(job, reserved=True, admitted=True)
    first = plan(job, Observed(pods=[], now=now, workload=running))
    assert _ops(first) == ["finish"]
    finished = {c["type"]: c for c in first.workload_ops[0].body["conditions"]}["Finished"]
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    done = _workload(job, reserved=True, admitted=True, finished=True)
    assert _ops(plan(job, Observed(pods=[], now=now, workload=done))) == ["drop_finalizer"]


def test_owner_job_finds_only_a_trainingjob_controller() -> None:
    owned = {"metadata": {"ownerReferences": [
        {"apiVersion": "phalanx.dev/v1alpha1", "kind": "TrainingJob", "name": "demo", "controller": True},
    ]}}  # fmt: skip
    other = {
        "metadata": {
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "controller": True}]
        }
    }
    assert queueing.owner_job(owned) == "demo" and queueing.owner_job(other) is None


def test_the_queue_label_and_kueue_pod_groups_together_are_refused(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job(gang={"podGroup": "Kueue", "queueName": "team-a"}))
    result = plan(job, Observed(pods=[], now=now))
    assert result.create_pods == [] and result.workload_ops == []
    valid = _condition(result, "SpecValid")
    assert valid["status"] == "False" and "gang.podGroup" in valid["message"]


def test_new_requests_while_pending_update_the_pod_sets(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    workload = _workload(job, pending="no quota")
    assert plan(job, Observed(pods=[], now=now, workload=workload)).workload_ops == []
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
    result = plan(job, Observed(pods=[], now=now, workload=workload))
    assert _ops(result) == ["pod_sets"]
    worker = result.workload_ops[0].body["podSets"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["requests"]["cpu"] == "2"


def test_a_label_removed_takes_the_admitted_condition_with_it(make_job: MakeJob, now: datetime) -> None:
    job = _queued(make_job())
    queued = plan(job, Observed(pods=[], now=now, workload=_workload(job, pending="no quota")))
    job["metadata"]["labels"] = {}
    job["status"] = queued.status
    result = plan(job, Observed(pods=[], now=now))
    assert all(c["type"] != "Admitted" for c in result.status["conditions"])
    assert "queue" not in result.status and len(result.create_pods) == 4
