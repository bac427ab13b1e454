"""The operator installed with Helm, driven with kubectl, training real models on the local cluster."""

from __future__ import annotations

import copy
import itertools
import json
import time
from typing import Any

import pytest
import yaml

from phalanx.operator import names

from .conftest import REPO_ROOT, RESTRICTED_CONTAINER, Cluster, Operator, operator_ready, wait_for

pytestmark = pytest.mark.e2e

TRAINER_LABELS = "phalanx.dev/component=trainer"


def trainingjob(
    name: str,
    *,
    replicas: int = 2,
    spares: int = 0,
    steps: int = 40,
    step_delay: float = 0.0,
    cpu: str = "100m",
    **spec: Any,
) -> dict[str, Any]:
    args = ["--steps", str(steps), "--print-every", "10", "--width", "32", "--layers", "1"]
    if step_delay:
        args += ["--step-delay", str(step_delay)]
    body: dict[str, Any] = {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "spares": spares,
            "checkpoint": {"volume": {"emptyDir": {}}, "path": "/checkpoints", "intervalSteps": 20},
            "heartbeat": {"intervalSeconds": 1, "timeoutSeconds": 10},
            "gang": {"scheduleTimeoutSeconds": 60},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:test",
                            "command": ["python", "-m", "phalanx.worker.examples.tinygpt"],
                            "args": args,
                            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                        }
                    ]
                }
            },
        },
    }
    body["spec"].update(spec)
    return body


def get_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("trainingjob", name, "-n", namespace)


def lease_step(cluster: Cluster, namespace: str, pod: str) -> int:
    """The step pod `pod`'s heartbeat Lease carries (0: none yet)."""
    lease = cluster.get_json("lease", pod, "-n", namespace)
    return int(lease["metadata"].get("annotations", {}).get("phalanx.dev/step", "0"))


def live_step(cluster: Cluster, namespace: str, name: str) -> int:
    """The newest step job `name` reached: its workers' heartbeat Leases carry every beat's, while its status
    writes a step that moved alone only every `stepReportSeconds` (6 s or more here), longer than a short job
    trains. (With a heartbeat hub the pods' own Leases go quiet after their first beat: the status's step then.)"""
    leases = cluster.get_json("leases", "-n", namespace)["items"]
    beats = [
        int(annotations.get("phalanx.dev/step") or 0)
        for lease in leases
        if lease["metadata"]["name"].startswith(f"{name}-worker-")
        and (annotations := lease["metadata"].get("annotations") or {})
    ]
    return max([*beats, get_job(cluster, namespace, name).get("status", {}).get("step") or 0])


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def has_condition(job: dict[str, Any], kind: str, status: str = "True", reason: str | None = None) -> bool:
    found = condition(job, kind)
    return bool(found and found["status"] == status and (reason is None or found["reason"] == reason))


def job_pods(cluster: Cluster, namespace: str, name: str, extra: str = "") -> list:
    selector = f"phalanx.dev/job-name={name}" + (f",{extra}" if extra else "")
    return [
        pod
        for pod in cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
        if pod.metadata.deletion_timestamp is None
    ]


def wait_succeeded(cluster: Cluster, namespace: str, name: str, timeout: int = 300) -> dict[str, Any]:
    cluster.kubectl(
        "wait", "--for=condition=Succeeded", f"trainingjob/{name}", "-n", namespace, f"--timeout={timeout}s",
        timeout=timeout + 10,
    )  # fmt: skip
    return get_job(cluster, namespace, name)


def events_for(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    events = cluster.get_json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
    return events["items"]


def service_addresses(cluster: Cluster, namespace: str, service: str) -> set[str]:
    """The addresses the EndpointSlices of a Service list (ready or not)."""
    slices = cluster.get_json(
        "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}"
    )
    return {
        address
        for endpoint_slice in slices["items"]
        for endpoint in endpoint_slice.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def endpoint_warnings(cluster: Cluster, namespace: str) -> list[str]:
    """The endpoint controllers' Warnings in the namespace (they refuse addresses such as loopback ones)."""
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "type=Warning")["items"]
    return [
        f"{event['reason']}: {event.get('message')}"
        for event in events
        if event["reason"].startswith(("FailedToUpdateEndpoint", "FailedToCreateEndpoint"))
    ]


@pytest.mark.compat
def test_example_trains_to_succeeded_with_columns_and_heartbeats(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    (operator_pod,) = [p for p in operator.pods(cluster) if p.metadata.deletion_timestamp is None]
    assert operator_pod.spec.service_account_name.startswith("phalanx")
    example = (REPO_ROOT / "examples" / "tinygpt.yaml").read_text()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=example)
    (name,) = [doc["metadata"]["name"] for doc in yaml.safe_load_all(example) if doc["kind"] == "TrainingJob"]

    wait_for(
        lambda: lease_step(cluster, namespace, f"{name}-worker-0") > 0,
        240,
        message="worker-0's heartbeat Lease to carry a step",
    )
    lease = cluster.get_json("lease", f"{name}-worker-0", "-n", namespace)
    assert lease["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    assert lease["metadata"]["annotations"]["phalanx.dev/phase"] in {"training", "saving"}

    spares = job_pods(cluster, namespace, name, "phalanx.dev/role=spare")
    assert len(spares) == 1
    rendezvous = job_pods(cluster, namespace, name, "phalanx.dev/role=rendezvous")
    assert len(rendezvous) == 1
    # The job's headless Services list their pods (the local cluster's pod addresses can go into Endpoints).
    wait_for(
        lambda: (
            service_addresses(cluster, namespace, names.rendezvous_name(name))
            == {rendezvous[0].status.pod_ip}
        ),
        60,
        message="the rendezvous Service's endpoint",
    )
    trainers = job_pods(cluster, namespace, name, "phalanx.dev/component=trainer")
    assert service_addresses(cluster, namespace, names.workers_service_name(name)) >= {
        pod.status.pod_ip for pod in trainers if pod.status.pod_ip
    }

    job = wait_succeeded(cluster, namespace, name, timeout=600)
    status = job["status"]
    assert status["step"] == 300
    assert status["completionTime"] and status["startTime"]
    assert has_condition(job, "GangScheduled") and has_condition(job, "Succeeded")
    assert not has_condition(job, "Failed")
    # The example runs a preflight: a restart from the checkpoint of step 10 that resumed bitwise.
    assert has_condition(job, "PreflightPassed", reason="Passed"), condition(job, "PreflightPassed")
    assert status["preflight"]["state"] == "Passed" and "bitwise" in status["preflight"]["message"]
    assert "Passed" in [event["reason"] for event in events_for(cluster, namespace, name)]
    table = cluster.kubectl("get", "trainingjobs", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header == ["NAME", "READY", "SPARES", "STEP", "RESTARTS", "STATE", "PROGRESS", "AGE"], table
    assert row[0] == name and row[3] == "300" and row[4] == "0" and row[5] == "Succeeded", table
    assert row[6] == "Reported", table
    wait_for(
        lambda: not job_pods(cluster, namespace, name, "phalanx.dev/role in (spare,rendezvous)"),
        60,
        message="spares and the rendezvous pod to be removed after success",
    )
    assert endpoint_warnings(cluster, namespace) == []


@pytest.mark.compat
@pytest.mark.parametrize(
    ("mutation", "field"),
    [
        ({"template": {"spec": {"containers": [{"name": "trainer", "command": ["python"]}]}}}, "image"),
        ({"template": {"spec": {"containers": [{"name": "trainer", "image": "phalanx:test"}]}}}, "command"),
    ],
    ids=["missing-image", "missing-command"],
)
def test_invalid_spec_is_reported_and_creates_no_pods(
    cluster: Cluster, operator: Operator, namespace: str, mutation: dict[str, Any], field: str
) -> None:
    job = trainingjob("bad")
    job["spec"].update(mutation)
    cluster.apply(job, namespace)
    current = wait_for(
        lambda: (
            (j := get_job(cluster, namespace, "bad"))
            and has_condition(j, "Failed", reason="InvalidSpec")
            and j
        ),
        60,
        message="Failed=True with reason InvalidSpec",
    )
    assert field in condition(current, "Failed")["message"]
    assert current["status"]["state"] == "Invalid"
    wait_for(
        lambda: any(
            e["reason"] == "InvalidSpec" and field in e["message"]
            for e in events_for(cluster, namespace, "bad")
        ),
        30,
        message="an InvalidSpec Event naming the field",
    )
    time.sleep(2)
    assert not job_pods(cluster, namespace, "bad")


@pytest.mark.parametrize(
    ("mutation", "field", "words"),
    [
        ({"replicas": "two"}, "spec.replicas", "integer"),
        ({"spares": -1}, "spec.spares", "greater than or equal to 0"),
        ({"replicas": 0}, "spec.replicas", "greater than or equal to 1"),
    ],
    ids=["wrong-type", "negative-spares", "zero-replicas"],
)
def test_values_that_can_never_be_valid_are_refused_at_apply_time(
    cluster: Cluster, operator: Operator, namespace: str, mutation: dict[str, Any], field: str, words: str
) -> None:
    job = trainingjob("typo")
    job["spec"].update(mutation)
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0
    assert field in result.stderr and words in result.stderr, result.stderr


def test_gang_is_all_or_nothing_and_starts_when_capacity_appears(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # Each worker needs 5 of a node's 8 CPUs; blockers take 3 of the 4 real nodes, so only one worker fits.
    blockers = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"blocker-{i}"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": f"node-{i}"},
                "containers": [
                    {
                        "name": "main",
                        "image": "pause",
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "5"}},
                        "securityContext": RESTRICTED_CONTAINER,
                    }
                ],
            },
        }
        for i in range(3)
    ]
    cluster.apply(blockers, namespace)
    for i in range(3):
        cluster.kubectl("wait", "--for=condition=Ready", f"pod/blocker-{i}", "-n", namespace, "--timeout=60s")
    job = trainingjob("big", replicas=2, cpu="5", steps=20)
    job["spec"]["gang"] = {"scheduleTimeoutSeconds": 5, "backoffSeconds": 3}
    cluster.apply(job, namespace)

    current = wait_for(
        lambda: (
            (j := get_job(cluster, namespace, "big"))
            and has_condition(j, "GangScheduled", "False", reason="ScheduleTimeout")
            and j
        ),
        90,
        message="GangScheduled=False with reason ScheduleTimeout",
    )
    assert (
        "1/2" in condition(current, "GangScheduled")["message"]
        or "schedul" in condition(current, "GangScheduled")["message"].lower()
    )

    def no_worker_bound() -> bool:
        return all(not pod.spec.node_name for pod in job_pods(cluster, namespace, "big", TRAINER_LABELS))

    wait_for(no_worker_bound, 30, message="the partly placed gang to be deleted")
    assert any(e["reason"] == "ScheduleTimeout" for e in events_for(cluster, namespace, "big"))

    cluster.kubectl("delete", "pod", "blocker-0", "blocker-1", "--grace-period=0", "--force", "-n", namespace)
    final = wait_succeeded(cluster, namespace, "big", timeout=300)
    assert has_condition(final, "GangScheduled")
    assert final["status"]["gang"]["attempts"] >= 1  # attempts counts gang attempts that timed out


@pytest.mark.compat
def test_a_gang_that_cannot_be_created_whole_binds_no_pod(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # A quota of 3 pods and a gang of 4 (two workers, a spare, the rendezvous): the last creation is refused.
    # Every pod is created behind the gang's scheduling gate, so none of the three is bound meanwhile.
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": "3"}},
    }
    cluster.apply(quota, namespace)
    cluster.apply(trainingjob("gated", replicas=2, spares=1, steps=20), namespace)
    selector = "phalanx.dev/job-name=gated"

    def three_waiting() -> list | None:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
        return pods if len(pods) == 3 else None

    pods = wait_for(three_waiting, 60, message="three of the gang's four pods created")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
        assert not [pod.metadata.name for pod in pods if pod.spec.node_name], (
            "a pod of an incomplete gang was bound"
        )
        assert all(
            [gate.name for gate in pod.spec.scheduling_gates or []] == ["phalanx.dev/gang"] for pod in pods
        ), [pod.spec.scheduling_gates for pod in pods]
        time.sleep(1)
    message = condition(get_job(cluster, namespace, "gated"), "GangScheduled")["message"]
    assert "held at the scheduling gate" in message, message
    # Room for the whole gang: the last pod is created, the gates open together and the job trains to the end.
    cluster.kubectl("delete", "resourcequota", "pods", "-n", namespace)
    final = wait_succeeded(cluster, namespace, "gated", timeout=300)
    assert has_condition(final, "GangScheduled")
    for pod in job_pods(cluster, namespace, "gated"):
        assert not pod.spec.scheduling_gates, pod.metadata.name


def zones_of(cluster: Cluster, pods: list) -> list[str]:
    return [
        cluster.core.read_node(pod.spec.node_name).metadata.labels["topology.kubernetes.io/zone"]
        for pod in pods
    ]


@pytest.mark.parametrize("policy", ["Pack", "Spread"])
def test_topology_pack_and_spread(cluster: Cluster, operator: Operator, namespace: str, policy: str) -> None:
    job = trainingjob("topo", replicas=2, spares=1 if policy == "Pack" else 0, steps=2000, step_delay=0.05)
    job["spec"]["topology"] = {"key": "topology.kubernetes.io/zone", "policy": policy, "required": True}
    cluster.apply(job, namespace)

    def placed() -> list:
        pods = job_pods(cluster, namespace, "topo", TRAINER_LABELS)
        expected = 3 if policy == "Pack" else 2
        return pods if len(pods) == expected and all(p.spec.node_name for p in pods) else []

    pods = wait_for(placed, 90, message="the gang to be scheduled")
    zones = zones_of(cluster, pods)
    if policy == "Pack":
        assert len(set(zones)) == 1, zones
    else:
        assert len(set(zones)) == 2, zones
    for pod in pods:
        assert pod.metadata.labels.get("topology.kubernetes.io/zone") or any(
            w.get("zone") for w in get_job(cluster, namespace, "topo")["status"].get("workers", [])
        )
    cluster.kubectl("delete", "trainingjob", "topo", "-n", namespace, "--wait=false")


def worker_heartbeats(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, str]]:
    """Annotations of each worker pod's heartbeat Lease (pods without a Lease yet are left out)."""
    leases = {
        lease["metadata"]["name"]: lease["metadata"].get("annotations", {})
        for lease in cluster.get_json("leases", "-n", namespace)["items"]
    }
    pods = [pod.metadata.name for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker")]
    return {pod: leases[pod] for pod in pods if pod in leases}


def training_at_world_size(
    cluster: Cluster, namespace: str, name: str, world_size: int, after_step: int = 0
) -> bool:
    """Every worker pod trains (phase training, past `after_step`) in a group of `world_size`."""
    beats = worker_heartbeats(cluster, namespace, name)
    return len(beats) == world_size and all(
        beat.get("phalanx.dev/phase") == "training"
        and beat.get("phalanx.dev/world-size") == str(world_size)
        and int(beat.get("phalanx.dev/step", "0")) > after_step
        for beat in beats.values()
    )


def group_report(cluster: Cluster, namespace: str, name: str) -> str:
    """What each worker's heartbeat last said (phase, world size, step) and the job's status: why a wait for a
    group of some size timed out."""
    beats = {
        pod: {
            key.removeprefix("phalanx.dev/"): value
            for key, value in beat.items()
            if key.startswith("phalanx.dev/")
        }
        for pod, beat in worker_heartbeats(cluster, namespace, name).items()
    }
    status = get_job(cluster, namespace, name).get("status") or {}
    shown = {
        key: status.get(key) for key in ("state", "step", "replicas", "restarts", "incidents", "conditions")
    }
    return f"heartbeats {beats}; status {shown}"


@pytest.mark.compat
def test_scale_within_and_outside_bounds(cluster: Cluster, operator: Operator, namespace: str) -> None:
    job = trainingjob(
        "elastic",
        replicas=2,
        steps=3000,
        step_delay=0.05,
        minReplicas=1,
        maxReplicas=3,
    )
    cluster.apply(job, namespace)
    wait_for(
        lambda: training_at_world_size(cluster, namespace, "elastic", 2),
        180,
        message="two active workers training at world size 2",
    )
    step_before_scale = get_job(cluster, namespace, "elastic")["status"].get("step") or 0
    cluster.kubectl("scale", "trainingjob/elastic", "--replicas=3", "-n", namespace)
    wait_for(
        lambda: (
            len(job_pods(cluster, namespace, "elastic", "phalanx.dev/role=worker")) == 3
            and get_job(cluster, namespace, "elastic")["status"]["replicas"]["desired"] == 3
        ),
        60,
        message="a third active worker after kubectl scale",
    )
    wait_for(
        lambda: training_at_world_size(cluster, namespace, "elastic", 3, after_step=step_before_scale),
        180,
        message=lambda: (
            "training to go on at world size 3 after kubectl scale: "
            + group_report(cluster, namespace, "elastic")
        ),
    )
    # Out of bounds: the API server refuses the scale itself (the CRD's rules hold on the scale subresource).
    refused = cluster.kubectl("scale", "trainingjob/elastic", "--replicas=5", "-n", namespace, check=False)
    assert refused.returncode != 0 and "spec.replicas" in refused.stderr, refused.stderr
    assert "replicas is above maxReplicas" in refused.stderr, refused.stderr
    time.sleep(3)
    assert len(job_pods(cluster, namespace, "elastic", "phalanx.dev/role=worker")) == 3
    assert get_job(cluster, namespace, "elastic")["status"]["replicas"]["desired"] == 3
    cluster.kubectl("delete", "trainingjob", "elastic", "-n", namespace, "--wait=false")


def test_deleted_rendezvous_is_recreated_and_job_finishes(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("rdzv", replicas=2, steps=80, step_delay=0.1), namespace)
    wait_for(lambda: live_step(cluster, namespace, "rdzv") >= 10, 180, message="step 10")
    (old,) = job_pods(cluster, namespace, "rdzv", "phalanx.dev/role=rendezvous")
    cluster.kubectl("delete", "pod", old.metadata.name, "-n", namespace, "--wait=false")
    wait_for(
        lambda: [
            p
            for p in job_pods(cluster, namespace, "rdzv", "phalanx.dev/role=rendezvous")
            if p.metadata.uid != old.metadata.uid
        ],
        60,
        message="a new rendezvous pod",
    )
    final = wait_succeeded(cluster, namespace, "rdzv", timeout=400)
    assert final["status"]["step"] == 80


def test_a_deleted_service_or_role_binding_is_made_again_at_once_and_the_job_finishes(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The operator watches a job's children: a deletion is undone in seconds, where the re-check by reading
    # every child again comes only every 10 minutes.
    cluster.apply(trainingjob("kept", replicas=2, steps=400, step_delay=0.1), namespace)
    wait_for(lambda: live_step(cluster, namespace, "kept") >= 5, 180, message="step 5")
    children = [
        ("service", names.rendezvous_name("kept")),
        ("rolebinding", names.worker_account_name("kept")),
    ]

    def uid(kind: str, name: str) -> str | None:
        found = cluster.kubectl(
            "get", kind, name, "-n", namespace, "-o", "jsonpath={.metadata.uid}", check=False
        )
        return (found.stdout.strip() or None) if found.returncode == 0 else None

    before = {child: uid(*child) for child in children}
    assert all(before.values()), before
    for kind, name in children:
        cluster.kubectl("delete", kind, name, "-n", namespace)
    wait_for(
        lambda: all(uid(*child) not in (None, before[child]) for child in children),
        30,
        message="the deleted Service and RoleBinding made again",
    )
    final = wait_succeeded(cluster, namespace, "kept", timeout=400)
    assert final["status"]["step"] == 400


def test_operator_restart_mid_job_creates_no_duplicates(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # Long enough to be still training when a restarted operator is back on a loaded machine: a job that ended
    # meanwhile has cleaned up its rendezvous and spare, which is no duplicate and no replacement.
    cluster.apply(trainingjob("sturdy", replicas=2, spares=1, steps=400, step_delay=0.1), namespace)
    wait_for(lambda: live_step(cluster, namespace, "sturdy") >= 5, 180, message="step 5")
    before = {p.metadata.name: p.metadata.uid for p in job_pods(cluster, namespace, "sturdy")}
    cluster.kubectl(
        "delete", "pod", "-n", operator.namespace, "-l", "app.kubernetes.io/name=phalanx", "--wait=true"
    )
    wait_for(lambda: operator_ready(cluster), 120, message="the operator to come back")
    time.sleep(5)
    after = {p.metadata.name: p.metadata.uid for p in job_pods(cluster, namespace, "sturdy")}
    assert after == before, "a restarted operator must adopt the pods it made, not duplicate or replace them"
    final = wait_succeeded(cluster, namespace, "sturdy", timeout=400)
    assert final["status"]["step"] == 400
    assert final["status"]["restarts"]["total"] == 0


def test_suspend_resume_and_delete(cluster: Cluster, operator: Operator, namespace: str) -> None:
    cluster.apply(trainingjob("pausable", replicas=2, spares=1, steps=4000, step_delay=0.05), namespace)
    wait_for(lambda: len(job_pods(cluster, namespace, "pausable", TRAINER_LABELS)) == 3, 90, message="3 pods")
    cluster.kubectl(
        "patch", "trainingjob", "pausable", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    # True once the pods are gone (each worker saved on SIGTERM first), not when their deletion was asked.
    cluster.kubectl(
        "wait", "--for=condition=Suspended", "trainingjob/pausable", "-n", namespace, "--timeout=120s",
        timeout=130,
    )  # fmt: skip
    assert not job_pods(cluster, namespace, "pausable", TRAINER_LABELS)
    suspended = get_job(cluster, namespace, "pausable")
    assert suspended["status"]["state"] == "Suspended" and suspended["status"].get("startTime")
    cluster.kubectl(
        "patch",
        "trainingjob",
        "pausable",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":false}}',
    )
    wait_for(
        lambda: len(job_pods(cluster, namespace, "pausable", TRAINER_LABELS)) == 3, 90, message="pods back"
    )
    cluster.kubectl(
        "wait", "--for=condition=Suspended=False", "trainingjob/pausable", "-n", namespace, "--timeout=60s"
    )

    cluster.kubectl(
        "delete", "trainingjob", "pausable", "-n", namespace, "--wait=true", "--timeout=120s", timeout=130
    )

    def nothing_owned_left() -> bool:
        selector = "phalanx.dev/job-name=pausable"
        kinds = "pods,services,serviceaccounts,secrets,roles,rolebindings,leases"
        return not cluster.get_json(kinds, "-n", namespace, "-l", selector)["items"]

    wait_for(nothing_owned_left, 90, message="everything the job owned to be deleted")
    assert not [
        lease
        for lease in cluster.get_json("leases", "-n", namespace)["items"]
        if lease["metadata"]["name"].startswith("pausable-")
    ]


def test_elastic_topology_example_applies(cluster: Cluster, operator: Operator, namespace: str) -> None:
    documents = list(
        yaml.safe_load_all((REPO_ROOT / "examples" / "tinygpt-elastic-topology.yaml").read_text())
    )
    (claim,) = [doc for doc in documents if doc["kind"] == "PersistentVolumeClaim"]
    (example,) = [doc for doc in documents if doc["kind"] == "TrainingJob"]
    quick = copy.deepcopy(example)
    quick["spec"]["template"]["spec"]["containers"][0]["args"] = ["--steps", "30", "--print-every", "10"]
    cluster.apply(claim, namespace)
    cluster.apply(quick, namespace)
    final = wait_succeeded(cluster, namespace, example["metadata"]["name"], timeout=400)
    assert final["status"]["step"] == 30
    assert has_condition(final, "PreflightPassed", reason="Passed"), condition(final, "PreflightPassed")


def test_a_training_jobs_status_is_not_written_for_every_step(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Heartbeats move the step between any two reconciles: a status written whenever it differs is written at
    every periodic reconcile (every 2 s here) of every training job. Here the step moves for 40 s and little
    else does (no checkpoint falls due): the status is written for the step alone at most every
    `stepReportSeconds` (6 s for the tests' operator, 30 s by default; up to half as long again, by job), while
    the worker's Lease carries every step; the last step is written with the job's end."""
    name, steps = "quietstatus", 700
    job = trainingjob(
        name,
        replicas=1,
        steps=steps,
        step_delay=0.1,
        checkpoint={"volume": {"emptyDir": {}}, "path": "/checkpoints", "intervalSteps": 100000},
    )
    cluster.apply(job, namespace)
    worker = f"{name}-worker-0"
    wait_for(
        lambda: get_job(cluster, namespace, name).get("status", {}).get("progress") == "Reported",
        240,
        message="the job's first step in its status",
    )
    time.sleep(3)  # the start's own writes (progress, conditions) are behind
    first_step, seen = (
        lease_step(cluster, namespace, worker),
        [(time.monotonic(), get_job(cluster, namespace, name)["status"])],
    )
    window_end = time.monotonic() + 40
    while time.monotonic() < window_end:
        status = get_job(cluster, namespace, name)["status"]
        if status != seen[-1][1]:
            seen.append((time.monotonic(), status))
        time.sleep(0.25)
    moved = lease_step(cluster, namespace, worker) - first_step
    assert get_job(cluster, namespace, name)["status"]["state"] == "Running"
    assert moved >= 50, f"the worker trained only {moved} steps in the window"
    writes = [
        (later - earlier, sorted(key for key in {*before, *after} if before.get(key) != after.get(key)))
        for (earlier, before), (later, after) in itertools.pairwise(seen)
    ]
    # A write for the step alone comes the report's 6 s after the write before it, whatever that one moved
    # (here and there another field, the training-health baseline once the warm-up is over), less a poll's lag
    # each way (every 0.25 s; a read takes up to a few tenths). The first write seen may follow one before the
    # window by any time.
    step_only = [round(apart, 1) for apart, keys in writes[1:] if keys == ["step"]]
    assert len(step_only) >= 2 and min(step_only) >= 4.5, writes
    final = wait_succeeded(cluster, namespace, name, timeout=600)
    assert final["status"]["step"] == steps, final["status"]
