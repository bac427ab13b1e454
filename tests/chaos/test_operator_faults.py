"""Chaos: faults of the operator and of the control plane itself, while real jobs train on the local cluster.

Each case checks the three things a fault of the platform must never cost: a healthy pod replaced, a step lost
beyond the one in flight, and a status or Event that disagrees with what the workers' heartbeats say.
Timeouts used here (printed with every failure): heartbeat interval 1 s, timeout 5 s, progress timeout 10 s;
the operator's view canary every 1 s, stale after 3 s (the chart's defaults).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from phalanx.devcluster import controlplane
from phalanx.operator import trackmemory

from ..e2e.conftest import Cluster, Operator, operator_ready, wait_for
from ..e2e.test_fault_scenarios import _checkpoint_claim
from ..e2e.test_fault_tolerance import HEARTBEAT, fault_job, incidents_of, training_worker
from ..e2e.test_operator import events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

TRAINERS = "phalanx.dev/component=trainer"
# Events that only a failure (or a judgement of one) posts: none may follow a fault of the operator alone.
FAILURE_REASONS = {
    "HeartbeatTimeout",
    "NoProgress",
    "TrainerStopped",
    "ReplaceWorker",
    "Recovering",
    "SparePromoted",
    "PodDeleted",
}


def pod_uids(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return {pod.metadata.name: pod.metadata.uid for pod in job_pods(cluster, namespace, name)}


def heartbeat_steps(cluster: Cluster, namespace: str, name: str) -> dict[str, int]:
    """The step each of the job's trainers last reported in its Lease, read from the API server (not from the
    job's status, which only the operator writes)."""
    steps: dict[str, int] = {}
    for pod in job_pods(cluster, namespace, name, TRAINERS):
        lease = cluster.get_json("lease", pod.metadata.name, "-n", namespace)
        step = (lease["metadata"].get("annotations") or {}).get("phalanx.dev/step")
        if step:  # a standby spare reports none
            steps[pod.metadata.name] = int(step)
    return steps


def operator_pod(cluster: Cluster, operator: Operator) -> str:
    (pod,) = [p for p in operator.pods(cluster) if p.metadata.deletion_timestamp is None]
    return str(pod.metadata.name)


def agent_log(cluster: Cluster) -> str:
    """What the node agent has logged so far."""
    return (cluster.state_dir / "logs" / "node-agent.log").read_text(errors="replace")


def freezes_applied(cluster: Cluster, namespace: str, pod: str) -> int:
    """How many times the node agent has frozen the pod (it logs each freeze once it has stopped the processes)."""
    return agent_log(cluster).count(f"pod {namespace}/{pod} frozen\n")


def container_group(cluster: Cluster, namespace: str, pod: str) -> int:
    """The process group of the pod's newest container process, as the node agent logged its start (the agent
    starts each container in a group of its own)."""
    started = re.findall(
        rf"pod {re.escape(namespace)}/{re.escape(pod)} container \S+ started \(pid (\d+)", agent_log(cluster)
    )
    assert started, f"no container of {namespace}/{pod} in the node agent's log"
    return int(started[-1])


def group_states(group: int) -> dict[str, str]:
    """The state letter (`/proc/PID/task/TID/stat`, `T`: stopped) of every thread of every process in the
    process group, by `PID/TID`: a process stops thread by thread."""
    states = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rpartition(")")[2].split()[2]) != group:
                continue
            for task in (entry / "task").iterdir():
                states[f"{entry.name}/{task.name}"] = (
                    (task / "stat").read_text().rpartition(")")[2].split()[0]
                )
        except OSError:
            continue  # gone meanwhile
    return states


def freeze_operator_pod(cluster: Cluster, operator: Operator, pod: str) -> None:
    """Annotate the operator's pod to be frozen and wait until the node agent has stopped it: the agent sees the
    annotation a moment later, longer on a busy machine, and the operator acts until then. Then every process of
    its container must be seen stopped (a CI run once saw the operator act after the agent's "frozen" line)."""
    before = freezes_applied(cluster, operator.namespace, pod)
    cluster.kubectl(
        "annotate", "pod", pod, "-n", operator.namespace, "phalanx.dev/freeze=true", "--overwrite"
    )
    wait_for(lambda: freezes_applied(cluster, operator.namespace, pod) > before, 30, message=f"{pod} frozen")
    group = container_group(cluster, operator.namespace, pod)
    wait_for(
        lambda: (states := group_states(group)) and all(state in "Tt" for state in states.values()),
        10,
        message=lambda: f"every process of {pod} stopped (process group {group}: {group_states(group)})",
    )


def kill_pod(cluster: Cluster, namespace: str, pod: str) -> None:
    """SIGKILL every process of the pod's containers (the node agent's kill, no SIGTERM and no SIGCONT first),
    and wait until the agent has."""
    line = f"pod {namespace}/{pod}: killed on request"
    before = agent_log(cluster).count(line)
    cluster.kubectl("annotate", "pod", pod, "-n", namespace, "phalanx.dev/kill=now", "--overwrite")
    wait_for(lambda: agent_log(cluster).count(line) > before, 30, message=f"{pod} killed")


def freeze_operator(cluster: Cluster, operator: Operator, seconds: float) -> None:
    """SIGSTOP the operator's process (the node agent's freeze) for `seconds`, then SIGCONT it: a long GC
    pause, a starved node or a debugger would do the same."""
    pod = operator_pod(cluster, operator)
    freeze_operator_pod(cluster, operator, pod)
    try:
        time.sleep(seconds)
    finally:
        cluster.kubectl(
            "annotate", "pod", pod, "-n", operator.namespace, "phalanx.dev/freeze=false", "--overwrite"
        )


def assert_untouched(
    cluster: Cluster, namespace: str, name: str, before: dict[str, str], what: str
) -> dict[str, Any]:
    """Nothing was replaced, no incident recorded, no failure's Event posted: the job as it was."""
    assert pod_uids(cluster, namespace, name) == before, f"{what}: the operator replaced healthy pods"
    job = get_job(cluster, namespace, name)
    status = job.get("status") or {}
    assert incidents_of(job) == [], f"{what}: {status.get('incidents')}"
    assert (status.get("restarts") or {}).get("total", 0) == 0, f"{what}: {status.get('restarts')}"
    reasons = [event["reason"] for event in events_for(cluster, namespace, name)]
    assert not FAILURE_REASONS & set(reasons), f"{what}: {reasons}"
    return job


def test_a_paused_operator_replaces_no_healthy_pod(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """The operator frozen for 20 s, then for 45 s, mid-training (both far past every heartbeat and progress
    timeout of the job): training goes on throughout, and on
    resume nothing is replaced, no incident is recorded, and the status catches up with the heartbeats."""
    job = trainingjob("paused", replicas=2, spares=1, steps=5000, step_delay=0.2)
    job["spec"]["heartbeat"] = HEARTBEAT
    cluster.apply(job, namespace)
    wait_for(lambda: (get_job(cluster, namespace, "paused").get("status") or {}).get("step", 0) >= 10, 240)
    before = pod_uids(cluster, namespace, "paused")
    for pause in (20, 45):
        steps_before = heartbeat_steps(cluster, namespace, "paused")
        freeze_operator(cluster, operator, pause)
        steps_after = heartbeat_steps(cluster, namespace, "paused")
        # Training never stopped: every worker moved on while the operator was away.
        workers = [
            pod.metadata.name for pod in job_pods(cluster, namespace, "paused", "phalanx.dev/role=worker")
        ]
        assert all(steps_after[w] > steps_before.get(w, 0) + 10 for w in workers), (steps_before, steps_after)
        # Several reconciles after the resume (every 2 s here), with heartbeats judged each time.
        reached = max(steps_after[w] for w in workers)
        wait_for(
            lambda reached=reached: (
                (get_job(cluster, namespace, "paused").get("status") or {}).get("step", 0) >= reached
            ),
            60,
            message=f"the status to catch up with step {reached} after a {pause} s pause",
        )
        time.sleep(2 * HEARTBEAT["timeoutSeconds"])
        job = assert_untouched(cluster, namespace, "paused", before, f"after a {pause} s pause")
        assert job["status"]["state"] == "Running", job["status"]


def test_an_operator_restarted_mid_recovery_recovers_once(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """A worker SIGKILLed and the operator restarted a moment later: the recovery completes once, with one
    incident, no duplicate pod, and the survivors untouched."""
    cluster.apply(fault_job("restarted"), namespace)
    victim = training_worker(cluster, namespace, "restarted").metadata.name
    survivors = {
        pod: uid
        for pod, uid in pod_uids(cluster, namespace, "restarted").items()
        if pod != victim and "-worker-" in pod
    }
    cluster.kubectl("annotate", "pod", victim, "-n", namespace, "phalanx.dev/kill=now")
    cluster.kubectl(
        "delete", "pod", "-n", operator.namespace, "-l", "app.kubernetes.io/name=phalanx", "--wait=false"
    )
    wait_for(lambda: operator_ready(cluster), 120, message="the operator to come back")
    job = wait_succeeded(cluster, namespace, "restarted", timeout=400)
    status = job["status"]
    mine = incidents_of(job, victim)
    assert [incident["cause"] for incident in mine] == ["Killed"], status.get("incidents")
    assert len(incidents_of(job)) == 1, status.get("incidents")
    assert status["restarts"]["total"] == 1, status["restarts"]
    (incident,) = mine
    assert incident["stepsLost"] is not None and incident["stepsLost"] <= 1, incident
    now_uids = pod_uids(cluster, namespace, "restarted")
    # The survivors were kept (a promoted spare keeps its pod too); names are never duplicated.
    assert {pod: now_uids.get(pod) for pod in survivors} == survivors
    trainers = job_pods(cluster, namespace, "restarted", TRAINERS)
    assert len({pod.metadata.name for pod in trainers}) == len(trainers)


def test_a_pod_that_vanished_while_the_operator_was_away_is_judged_from_its_status(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """A worker remembered only as an index range in `status.tracked`, removed at once while the operator is
    frozen, and the operator then replaced: the new one never saw the pod, and judges its loss from the job's
    status alone (PodDeleted, one incident, the job trained to its end)."""
    cluster.apply(fault_job("forgotten"), namespace)
    victim = training_worker(cluster, namespace, "forgotten")
    index = int(victim.metadata.labels["phalanx.dev/index"])

    def as_a_range() -> bool:
        status = get_job(cluster, namespace, "forgotten").get("status", {})
        stored = {track["pod"] for track in status.get("tracking", [])}
        known = trackmemory.IndexRanges((status.get("tracked") or {}).get("known", []))
        return victim.metadata.name not in stored and index in known

    wait_for(as_a_range, 60, message=f"{victim.metadata.name} remembered as an index range")
    frozen = operator_pod(cluster, operator)
    freeze_operator_pod(cluster, operator, frozen)
    cluster.kubectl(
        "delete", "pod", victim.metadata.name, "-n", namespace, "--grace-period=0", "--force", "--wait=false"
    )
    wait_for(
        lambda: victim.metadata.name not in pod_uids(cluster, namespace, "forgotten"),
        30,
        message="the pod gone",
    )
    # The frozen operator must never run again. Deleting its pod alone would not do: the node agent stops a
    # container with SIGCONT and SIGTERM, and for the two seconds before its SIGKILL the woken operator, still
    # holding its Lease, acted on the deletion it had missed (seen in a CI run). Killed while frozen, it cannot;
    # its container's restart is frozen from its start, as the agent keeps a frozen pod frozen.
    kill_pod(cluster, operator.namespace, frozen)
    cluster.kubectl("delete", "pod", frozen, "-n", operator.namespace, "--grace-period=0", "--force")
    wait_for(lambda: operator_ready(cluster), 120, message="the operator to come back")
    job = wait_succeeded(cluster, namespace, "forgotten", timeout=400)
    mine = incidents_of(job, victim.metadata.name)
    assert [incident["cause"] for incident in mine] == ["PodDeleted"], job["status"].get("incidents")
    assert "disappeared" in mine[0]["message"], mine
    assert len(incidents_of(job)) == 1, job["status"].get("incidents")


def test_jobs_applied_together_are_admitted_one_by_one(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Three gangs in one `kubectl apply` with room for two (each worker takes 5 of a node's 8 CPUs, four
    nodes): the last-ranked job is held with 0 pods until two of the others' workers end, and no gang is ever
    left partly bound."""
    jobs = [trainingjob(name, replicas=2, cpu="5", steps=150, step_delay=0.1) for name in ("a", "b", "c")]
    for job in jobs:
        job["spec"]["gang"] = {"scheduleTimeoutSeconds": 120}
    cluster.apply(jobs, namespace)
    created = {
        job["metadata"]["name"]: job["metadata"]["creationTimestamp"]
        for job in cluster.get_json("trainingjobs", "-n", namespace)["items"]
    }
    held = max(created, key=lambda name: (created[name], name))
    first, second = sorted(set(created) - {held})

    partly_bound_since: dict[str, float] = {}

    def watch_gangs() -> None:
        for name in created:
            trainers = job_pods(cluster, namespace, name, TRAINERS)
            bound = [pod for pod in trainers if pod.spec.node_name]
            if trainers and 0 < len(bound) < len(trainers):
                since = partly_bound_since.setdefault(name, time.monotonic())
                # The scheduler binds a gang's pods one by one within moments; a gang stuck half bound is not.
                assert time.monotonic() - since < 5, f"{name}: {len(bound)}/{len(trainers)} bound for 5 s"
            else:
                partly_bound_since.pop(name, None)

    def running(name: str) -> bool:
        return (get_job(cluster, namespace, name).get("status") or {}).get("step", 0) >= 5

    def succeeded(name: str) -> bool:
        return (get_job(cluster, namespace, name).get("status") or {}).get("state") == "Succeeded"

    def live_trainers(name: str) -> int:
        return sum(
            pod.status.phase not in ("Succeeded", "Failed")
            for pod in job_pods(cluster, namespace, name, TRAINERS)
        )

    def made_room() -> bool:
        """Whether the two jobs gave back room for the held gang's two workers: each worker has a node of its
        own, so two nodes are free once at most two of the others' workers still run, from one job or both (a
        job's workers end moments apart: the first to end of each job together make the room). The operator
        counts only live pods, so this comes before either job's status says Succeeded."""
        return live_trainers(first) + live_trainers(second) <= 2

    def still_held() -> None:
        """The held job has no pod, or got them only after the two made room. Its pods are read first: room
        once made stays made, so reading the two jobs after sees whatever let the held one start."""
        if job_pods(cluster, namespace, held, TRAINERS):
            assert made_room(), f"{held} got pods while held"

    def both_running() -> bool:
        watch_gangs()
        assert job_pods(cluster, namespace, held, TRAINERS) == [], f"{held} got pods while held"
        return running(first) and running(second)

    wait_for(both_running, 240, interval=0.3, message=f"{first} and {second} to train")
    held_job = get_job(cluster, namespace, held)
    gang = next(c for c in held_job["status"]["conditions"] if c["type"] == "GangScheduled")
    assert (gang["status"], gang["reason"]) == ("False", "InsufficientCapacity"), gang
    # Held, with no pod, until the two make room; then it starts and trains to the end.
    while not any(succeeded(name) for name in (first, second)):
        watch_gangs()
        still_held()
        time.sleep(0.3)
    for name in (first, second, held):
        final = wait_succeeded(cluster, namespace, name, timeout=400)
        assert final["status"]["restarts"]["total"] == 0, (name, final["status"]["restarts"])
    reasons = [event["reason"] for event in events_for(cluster, namespace, held)]
    assert "InsufficientCapacity" in reasons, reasons


def freeze_component(cluster: Cluster, component: str, seconds: float) -> None:
    """SIGSTOP a control-plane process of the local cluster for `seconds`, then SIGCONT it."""
    layout = controlplane.Layout(cluster.state_dir)
    record = controlplane.running_components(layout)[component]
    process = record.process()
    assert process is not None, component
    process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        process.send_signal(signal.SIGCONT)


def test_a_control_plane_outage_replaces_no_healthy_pod(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """The API server hangs for 20 s mid-training, later etcd behind it: no Lease can be renewed, no watch
    event arrives, and the node controller's view lapses too (after etcd it calls every node unreachable).
    Once the control plane answers again nothing is replaced and training went on."""
    job = trainingjob("outage", replicas=2, spares=1, steps=3000, step_delay=0.2)
    job["spec"]["heartbeat"] = HEARTBEAT
    cluster.apply(job, namespace)
    wait_for(lambda: (get_job(cluster, namespace, "outage").get("status") or {}).get("step", 0) >= 10, 240)
    before = pod_uids(cluster, namespace, "outage")
    for component in ("kube-apiserver", "etcd"):
        steps_before = heartbeat_steps(cluster, namespace, "outage")
        freeze_component(cluster, component, 20)
        wait_for(lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60)
        time.sleep(3 * HEARTBEAT["timeoutSeconds"])
        steps_after = heartbeat_steps(cluster, namespace, "outage")
        workers = [
            pod.metadata.name for pod in job_pods(cluster, namespace, "outage", "phalanx.dev/role=worker")
        ]
        assert all(steps_after[w] > steps_before.get(w, 0) for w in workers), (steps_before, steps_after)
        assert_untouched(cluster, namespace, "outage", before, f"after {component} hung for 20 s")


def test_a_worker_killed_during_the_preflight(cluster: Cluster, operator: Operator, namespace: str) -> None:
    """A worker SIGKILLed while the preflight trains: the spare takes its slot, the preflight still passes (its
    check is not fooled into a mismatch by the kill), and the job trains to the end with one incident."""
    cluster.apply(_checkpoint_claim(), namespace)
    job = fault_job(
        "pfkill",
        checkpoint={"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 20},
        preflight={"enabled": True, "steps": 40},
    )
    cluster.apply(job, namespace)

    def preflight_training() -> Any:
        current = get_job(cluster, namespace, "pfkill")
        if ((current.get("status") or {}).get("preflight") or {}).get("state") != "Running":
            return None
        steps = heartbeat_steps(cluster, namespace, "pfkill")
        workers = job_pods(cluster, namespace, "pfkill", "phalanx.dev/role=worker")
        return next((pod for pod in workers if steps.get(pod.metadata.name, 0) >= 5), None)

    victim = wait_for(preflight_training, 240, interval=0.2, message="the preflight to train").metadata.name
    cluster.kubectl("annotate", "pod", victim, "-n", namespace, "phalanx.dev/kill=now")
    final = wait_succeeded(cluster, namespace, "pfkill", timeout=400)
    status = final["status"]
    assert status["preflight"]["state"] == "Passed", status["preflight"]
    assert [incident["cause"] for incident in incidents_of(final)] == ["Killed"], status.get("incidents")
    assert status["restarts"]["total"] == 1, status["restarts"]
    assert status["restarts"].get("counted", 0) == 0, status["restarts"]
    reasons = [event["reason"] for event in events_for(cluster, namespace, "pfkill")]
    assert "PreflightFailed" not in reasons and "Passed" in reasons, reasons
