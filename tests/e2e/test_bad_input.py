"""A typo never floods the cluster: a job far over the gang limit is refused, one the cluster cannot hold is
held, both without a single pod, while a job beside them keeps training."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_operator import condition, events_for, get_job, has_condition, job_pods, trainingjob

pytestmark = pytest.mark.e2e

DEFAULT_MAX_GANG_PODS = 2000


def _step(cluster: Cluster, namespace: str, name: str) -> int:
    return get_job(cluster, namespace, name).get("status", {}).get("step") or 0


def _event(cluster: Cluster, namespace: str, name: str, reason: str, *words: str) -> dict[str, Any] | None:
    return next(
        (
            event
            for event in events_for(cluster, namespace, name)
            if event["reason"] == reason and all(word in event["message"] for word in words)
        ),
        None,
    )


def _schedulable_pod_slots(cluster: Cluster) -> int:
    """Pods the nodes an untolerating pod may use can hold (the simulated nodes are tainted)."""
    return sum(
        int(node.status.allocatable["pods"])
        for node in cluster.core.list_node().items
        if not node.spec.taints and not node.spec.unschedulable
    )


def test_absurd_jobs_are_refused_or_held_without_pods_while_a_running_job_trains_on(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("steady", replicas=2, steps=100000, step_delay=0.05), namespace)
    wait_for(lambda: _step(cluster, namespace, "steady") > 0, 180, message="the steady job to train")

    typo = trainingjob("typo", replicas=100000, maxReplicas=100000)
    slots = _schedulable_pod_slots(cluster)
    # Under the gang limit, over what the nodes hold: the capacity check, not the limit, must stop it.
    too_big = slots + 60
    assert too_big < DEFAULT_MAX_GANG_PODS
    oversized = trainingjob("oversized", replicas=too_big)
    cluster.apply([typo, oversized], namespace)

    refused = wait_for(
        lambda: (
            (job := get_job(cluster, namespace, "typo"))
            and has_condition(job, "Failed", reason="InvalidSpec")
            and job
        ),
        60,
        message="the 100000-replica job to be refused (Failed=True, InvalidSpec)",
    )
    message = condition(refused, "SpecValid")["message"]
    assert "spec.replicas" in message and str(DEFAULT_MAX_GANG_PODS) in message and "maxGangPods" in message
    assert refused["status"]["state"] == "Invalid"
    wait_for(
        lambda: _event(cluster, namespace, "typo", "InvalidSpec", "spec.replicas", "maxGangPods"),
        30,
        message="an InvalidSpec Event naming spec.replicas and the limit",
    )

    held = wait_for(
        lambda: (
            (job := get_job(cluster, namespace, "oversized"))
            and has_condition(job, "GangScheduled", "False", reason="InsufficientCapacity")
            and job
        ),
        60,
        message="the oversized job to be held (GangScheduled=False, InsufficientCapacity)",
    )
    message = condition(held, "GangScheduled")["message"]
    assert f"needs {too_big} pods" in message and "short of" in message and "pods: room for" in message
    room = re.search(r"capacity holds (\d+)", message)
    assert room is not None and int(room.group(1)) <= slots < too_big, message
    assert held["status"]["state"] == "Unschedulable"
    wait_for(
        lambda: _event(cluster, namespace, "oversized", "InsufficientCapacity", f"needs {too_big} pods"),
        30,
        message="an InsufficientCapacity Event",
    )
    table = cluster.kubectl("get", "tj", "-n", namespace, "--no-headers").stdout
    # STATE is next to last (AGE last); an empty STEP column leaves no field of its own.
    states = {line.split()[0]: line.split()[-2] for line in table.splitlines()}
    assert states["typo"] == "Invalid" and states["oversized"] == "Unschedulable", table

    # Several reconciles later: still not one pod of either, and the steady job kept training.
    before = _step(cluster, namespace, "steady")
    wait_for(
        lambda: _step(cluster, namespace, "steady") >= before + 20,
        90,
        message="the steady job's step to advance beside the absurd jobs",
    )
    assert job_pods(cluster, namespace, "typo") == []
    assert job_pods(cluster, namespace, "oversized") == []
    assert has_condition(get_job(cluster, namespace, "steady"), "Running")
    every_slot = sum(int(node.status.allocatable["pods"]) for node in cluster.core.list_node().items)
    bound = [pod for pod in cluster.core.list_pod_for_all_namespaces().items if pod.spec.node_name]
    assert len(bound) <= every_slot

    # The hold is looked at again: once the job asks for what the cluster holds, its gang is created.
    cluster.kubectl("scale", "tj/oversized", "--replicas=2", "-n", namespace)
    wait_for(
        lambda: has_condition(get_job(cluster, namespace, "oversized"), "GangScheduled"),
        120,
        message="the scaled-down job's gang to be scheduled",
    )
