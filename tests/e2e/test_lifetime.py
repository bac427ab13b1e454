"""A job's lifetime bounds, with the semantics of Kubernetes' Job: `activeDeadlineSeconds` ends a job that runs
too long (its workers save on the way out), `ttlSecondsAfterFinished` removes a finished job and its pods."""

from __future__ import annotations

import time

import pytest

from phalanx.operator.timeutil import parse_time

from .conftest import Cluster, Operator, wait_for
from .test_operator import condition, events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

DEADLINE = 25


def test_a_job_past_its_active_deadline_fails_and_its_pods_go(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = trainingjob("bounded", replicas=2, spares=1, steps=100000, step_delay=0.05)
    job["spec"]["activeDeadlineSeconds"] = DEADLINE
    cluster.apply(job, namespace)

    def failed() -> dict | None:
        found = condition(get_job(cluster, namespace, "bounded"), "Failed")
        return found if found and found["status"] == "True" else None

    verdict = wait_for(failed, DEADLINE + 120, message="the job to fail at its deadline")
    assert verdict["reason"] == "DeadlineExceeded", verdict
    assert f"activeDeadlineSeconds ({DEADLINE} s)" in verdict["message"], verdict
    status = get_job(cluster, namespace, "bounded")["status"]
    assert status["state"] == "Failed"
    # At the deadline, counted from the job's start (its first pods), not before it and not long after.
    active = (parse_time(status["completionTime"]) - parse_time(status["startTime"])).total_seconds()
    assert DEADLINE <= active <= DEADLINE + 15, (status["startTime"], status["completionTime"])
    # Every pod goes, the workers through SIGTERM (each saves a checkpoint on its way out).
    wait_for(lambda: job_pods(cluster, namespace, "bounded") == [], 60, message="the job's pods to go")
    assert "DeadlineExceeded" in {event["reason"] for event in events_for(cluster, namespace, "bounded")}
    # A failed job is not started again.
    time.sleep(5)
    assert job_pods(cluster, namespace, "bounded") == []


def test_a_finished_job_is_deleted_with_its_pods_after_its_ttl(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("brief", replicas=1, steps=20, ttlSecondsAfterFinished=5), namespace)
    finished = wait_succeeded(cluster, namespace, "brief", timeout=180)
    assert finished["status"]["completionTime"]
    assert job_pods(cluster, namespace, "brief"), (
        "a finished job keeps its workers (for their logs) until then"
    )
    wait_for(
        lambda: cluster.kubectl("get", "trainingjob/brief", "-n", namespace, check=False).returncode != 0,
        60,
        message="the finished job to be deleted",
    )
    # Its pods follow it (owner references).
    wait_for(lambda: job_pods(cluster, namespace, "brief") == [], 60, message="the job's pods to go")
