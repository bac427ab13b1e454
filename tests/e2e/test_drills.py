"""`phalanx drill` end to end: the real command, as a user runs it, against jobs on the local cluster.

Each drill strikes a training job that opted in, waits for the recovery and prints the figures read from
the job's status; a job that did not opt in is refused with nothing touched.
Timeouts used here: heartbeat interval 1 s, timeout 5 s, progress timeout 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_fault_tolerance import fault_job, incidents_of, training_worker
from .test_operator import get_job, job_pods, lease_step, wait_succeeded

pytestmark = pytest.mark.e2e


def drill(cluster: Cluster, namespace: str, job: str, *strike: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "drill",
        job,
        "-n",
        namespace,
        *strike,
        "--timeout",
        "240",
    ]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)


def drill_job(name: str) -> dict[str, Any]:
    job = fault_job(name)
    job["spec"]["drills"] = {"allowed": True}
    return job


def figures_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)  # shown with -rA: what the user sees
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_job_without_opt_in_is_refused_and_left_alone(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(fault_job("closed"), namespace)
    worker = training_worker(cluster, namespace, "closed", min_step=5)
    result = drill(cluster, namespace, "closed", "--kill-worker")
    assert result.returncode != 0
    assert "spec.drills.allowed: true" in result.stderr, result.stderr
    alive = {pod.metadata.name for pod in job_pods(cluster, namespace, "closed")}
    assert worker.metadata.name in alive
    assert incidents_of(get_job(cluster, namespace, "closed")) == []
    # Nor does it obey the drills' marks set by hand, bypassing the command: the operator and the launcher
    # check the opt-in themselves.
    node = worker.spec.node_name
    target = f"phalanx.dev/drill-hang={worker.metadata.name}/{worker.metadata.uid}"
    cluster.kubectl("annotate", "trainingjob", "closed", "-n", namespace, target)
    cluster.kubectl("annotate", "node", node, f"phalanx.dev/drill-crash={namespace}/closed")
    try:
        # The worker's own heartbeat: the status is written for a step alone only every `stepReportSeconds`.
        before = lease_step(cluster, namespace, worker.metadata.name)
        time.sleep(15)  # three heartbeat timeouts: a frozen trainer or a node taken away would be seen
        job = get_job(cluster, namespace, "closed")
        after = lease_step(cluster, namespace, worker.metadata.name)
    finally:
        cluster.kubectl("annotate", "node", node, "phalanx.dev/drill-crash-", check=False)
    assert incidents_of(job) == [] and after > before, (before, after, job["status"])
    assert worker.metadata.name in {pod.metadata.name for pod in job_pods(cluster, namespace, "closed")}


def test_kill_worker_drill_reports_the_recovery(cluster: Cluster, operator: Operator, namespace: str) -> None:
    cluster.apply(drill_job("killed"), namespace)
    victim = training_worker(cluster, namespace, "killed")
    figures = figures_of(drill(cluster, namespace, "killed", "--kill-worker", victim.metadata.name, "--json"))
    assert figures["drill"] == "kill-worker" and figures["target"] == victim.metadata.name
    assert figures["cause"] == "PodDeleted" and figures["action"] == "ReplaceWorker"
    assert figures["seconds_to_detect"] is not None and figures["seconds_to_resume"] is not None
    assert figures["steps_lost"] is not None
    job = wait_succeeded(cluster, namespace, "killed", timeout=400)
    assert [i["cause"] for i in incidents_of(job, victim.metadata.name)] == ["PodDeleted"]


def test_crash_node_drill_takes_the_node_from_the_job_and_gives_it_back(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(drill_job("crashed"), namespace)
    victim = training_worker(cluster, namespace, "crashed")
    node = victim.spec.node_name
    figures = figures_of(drill(cluster, namespace, "crashed", "--crash-node", node, "--json"))
    assert figures["cause"] == "NodeLost" and figures["target"] == node
    assert figures["seconds_to_resume"] is not None
    restored = cluster.core.read_node(node)
    assert not restored.spec.unschedulable
    assert "phalanx.dev/drill-crash" not in (restored.metadata.annotations or {})
    job = wait_succeeded(cluster, namespace, "crashed", timeout=400)
    (incident,) = incidents_of(job, victim.metadata.name)
    assert incident["cause"] == "NodeLost" and "drill" in incident["message"]


@pytest.mark.long
def test_kill_rendezvous_drill_reports_the_recovery(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(drill_job("rdzv"), namespace)
    training_worker(cluster, namespace, "rdzv")
    result = drill(cluster, namespace, "rdzv", "--kill-rendezvous")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "drill kill-rendezvous on rdzv-rdzv: RendezvousLost" in result.stdout, result.stdout
    wait_for(
        lambda: (get_job(cluster, namespace, "rdzv").get("status") or {}).get("state") == "Succeeded",
        400,
        message="the job to succeed after the drill",
    )


@pytest.mark.long
def test_hang_worker_drill_freezes_the_trainers_and_their_launcher_reports_them_stopped(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(drill_job("hung"), namespace)
    victim = training_worker(cluster, namespace, "hung")
    figures = figures_of(drill(cluster, namespace, "hung", "--hang-worker", victim.metadata.name, "--json"))
    # The launcher kept renewing its Lease and saw its training processes stopped: it said so at once.
    assert figures["cause"] == "TrainerStopped" and figures["action"] == "ReplaceWorker", figures
    assert figures["target"] == victim.metadata.name
    # Below the heartbeat timeout (5 s) a silent launcher would have needed, with room for a loaded machine.
    assert figures["seconds_to_detect"] <= 30.0, figures
    assert figures["seconds_to_resume"] is not None
    annotations = get_job(cluster, namespace, "hung")["metadata"].get("annotations") or {}
    assert "phalanx.dev/drill-hang" not in annotations
    job = wait_succeeded(cluster, namespace, "hung", timeout=400)
    assert [i["cause"] for i in incidents_of(job, victim.metadata.name)] == ["TrainerStopped"]
