"""Fault tolerance end to end: real training on the local cluster, one injected fault per test.

Each test trains the tiny GPT to its final step through a fault and checks what the operator recorded:
the incident (cause, seconds to recover, steps lost), the restarts by cause, and the Events.
Timeouts used here (printed with every failure): heartbeat interval 1 s, timeout 5 s, progress timeout 10 s.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from phalanx import beatsummary, contract
from phalanx.bench import faults
from phalanx.operator import status as observe
from phalanx.operator.timeutil import parse_time

from .conftest import Cluster, Operator, operator_ready, wait_for
from .test_operator import (
    condition,
    events_for,
    get_job,
    has_condition,
    job_pods,
    live_step,
    trainingjob,
    wait_succeeded,
)

pytestmark = pytest.mark.e2e

STEPS = 80
STEP_DELAY = 0.25
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 5, "progressTimeoutSeconds": 10}
TRAINERS = "phalanx.dev/component=trainer"


def fault_job(
    name: str, *, spares: int = 1, heartbeat: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    job = trainingjob(name, replicas=2, spares=spares, steps=STEPS, step_delay=STEP_DELAY, **spec)
    job["spec"]["heartbeat"] = heartbeat or HEARTBEAT
    return job


def step_of(cluster: Cluster, namespace: str, name: str) -> int:
    return get_job(cluster, namespace, name).get("status", {}).get("step") or 0


def hub_phases(cluster: Cluster, namespace: str, name: str) -> dict[str, str | None]:
    """Each worker's phase by the job's heartbeat hub summary (empty without a hub): with the hub a pod's own
    Lease goes quiet after its first beat."""
    found = cluster.kubectl("get", "lease", f"{name}-rdzv", "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return {}
    annotations = json.loads(found.stdout)["metadata"].get("annotations") or {}
    summary = beatsummary.decode(annotations.get(beatsummary.SUMMARY_ANNOTATION))
    return {pod: beat.get("phase") for pod, beat in beatsummary.expand(summary).items()} if summary else {}


def training_worker(
    cluster: Cluster, namespace: str, name: str, min_step: int = 15, avoid_nodes: frozenset[str] = frozenset()
) -> Any:
    """A worker pod whose heartbeat says it trains (on none of `avoid_nodes`), once the job passed `min_step`."""
    wait_for(lambda: live_step(cluster, namespace, name) >= min_step, 240, message=f"step {min_step}")

    def pick() -> Any:
        by_hub = hub_phases(cluster, namespace, name)
        for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
            if pod.spec.node_name in avoid_nodes:
                continue
            lease = cluster.get_json("lease", pod.metadata.name, "-n", namespace)
            own = lease["metadata"].get("annotations", {}).get("phalanx.dev/phase")
            if "training" in (own, by_hub.get(pod.metadata.name)):
                return pod
        return None

    return wait_for(pick, 60, message="a training worker")


def incidents_of(job: dict[str, Any], worker: str | None = None) -> list[dict[str, Any]]:
    found = job["status"].get("incidents", [])
    return [i for i in found if worker is None or i.get("worker") == worker]


def assert_recovered(
    job: dict[str, Any], victim: str, cause: str, *, spare: bool = True, pods_lost: int = 1
) -> dict[str, Any]:
    """The victim's failure was recovered from as one incident; `pods_lost`: the job's workers the fault took
    (a node's crash also takes a spare that ran there, replaced without a restart)."""
    status = job["status"]
    assert status["step"] == STEPS, status
    mine = incidents_of(job, victim)
    assert [i["cause"] for i in mine] == [cause], status.get("incidents")
    (incident,) = mine
    # Shown with -rA: the recovery this run measured, next to the timeouts it ran with.
    print(f"{cause}: {incident} heartbeat={HEARTBEAT}; all: {status.get('incidents')} {status['restarts']}")
    assert incident["action"] == "ReplaceWorker"
    assert incident["resumedAt"] and incident["secondsToRecover"] is not None, incident
    if spare:
        assert incident["stepsLost"] is not None and incident["stepsLost"] <= 1, incident
    restarts = status["restarts"]
    assert restarts["byCause"].get(cause) == pods_lost, restarts
    assert restarts.get("counted", 0) == 0, "an infrastructure fault must not spend the user's budget"
    assert has_condition(job, "Recovering", "False", reason="Recovered")
    assert 0 < status["goodput"] <= 1
    return incident


def assert_story(cluster: Cluster, namespace: str, name: str, cause: str) -> None:
    reasons = [e["reason"] for e in sorted(events_for(cluster, namespace, name), key=_event_order)]
    assert cause in reasons and "Recovered" in reasons, reasons
    assert reasons.index(cause) < reasons.index("Recovered"), reasons


def _event_order(event: dict[str, Any]) -> tuple[str, str, int]:
    # Timestamps have a second's precision: a recovery within the second of its failure (the operator can see
    # both in one reconcile) ties, and the operator posts the events of one reconcile in order, so the store's
    # revision of each event breaks the tie.
    meta = event["metadata"]
    return (
        event.get("lastTimestamp") or "",
        meta.get("creationTimestamp") or "",
        int(meta["resourceVersion"]),
    )


def trainer_pids(pod: str) -> set[int]:
    """The training processes of a pod on the node agent (processes of this machine): pids of the example
    started by that pod's launcher."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            command = " ".join(process.info["cmdline"] or ())
            if "phalanx.worker.examples.tinygpt" in command and process.environ().get("POD_NAME") == pod:
                found.add(process.pid)
    return found


# c10d's SIGKILL path is also in tests/chaos/test_kill_during_recovery.py (a worker, then the promoted spare).
@pytest.mark.compat
@pytest.mark.parametrize("protocol", [pytest.param("c10d", marks=pytest.mark.long), "rounds"])
def test_sigkilled_worker_is_replaced_by_the_spare(
    cluster: Cluster, operator: Operator, namespace: str, protocol: str
) -> None:
    cluster.apply(fault_job("killed", rendezvous={"protocol": protocol}), namespace)
    victim = training_worker(cluster, namespace, "killed")
    (survivor,) = [
        pod.metadata.name
        for pod in job_pods(cluster, namespace, "killed", "phalanx.dev/role=worker")
        if pod.metadata.name != victim.metadata.name
    ]
    survivor_pids = trainer_pids(survivor)
    assert survivor_pids, f"no training process of {survivor} found"
    cluster.kubectl("annotate", "pod", victim.metadata.name, "-n", namespace, "phalanx.dev/kill=now")

    def resumed() -> bool:
        incidents = incidents_of(get_job(cluster, namespace, "killed"), victim.metadata.name)
        return bool(incidents and incidents[0].get("resumedAt"))

    wait_for(resumed, 120, message="the recovery")
    # Live regroup: the survivor's training processes were handed the new group, not restarted.
    assert trainer_pids(survivor) == survivor_pids
    job = wait_succeeded(cluster, namespace, "killed", timeout=400)
    assert_recovered(job, victim.metadata.name, "Killed")
    assert any(e["reason"] == "SparePromoted" for e in events_for(cluster, namespace, "killed"))
    assert_story(cluster, namespace, "killed", "Killed")


def test_deleted_worker_pod_is_replaced(cluster: Cluster, operator: Operator, namespace: str) -> None:
    cluster.apply(fault_job("deleted"), namespace)
    victim = training_worker(cluster, namespace, "deleted")
    cluster.kubectl("delete", "pod", victim.metadata.name, "-n", namespace, "--wait=false")
    job = wait_succeeded(cluster, namespace, "deleted", timeout=400)
    assert_recovered(job, victim.metadata.name, "PodDeleted")


@pytest.mark.parametrize("protocol", ["c10d", pytest.param("rounds", marks=pytest.mark.long)])
def test_frozen_worker_is_detected_by_heartbeat_and_replaced(
    cluster: Cluster, operator: Operator, namespace: str, protocol: str
) -> None:
    cluster.apply(fault_job("frozen", rendezvous={"protocol": protocol}), namespace)
    victim = training_worker(cluster, namespace, "frozen")
    cluster.kubectl("annotate", "pod", victim.metadata.name, "-n", namespace, "phalanx.dev/freeze=true")
    job = wait_succeeded(cluster, namespace, "frozen", timeout=400)
    incident = assert_recovered(job, victim.metadata.name, "HeartbeatTimeout")
    assert "no heartbeat" in incident["message"]


# Heartbeats that leave the launcher's report as the only quick way to see a stopped or hung trainer.
PATIENT_HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 30, "progressTimeoutSeconds": 60}


def seconds_after(incident: dict[str, Any], moment: float) -> float:
    """When the operator detected `incident`, in seconds after `moment` (at most: `detectedAt` is truncated
    to its second)."""
    detected = parse_time(incident["detectedAt"])
    assert detected is not None, incident
    return detected.timestamp() + 1.0 - moment


def test_stopped_trainer_is_reported_by_its_launcher_and_replaced(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(fault_job("stopped", heartbeat=PATIENT_HEARTBEAT), namespace)
    victim = training_worker(cluster, namespace, "stopped")
    # SIGSTOP to the training processes alone: the launcher lives on and keeps renewing its Lease.
    stopped_at, pids = faults.hang_trainer(namespace, victim.metadata.name)
    assert pids, "no training process found"
    job = wait_succeeded(cluster, namespace, "stopped", timeout=400)
    incident = assert_recovered(job, victim.metadata.name, "TrainerStopped")
    assert "is stopped" in incident["message"], incident
    # Well before either fixed timeout could have told (the progress timeout is 60 s).
    assert seconds_after(incident, stopped_at) < PATIENT_HEARTBEAT["timeoutSeconds"], incident


@pytest.mark.parametrize("reporting", ["leases", "hub"])
def test_hung_trainer_is_judged_against_the_jobs_own_step_times(
    cluster: Cluster, operator: Operator, namespace: str, reporting: str
) -> None:
    # Through the heartbeat hub too: the verdict goes to the pod's own Lease, the peers' renewals that it waits
    # for come in the hub's summary (published as soon as they came: worker/beathub.py).
    cluster.apply(fault_job("hung", heartbeat={**PATIENT_HEARTBEAT, "reporting": reporting}), namespace)
    victim = training_worker(cluster, namespace, "hung", min_step=25)
    # tinygpt hangs in its step on SIGUSR1: alive, not stopped, never reaching the next step.
    hung_at = time.time()
    assert faults.signal_all(faults.trainer_processes(victim.metadata.name, namespace), signal.SIGUSR1)
    job = wait_succeeded(cluster, namespace, "hung", timeout=400)
    status = job["status"]
    print(f"incidents: {status.get('incidents')} restarts: {status['restarts']}")
    assert status["step"] == STEPS
    (first, *_) = [i for i in incidents_of(job) if seconds_after(i, hung_at) > 0]
    # The hung rank stalls its peer in the same collective: which of them is replaced follows the blame rule
    # of stalled workers (the lower step, then the lower index); the job trains on either way.
    assert first["cause"] == "NoProgress" and "hang threshold" in first["message"], first
    assert "p99" in first["message"] or "floor" in first["message"], first
    assert seconds_after(first, hung_at) < PATIENT_HEARTBEAT["progressTimeoutSeconds"], first
    assert status["restarts"].get("counted", 0) == 0


def workers_on(cluster: Cluster, namespace: str, name: str, node: str) -> int:
    """The job's workers on `node`: each one lost is a restart, while a standby spare lost there is only
    replaced (`SpareReplaced`). Whether a pod stands by is judged as the operator judges it
    (`status.standing_by`, from its heartbeat's phase): a spare that started before a slow worker takes that
    worker's seat, and the worker stands by, whatever their labels say. Every trainer pod is printed, for the
    record of a failed run."""
    pods = job_pods(cluster, namespace, name, TRAINERS)
    spare = {pod.metadata.name: stands_by(cluster, namespace, pod) for pod in pods}
    print(
        "before the crash:",
        {pod.metadata.name: (pod.spec.node_name, pod.status.phase, spare[pod.metadata.name]) for pod in pods},
    )
    return sum(1 for pod in pods if pod.spec.node_name == node and not spare[pod.metadata.name])


def trainer_phases(cluster: Cluster, namespace: str, name: str) -> dict[str, str | None]:
    """Each trainer pod's heartbeat phase (None: no heartbeat yet)."""
    leases = {
        lease["metadata"]["name"]: (lease["metadata"].get("annotations") or {}).get("phalanx.dev/phase")
        for lease in cluster.get_json("leases", "-n", namespace)["items"]
    }
    return {
        pod.metadata.name: leases.get(pod.metadata.name)
        for pod in job_pods(cluster, namespace, name, TRAINERS)
    }


def settled_phases(cluster: Cluster, namespace: str, name: str) -> bool:
    """Every trainer pod's heartbeat says it trains or stands by: none is between the two."""
    phases = trainer_phases(cluster, namespace, name)
    settled = (contract.PHASE_TRAINING, contract.PHASE_STANDBY)
    return bool(phases) and all(phase in settled for phase in phases.values())


def stands_by(cluster: Cluster, namespace: str, pod: Any) -> bool:
    try:
        lease = cluster.get_json("lease", pod.metadata.name, "-n", namespace)
    except AssertionError:  # no heartbeat yet
        lease = {"metadata": {}}
    phase = (lease["metadata"].get("annotations") or {}).get("phalanx.dev/phase")
    return observe.standing_by({"metadata": {"labels": pod.metadata.labels or {}}}, {"phase": phase})


def crash_until_succeeded(
    cluster: Cluster, namespace: str, name: str, node: str, delete_node: bool = False
) -> dict[str, Any]:
    """Crash `node` (the node agent stops it, as a power loss would) until the job succeeds; bring it back. With
    `delete_node` its Node is deleted too, as a cloud's controller deletes one whose machine is gone (the local
    cluster's agent keeps a crashed node's deleted Node away for 20 s; a live one's it registers again at once)."""
    try:
        cluster.kubectl("annotate", "node", node, "phalanx.dev/crash=true")
        if delete_node:
            cluster.kubectl("delete", "node", node, "--wait=false")
        return wait_succeeded(cluster, namespace, name, timeout=400)
    finally:
        cluster.kubectl("annotate", "node", node, "phalanx.dev/crash-", check=False)
        cluster.wait_node_healthy(node)


def crash_a_worker_s_node(
    cluster: Cluster, operator: Operator, namespace: str, name: str, delete_node: bool = False
) -> tuple[dict[str, Any], str, str, int]:
    """Fault job `name` trained to step 15, then the node of a training worker crashed until the job succeeds
    (`crash_until_succeeded`); returns the finished job, the struck worker, its node and how many of the job's
    workers were on it (the spare may share the victim's node: the crash takes it too, replaced, not counted)."""
    # A long heartbeat timeout, so the node's own signal (NotReady after 8 s here, or its deletion) catches it.
    slow_heartbeat = {"intervalSeconds": 1, "timeoutSeconds": 30, "progressTimeoutSeconds": 60}
    # Only the worker's node: a crash of the operator's node is the operator-restart case, and of the
    # rendezvous pod's node the rendezvous-loss case, each tested on its own. The job is kept off the
    # operator's node; the struck worker is one away from the rendezvous pod.
    operator_nodes = sorted({pod.spec.node_name for pod in operator.pods(cluster) if pod.spec.node_name})
    for held in operator_nodes:
        cluster.kubectl("cordon", held)
    try:
        cluster.apply(fault_job(name, heartbeat=slow_heartbeat), namespace)
        wait_for(lambda: live_step(cluster, namespace, name) >= 15, 240, message="step 15")
        rendezvous = job_pods(cluster, namespace, name, "phalanx.dev/role=rendezvous")
        victim = training_worker(
            cluster, namespace, name, avoid_nodes=frozenset(pod.spec.node_name for pod in rendezvous)
        )
        node = victim.spec.node_name
        on_node = workers_on(cluster, namespace, name, node)
        job = crash_until_succeeded(cluster, namespace, name, node, delete_node=delete_node)
    finally:
        for held in operator_nodes:
            cluster.kubectl("uncordon", held, check=False)
    return job, victim.metadata.name, node, on_node


@pytest.mark.compat
@pytest.mark.long
def test_crashed_node_is_handled_at_once(cluster: Cluster, operator: Operator, namespace: str) -> None:
    job, victim, node, on_node = crash_a_worker_s_node(cluster, operator, namespace, "crash")
    incident = assert_recovered(job, victim, "NodeLost", pods_lost=on_node)
    assert incident["node"] == node
    wait_for(
        lambda: all(p.spec.node_name != node for p in job_pods(cluster, namespace, "crash")),
        30,
        message="nothing of the job left on the crashed node",
    )


def test_a_crashed_node_whose_node_is_deleted_is_handled_at_once(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """A cloud's controller deletes the Node of a machine that is gone: the node view's deletion wakes the job,
    and the workers bound there are replaced at once, before the node would even have turned NotReady (8 s
    here) and long before the heartbeat timeout."""
    job, victim, node, on_node = crash_a_worker_s_node(cluster, operator, namespace, "gone", delete_node=True)
    incident = assert_recovered(job, victim, "NodeLost", pods_lost=on_node)
    assert incident["node"] == node
    assert f"its node {node} was deleted" in incident["message"], incident


def test_a_job_whose_training_never_runs_fails_and_never_reports_success(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Every worker's training command crashes before any step: each launcher gives up (exit 1), and every
    pod that takes a place in the group does the same. No pod leaves with 0 (a spare released with 0, read as
    training finished, once marked such a job Succeeded), and the job fails once `maxRestarts` is spent."""
    job = trainingjob("crashloop", replicas=2, spares=1)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"], container["args"] = ["python", "-c", "raise SystemExit(7)"], []
    job["spec"]["failurePolicy"] = {"maxRestarts": 2}
    cluster.apply(job, namespace)
    states: set[str | None] = set()

    def failed() -> dict[str, Any] | None:
        current = get_job(cluster, namespace, "crashloop")
        states.add((current.get("status") or {}).get("state"))
        return current if has_condition(current, "Failed") else None

    final = wait_for(failed, 300, interval=0.3, message="the job to fail")
    assert "Succeeded" not in states and not has_condition(final, "Succeeded"), states
    assert final["status"]["restarts"]["counted"] >= 2, final["status"]["restarts"]
    reasons = [event["reason"] for event in events_for(cluster, namespace, "crashloop")]
    assert "TrainingFinished" not in reasons, reasons


# The example, except in the pod named by CRASHING_POD, whose training crashes before any step.
CRASHES_ON_ONE_POD = (
    "import os, sys, time\n"
    "if os.environ['POD_NAME'] == os.environ['CRASHING_POD']:\n"
    "    time.sleep(1)\n"
    "    sys.exit(7)\n"
    "from phalanx.worker.examples import tinygpt\n"
    "sys.exit(tinygpt.main(sys.argv[1:]))\n"
)


def test_a_pod_whose_training_crashes_in_a_loop_is_replaced_and_the_job_trains_on(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """One pod's training crashes before any step, again and again (a broken node, a bad device), and no
    spare stands by (with one, the spare takes its place in the group at its first crash): its launcher
    gives up (exit 1), and the operator replaces it, counted. The job trains to the end. When the launcher
    that gave up closed the rendezvous, every replacement found it closed and failed as well, and the job
    failed once `maxRestarts` was spent."""
    job = trainingjob("onebad", replicas=2, spares=0, steps=STEPS, step_delay=0.05)
    job["spec"]["heartbeat"] = HEARTBEAT
    job["spec"]["failurePolicy"] = {"maxRestarts": 4}
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", "-c", CRASHES_ON_ONE_POD]
    container["env"] = [{"name": "CRASHING_POD", "value": "onebad-worker-1"}]
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "onebad", timeout=400)
    assert final["status"]["step"] == STEPS, final["status"]
    restarts = final["status"]["restarts"]
    assert 1 <= restarts["counted"] <= 4, restarts
    crashed = incidents_of(final, "onebad-worker-1")
    assert crashed and crashed[0]["action"] == "ReplaceWorker", final["status"].get("incidents")


def test_permanent_user_error_fails_the_job_once(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    rules = [{"name": "diverged", "match": {"exitCodes": [5]}, "action": "FailJob"}]
    job = trainingjob("diverges", replicas=2, spares=1, steps=STEPS, step_delay=0.05)
    job["spec"]["heartbeat"] = HEARTBEAT
    job["spec"]["failurePolicy"] = {"maxRestarts": 3, "rules": rules}
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    args += ["--nan-at-step", "10", "--nan-repeat", "1000"]
    cluster.apply(job, namespace)
    failed = wait_for(
        lambda: (j := get_job(cluster, namespace, "diverges")) and has_condition(j, "Failed") and j,
        300,
        message="the job to fail",
    )
    assert condition(failed, "Failed")["reason"] == "PermanentFailure"
    assert "code 5" in condition(failed, "Failed")["message"]
    (incident,) = incidents_of(failed)
    assert incident["action"] == "FailJob" and incident["rule"] == "diverged"
    assert failed["status"]["restarts"]["total"] == 0
    time.sleep(4)
    again = get_job(cluster, namespace, "diverges")
    assert len(incidents_of(again)) == 1 and again["status"]["restarts"]["total"] == 0
    assert again["status"]["state"] == "Failed"


@pytest.mark.long
def test_operator_restart_in_the_middle_of_a_recovery(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(fault_job("midway"), namespace)
    victim = training_worker(cluster, namespace, "midway")
    cluster.kubectl("annotate", "pod", victim.metadata.name, "-n", namespace, "phalanx.dev/freeze=true")
    wait_for(
        lambda: incidents_of(get_job(cluster, namespace, "midway"), victim.metadata.name),
        60,
        message="the incident to be recorded",
    )
    cluster.kubectl(
        "delete", "pod", "-n", operator.namespace, "-l", "app.kubernetes.io/name=phalanx", "--wait=true"
    )
    wait_for(lambda: operator_ready(cluster), 120, message="the operator to come back")
    job = wait_succeeded(cluster, namespace, "midway", timeout=400)
    assert_recovered(job, victim.metadata.name, "HeartbeatTimeout")
    assert job["status"]["restarts"]["total"] == 1, job["status"]["restarts"]
    trainers = job_pods(cluster, namespace, "midway", "phalanx.dev/component=trainer")
    assert len({p.metadata.name for p in trainers}) == len(trainers)


@pytest.mark.long
def test_no_false_alarm_with_frequent_checkpoints(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = fault_job(
        "steady", checkpoint={"volume": {"emptyDir": {}}, "path": "/checkpoints", "intervalSteps": 2}
    )
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "steady", timeout=400)
    assert final["status"]["step"] == STEPS
    assert incidents_of(final) == [], final["status"]["incidents"]
    assert final["status"]["restarts"]["total"] == 0
    assert has_condition(final, "Recovering", "False")
    assert final["status"]["goodput"] == 1.0


def test_a_launcher_stalled_past_its_keepalive_swaps_roles_with_the_spare(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """A worker's launcher stalls (SIGSTOP, its training processes left running) longer than the rendezvous
    keep-alive (5 s) and well within the heartbeat timeout: torch drops it and promotes the spare, and the
    worker rejoins as the standby. No failure happened: every pod stays, nothing is counted."""
    cluster.apply(fault_job("stalled", heartbeat=PATIENT_HEARTBEAT), namespace)
    victim = training_worker(cluster, namespace, "stalled")
    (spare,) = job_pods(cluster, namespace, "stalled", "phalanx.dev/role=spare")
    before = {p.metadata.name: p.metadata.uid for p in job_pods(cluster, namespace, "stalled", TRAINERS)}
    launcher = [
        pid
        for pid in faults.pod_processes(victim.metadata.name, namespace)
        if pid not in faults.trainer_processes(victim.metadata.name, namespace)
    ]
    assert faults.signal_all(launcher, signal.SIGSTOP)
    try:
        wait_for(
            lambda: any(e["reason"] == "SparePromoted" for e in events_for(cluster, namespace, "stalled")),
            30,
            message=f"torch to promote {spare.metadata.name}",
        )
    finally:
        faults.signal_all(launcher, signal.SIGCONT)

    def victim_stands_by() -> bool:
        lease = cluster.get_json("lease", victim.metadata.name, "-n", namespace)
        return lease["metadata"].get("annotations", {}).get("phalanx.dev/phase") == "standby"

    wait_for(victim_stands_by, 60, message=f"{victim.metadata.name} to rejoin as the standby")
    wait_for(
        lambda: (
            [pod.metadata.name for pod in job_pods(cluster, namespace, "stalled", "phalanx.dev/role=spare")]
            == [victim.metadata.name]
        ),
        30,
        message=f"{victim.metadata.name} to be labelled the spare",
    )
    # Before the job ends: a finished job removes its spares.
    after = {p.metadata.name: p.metadata.uid for p in job_pods(cluster, namespace, "stalled", TRAINERS)}
    assert after == before, "a role swap must not delete the spare that took the slot, nor any pod"
    job = wait_succeeded(cluster, namespace, "stalled", timeout=400)
    assert incidents_of(job) == [], job["status"]["incidents"]
    assert job["status"]["restarts"]["total"] == 0, job["status"]["restarts"]
    assert job["status"]["step"] == STEPS


POOL_LABEL = "phalanx.dev/e2e-pool"


def _place_worker_beside_rendezvous(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Any:
    """Apply `job` until the scheduler puts one worker (not the spare) on the rendezvous pod's node and the
    other elsewhere, so a survivor keeps the newest state in memory; the worker beside it. The job's
    nodeSelector holds it to two nodes, so a few tries usually do."""
    name = job["metadata"]["name"]
    selector = f"phalanx.dev/job-name={name}"
    for _ in range(8):
        cluster.apply(job, namespace)
        pods = wait_for(
            lambda: (
                (found := job_pods(cluster, namespace, name))
                and len(found) == 4
                and all(pod.spec.node_name for pod in found)
                and found
            ),
            120,
            message="the gang bound",
        )
        (rendezvous,) = [pod for pod in pods if pod.metadata.labels.get("phalanx.dev/role") == "rendezvous"]
        beside = [
            pod
            for pod in pods
            if pod.metadata.labels.get("phalanx.dev/role") == "worker"
            and pod.spec.node_name == rendezvous.spec.node_name
        ]
        if len(beside) == 1:
            return beside[0]
        cluster.kubectl("delete", "trainingjob", name, "-n", namespace, "--wait=true", timeout=120)
        wait_for(
            lambda: not cluster.core.list_namespaced_pod(namespace, label_selector=selector).items,
            120,
            message="the job's pods gone",
        )
    raise AssertionError("the scheduler never put exactly one worker beside the rendezvous pod")


def test_crashed_node_with_a_worker_and_the_rendezvous_resumes_from_memory(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The worst single-node loss: the store and a worker go together. The store is recreated on another node,
    # the spare takes the worker's place, and the group resumes from the survivor's in-memory snapshot.
    slow_heartbeat = {"intervalSeconds": 1, "timeoutSeconds": 30, "progressTimeoutSeconds": 60}
    operator_nodes = {pod.spec.node_name for pod in operator.pods(cluster) if pod.spec.node_name}
    real_nodes = cluster.kubectl(
        "get", "nodes", "-l", "!phalanx.dev/simulated", "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    pool = [node for node in sorted(real_nodes) if node not in operator_nodes][:2]
    assert len(pool) == 2, real_nodes
    for pooled in pool:
        cluster.kubectl("label", "node", pooled, f"{POOL_LABEL}={namespace}", "--overwrite")
    # Two snapshot slots: a job that asks for less /dev/shm still resumes from memory, the promoted spare
    # receiving the survivor's state into a slot of its own.
    job = fault_job("both", heartbeat=slow_heartbeat, sharedMemory={"snapshotSlots": 2})
    job["spec"]["template"]["spec"]["nodeSelector"] = {POOL_LABEL: namespace}
    try:
        victim = _place_worker_beside_rendezvous(cluster, namespace, job)
        trainer = next(c for c in victim.spec.containers if c.name == "trainer")
        assert {"name": "PHALANX_SNAPSHOT_SLOTS", "value": "2"} in [
            {"name": variable.name, "value": variable.value} for variable in trainer.env or []
        ]
        node = victim.spec.node_name
        wait_for(lambda: live_step(cluster, namespace, "both") >= 15, 240, message="step 15")
        # After the crash only the other pool node is left: the new store and the new spare go there too.
        cluster.kubectl("label", "node", node, f"{POOL_LABEL}-")
        # Whether a pod on the node is a worker or a standing-by spare is judged from its heartbeat, by this test
        # and by the operator: crash only once every trainer's says training or standby, and the operator's
        # watch has had two renewals to see the same (a crash while the spare was still joining was counted as
        # a worker's loss by the operator and not by the test, in a CI run).
        wait_for(
            lambda: settled_phases(cluster, namespace, "both"),
            120,
            message=lambda: (
                f"every trainer training or standing by: {trainer_phases(cluster, namespace, 'both')}"
            ),
        )
        time.sleep(2 * slow_heartbeat["intervalSeconds"])
        on_node = workers_on(cluster, namespace, "both", node)
        final = crash_until_succeeded(cluster, namespace, "both", node)
    finally:
        for pooled in pool:
            cluster.kubectl("label", "node", pooled, f"{POOL_LABEL}-", check=False)
    # With two slots a snapshot is skipped while the saver writes the durable checkpoint from the other one (a
    # third slot keeps them): a crash within that write loses the steps it took, three on a loaded machine. The
    # memory still never does worse than the durable tier it stands in front of.
    incident = assert_recovered(final, victim.metadata.name, "NodeLost", spare=False, pods_lost=on_node)
    assert incident["node"] == node
    assert incident.get("restoredFrom") in ("memory", "peer"), incident
    durable_interval = job["spec"]["checkpoint"]["intervalSteps"]
    newest_durable = incident["detectedStep"] // durable_interval * durable_interval
    assert incident.get("restoredStep", -1) >= newest_durable, incident
    lost = [i for i in incidents_of(final) if i["cause"] == "RendezvousLost"]
    assert lost and lost[0]["node"] == node, incidents_of(final)


def step_log(path: Path) -> list[dict[str, Any]]:
    """The example's log (`--log-file`): one line per step from rank 0, one per restore from every rank."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class LoggedRecovery:
    """What the step log says of a failure at `failed_at`: the step training had reached, the step the group
    that trained on first restored, and when that group completed its first step."""

    reached: int
    restored: int
    resumed_at: float

    @property
    def lost(self) -> int:
        return self.reached - self.restored


def logged_recovery(log: list[dict[str, Any]], failed_at: float) -> LoggedRecovery:
    steps = [line for line in log if "event" not in line]
    # Rank 0 logs a step after the step's delay: a step logged within one delay after the failure had been
    # computed before it (its all-reduce done), and the survivors hold it.
    in_flight = failed_at + STEP_DELAY + 0.05
    reached = max((line["step"] for line in steps if line["time"] < in_flight), default=0)
    restores = [line for line in log if line.get("event") == "restore" and line["time"] > failed_at]
    # The first step of a group formed after the failure: one that restored after it, before that step.
    first = next(
        line for line in steps if line["time"] > failed_at and any(r["time"] < line["time"] for r in restores)
    )
    restored = [r for r in restores if r["time"] < first["time"]][-1]
    assert first["step"] == restored["step"] + 1, (first, restored)
    return LoggedRecovery(reached, restored["step"], first["time"])


def assert_incident_agrees(incident: dict[str, Any], log: list[dict[str, Any]], killed_at: float) -> None:
    """The incident's figures are the step log's: the step reached before the kill, the step resumed from,
    when the first step after it completed, and the time from the kill to then."""
    logged = logged_recovery(log, killed_at)
    resumed = parse_time(incident.get("resumedAt"))
    assert resumed is not None, incident
    assert incident["restoredStep"] == logged.restored, (incident, logged)
    # Rank 0 itself killed never logs the step it had just completed: the survivors hold it.
    assert logged.reached <= incident["detectedStep"] <= logged.reached + 1, (incident, logged)
    assert incident["stepsLost"] == incident["detectedStep"] - logged.restored, (incident, logged)
    # The first step's heartbeat is published right before rank 0 logs it.
    assert abs(resumed.timestamp() - logged.resumed_at) < 0.5, (incident, logged)
    # From `occurredAt`, when the node agent saw the container end (a kubelet keeps it to the second, and the
    # operator takes the end of that second): never before the kill, and within seconds of it (a second or so
    # on an idle machine; a CI run with both cores busy saw 2.2 s).
    logged_seconds = logged.resumed_at - killed_at
    assert logged_seconds - 3.0 <= incident["secondsToRecover"] <= logged_seconds + 0.5, (incident, logged)


def kill_whole_pod(namespace: str, pod: str) -> float:
    """SIGKILL every process of the pod (launcher and training processes) in one instant; that instant."""
    pids = faults.pod_processes(pod, namespace)
    moment = time.time()
    assert faults.signal_all(pids, signal.SIGKILL), f"no process of {pod} found"
    return moment


def lease_phase(cluster: Cluster, namespace: str, pod: str) -> str | None:
    lease = cluster.get_json("lease", pod, "-n", namespace)
    return lease["metadata"].get("annotations", {}).get("phalanx.dev/phase")
