"""The heartbeat hub on the local cluster (`heartbeat.reporting: hub`, worker/beathub.py, operator/hubview.py):
a job's workers beat through its rendezvous store, one summary Lease carries them all, the pods' own Leases go
quiet, a hub that stalls or dies replaces no worker (the launchers renew their own Leases meanwhile), and a
frozen worker is still found once the hub is back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

import pytest

from phalanx import beatsummary
from phalanx.devcluster.agent.runtime import processes_with_environment
from phalanx.operator.timeutil import parse_time

from .conftest import Cluster, Operator, wait_for
from .test_fault_tolerance import incidents_of, step_of
from .test_operator import get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

STEPS = 320
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 5, "progressTimeoutSeconds": 20, "reporting": "hub"}


def hub_summary(cluster: Cluster, namespace: str, job: str) -> tuple[dict[str, Any], float] | None:
    """The job's hub summary and its Lease's renew time (None before the hub wrote one)."""
    found = cluster.kubectl("get", "lease", f"{job}-rdzv", "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    lease = json.loads(found.stdout)
    summary = beatsummary.decode(
        (lease["metadata"].get("annotations") or {}).get(beatsummary.SUMMARY_ANNOTATION)
    )
    renewed = parse_time(lease["spec"].get("renewTime"))
    return (summary, renewed.timestamp()) if summary is not None and renewed is not None else None


def hub_training_worker(cluster: Cluster, namespace: str, job: str) -> Any:
    """A worker pod whose heartbeat, by the hub's summary, says it trains (its own Lease went quiet)."""

    def pick() -> Any:
        found = hub_summary(cluster, namespace, job)
        if found is None:
            return None
        said = beatsummary.expand(found[0])
        for pod in job_pods(cluster, namespace, job, "phalanx.dev/role=worker"):
            if (said.get(pod.metadata.name) or {}).get("phase") == "training":
                return pod
        return None

    return wait_for(pick, 60, message="a worker training by the hub's summary")


def own_renewal(cluster: Cluster, namespace: str, pod: str) -> str:
    return cluster.get_json("lease", pod, "-n", namespace)["spec"]["renewTime"]


def signal_hub(cluster: Cluster, namespace: str, job: str, signum: int) -> int:
    """Signal the hub container's processes (SIGSTOP: a hub that stalls; SIGKILL: an OOM kill); their count."""
    pod = cluster.get_json("pod", f"{job}-rdzv", "-n", namespace)
    (hub,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "heartbeat-hub"]
    pids = processes_with_environment({"PHALANX_CONTAINER_ID": hub["containerID"]})
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return len(pids)


def assert_untouched(cluster: Cluster, namespace: str, job: str) -> None:
    status = get_job(cluster, namespace, job)["status"]
    assert status["restarts"]["total"] == 0, status.get("incidents")
    assert not status.get("incidents"), status.get("incidents")


def test_a_job_beats_through_its_hub_survives_the_hub_s_loss_and_still_catches_a_frozen_worker(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = trainingjob("hubbed", replicas=2, spares=1, steps=STEPS, step_delay=0.25)
    job["spec"]["heartbeat"] = HEARTBEAT
    cluster.apply(job, namespace)
    # The job's step in its status comes from the hub's summary once the pods' own Leases are quiet.
    wait_for(lambda: step_of(cluster, namespace, "hubbed") >= 15, 240, message="step 15")
    members = wait_for(
        lambda: (found := hub_summary(cluster, namespace, "hubbed")) and found[0]["members"] == 3 and found,
        60,
        message="a hub summary of the job's three trainers",
    )
    print("hub summary:", members)
    expanded = beatsummary.expand(members[0])
    assert set(expanded) == {f"hubbed-worker-{index}" for index in range(3)}

    # The pods' own Leases are not renewed while the hub takes their beats; the hub's Lease is, each interval.
    before = {pod: own_renewal(cluster, namespace, pod) for pod in expanded}
    hub_before = members[1]
    time.sleep(4 * HEARTBEAT["intervalSeconds"])
    assert {pod: own_renewal(cluster, namespace, pod) for pod in expanded} == before
    latest = hub_summary(cluster, namespace, "hubbed")
    assert latest is not None and latest[1] > hub_before

    # The hub stalls for longer than the heartbeat timeout: no worker is taken for silent, and the launchers
    # renew their own Leases until it is back.
    stalled_at = time.time()
    assert signal_hub(cluster, namespace, "hubbed", signal.SIGSTOP) >= 1
    try:
        time.sleep(2 * HEARTBEAT["timeoutSeconds"])
        assert_untouched(cluster, namespace, "hubbed")
        fallen_back = {pod: own_renewal(cluster, namespace, pod) for pod in expanded}
        late = [pod for pod, renewed in fallen_back.items() if renewed == before[pod]]
        assert not late, f"own Leases not renewed while the hub stalled: {late}"
    finally:
        signal_hub(cluster, namespace, "hubbed", signal.SIGCONT)
    wait_for(
        lambda: (found := hub_summary(cluster, namespace, "hubbed")) and found[1] > stalled_at + 1.0,
        60,
        message="the heartbeat hub summarising again after its stall",
    )
    assert_untouched(cluster, namespace, "hubbed")

    # The hub dies: no worker is replaced for it, and it comes back.
    killed_at = time.time()
    assert signal_hub(cluster, namespace, "hubbed", signal.SIGKILL) >= 1
    wait_for(
        lambda: (found := hub_summary(cluster, namespace, "hubbed")) and found[1] > killed_at + 1.0,
        120,
        message="the heartbeat hub summarising again after its kill",
    )
    back_at = time.time()
    print(f"hub back {back_at - killed_at:.1f}s after its kill")
    assert_untouched(cluster, namespace, "hubbed")

    # With the hub back, a frozen worker is found by its silence, and the spare takes its place.
    wait_for(lambda: step_of(cluster, namespace, "hubbed") >= 60, 240, message="step 60")
    victim = hub_training_worker(cluster, namespace, "hubbed")
    frozen_at = time.time()
    cluster.kubectl("annotate", "pod", victim.metadata.name, "-n", namespace, "phalanx.dev/freeze=true")
    final = wait_succeeded(cluster, namespace, "hubbed", timeout=400)
    status = final["status"]
    assert status["step"] == STEPS, status
    (incident,) = incidents_of(final)
    assert (incident["worker"], incident["cause"], incident["action"]) == (
        victim.metadata.name,
        "HeartbeatTimeout",
        "ReplaceWorker",
    ), incident
    assert "no heartbeat" in incident["message"], incident
    assert status["restarts"]["byCause"] == {"HeartbeatTimeout": 1}, status["restarts"]
    detected = parse_time(incident["detectedAt"])
    assert detected is not None
    print(
        f"frozen worker detected {detected.timestamp() + 1.0 - frozen_at:.1f}s after the freeze: {incident}"
    )
