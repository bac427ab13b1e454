"""TrainingJobs under a real Kueue: Phalanx is their job controller (`TrainingJob.v1alpha1.phalanx.dev` among
Kueue's external frameworks).

- Two jobs and a ClusterQueue with quota for one gang: the second has no pod until the first ends, then runs.
- A high-priority job preempts a running low-priority one: the low one's workers save on SIGTERM, its quota
  goes to the high one, and it resumes from that save once the high one is done, losing no step before it.
- A job larger than the whole quota stays pending, with Kueue's reason in its `Admitted` condition.
Timeouts (printed with every failure): heartbeat interval 1 s, timeout 10 s; Kueue admits within seconds.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.operator import queueing
from phalanx.worker.checkpoint import durable

from .conftest import Cluster, Operator, wait_for
from .test_fault_scenarios import _checkpoint_claim, _claim_directory
from .test_operator import get_job, has_condition, job_pods, live_step, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

KUEUE = "kueue.x-k8s.io/v1beta2"
FLAVOR = "phalanx-e2e"
GANG_CPU = "400m"
"""One gang of `trainingjob(replicas=2, spares=1)`: three 100m pods and the 100m rendezvous pod."""
TRAINERS = "phalanx.dev/component=trainer"


@pytest.fixture
def queue(cluster: Cluster, kueue: Any, namespace: str) -> Iterator[str]:
    """A ClusterQueue with room for one gang (cpu), preempting lower priorities within it, and the test
    namespace's LocalQueue `team` on it; the ClusterQueue's name is returned."""
    name = f"cq-{namespace}"[:63]
    cluster.apply(
        [
            {
                "apiVersion": KUEUE,
                "kind": "ResourceFlavor",
                "metadata": {"name": FLAVOR},
                "spec": {"nodeLabels": {"kubernetes.io/os": "linux"}},
            },
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {},
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [
                                {
                                    "name": FLAVOR,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": GANG_CPU},
                                        {"name": "memory", "nominalQuota": "4Gi"},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ]
    )
    cluster.apply(
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": "team"},
            "spec": {"clusterQueue": name},
        },
        namespace,
    )
    yield name
    cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)


def queued_job(name: str, *, priority: str | None = None, **settings: Any) -> dict[str, Any]:
    job = trainingjob(name, replicas=2, spares=1, **settings)
    labels = {queueing.QUEUE_LABEL: "team"}
    if priority:
        labels[queueing.PRIORITY_LABEL] = priority
    job["metadata"]["labels"] = labels
    return job


def workload(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    uid = get_job(cluster, namespace, job)["metadata"]["uid"]
    found = cluster.get_json(
        "workloads.kueue.x-k8s.io", "-n", namespace, "-l", f"{queueing.JOB_UID_LABEL}={uid}"
    )
    (only,) = found["items"]
    return only


def short_of_quota(message: str) -> bool:
    """Kueue's words for a Workload its ClusterQueue has no room for (`insufficient quota`, `insufficient
    unused quota`, ...)."""
    return re.search(r"insufficient (\w+ )?quota", message) is not None


def admitted(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    return next(
        c for c in get_job(cluster, namespace, job)["status"]["conditions"] if c["type"] == "Admitted"
    )


def test_a_second_gang_waits_for_the_quota_of_the_first(
    cluster: Cluster, operator: Operator, namespace: str, queue: str
) -> None:
    cluster.apply(queued_job("first", steps=300, step_delay=0.1), namespace)
    cluster.kubectl(
        "wait", "--for=condition=Admitted", "trainingjob/first", "-n", namespace, "--timeout=120s"
    )
    wait_for(lambda: len(job_pods(cluster, namespace, "first", TRAINERS)) == 3, 90, message="first's gang")
    pods = job_pods(cluster, namespace, "first", TRAINERS)
    assert all(pod.spec.node_selector.get("kubernetes.io/os") == "linux" for pod in pods), (
        "the flavor's labels"
    )
    assert {pod.metadata.labels[queueing.PODSET_LABEL] for pod in pods} == {"workers"}
    first = workload(cluster, namespace, "first")
    assert first["status"]["admission"]["clusterQueue"] == queue
    assert [(ps["name"], ps["count"]) for ps in first["spec"]["podSets"]] == [
        ("workers", 3),
        ("rendezvous", 1),
    ]

    cluster.apply(queued_job("second", steps=20, minReplicas=1, maxReplicas=2), namespace)
    wait_for(
        lambda: (
            admitted(cluster, namespace, "second")["status"] == "False"
            and short_of_quota(admitted(cluster, namespace, "second")["message"])
        ),
        60,
        message=lambda: (
            f"second's Admitted condition to give Kueue's reason ({admitted(cluster, namespace, 'second')})"
        ),
    )
    assert get_job(cluster, namespace, "second")["status"]["state"] == "Queued"
    cluster.kubectl(
        "wait", "--for=condition=Suspended", "trainingjob/second", "-n", namespace, "--timeout=30s"
    )
    # A scale while it waits is the Workload's too.
    cluster.kubectl("scale", "trainingjob/second", "--replicas=1", "-n", namespace)
    wait_for(
        lambda: workload(cluster, namespace, "second")["spec"]["podSets"][0]["count"] == 2,
        60,
        message="second's Workload to ask for 1 worker and 1 spare",
    )

    def first_done() -> bool:
        if get_job(cluster, namespace, "first")["status"].get("state") == "Succeeded":
            return True
        # All the while the first runs, the second has no pod.
        assert not job_pods(cluster, namespace, "second"), "the second gang started before the first ended"
        return False

    wait_for(first_done, 300, interval=1, message="first to succeed")
    first_ended = get_job(cluster, namespace, "first")["status"]["completionTime"]
    finished = workload(cluster, namespace, "first")
    assert any(c["type"] == "Finished" and c["status"] == "True" for c in finished["status"]["conditions"])
    final = wait_succeeded(cluster, namespace, "second", timeout=300)
    assert has_condition(final, "Admitted", "True") and final["status"]["step"] == 20
    # Not one of the second's pods was made before the first ended (the finished workers are kept).
    second_pods = cluster.core.list_namespaced_pod(
        namespace, label_selector="phalanx.dev/job-name=second"
    ).items
    assert second_pods
    created = min(pod.metadata.creation_timestamp for pod in second_pods)
    assert created.strftime("%Y-%m-%dT%H:%M:%SZ") >= first_ended, (created, first_ended)
    wait_for(
        lambda: (
            queueing.FINALIZER
            not in (workload(cluster, namespace, "second")["metadata"].get("finalizers") or [])
        ),
        60,
        message="the finished Workload's finalizer to go",
    )


@pytest.mark.long
def test_a_high_priority_job_preempts_a_low_one_which_resumes_from_its_save(
    cluster: Cluster, operator: Operator, namespace: str, queue: str
) -> None:
    suffix = uuid.uuid4().hex[:5]
    low_class, high_class = f"low-{suffix}", f"high-{suffix}"
    for name, value in ((low_class, 100), (high_class, 1000)):
        cluster.apply(
            {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        )
    cluster.apply(_checkpoint_claim(), namespace)
    # No interval checkpoint before the end: a durable checkpoint before it can only be the save on SIGTERM.
    checkpoint = {"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 1000, "keep": 100}
    cluster.apply(
        queued_job("low", priority=low_class, steps=160, step_delay=0.1, checkpoint=checkpoint), namespace
    )
    wait_for(
        lambda: live_step(cluster, namespace, "low") >= 20,
        240,
        message="low at step 20",
    )
    directory = _claim_directory(cluster, namespace, "low")

    before = get_job(cluster, namespace, "low")["status"]["step"]
    cluster.apply(queued_job("high", priority=high_class, steps=20), namespace)
    wait_for(
        lambda: admitted(cluster, namespace, "low")["reason"] == queueing.REASON_EVICTED,
        120,
        message=lambda: f"low to be evicted ({admitted(cluster, namespace, 'low')})",
    )
    assert "Preempted" in admitted(cluster, namespace, "low")["message"]
    wait_for(
        lambda: (
            not cluster.core.list_namespaced_pod(namespace, label_selector="phalanx.dev/job-name=low").items
        ),
        120,
        message="low's pods to be gone, terminating ones too",
    )
    # Its workers saved on SIGTERM, at least as far as they had trained when the high one came.
    saved = durable.complete_steps(directory)
    assert len(saved) == 1 and saved[0] >= before, f"the save on eviction: {saved}, step {before} before it"
    save = saved[0]

    high = wait_succeeded(cluster, namespace, "high", timeout=300)
    assert has_condition(high, "Admitted", "True")
    low_workload = workload(cluster, namespace, "low")
    requeued = next(c for c in low_workload["status"]["conditions"] if c["type"] == "Requeued")
    assert requeued["reason"] == "Preempted", requeued

    seen: list[int] = []
    # The step the evicted gang's last heartbeat showed stays in the status until the resumed gang's first one:
    # the SIGTERM save may have gone a step further than it.
    stale = get_job(cluster, namespace, "low")["status"].get("step")

    def low_done() -> bool:
        job = get_job(cluster, namespace, "low")
        step = job["status"].get("step")
        if job["status"].get("state") == "Running" and step is not None and (seen or step != stale):
            seen.append(step)
        return job["status"].get("state") == "Succeeded"

    wait_for(low_done, 400, interval=0.5, message="low to resume and succeed")
    final = get_job(cluster, namespace, "low")
    assert final["status"]["step"] == 160
    # The resumed gang went on from its save: no step before it was trained again.
    assert seen and min(seen) >= save, (save, seen)


def test_a_job_larger_than_the_quota_stays_pending_with_kueues_reason(
    cluster: Cluster, operator: Operator, namespace: str, queue: str
) -> None:
    job = queued_job("huge")
    job["spec"]["replicas"] = 8
    cluster.apply(job, namespace)
    wait_for(
        lambda: short_of_quota(admitted(cluster, namespace, "huge")["message"]),
        90,
        message=lambda: (
            f"huge's Admitted condition to give Kueue's reason ({admitted(cluster, namespace, 'huge')})"
        ),
    )
    condition = admitted(cluster, namespace, "huge")
    assert condition["status"] == "False", condition
    assert get_job(cluster, namespace, "huge")["status"]["state"] == "Queued"
    assert not job_pods(cluster, namespace, "huge")
    # kubectl describe shows it too.
    described = cluster.kubectl("describe", "trainingjob", "huge", "-n", namespace).stdout
    assert short_of_quota(described)
