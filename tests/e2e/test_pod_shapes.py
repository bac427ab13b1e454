"""Every pod Phalanx builds is one the API server accepts: each shape the builders and the reconcile make
(placement options, node exclusions of 0, 1 and many nodes, spares, the rendezvous pod, preflight,
checkpoint tiers, gang schedulers, the longest job name) is created with `dryRun=All` against the real local
API server, which runs its whole validation and admission on it and stores nothing. And a pod it refuses
(the user's template can hold anything) is told as a `FailedCreate` Warning with the server's answer, never
as `CreatedPods`, and tried again only after a growing pause."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from phalanx.operator import builders, names, reconcile, topology, validation
from phalanx.operator.timeutil import format_time, parse_time

from .conftest import Cluster, Operator, wait_for
from .test_operator import events_for, get_job, has_condition, job_pods, trainingjob

pytestmark = pytest.mark.e2e

JOB = "shape"
LONGEST = "l" * (names.MAX_HOSTNAME - names.WORKER_SUFFIX_ROOM)
"""The longest job name the operator accepts."""
ZONE = "topology.kubernetes.io/zone"
RACK = "phalanx.dev/rack"
EXCLUSIONS: dict[str, frozenset[str]] = {
    "no node": frozenset(),
    "one node": frozenset({"node-1"}),
    "many nodes": frozenset({"node-1", "node-2", "node-3", "sim-node-4"}),
}


def _template() -> dict[str, Any]:
    return {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"example.com/owner": "ml"}},
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "phalanx:test",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "phalanx.worker.examples.tinygpt"],
                    "args": ["--steps", "10"],
                    "env": [{"name": "USER_VAR", "value": "1"}, {"name": "PHALANX_ROLE", "value": "bogus"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ]
        },
    }


def _users_own_placement() -> dict[str, Any]:
    """A template that already places its pods: node affinity alternatives, a field selector of its own,
    pod affinity, a spread constraint over the zone, tolerations, a node selector and its own /dev/shm."""
    template = _template()
    spec = template["spec"]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["zone-a"]}]},
                    {
                        "matchExpressions": [{"key": ZONE, "operator": "In", "values": ["zone-b"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-9"]}],
                    },
                ]
            }
        },
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": "cache"}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    }
    spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 2,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"team": "ml"}},
        }
    ]
    spec["tolerations"] = [{"key": "phalanx.dev/simulated", "operator": "Exists", "effect": "NoSchedule"}]
    spec["nodeSelector"] = {"kubernetes.io/os": "linux"}
    spec["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    return template


VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "pack preferred": {"topology": {"policy": "Pack"}},
    "pack required by rack": {"topology": {"policy": "Pack", "key": RACK, "required": True}},
    "spread preferred": {"topology": {"policy": "Spread"}},
    "spread required": {"topology": {"policy": "Spread", "required": True}},
    "spread over the template's own placement": {
        "topology": {"policy": "Spread", "required": True},
        "template": _users_own_placement(),
    },
    "pack over the template's own placement": {
        "topology": {"policy": "Pack", "required": True},
        "template": _users_own_placement(),
    },
    "preflight": {"preflight": {"enabled": True, "steps": 10, "tolerance": 0.01}},
    "claim and shared memory limit": {
        "checkpoint": {"claimName": "checkpoints", "path": "/checkpoints"},
        "sharedMemory": {"sizeLimit": "256Mi"},
    },
    "volume, no shared memory": {
        "checkpoint": {"volume": {"emptyDir": {}}, "path": "/checkpoints"},
        "sharedMemory": {"enabled": False},
    },
    "local tier on the host, object store": {
        "checkpoint": {
            "path": "/checkpoints",
            "localTier": {"enabled": True, "hostPath": "/var/lib/phalanx"},
            "objectStore": {
                "url": "s3://bucket/prefix",
                "endpointUrl": "http://minio.storage:9000",
                "secretName": "store-credentials",
                "storageOptions": {"client_kwargs": {"region_name": "eu"}},
            },
        }
    },
    "local tier in an emptyDir": {
        "checkpoint": {
            "volume": {"emptyDir": {}},
            "path": "/checkpoints",
            "localTier": {"enabled": True, "sizeLimit": "1Gi"},
        }
    },
    "coscheduling": {"gang": {"podGroup": "Coscheduling"}},
    "volcano": {"gang": {"podGroup": "Volcano", "queueName": "training"}},
    "kueue": {"gang": {"podGroup": "Kueue", "queueName": "training"}},
    "rendezvous image, metrics, elastic": {
        "rendezvous": {"image": "phalanx:test", "port": 29500},
        "metricsPort": 9400,
        "minReplicas": 1,
        "maxReplicas": 4,
        "nprocPerNode": 2,
    },
}


def _job(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"replicas": 2, "spares": 1, "template": _template()}
    body.update(copy.deepcopy(spec))
    return {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        # The owner need not exist: a dry run stores nothing for the garbage collector to judge.
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": body,
    }


def _spec(job: dict[str, Any]) -> Any:
    spec, issues = validation.check(job["spec"], job["metadata"]["name"])
    assert not issues, issues
    return spec


def _lost_nodes_status(job_name: str, nodes: frozenset[str], now: datetime) -> dict[str, Any]:
    """A status in which the job's workers were lost with `nodes` moments ago (open NodeLost incidents)."""
    incidents = [
        {
            "cause": "NodeLost",
            "worker": names.worker_pod_name(job_name, index),
            "node": node,
            "action": "ReplaceWorker",
            "detectedAt": format_time(now),
        }
        for index, node in enumerate(sorted(nodes))
    ]
    return {"incidents": incidents}


def _shapes(namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what it is, object) for every shape: the reconcile's own plans, then the builders called directly
    with every exclusion, role and domain preference."""
    now = datetime.now(UTC)
    many = EXCLUSIONS["many nodes"]
    for variant, spec_fields in VARIANTS.items():
        job = _job(namespace, JOB, **spec_fields)
        spec = _spec(job)
        fresh = reconcile.plan(job, reconcile.Observed(pods=[], now=now))
        assert len(fresh.create_pods) == 4, variant  # the rendezvous, two workers, a spare
        for obj in [*fresh.ensure, *fresh.create_pods]:
            yield f"{variant}: new job's {obj['kind']} {obj['metadata']['name']}", obj
        lost = {**job, "status": _lost_nodes_status(JOB, many, now)}
        recovering = reconcile.plan(lost, reconcile.Observed(pods=[], now=now, nodes={}))
        for pod in recovering.create_pods:
            assert topology.avoided_nodes(pod["spec"]) == many, (variant, pod["metadata"]["name"])
            yield f"{variant}: pod {pod['metadata']['name']} kept off the lost nodes", pod
        for exclusion, nodes in EXCLUSIONS.items():
            for role in (names.ROLE_WORKER, names.ROLE_SPARE):
                pod = builders.build_worker_pod(job, spec, 1, role, avoid=nodes)
                yield f"{variant}: {role} avoiding {exclusion}", pod
            near = builders.build_worker_pod(
                job, spec, 2, names.ROLE_SPARE, near=(ZONE, "zone-a"), avoid=nodes
            )
            yield f"{variant}: spare near zone-a avoiding {exclusion}", near
            yield (
                f"{variant}: rendezvous avoiding {exclusion}",
                builders.build_rendezvous_pod(job, spec, nodes),
            )
    passed = _job(namespace, JOB, preflight={"enabled": True})
    passed["status"] = {"preflight": {"state": "Passed", "reason": "Passed", "message": "resumed bitwise"}}
    for pod in reconcile.plan(passed, reconcile.Observed(pods=[], now=now)).create_pods:
        yield f"after a passed preflight: pod {pod['metadata']['name']}", pod
    longest = _job(namespace, LONGEST, topology={"policy": "Pack", "required": True})
    spec = _spec(longest)
    for obj in reconcile.plan(longest, reconcile.Observed(pods=[], now=now)).ensure:
        yield f"longest name: {obj['kind']}", obj
    yield (
        "longest name: spare 9999",
        builders.build_worker_pod(longest, spec, 9999, names.ROLE_SPARE, avoid=many),
    )
    yield "longest name: rendezvous", builders.build_rendezvous_pod(longest, spec, many)


def _dry_run(cluster: Cluster, namespace: str) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """A dry-run create for each kind of the job's objects the local cluster serves (PodGroups belong to
    gang schedulers it does not run; their pods' labels and annotations are checked all the same)."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    core = cluster.core
    return {
        "Pod": lambda obj: core.create_namespaced_pod(namespace, obj, dry_run="All"),
        "Service": lambda obj: core.create_namespaced_service(namespace, obj, dry_run="All"),
        "ServiceAccount": lambda obj: core.create_namespaced_service_account(namespace, obj, dry_run="All"),
        "Role": lambda obj: rbac.create_namespaced_role(namespace, obj, dry_run="All"),
        "RoleBinding": lambda obj: rbac.create_namespaced_role_binding(namespace, obj, dry_run="All"),
    }


def test_the_api_server_accepts_every_shape_of_pod_the_operator_builds(
    cluster: Cluster, namespace: str
) -> None:
    create = _dry_run(cluster, namespace)
    shapes = [(what, obj) for what, obj in _shapes(namespace) if obj["kind"] in create]
    assert {obj["kind"] for _, obj in shapes} == set(create)
    assert len(shapes) > 200
    refused: list[str] = []

    def dry_run(kinds: Callable[[str], bool]) -> None:
        for what, obj in shapes:
            if kinds(obj["kind"]):
                try:
                    create[obj["kind"]](obj)
                except ApiException as error:
                    refused.append(f"{what}: {error.status} {error.body}")

    dry_run(lambda kind: kind != "Pod")
    # Admission looks a pod's ServiceAccount up: the operator creates it before any pod (`ensure`).
    for job_name in (JOB, LONGEST):
        account = {"metadata": {"name": names.worker_account_name(job_name)}}
        cluster.core.create_namespaced_service_account(namespace, account)
    dry_run(lambda kind: kind == "Pod")
    # The namespace enforces Pod Security `restricted`, which runs after the pod's validation: every pod but
    # those with a local tier on the host (a hostPath volume, which no level below privileged allows) meets it.
    on_host = "local tier on the host"
    host_pods = [
        what
        for what, obj in shapes
        if obj["kind"] == "Pod" and any("hostPath" in v for v in obj["spec"].get("volumes") or [])
    ]
    assert host_pods and all(what.startswith(on_host) for what in host_pods)
    forbidden = [entry for entry in refused if entry.startswith(on_host)]
    assert [entry.split(": 403 ")[0] for entry in forbidden] == host_pods, forbidden
    assert all(
        "violates PodSecurity" in entry and "restricted:latest" in entry and 'type \\"hostPath\\"' in entry
        for entry in forbidden
    ), forbidden[:3]
    accepted_elsewhere = [entry for entry in refused if not entry.startswith(on_host)]
    assert not accepted_elsewhere, f"{len(accepted_elsewhere)} of {len(shapes)} refused:\n" + "\n".join(
        accepted_elsewhere
    )


def _events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [event for event in events_for(cluster, namespace, name) if event["reason"] == reason]


def _trainers(cluster: Cluster, namespace: str, name: str) -> set[str]:
    return {pod.metadata.name for pod in job_pods(cluster, namespace, name, "phalanx.dev/component=trainer")}


def test_a_pod_the_api_server_refuses_is_a_failed_create_with_its_reason_and_a_back_off(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The CRD keeps the template as it is; the API server refuses a mount of a volume the pod does not have.
    job = trainingjob("refused", replicas=2, spares=1, steps=100000, step_delay=0.05)
    job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "nowhere", "mountPath": "/x"}
    ]
    cluster.apply(job, namespace)
    first = wait_for(
        lambda: _events(cluster, namespace, "refused", "FailedCreate"),
        120,
        message="a FailedCreate Event for the refused job",
    )[0]
    assert first["type"] == "Warning"
    message = first["message"]
    assert message.startswith("pod refused-worker-") and "refused: 422 Invalid" in message, message
    assert 'volumeMounts[0].name: Not found: "nowhere"' in message, message

    # The job keeps trying, but each attempt waits twice as long as the one before (1 s, 2 s, 4 s, ...).
    wait_for(
        lambda: len(_events(cluster, namespace, "refused", "FailedCreate")) >= 4,
        120,
        message="four attempts to create the refused pods",
    )
    time.sleep(10)
    failures = _events(cluster, namespace, "refused", "FailedCreate")
    earliest = min(parse_time(event["firstTimestamp"]) or datetime.now(UTC) for event in failures)
    # Stamps are whole seconds, cut down: one more second covers the part of the first one that was cut.
    since_first = (datetime.now(UTC) - earliest).total_seconds() + 1
    # Attempt k comes at least 2^k - 1 seconds after the first; a reconcile every 2 s would be many more.
    assert len(failures) <= math.floor(math.log2(since_first + 1)) + 1, (since_first, len(failures))
    assert not _events(cluster, namespace, "refused", "CreatedPods")
    assert _trainers(cluster, namespace, "refused") == set()

    # Fixed (a new spec ends the pause), the pods are created, and `CreatedPods` names pods that exist.
    unmount = [{"op": "remove", "path": "/spec/template/spec/containers/0/volumeMounts"}]
    cluster.kubectl(
        "patch", "trainingjob", "refused", "-n", namespace, "--type=json", "-p", json.dumps(unmount)
    )
    created = wait_for(
        lambda: _events(cluster, namespace, "refused", "CreatedPods"),
        60,
        message="a CreatedPods Event once the template is fixed",
    )
    named = {pod for event in created for pod in event["message"].removeprefix("created ").split(", ")}
    assert named == {"refused-worker-0", "refused-worker-1", "refused-worker-2"}, created
    assert named <= _trainers(cluster, namespace, "refused")
    wait_for(
        lambda: has_condition(get_job(cluster, namespace, "refused"), "Running"),
        180,
        message="the fixed job to run",
    )
