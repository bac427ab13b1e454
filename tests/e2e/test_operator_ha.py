"""The operator's two replicas (the chart's default) under leader election, on the local cluster: a leader whose
process is killed is replaced by the standby, a leader paused past its Lease stops acting once it wakes, and a job
trains on through both with no pod replaced.

Timeouts used (printed with every failure): the chart's Lease times (8 s lease, 6 s renew deadline, 1 s retry),
a reconcile every 2 s; a killed leader's successor must act within 30 s (the benchmark `operator-takeover`
reports the p50 and p95 against the 15 s target).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .conftest import Cluster, Operator, operator_ready, wait_for
from .test_fault_tolerance import incidents_of, step_of
from .test_operator import get_job, job_pods, trainingjob

pytestmark = pytest.mark.e2e

ACT_WITHIN_SECONDS = 30.0
"""A killed leader's successor acts within this: its 8 s lease, one retry and its start, with room for a busy
machine. The 15 s target is judged by the benchmark (p95 of repeated takeovers), not by one timed test."""


@pytest.fixture
def two_replicas(cluster: Cluster, operator: Operator) -> Iterator[None]:
    operator.scale(cluster, 2)
    try:
        yield
    finally:
        operator.scale(cluster, 1)
        wait_for(lambda: operator_ready(cluster), 120, message="the operator back at one replica")


def training(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    job = trainingjob(name, replicas=2, spares=1, steps=100000, step_delay=0.1)
    cluster.apply(job, namespace)
    wait_for(lambda: step_of(cluster, namespace, name) >= 5, 240, message="step 5")
    return {pod.metadata.name: pod.metadata.uid for pod in job_pods(cluster, namespace, name)}


def assert_untouched(cluster: Cluster, namespace: str, name: str, before: dict[str, str]) -> None:
    now = {pod.metadata.name: pod.metadata.uid for pod in job_pods(cluster, namespace, name)}
    assert now == before, "a healthy pod was replaced, or one was added"
    job = get_job(cluster, namespace, name)
    assert incidents_of(job) == [], job["status"].get("incidents")
    assert (job["status"].get("restarts") or {}).get("total", 0) == 0, job["status"].get("restarts")
    assert job["status"]["state"] == "Running", job["status"]


def test_a_killed_leader_is_replaced_by_a_standby_that_acts_at_once(
    cluster: Cluster, operator: Operator, namespace: str, two_replicas: None
) -> None:
    before = training(cluster, namespace, "ha")
    leader = operator.leader(cluster)
    reached = step_of(cluster, namespace, "ha")
    # The leader's pod is gone at once, its process killed with it: no SIGTERM, so no release of the Lease.
    killed = time.monotonic()
    cluster.kubectl(
        "delete", "pod", str(leader), "-n", operator.namespace, "--grace-period=0", "--force", "--wait=false"
    )
    # The standby, or the Deployment's replacement pod should it read the Lease first.
    wait_for(lambda: operator.leader(cluster) not in (None, leader), 60, message="another replica to lead")
    successor = operator.leader(cluster)
    holding = time.monotonic() - killed
    # Acting: the new leader's reconcile writes the job's status with the step training reached since.
    wait_for(lambda: step_of(cluster, namespace, "ha") > reached + 10, 60, message="the status to move on")
    acting = time.monotonic() - killed
    print(f"takeover: {successor} held the Lease {holding:.1f} s after the kill and acted at {acting:.1f} s")
    assert acting <= ACT_WITHIN_SECONDS, f"the successor acted {acting:.1f} s after the leader was killed"
    assert_untouched(cluster, namespace, "ha", before)
    # The Deployment's new pod stands by.
    wait_for(lambda: len(operator.ready_pods(cluster)) == 2, 120, message="a new standby")
    assert operator.leader(cluster) == successor


def test_a_leader_paused_past_its_lease_stops_acting_when_it_wakes(
    cluster: Cluster, operator: Operator, namespace: str, two_replicas: None
) -> None:
    before = training(cluster, namespace, "paused")
    leader = str(operator.leader(cluster))
    (standby,) = [pod for pod in operator.ready_pods(cluster) if pod != leader]
    restarts = restart_count(cluster, operator, leader)
    cluster.kubectl(
        "annotate", "pod", leader, "-n", operator.namespace, "phalanx.dev/freeze=true", "--overwrite"
    )
    try:
        wait_for(lambda: operator.leader(cluster) == standby, 60, message=f"{standby} to take the Lease")
        reached = step_of(cluster, namespace, "paused")
        wait_for(
            lambda: step_of(cluster, namespace, "paused") > reached + 10, 60, message="the standby to act"
        )
    finally:
        cluster.kubectl(
            "annotate", "pod", leader, "-n", operator.namespace, "phalanx.dev/freeze=false", "--overwrite"
        )
    # Awake, the old leader finds its Lease taken: it exits before any write, and comes back as a standby.
    wait_for(
        lambda: restart_count(cluster, operator, leader) > restarts,
        60,
        message=f"{leader} to exit once awake",
    )
    previous = cluster.kubectl("logs", leader, "-n", operator.namespace, "--previous").stdout
    assert "was taken by" in previous and "this replica stops acting" in previous, previous[-3000:]
    assert "exiting: another replica" in previous, previous[-3000:]
    wait_for(
        lambda: (
            "standing by for the operator's Lease"
            in cluster.kubectl("logs", leader, "-n", operator.namespace).stdout
        ),
        60,
        message=f"{leader} to stand by",
    )
    assert operator.leader(cluster) == standby
    time.sleep(5)  # several reconciles of the new leader
    assert_untouched(cluster, namespace, "paused", before)


def restart_count(cluster: Cluster, operator: Operator, pod: str) -> int:
    found = cluster.core.read_namespaced_pod(pod, operator.namespace)
    return sum(status.restart_count for status in found.status.container_statuses or [])
