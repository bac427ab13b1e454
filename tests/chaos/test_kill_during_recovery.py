"""Chaos: a second failure inside the recovery from the first, while a real job trains on the local cluster.

The state that counts is the newest one, wherever it is: a survivor's memory outranks the durable checkpoint,
and the group that trains on after both failures must restore from it. Timeouts used here: heartbeat interval
1 s, timeout 5 s, progress timeout 10 s; a durable checkpoint every 20 steps, a snapshot every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..e2e.conftest import Cluster, Operator, wait_for
from ..e2e.test_fault_tolerance import (
    STEPS,
    assert_incident_agrees,
    fault_job,
    incidents_of,
    kill_whole_pod,
    lease_phase,
    logged_recovery,
    step_log,
    training_worker,
)
from ..e2e.test_operator import job_pods, wait_succeeded

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def the_incident_of(job: dict[str, Any], pod_uid: str) -> dict[str, Any]:
    """The one incident of the pod with `pod_uid` (by UID: a new pod may take a killed one's name)."""
    incidents = incidents_of(job)
    mine = [incident for incident in incidents if incident.get("podUid") == pod_uid]
    assert len(mine) == 1, (pod_uid, incidents)
    return mine[0]


@pytest.mark.pod_security(
    "privileged", reason="the trainers write their step log to the test's folder through a hostPath volume"
)
@pytest.mark.parametrize("protocol", ["c10d", "rounds"])
def test_a_worker_and_then_the_promoted_spare_killed_lose_at_most_one_step(
    cluster: Cluster, operator: Operator, namespace: str, tmp_path: Path, protocol: str
) -> None:
    """Two failures that overlap: a worker is killed, and the spare taking its slot is killed as soon as it
    leaves standby to join the round that replaces the first group (its heartbeat says so at once). The
    survivor holds the newest state in its memory: it stays a worker, and the group that trains on restores
    from it (at most the step in flight is lost), not from the durable checkpoint many steps back. Each
    incident's figures are the step log's."""
    tmp_path.chmod(0o777)
    job = fault_job("twice", rendezvous={"protocol": protocol})
    template = job["spec"]["template"]["spec"]
    (container,) = template["containers"]
    container["args"] += ["--log-file", "/steplog/steps.jsonl"]
    container["volumeMounts"] = [{"name": "steplog", "mountPath": "/steplog"}]
    template["volumes"] = [{"name": "steplog", "hostPath": {"path": str(tmp_path)}}]
    cluster.apply(job, namespace)
    # Past a durable checkpoint (every 20 steps) by several steps: the disk holds an older state than memory.
    victim = training_worker(cluster, namespace, "twice", min_step=28)
    (spare,) = job_pods(cluster, namespace, "twice", "phalanx.dev/role=spare")
    wait_for(
        lambda: lease_phase(cluster, namespace, spare.metadata.name) == "standby",
        60,
        message="the spare to stand by",
    )
    first_killed = kill_whole_pod(namespace, victim.metadata.name)
    # Killed before its promotion shows, the spare would be only a lost spare: no second failure to recover.
    wait_for(
        lambda: lease_phase(cluster, namespace, spare.metadata.name) not in ("standby", None),
        60,
        interval=0.1,
        message="the spare to leave standby for the new round",
    )
    second_killed = kill_whole_pod(namespace, spare.metadata.name)
    print(f"the spare was killed {second_killed - first_killed:.1f} s after the worker")
    final = wait_succeeded(cluster, namespace, "twice", timeout=400)
    log = step_log(tmp_path / "steps.jsonl")
    status = final["status"]
    print(f"incidents: {status.get('incidents')} restarts: {status['restarts']}")
    print(
        "restores:", [line for line in log if line.get("event") == "restore" and line["time"] > first_killed]
    )
    assert status["step"] == STEPS
    reached = max(line["step"] for line in log if "event" not in line and line["time"] < first_killed)
    final_resume = logged_recovery(log, second_killed)
    assert final_resume.restored >= reached - 1, (reached, final_resume)
    first = the_incident_of(final, victim.metadata.uid)
    second = the_incident_of(final, spare.metadata.uid)
    assert first["cause"] == second["cause"] == "Killed", (first, second)
    assert_incident_agrees(first, log, first_killed)
    assert_incident_agrees(second, log, second_killed)
    assert second["restoredFrom"] in ("memory", "peer"), second
    assert status["restarts"].get("counted", 0) == 0
