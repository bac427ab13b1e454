"""The preflight end to end: a job whose checkpoints cannot be used, or whose resume does not continue the
run, is stopped by its preflight before the real run, with the reason in `PreflightPassed` and `Failed`.
(The passing preflight is the example's: tests/e2e/test_operator.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_fault_scenarios import _checkpoint_claim
from .test_operator import condition, events_for, get_job, job_pods, trainingjob

pytestmark = pytest.mark.e2e

PREFLIGHT = {"enabled": True, "steps": 8}


def wait_failed(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    cluster.kubectl(
        "wait", "--for=condition=Failed", f"trainingjob/{name}", "-n", namespace, "--timeout=300s", timeout=310
    )  # fmt: skip
    wait_for(lambda: not job_pods(cluster, namespace, name), 90, message="the job's pods to be removed")
    return get_job(cluster, namespace, name)


def assert_stopped_by_preflight(cluster: Cluster, namespace: str, job: dict[str, Any], reason: str) -> str:
    """The preflight failed the job for `reason`; returns its message."""
    name = job["metadata"]["name"]
    failed, preflight = condition(job, "Failed"), condition(job, "PreflightPassed")
    print(f"{name}: {failed} {preflight} {job['status'].get('preflight')}")
    assert failed is not None and failed["status"] == "True" and failed["reason"] == "PreflightFailed"
    assert preflight is not None and preflight["status"] == "False" and preflight["reason"] == reason
    assert job["status"]["preflight"]["state"] == "Failed" and job["status"]["preflight"]["reason"] == reason
    assert job["status"]["restarts"]["total"] == 0
    # The operator posts a reconcile's Events after its status write: they may trail the Failed condition.
    wait_for(
        lambda: (
            {reason, "PreflightFailed"} <= {event["reason"] for event in events_for(cluster, namespace, name)}
        ),
        30,
        message=lambda: (
            f"Events {reason} and PreflightFailed, beside "
            f"{[event['reason'] for event in events_for(cluster, namespace, name)]}"
        ),
    )
    return str(job["status"]["preflight"]["message"])


def test_an_unwritable_checkpoint_location_stops_the_job_before_training(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The checkpoint path lies on a volume the template mounts read-only.
    job = trainingjob("pf-readonly", spares=1, steps=40, preflight=PREFLIGHT)
    job["spec"]["checkpoint"] = {"path": "/frozen/checkpoints", "intervalSteps": 20}
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "frozen", "emptyDir": {}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "frozen", "mountPath": "/frozen", "readOnly": True}]
    cluster.apply(job, namespace)
    stopped = wait_failed(cluster, namespace, "pf-readonly")
    message = assert_stopped_by_preflight(cluster, namespace, stopped, "CheckpointStorageUnusable")
    assert "/frozen/checkpoints" in message and "cannot create the directory" in message
    assert not stopped["status"].get("step")  # no training step was spent


def test_a_resume_that_does_not_continue_the_run_stops_the_job(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(_checkpoint_claim(), namespace)
    job = trainingjob("pf-drift", spares=1, steps=40, preflight=PREFLIGHT)
    job["spec"]["checkpoint"] = {"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 20}
    job["spec"]["template"]["spec"]["containers"][0]["args"].append("--nondeterministic-resume")
    cluster.apply(job, namespace)
    stopped = wait_failed(cluster, namespace, "pf-drift")
    message = assert_stopped_by_preflight(cluster, namespace, stopped, "ResumeMismatch")
    assert "loss at step 5 after the restart" in message
    assert (stopped["status"].get("step") or 0) <= PREFLIGHT["steps"]


def test_checkpoints_the_pods_do_not_share_stop_the_job(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # Each pod's own emptyDir: rank 0's durable checkpoint is nowhere the other pods could read it.
    job = trainingjob("pf-local", spares=1, steps=40, preflight=PREFLIGHT)
    cluster.apply(job, namespace)
    stopped = wait_failed(cluster, namespace, "pf-local")
    message = assert_stopped_by_preflight(cluster, namespace, stopped, "RestoreFailed")
    assert "not shared by the pods" in message


def test_pods_that_cannot_reach_the_rendezvous_stop_the_job(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The pods' /etc/hosts sends the rendezvous service's name to an address where nothing listens, as a pod on
    # a network that does not reach the store would see it.
    name = "pf-nordzv"
    endpoint = f"{name}-rdzv.{namespace}.svc"
    job = trainingjob(name, spares=1, steps=40, preflight=PREFLIGHT)
    job["spec"]["rendezvous"] = {"joinTimeoutSeconds": 15}
    job["spec"]["template"]["spec"]["hostAliases"] = [{"ip": "127.0.0.3", "hostnames": [endpoint]}]
    cluster.apply(job, namespace)
    stopped = wait_failed(cluster, namespace, name)
    message = assert_stopped_by_preflight(cluster, namespace, stopped, "RendezvousUnreachable")
    assert endpoint in message and "cannot reach the job's rendezvous" in message
    assert not stopped["status"].get("step")
