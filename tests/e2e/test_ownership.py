"""A job's pods and objects are those it owns (their controller ownerReference), never those that merely carry
its name or its label: a pod labelled as the job's that fails does not fail it, and a Service squatting the
job's rendezvous name or a Secret squatting its store secret's is refused, with a condition, until it is
gone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .conftest import RESTRICTED_CONTAINER, Cluster, Operator, wait_for
from .test_operator import condition, events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e


def impostor_pod(job: str) -> dict[str, Any]:
    """A pod labelled as a worker of `job` that exits 2, what a worker's permanent failure looks like."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-worker-9",
            "labels": {"phalanx.dev/job-name": job, "phalanx.dev/role": "worker", "phalanx.dev/index": "9"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "trainer",
                    "image": "python:3.11",
                    "command": ["python", "-c", "import sys; sys.exit(2)"],
                    "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
                }
            ],
        },
    }


def test_a_failing_pod_labelled_as_the_jobs_neither_fails_it_nor_is_deleted(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("victim", steps=60, step_delay=0.1), namespace)
    wait_for(lambda: (get_job(cluster, namespace, "victim").get("status") or {}).get("step", 0) >= 5, 240)
    cluster.apply(impostor_pod("victim"), namespace)
    wait_for(
        lambda: cluster.core.read_namespaced_pod("victim-worker-9", namespace).status.phase == "Failed",
        120,
        message="the impostor to exit 2",
    )
    final = wait_succeeded(cluster, namespace, "victim", timeout=300)
    assert final["status"]["restarts"]["total"] == 0, final["status"]["restarts"]
    assert not final["status"].get("incidents"), final["status"].get("incidents")
    # Not the operator's to delete either.
    assert cluster.core.read_namespaced_pod("victim-worker-9", namespace).metadata.deletion_timestamp is None


def test_a_squatted_rendezvous_service_and_store_secret_hold_the_job_until_they_are_gone(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Whoever made the Secret would know the store's secret; whoever made the Service would get the workers'
    connections."""
    squatter = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "held-rdzv"},
        "spec": {"selector": {"app": "elsewhere"}, "ports": [{"port": 29400}]},
    }
    known_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "held-store"},
        "stringData": {"secret": "a value the squatter knows, long enough"},
    }
    cluster.apply(squatter, namespace)
    cluster.apply(known_secret, namespace)
    cluster.apply(trainingjob("held", steps=20), namespace)

    def refused() -> dict[str, Any] | None:
        found = condition(get_job(cluster, namespace, "held"), "ChildrenOwned")
        return found if found and found["status"] == "False" else None

    owned = wait_for(refused, 120, message="ChildrenOwned False")
    print(f"condition: {owned}")
    assert owned["reason"] == "ForeignObject", owned
    assert "Service held-rdzv exists and is not this job's (it has no controller)" in owned["message"], owned
    assert "Secret held-store exists and is not this job's (it has no controller)" in owned["message"], owned
    assert not job_pods(cluster, namespace, "held")
    assert "ForeignObject" in [event["reason"] for event in events_for(cluster, namespace, "held")]

    cluster.kubectl("delete", "service", "held-rdzv", "-n", namespace)
    cluster.kubectl("delete", "secret", "held-store", "-n", namespace)
    final = wait_succeeded(cluster, namespace, "held", timeout=300)
    owned = condition(final, "ChildrenOwned")
    assert owned is not None and (owned["status"], owned["reason"]) == ("True", "AllOwned"), owned
    service = cluster.core.read_namespaced_service("held-rdzv", namespace)
    assert service.metadata.owner_references[0].uid == final["metadata"]["uid"]
    secret = cluster.core.read_namespaced_secret("held-store", namespace)
    assert secret.metadata.owner_references[0].uid == final["metadata"]["uid"]
    assert secret.data["secret"] != known_secret["stringData"]["secret"]
