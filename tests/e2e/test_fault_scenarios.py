"""Fault tolerance end to end, the harder scenarios: several failures at once with capacity short, the
rendezvous endpoint lost, a worker killed in the middle of a durable save, and a straggler.

Like test_fault_tolerance.py, each test trains the tiny GPT to its final step through the fault and checks
what the operator recorded. Timeouts (printed with every failure): heartbeat interval 1 s, timeout 5 s,
progress timeout 10 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from phalanx.worker.checkpoint import durable, layout

from .conftest import Cluster, Operator, wait_for
from .test_fault_tolerance import HEARTBEAT, STEPS, assert_recovered, fault_job, incidents_of, training_worker
from .test_operator import events_for, get_job, has_condition, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

# Each pod asks for 5 of a node's 8 CPUs: one pod per real node, so capacity is counted in nodes.
WHOLE_NODE_CPU = "5"
STEP_DELAY_SLOW = 0.25


def lease_annotations(cluster: Cluster, namespace: str, pod: str) -> dict[str, str]:
    lease = cluster.get_json("lease", pod, "-n", namespace)
    return lease["metadata"].get("annotations") or {}


def active_world_sizes(cluster: Cluster, namespace: str, name: str) -> list[int]:
    """World sizes the training workers of a job report in their heartbeats."""
    sizes = []
    for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
        if pod.metadata.deletion_timestamp is not None:
            continue
        annotations = lease_annotations(cluster, namespace, pod.metadata.name) if pod.status.pod_ip else {}
        if annotations.get("phalanx.dev/phase") == "training" and annotations.get("phalanx.dev/world-size"):
            sizes.append(int(annotations["phalanx.dev/world-size"]))
    return sizes


def test_two_workers_killed_with_one_spare_swap_shrink_and_grow_back(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = trainingjob(
        "twokills", replicas=3, spares=1, steps=260, step_delay=STEP_DELAY_SLOW, cpu=WHOLE_NODE_CPU
    )
    job["spec"]["minReplicas"] = 2
    job["spec"]["heartbeat"] = HEARTBEAT
    cluster.apply(job, namespace)
    wait_for(
        lambda: active_world_sizes(cluster, namespace, "twokills") == [3, 3, 3], 240, message="3 workers"
    )
    first = training_worker(cluster, namespace, "twokills")
    others = [
        pod.metadata.name
        for pod in job_pods(cluster, namespace, "twokills", "phalanx.dev/role=worker")
        if pod.metadata.name != first.metadata.name
    ]
    victims = [first.metadata.name, others[0]]
    nodes = [
        pod.spec.node_name for pod in job_pods(cluster, namespace, "twokills") if pod.metadata.name in victims
    ]
    # Capacity goes with the killed workers: their nodes take no new pod until one "returns".
    try:
        for node in nodes:
            cluster.kubectl("cordon", node)
        cluster.kubectl("annotate", "pod", *victims, "-n", namespace, "phalanx.dev/kill=now")

        def shrunk() -> bool:
            current = get_job(cluster, namespace, "twokills")
            return has_condition(current, "Degraded", "True", reason="Shrunk") and active_world_sizes(
                cluster, namespace, "twokills"
            ) == [2, 2]

        wait_for(shrunk, 120, message="training on at world size 2 (Degraded/Shrunk)")
        step_when_shrunk = get_job(cluster, namespace, "twokills")["status"]["step"]
        wait_for(
            lambda: get_job(cluster, namespace, "twokills")["status"]["step"] >= step_when_shrunk + 5,
            120,
            message="progress while shrunk",
        )
        cluster.kubectl("uncordon", nodes[0])
        wait_for(
            lambda: active_world_sizes(cluster, namespace, "twokills") == [3, 3, 3],
            180,
            message="grown back to 3 workers once a node returned",
        )
    finally:
        for node in nodes:
            cluster.kubectl("uncordon", node, check=False)
    final = wait_succeeded(cluster, namespace, "twokills", timeout=600)
    status = final["status"]
    assert status["step"] == 260, status
    incidents = incidents_of(final)
    print(f"incidents: {incidents} restarts: {status['restarts']} heartbeat={HEARTBEAT}")
    assert sorted(i["worker"] for i in incidents) == sorted(victims), incidents
    assert all(i["cause"] == "Killed" and i["action"] == "ReplaceWorker" for i in incidents), incidents
    assert all(i["resumedAt"] and i["stepsLost"] is not None and i["stepsLost"] <= 1 for i in incidents)
    assert status["restarts"]["byCause"].get("Killed") == 2 and status["restarts"].get("counted", 0) == 0
    reasons = [e["reason"] for e in events_for(cluster, namespace, "twokills")]
    assert "SparePromoted" in reasons, reasons


def test_killed_rendezvous_is_an_incident_and_training_resumes_from_memory(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(fault_job("rdzvkill"), namespace)
    training_worker(cluster, namespace, "rdzvkill")
    rendezvous = "rdzvkill-rdzv"
    cluster.kubectl("annotate", "pod", rendezvous, "-n", namespace, "phalanx.dev/kill=now")
    # The store's container restarts in place (restartPolicy Always) or its pod is recreated: either way
    # the operator records the loss.
    wait_for(
        lambda: [
            i for i in incidents_of(get_job(cluster, namespace, "rdzvkill")) if i["cause"] == "RendezvousLost"
        ],
        60,
        message="the rendezvous loss recorded as an incident",
    )
    final = wait_succeeded(cluster, namespace, "rdzvkill", timeout=400)
    status = final["status"]
    assert status["step"] == STEPS, status
    incidents = incidents_of(final)
    print(f"incidents: {incidents} heartbeat={HEARTBEAT}")
    lost = [i for i in incidents if i["cause"] == "RendezvousLost"]
    assert len(lost) == 1 and lost[0]["worker"] == rendezvous, incidents
    # On a loaded machine a launcher may give up on the restarting store first (exit 3, "rendezvous
    # unreachable") and its worker is replaced: an infrastructure incident of its own, charged to no budget.
    # Whatever happened, every incident resumed from memory and lost at most the step in flight.
    for each in incidents:
        assert each["resumedAt"] and each["stepsLost"] is not None and each["stepsLost"] <= 1, each
        assert each.get("restoredFrom") in (None, "memory", "peer"), each
    assert status["restarts"].get("counted", 0) == 0
    assert has_condition(final, "Recovering", "False", reason="Recovered")


def _pod_processes(pod_name: str) -> list[int]:
    """Processes of a pod of the local cluster (pods are local processes carrying POD_NAME)."""
    found = []
    marker = f"POD_NAME={pod_name}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            found.append(int(entry.name))
    return found


def _checkpoint_claim() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "checkpoints"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}}},
    }


def _claim_directory(cluster: Cluster, namespace: str, job: str) -> Path:
    """The folder of `job`'s checkpoints on the claim `checkpoints`: `<namespace>/<job>` under its volume."""
    claim = cluster.get_json("pvc", "checkpoints", "-n", namespace)
    volume = cluster.get_json("pv", claim["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"]) / namespace / job


def test_worker_killed_during_a_durable_save_loses_no_checkpoint(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(_checkpoint_claim(), namespace)
    job = fault_job("savekill", checkpoint={"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 5})
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    # A model big enough that writing a checkpoint takes a while (~40 MB of state with the optimizer).
    args[args.index("--width") + 1] = "256"
    args[args.index("--layers") + 1] = "4"
    cluster.apply(job, namespace)
    writer = wait_for(
        lambda: next(
            (
                pod
                for pod in job_pods(cluster, namespace, "savekill", "phalanx.dev/role=worker")
                if lease_annotations(cluster, namespace, pod.metadata.name).get("phalanx.dev/rank") == "0"
                and lease_annotations(cluster, namespace, pod.metadata.name).get("phalanx.dev/phase")
                in ("training", "saving")
            ),
            None,
        ),
        240,
        message="rank 0 training",
    )
    directory = wait_for(
        lambda: _claim_directory(cluster, namespace, "savekill"), 60, message="the claim's volume"
    )
    wait_for(lambda: durable.complete_steps(directory), 240, message="a first save")
    # Catch a save in the act: a temporary folder appears, and the writer's processes die at once.
    deadline = time.monotonic() + 120
    killed_during: int | None = None
    while killed_during is None and time.monotonic() < deadline:
        pending = [name for name in os.listdir(directory) if layout.parse_tmp_dir(name) is not None]
        if pending:
            for pid in _pod_processes(writer.metadata.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            step = layout.parse_tmp_dir(pending[0])
            torn = [name for name in os.listdir(directory) if layout.parse_tmp_dir(name) == step]
            if torn and step not in durable.complete_steps(directory):
                killed_during = step
            break
        time.sleep(0.002)
    assert killed_during is not None, "no save was caught in the act (the kill landed between saves)"

    final = wait_succeeded(cluster, namespace, "savekill", timeout=600)
    assert final["status"]["step"] == STEPS, final["status"]
    assert_recovered(final, writer.metadata.name, "Killed")
    complete = durable.complete_steps(directory)
    assert complete and complete[0] == STEPS, complete
    for step in complete:
        manifest, problem = durable.verify(directory / layout.step_dir_name(step), step)
        assert problem is None and manifest is not None, f"step {step}: {problem}"
    print(f"killed the writer while it wrote step {killed_during}; complete now: {complete}")


def test_straggler_is_swapped_for_the_spare(cluster: Cluster, operator: Operator, namespace: str) -> None:
    heartbeat = {**HEARTBEAT, "stragglerFactor": 2.0, "stragglerHeartbeats": 3}
    job = trainingjob("slowpoke", replicas=3, spares=1, steps=STEPS, step_delay=0.1)
    job["spec"]["heartbeat"] = heartbeat
    victim = "slowpoke-worker-1"
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "PHALANX_EXAMPLE_SLOW_POD", "value": victim},
        {"name": "PHALANX_EXAMPLE_SLOW_SECONDS", "value": "0.6"},
    ]
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "slowpoke", timeout=600)
    status = final["status"]
    assert status["step"] == STEPS, status
    mine = incidents_of(final, victim)
    print(f"straggler: {mine} heartbeat={heartbeat}; all: {status.get('incidents')}")
    assert [i["cause"] for i in mine] == ["Straggler"], status.get("incidents")
    assert mine[0]["action"] == "ReplaceWorker" and mine[0]["resumedAt"], mine
    assert [i["worker"] for i in incidents_of(final)] == [victim], "only the slowed worker is a straggler"
    reasons = [e["reason"] for e in events_for(cluster, namespace, "slowpoke")]
    assert "SparePromoted" in reasons, reasons
