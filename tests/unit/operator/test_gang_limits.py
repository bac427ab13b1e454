"""Bad input never floods the cluster: a job over the operator's gang limit is refused, a gang the cluster
cannot hold is held, and a large gang is created in bounded batches (pure plans)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator.capacity import ClusterView
from phalanx.operator.reconcile import NEXT_BATCH_SECONDS, Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]


def _condition(result: Plan, condition_type: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == condition_type)


def _nodes(count: int, pods: int = 110) -> ClusterView:
    node = {"labels": {}, "ready": "True", "allocatable": {"pods": str(pods), "cpu": "8", "memory": "16Gi"}}
    return ClusterView({f"node-{i}": node for i in range(count)})


def test_a_job_over_the_gang_limit_is_refused_naming_the_field_and_the_limit(
    make_job: MakeJob, now: datetime
) -> None:
    job = make_job(replicas=100000, maxReplicas=100000, spares=0)
    result = plan(job, Observed(pods=[], now=now, max_gang_pods=2000, capacity=_nodes(4)))
    assert result.create_pods == []
    failed = _condition(result, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.replicas" in failed["message"] and "2000" in failed["message"]
    assert "maxGangPods" in failed["message"]
    assert result.status["state"] == "Invalid"
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]
    # At the limit, it is accepted (and then judged against the cluster).
    within = plan(make_job(replicas=1999, spares=1), Observed(pods=[], now=now, max_gang_pods=2000))
    assert _condition(within, "SpecValid")["status"] == "True"


def test_a_max_replicas_beyond_the_gang_limit_is_refused(make_job: MakeJob, now: datetime) -> None:
    job = make_job(replicas=2, maxReplicas=5000, spares=1)
    result = plan(job, Observed(pods=[], now=now, max_gang_pods=2000))
    assert result.create_pods == []
    assert "spec.maxReplicas" in _condition(result, "SpecValid")["message"]


def test_a_gang_the_cluster_cannot_hold_is_held_without_a_pod_until_capacity_appears(
    make_job: MakeJob, now: datetime
) -> None:
    job = make_job(replicas=1500, spares=0)
    held = plan(job, Observed(pods=[], now=now, max_gang_pods=2000, capacity=_nodes(4)))
    assert held.create_pods == []  # not even the rendezvous pod
    gang = _condition(held, "GangScheduled")
    assert gang["status"] == "False" and gang["reason"] == "InsufficientCapacity"
    assert "needs 1500 pods" in gang["message"] and "holds 440" in gang["message"]
    assert held.status["state"] == "Unschedulable"
    assert [(e.type, e.reason) for e in held.events] == [("Warning", "InsufficientCapacity")]
    # Looked at again: still held, no second Event.
    again = plan({**job, "status": held.status}, Observed(pods=[], now=now, capacity=_nodes(4)))
    assert again.create_pods == [] and again.events == []
    # Nodes joined: the gang is created (in batches).
    later = now + timedelta(seconds=30)
    started = plan(
        {**job, "status": again.status}, Observed(pods=[], now=later, capacity=_nodes(14), create_batch=100)
    )
    assert len(started.create_pods) == 101  # the rendezvous pod and the first 100 workers
    assert _condition(started, "GangScheduled")["reason"] == "Scheduling"


def test_a_gang_that_fits_is_not_held(make_job: MakeJob, now: datetime) -> None:
    result = plan(make_job(replicas=2, spares=1), Observed(pods=[], now=now, capacity=_nodes(1, pods=3)))
    assert len(result.create_pods) == 4
    tight = plan(make_job(replicas=2, spares=1), Observed(pods=[], now=now, capacity=_nodes(1, pods=2)))
    assert tight.create_pods == []


def test_an_attempt_under_way_is_left_to_the_gang_timeout(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # The job's own pods exist: the capacity check does not judge (the handler does not even observe it).
    pods = [make_pod("demo-worker-0", node=None), make_pod("demo-rdzv", role="rendezvous")]
    result = plan(make_job(replicas=2, spares=1), Observed(pods=pods, now=now, capacity=_nodes(1, pods=1)))
    assert [p["metadata"]["name"] for p in result.create_pods] == ["demo-worker-1", "demo-worker-2"]


def test_missing_pods_are_created_in_bounded_batches(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(replicas=7, spares=2)
    first = plan(job, Observed(pods=[], now=now, create_batch=4))
    names = [pod["metadata"]["name"] for pod in first.create_pods]
    assert names == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2", "demo-worker-3"]
    assert first.wake_after == NEXT_BATCH_SECONDS
    assert _condition(first, "GangScheduled")["reason"] == "Scheduling"
    seen = [make_pod(name, node=None) for name in names[1:]] + [make_pod("demo-rdzv", role="rendezvous")]
    second = plan({**job, "status": first.status}, Observed(pods=seen, now=now, create_batch=4))
    names = [pod["metadata"]["name"] for pod in second.create_pods]
    assert names == [f"demo-worker-{i}" for i in range(4, 8)]
    roles = [pod["metadata"]["labels"]["phalanx.dev/role"] for pod in second.create_pods]
    assert roles == ["worker", "worker", "worker", "spare"]
    seen += [make_pod(name, node=None, role=role) for name, role in zip(names, roles, strict=True)]
    last = plan({**job, "status": second.status}, Observed(pods=seen, now=now, create_batch=4))
    assert [pod["metadata"]["name"] for pod in last.create_pods] == ["demo-worker-8"]
    assert last.wake_after is None
