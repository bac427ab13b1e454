"""Refusals made visible: a pod the API server refuses (a ResourceQuota, a LimitRange) is named in the job's
condition `GangScheduled=False` (reason `CreateRefused`) with the server's reason and a `FailedCreate` Event;
the creations back off, and the job starts once the cause is gone."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_operator import condition, events_for, get_job, trainingjob

pytestmark = pytest.mark.e2e


def refused_condition(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = condition(get_job(cluster, namespace, name), "GangScheduled")
    return found if found and found["reason"] == "CreateRefused" else None


def training(cluster: Cluster, namespace: str, name: str) -> bool:
    return ((get_job(cluster, namespace, name).get("status") or {}).get("step") or 0) >= 1


def test_a_quota_that_admits_the_workers_but_not_the_rendezvous_is_named_in_the_job(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # Three workers of 64Mi fit; the rendezvous pod's 640Mi does not, whichever is created first.
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "team-memory"},
        "spec": {"hard": {"requests.memory": "512Mi"}},
    }
    cluster.apply(quota, namespace)
    wait_for(
        lambda: (
            cluster.get_json("resourcequota", "team-memory", "-n", namespace).get("status", {}).get("hard")
        ),
        30,
        message="the quota to be in force",
    )
    cluster.apply(trainingjob("quota", replicas=2, spares=1, steps=100000, step_delay=0.05), namespace)
    refused = wait_for(lambda: refused_condition(cluster, namespace, "quota"), 60, message="CreateRefused")
    assert refused["status"] == "False"
    assert "quota-rdzv" in refused["message"] and "exceeded quota: team-memory" in refused["message"], refused
    failed = [e for e in events_for(cluster, namespace, "quota") if e["reason"] == "FailedCreate"]
    assert failed and "exceeded quota: team-memory" in failed[0]["message"], failed
    assert get_job(cluster, namespace, "quota")["status"]["state"] == "Scheduling"

    # Room made: the next attempt (backing off meanwhile) creates the rendezvous pod, and the job trains.
    cluster.kubectl(
        "patch", "resourcequota", "team-memory", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"hard":{"requests.memory":"2Gi"}}}',
    )  # fmt: skip
    wait_for(lambda: training(cluster, namespace, "quota"), 180, message="training once the quota has room")
    assert condition(get_job(cluster, namespace, "quota"), "GangScheduled")["status"] == "True"


def test_a_limit_range_the_rendezvous_exceeds_is_named_and_a_spec_within_it_starts(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "container-limits"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "512Mi", "cpu": "2"}}]},
    }
    cluster.apply(limits, namespace)
    cluster.apply(trainingjob("limited", replicas=1, steps=100000, step_delay=0.05), namespace)
    refused = wait_for(lambda: refused_condition(cluster, namespace, "limited"), 60, message="CreateRefused")
    assert "limited-rdzv" in refused["message"], refused
    assert "maximum memory usage per Container is 512Mi" in refused["message"], refused

    # A spec within the range: a new generation, tried at once.
    cluster.kubectl(
        "patch", "trainingjob", "limited", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"rendezvous":{"resources":{"requests":{"cpu":"100m","memory":"256Mi"},"limits":{"cpu":"1","memory":"512Mi"}}}}}',
    )  # fmt: skip
    wait_for(lambda: training(cluster, namespace, "limited"), 180, message="training within the LimitRange")
