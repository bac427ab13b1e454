"""A typo never floods the cluster: a job far over the gang limit is refused, one the cluster cannot hold is
held, both without a single pod, while a job beside them keeps training. Bad input is refused naming the
field: by the API server where the CRD can tell (its schema, and its CEL rules for bad combinations), else by the
operator (`InvalidSpec`) before any pod exists."""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from typing import Any

import pytest

from phalanx.operator import api

from .conftest import Cluster, Operator, wait_for
from .test_operator import condition, events_for, get_job, has_condition, job_pods, trainingjob

pytestmark = pytest.mark.e2e

DEFAULT_MAX_GANG_PODS = 2000


def _step(cluster: Cluster, namespace: str, name: str) -> int:
    return get_job(cluster, namespace, name).get("status", {}).get("step") or 0


def _event(cluster: Cluster, namespace: str, name: str, reason: str, *words: str) -> dict[str, Any] | None:
    return next(
        (
            event
            for event in events_for(cluster, namespace, name)
            if event["reason"] == reason and all(word in event["message"] for word in words)
        ),
        None,
    )


def _schedulable_pod_slots(cluster: Cluster) -> int:
    """Pods the nodes an untolerating pod may use can hold (the simulated nodes are tainted)."""
    return sum(
        int(node.status.allocatable["pods"])
        for node in cluster.core.list_node().items
        if not node.spec.taints and not node.spec.unschedulable
    )


def test_absurd_jobs_are_refused_or_held_without_pods_while_a_running_job_trains_on(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("steady", replicas=2, steps=100000, step_delay=0.05), namespace)
    wait_for(lambda: _step(cluster, namespace, "steady") > 0, 180, message="the steady job to train")

    typo = trainingjob("typo", replicas=100000, maxReplicas=100000)
    slots = _schedulable_pod_slots(cluster)
    # Under the gang limit, over what the nodes hold: the capacity check, not the limit, must stop it.
    too_big = slots + 60
    assert too_big < DEFAULT_MAX_GANG_PODS
    # Its heartbeats within the operator's write budget (heartbeatWritesPerSecond): only its size is wrong.
    heartbeat = {"intervalSeconds": too_big // 50 + 1, "timeoutSeconds": too_big // 25 + 10}
    oversized = trainingjob("oversized", replicas=too_big, heartbeat=heartbeat)
    cluster.apply([typo, oversized], namespace)

    refused = wait_for(
        lambda: (
            (job := get_job(cluster, namespace, "typo"))
            and has_condition(job, "Failed", reason="InvalidSpec")
            and job
        ),
        60,
        message="the 100000-replica job to be refused (Failed=True, InvalidSpec)",
    )
    message = condition(refused, "SpecValid")["message"]
    assert "spec.replicas" in message and str(DEFAULT_MAX_GANG_PODS) in message and "maxGangPods" in message
    assert refused["status"]["state"] == "Invalid"
    wait_for(
        lambda: _event(cluster, namespace, "typo", "InvalidSpec", "spec.replicas", "maxGangPods"),
        30,
        message="an InvalidSpec Event naming spec.replicas and the limit",
    )

    held = wait_for(
        lambda: (
            (job := get_job(cluster, namespace, "oversized"))
            and has_condition(job, "GangScheduled", "False", reason="InsufficientCapacity")
            and job
        ),
        60,
        message="the oversized job to be held (GangScheduled=False, InsufficientCapacity)",
    )
    message = condition(held, "GangScheduled")["message"]
    assert f"needs {too_big} pods" in message and "short of" in message and "pods: room for" in message
    room = re.search(r"capacity holds (\d+)", message)
    assert room is not None and int(room.group(1)) <= slots < too_big, message
    assert held["status"]["state"] == "Unschedulable"
    wait_for(
        lambda: _event(cluster, namespace, "oversized", "InsufficientCapacity", f"needs {too_big} pods"),
        30,
        message="an InsufficientCapacity Event",
    )
    table = cluster.kubectl("get", "tj", "-n", namespace, "--no-headers").stdout
    # STATE is next to last (AGE last); an empty STEP column leaves no field of its own.
    states = {line.split()[0]: line.split()[-2] for line in table.splitlines()}
    assert states["typo"] == "Invalid" and states["oversized"] == "Unschedulable", table

    # Several reconciles later: still not one pod of either, and the steady job kept training.
    before = _step(cluster, namespace, "steady")
    wait_for(
        lambda: _step(cluster, namespace, "steady") >= before + 20,
        90,
        message="the steady job's step to advance beside the absurd jobs",
    )
    assert job_pods(cluster, namespace, "typo") == []
    assert job_pods(cluster, namespace, "oversized") == []
    assert has_condition(get_job(cluster, namespace, "steady"), "Running")
    every_slot = sum(int(node.status.allocatable["pods"]) for node in cluster.core.list_node().items)
    bound = [pod for pod in cluster.core.list_pod_for_all_namespaces().items if pod.spec.node_name]
    assert len(bound) <= every_slot

    # The hold is looked at again: once the job asks for what the cluster holds, its gang is created.
    cluster.kubectl("scale", "tj/oversized", "--replicas=2", "-n", namespace)
    wait_for(
        lambda: has_condition(get_job(cluster, namespace, "oversized"), "GangScheduled"),
        120,
        message="the scaled-down job's gang to be scheduled",
    )


def _pods_of(cluster: Cluster, namespace: str, name: str) -> list[str]:
    """Every pod of the job, terminating ones included."""
    selector = f"phalanx.dev/job-name={name}"
    return [
        pod.metadata.name
        for pod in cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    ]


def _with(job: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`job` with `spec.<path>` (dots between keys, `[i]` for list items) set to `value`."""
    job = copy.deepcopy(job)
    node: Any = job["spec"]
    keys = [int(key) if key.isdigit() else key for key in re.split(r"\.|\[|\]\.?", path) if key]
    for key, after in itertools.pairwise(keys):
        if isinstance(key, str) and key not in node:
            node[key] = [] if isinstance(after, int) else {}
        node = node[key]
    node[keys[-1]] = value
    return job


@pytest.mark.compat
@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("sharedMemory.sizeLimit", "lots"),
        ("sharedMemory.snapshotSlots", 4),
        ("checkpoint.localTier.sizeLimit", "-1Gi"),
        ("checkpoint.path", "../../etc"),
        ("checkpoint.path", "/checkpoints/"),
        ("heartbeat.intervalSeconds", 0),
        ("heartbeat.intervalSeconds", 0.1),
        ("trainerContainer", "Trainer_1"),
    ],
    ids=[
        "size-lots",
        "slots-4",
        "size-negative",
        "path-relative",
        "path-trailing-slash",
        "interval-0",
        "interval-0.1",
        "container-name",
    ],
)
def test_values_the_crd_can_judge_are_refused_at_apply_time_naming_the_field(
    cluster: Cluster, operator: Operator, namespace: str, path: str, value: Any
) -> None:
    job = _with(trainingjob("bad", replicas=1), path, value)
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0, result.stdout
    assert f"spec.{path}" in result.stderr, result.stderr
    missing = cluster.kubectl("get", "trainingjob", "bad", "-n", namespace, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
    assert _pods_of(cluster, namespace, "bad") == []
    # The same job with a good value is accepted: only the field named was wrong.
    good = {
        "sharedMemory.sizeLimit": "1Gi",
        "sharedMemory.snapshotSlots": 2,
        "checkpoint.localTier.sizeLimit": 1073741824,
    }
    good |= {
        "checkpoint.path": "/checkpoints",
        "heartbeat.intervalSeconds": 0.2,
        "trainerContainer": "trainer",
    }
    fixed = _with(job, path, good[path])
    dry = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(fixed), check=False
    )
    assert dry.returncode == 0, dry.stderr


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`base` with `change` merged in (objects key by key, anything else replaced), as a JSON merge patch."""
    merged = copy.deepcopy(base)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@pytest.mark.parametrize(
    "rule",
    [rule for rule in api.all_cel_rules() if not rule.transition],
    ids=lambda rule: rule.message.replace(" ", "-"),
)
def test_bad_combinations_are_refused_at_apply_time_by_the_crds_rules_naming_the_field(
    cluster: Cluster, operator: Operator, namespace: str, rule: api.CelRule
) -> None:
    job = trainingjob("bad", replicas=1)
    job["spec"] = _merged(job["spec"], rule.example)
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0, result.stdout
    assert rule.field_path in result.stderr and rule.message in result.stderr, result.stderr
    assert cluster.kubectl("get", "trainingjob", "bad", "-n", namespace, check=False).returncode != 0
    assert _pods_of(cluster, namespace, "bad") == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"containers": [{"imagePullPolicyy": "Always"}]},
            "spec.template.spec.containers[0].imagePullPolicyy",
        ),
        ({"nodeSelectr": {"zone": "a"}}, "spec.template.spec.nodeSelectr"),
        (
            {"containers": [{"ports": [{"containerPort": "http"}]}]},
            "spec.template.spec.containers[0].ports[0].containerPort",
        ),
        ({"containers": [{"name": None}]}, "spec.template.spec.containers[0].name"),
    ],
    ids=["container-field-typo", "pod-field-typo", "port-not-a-number", "container-without-a-name"],
)
def test_a_pod_template_kubernetes_would_refuse_is_refused_at_apply_time_naming_the_field(
    cluster: Cluster, operator: Operator, namespace: str, change: dict[str, Any], field: str
) -> None:
    """The template is checked against Kubernetes' own PodTemplateSpec: a misspelt field is refused by
    `kubectl apply` (its strict field validation), not dropped without a word."""
    job = trainingjob("typo", replicas=1)
    pod = job["spec"]["template"]["spec"]
    for key, value in change.items():
        if key == "containers":
            container = {k: v for k, v in {**pod["containers"][0], **value[0]}.items() if v is not None}
            pod["containers"] = [container]
        else:
            pod[key] = value
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0, result.stdout
    assert field in result.stderr, result.stderr
    assert cluster.kubectl("get", "trainingjob", "typo", "-n", namespace, check=False).returncode != 0
    assert _pods_of(cluster, namespace, "typo") == []
    # The same template as Kubernetes spells it is accepted.
    assert (
        cluster.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(trainingjob("typo", replicas=1)),
        ).returncode
        == 0
    )


@pytest.mark.compat
def test_names_pods_could_not_take_and_scaling_past_the_bounds_are_refused_at_apply_time(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    for name in ("run.1", "a" * 52):
        result = cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(trainingjob(name)), check=False
        )
        assert result.returncode != 0 and "metadata.name" in result.stderr, result.stderr
    longest = trainingjob("a" * 51, replicas=1)
    longest["spec"] |= {"minReplicas": 1, "maxReplicas": 2, "suspend": True}
    cluster.apply(longest, namespace)
    # `kubectl scale` goes through the scale subresource: the same rules hold there.
    scaled = cluster.kubectl("scale", f"tj/{'a' * 51}", "--replicas=3", "-n", namespace, check=False)
    assert scaled.returncode != 0 and "replicas is above maxReplicas" in scaled.stderr, scaled.stderr
    cluster.kubectl("scale", f"tj/{'a' * 51}", "--replicas=2", "-n", namespace)
    assert get_job(cluster, namespace, "a" * 51)["spec"]["replicas"] == 2


def _no_trainer_container(job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    containers = job["spec"]["template"]["spec"]["containers"]
    containers[0]["name"] = "main"
    # A sidecar first: the operator used to train in the first container when none was called `trainer`.
    sidecar = {
        "name": "helper",
        "image": "phalanx:test",
        "command": ["python", "-c", "import time; time.sleep(3600)"],
    }
    containers.insert(0, sidecar)
    return job


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (
            lambda job: _with(job, "template.spec.containers[0].resources.limits.memory", "lots"),
            "spec.template.spec.containers[0].resources.limits.memory",
            "quantity",
        ),
        (
            lambda job: _with(job, "template.spec.containers[0].resources.requests.cpu", "-1"),
            "spec.template.spec.containers[0].resources.requests.cpu",
            "quantity",
        ),
        (
            lambda job: _with(job, "checkpoint.volume", {"emptyDir": {"sizeLimit": "big"}}),
            "spec.checkpoint.volume.emptyDir.sizeLimit",
            "quantity",
        ),
        (_no_trainer_container, "spec.trainerContainer", "'trainer'"),
        (lambda job: _with(job, "spares", 50000), "spec.spares", "maxGangPods"),
        (lambda job: _with(job, "maxReplicas", 5000), "spec.maxReplicas", "maxGangPods"),
        (
            lambda job: _with(
                job, "checkpoint.objectStore", {"url": "s3://b/p", "storageOptions": {"secret": "x"}}
            ),
            "spec.checkpoint.objectStore.storageOptions.secret",
            "credential",
        ),
        (
            lambda job: _with(job, "checkpoint.localTier", {"enabled": True, "hostPath": "/etc"}),
            "spec.checkpoint.localTier.hostPath",
            "allows no host path",
        ),
        (
            lambda job: _with(job, "template.spec.serviceAccountName", "default"),
            "spec.template.spec.serviceAccountName",
            "never bound to default",
        ),
    ],
    ids=[
        "limit-lots",
        "request-negative",
        "checkpoint-emptydir",
        "no-trainer-container",
        "spares",
        "max-replicas",
        "credential-in-storage-options",
        "host-path-not-allowed",
        "default-service-account",
    ],
)
def test_bad_input_the_crd_cannot_judge_is_invalid_spec_naming_the_field_with_no_pod(
    cluster: Cluster, operator: Operator, namespace: str, mutate: Any, field: str, words: str
) -> None:
    cluster.apply(mutate(trainingjob("bad", replicas=1)), namespace)
    refused = wait_for(
        lambda: (
            (job := get_job(cluster, namespace, "bad"))
            and has_condition(job, "Failed", reason="InvalidSpec")
            and job
        ),
        60,
        message="Failed=True with reason InvalidSpec",
    )
    message = condition(refused, "SpecValid")["message"]
    assert field in message and words in message, message
    assert condition(refused, "SpecValid")["status"] == "False"
    assert refused["status"]["state"] == "Invalid"
    wait_for(
        lambda: _event(cluster, namespace, "bad", "InvalidSpec", field),
        30,
        message=f"an InvalidSpec Event naming {field}",
    )
    # Reconciles go on every 2 s: over several of them, not one pod (not even the rendezvous) is made.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert _pods_of(cluster, namespace, "bad") == []
        time.sleep(0.5)
    assert get_job(cluster, namespace, "bad")["status"]["state"] == "Invalid"


def test_the_container_named_by_trainer_container_trains_and_the_others_are_left_alone(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = _no_trainer_container(trainingjob("chosen", replicas=1, steps=100000, step_delay=0.05))
    cluster.apply(job, namespace)
    wait_for(
        lambda: has_condition(get_job(cluster, namespace, "chosen"), "Failed", reason="InvalidSpec"),
        60,
        message="the job without a `trainer` container to be refused",
    )
    assert _pods_of(cluster, namespace, "chosen") == []
    # Naming the container fixes the job: it starts, and training runs in `main`, not in the first container.
    cluster.kubectl(
        "patch", "tj", "chosen", "-n", namespace, "--type=merge", "-p", '{"spec":{"trainerContainer":"main"}}'
    )
    wait_for(lambda: _step(cluster, namespace, "chosen") > 0, 180, message="the job to train in `main`")
    (pod,) = job_pods(cluster, namespace, "chosen", "phalanx.dev/role=worker")
    helper, main = pod.spec.containers
    assert (helper.name, main.name) == ("helper", "main")
    assert main.command[:4] == ["python", "-m", "phalanx.worker.launch", "--"]
    assert helper.command == ["python", "-c", "import time; time.sleep(3600)"] and not helper.env
    assert any(mount.mount_path == "/dev/shm" for mount in main.volume_mounts or [])
    wait_for(
        lambda: (
            (current := get_job(cluster, namespace, "chosen"))
            and has_condition(current, "SpecValid")
            and current["status"]["state"] == "Running"
        ),
        60,
        message="the job to be valid and Running",
    )


@pytest.mark.compat
def test_a_job_managed_by_another_controller_is_left_to_it(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # As Kubernetes' Job and JobSet: another controller (here MultiKueue's name) runs it; Phalanx touches nothing.
    foreign = trainingjob("elsewhere", replicas=1)
    foreign["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    ours = trainingjob("here", replicas=1, suspend=True)
    ours["spec"]["managedBy"] = api.CONTROLLER_NAME
    cluster.apply([foreign, ours], namespace)
    wait_for(
        lambda: has_condition(get_job(cluster, namespace, "here"), "SpecValid"),
        60,
        message="the job naming Phalanx to be reconciled",
    )
    time.sleep(6)  # several reconcile intervals
    job = get_job(cluster, namespace, "elsewhere")
    assert "status" not in job or not job["status"], job.get("status")
    assert not job["metadata"].get("finalizers"), job["metadata"]
    assert not [key for key in job["metadata"].get("annotations", {}) if "phalanx.dev" in key], job[
        "metadata"
    ]
    assert _pods_of(cluster, namespace, "elsewhere") == []
    for change in (
        '{"spec":{"managedBy":"phalanx.dev/trainingjob-controller"}}',
        '{"spec":{"managedBy":null}}',
    ):
        refused = cluster.kubectl(
            "patch", "tj", "elsewhere", "-n", namespace, "--type=merge", "-p", change, check=False
        )
        assert refused.returncode != 0 and "spec.managedBy" in refused.stderr, refused.stderr
        assert "managedBy is immutable" in refused.stderr, refused.stderr
    changed = cluster.kubectl(
        "patch",
        "tj",
        "here",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"managedBy":"example.com/other"}}',
        check=False,
    )
    assert changed.returncode != 0 and "managedBy is immutable" in changed.stderr, changed.stderr


@pytest.mark.long
def test_a_worker_that_exits_143_in_a_loop_is_replaced_ever_more_slowly(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """Exit 143 is never charged to `maxRestarts` (it is how a pod killed from outside ends), so nothing ends a
    job whose pods exit 143 at once; the chart's pacing (10 replacements an hour at once, then a back-off from
    10 s, doubling) keeps it from costing the API server a pod every few seconds forever. Here the training
    command SIGTERMs its launcher, which then ends the pod with 143 (a training process that merely exits 143
    is a failure of the training command, which the launcher gives up on and the restart budget counts)."""
    job = trainingjob("looping", replicas=1)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"], container["args"] = (
        [
            "sh",
            "-c",
            # Again each second until it lands: a SIGTERM that comes while the launcher is still starting is lost.
            "while kill -TERM $PPID; do sleep 1; done; sleep 60",
        ],
        [],
    )
    cluster.apply(job, namespace)
    wait_for(
        lambda: has_condition(
            get_job(cluster, namespace, "looping"), "Degraded", reason="ReplacementBackoff"
        ),
        300,
        message="the replacements of a worker exiting 143 to back off",
    )
    restarts = get_job(cluster, namespace, "looping")["status"]["restarts"]
    # (A pod may end otherwise now and then, e.g. exit 1 when the node is busy: counted, and not paced.)
    assert restarts["byRule"]["default-infrastructure"] >= 11, restarts
    assert _event(cluster, namespace, "looping", "ReplacementBackoff", "did not spend maxRestarts")
    time.sleep(15)
    later = get_job(cluster, namespace, "looping")["status"]
    # The 11th waited 10 s, the 12th waits 20 s after it: at most two more in 15 s (at once: about five).
    assert later["restarts"]["total"] - restarts["total"] <= 2, later["restarts"]
    assert not has_condition({"status": later}, "Failed")
