"""Desired objects: deterministic names, the env contract, ownership, DNS, the rendezvous outside workers."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from phalanx.operator import api, builders, kube
from phalanx.operator.validation import check

MakeJob = Callable[..., dict[str, Any]]
Violations = Callable[[dict[str, Any]], list[str]]

CONTRACT = {
    "PHALANX_JOB_NAME",
    "PHALANX_JOB_UID",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "NODE_NAME",
    "PHALANX_RDZV_ENDPOINT",
    "PHALANX_MIN_NODES",
    "PHALANX_MAX_NODES",
    "PHALANX_NPROC_PER_NODE",
    "PHALANX_ROLE",
    "PHALANX_RDZV_PROTOCOL",
    "PHALANX_RDZV_JOIN_TIMEOUT",
    "PHALANX_RDZV_LAST_CALL_TIMEOUT",
    "PHALANX_RDZV_KEEPALIVE_INTERVAL",
    "PHALANX_RDZV_KEEPALIVE_TIMEOUT",
    "PHALANX_CHECKPOINT_DIR",
    "PHALANX_CHECKPOINT_INTERVAL",
    "PHALANX_CHECKPOINT_KEEP",
    "PHALANX_SNAPSHOT_SLOTS",
    "PHALANX_HEARTBEAT_INTERVAL",
    "PHALANX_HEARTBEAT_TIMEOUT",
    "PHALANX_HEARTBEAT_REPORTING",
    "PHALANX_METRICS_PORT",
    "PHALANX_COLLECTIVE_TIMEOUT",
}


def _spec(job: dict[str, Any]) -> Any:
    spec, issues = check(job["spec"], job["metadata"]["name"])
    assert not issues
    return spec


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    trainer = pod["spec"]["containers"][0]
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in trainer["env"]}


def test_worker_pod_carries_the_whole_env_contract(make_job: MakeJob) -> None:
    job = make_job(minReplicas=1, maxReplicas=4, nprocPerNode=2)
    pod = builders.build_worker_pod(job, _spec(job), 3, "spare")
    env = _env(pod)
    assert set(env) >= CONTRACT
    assert env["PHALANX_RDZV_ENDPOINT"] == "demo-rdzv.ml.svc:29400"
    assert env["PHALANX_JOB_UID"] == "uid-123"
    assert (env["PHALANX_MIN_NODES"], env["PHALANX_MAX_NODES"]) == ("1", "2")
    assert env["PHALANX_NPROC_PER_NODE"] == "2"
    assert env["PHALANX_ROLE"] == "spare"  # the user's PHALANX_ROLE is replaced, not duplicated
    assert env["USER_VAR"] == "1"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    names = [entry["name"] for entry in pod["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("sizes", "protocol", "expected"),
    [
        ({"replicas": 2, "spares": 1}, None, "c10d"),
        ({"replicas": 30, "spares": 2}, None, "rounds"),
        ({"replicas": 8, "maxReplicas": 40, "minReplicas": 4}, None, "rounds"),
        ({"replicas": 64}, "c10d", "c10d"),
        ({"replicas": 2}, "rounds", "rounds"),
    ],
)
def test_the_rendezvous_protocol_is_chosen_by_the_groups_size_unless_the_spec_names_one(
    make_job: MakeJob, sizes: dict[str, int], protocol: str | None, expected: str
) -> None:
    job = make_job(**sizes, **({"rendezvous": {"protocol": protocol}} if protocol else {}))
    env = _env(builders.build_worker_pod(job, _spec(job), 0, "worker"))
    assert env["PHALANX_RDZV_PROTOCOL"] == expected


@pytest.mark.parametrize(
    ("sizes", "reporting", "expected"),
    [
        ({"replicas": 2, "spares": 1}, None, "leases"),
        ({"replicas": 127, "spares": 0}, None, "leases"),
        ({"replicas": 126, "spares": 2}, None, "hub"),
        ({"replicas": 8, "maxReplicas": 200, "minReplicas": 4}, None, "hub"),
        ({"replicas": 512}, "leases", "leases"),
        ({"replicas": 2}, "hub", "hub"),
    ],
)
def test_the_heartbeat_path_is_chosen_by_the_groups_size_unless_the_spec_names_one(
    make_job: MakeJob, sizes: dict[str, int], reporting: str | None, expected: str
) -> None:
    job = make_job(**sizes, **({"heartbeat": {"reporting": reporting}} if reporting else {}))
    spec = _spec(job)
    assert _env(builders.build_worker_pod(job, spec, 0, "worker"))["PHALANX_HEARTBEAT_REPORTING"] == expected
    rendezvous = builders.build_rendezvous_pod(job, spec)["spec"]
    containers = [container["name"] for container in rendezvous["containers"]]
    assert containers == (["rendezvous", "heartbeat-hub"] if expected == "hub" else ["rendezvous"])
    # Only a hub talks to the API server from the rendezvous pod.
    assert rendezvous["automountServiceAccountToken"] is (expected == "hub")


def test_the_heartbeat_hub_reaches_the_store_through_its_gate_and_is_restricted(
    make_job: MakeJob, restricted_violations: Violations
) -> None:
    job = make_job(heartbeat={"reporting": "hub", "intervalSeconds": 2, "timeoutSeconds": 9})
    pod = builders.build_rendezvous_pod(job, _spec(job))
    store, hub = pod["spec"]["containers"]
    assert hub["image"] == store["image"]
    assert hub["command"] == [
        *builders.HEARTBEAT_HUB, "--store", "$(POD_IP):29400", "--job", "demo", "--interval", "2", "--timeout", "9"
    ]  # fmt: skip
    env = {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in hub["env"]}
    assert env["PHALANX_STORE_SECRET_FILE"] == "/var/run/secrets/phalanx/store/secret"
    assert {"POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"} <= set(env)
    assert hub["volumeMounts"] == store["volumeMounts"]
    assert restricted_violations(pod) == []


def test_worker_pod_names_labels_ownership_and_dns(make_job: MakeJob) -> None:
    job = make_job()
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    meta = pod["metadata"]
    assert meta["name"] == "demo-worker-0" and meta["namespace"] == "ml"
    assert meta["labels"]["phalanx.dev/job-name"] == "demo"
    assert meta["labels"]["phalanx.dev/role"] == "worker"
    assert meta["labels"]["phalanx.dev/index"] == "0"
    assert meta["labels"]["team"] == "ml"  # the template's labels are kept
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "demo",
        "uid": "uid-123",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["spec"]["hostname"] == "demo-worker-0"
    assert pod["spec"]["subdomain"] == "demo-workers"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "demo-worker"


def test_the_users_command_is_wrapped_by_the_launcher(make_job: MakeJob) -> None:
    job = make_job()
    trainer = builders.build_worker_pod(job, _spec(job), 0, "worker")["spec"]["containers"][0]
    assert trainer["command"] == [
        "python",
        "-m",
        "phalanx.worker.launch",
        "--",
        "python",
        "-m",
        "phalanx.worker.examples.tinygpt",
        "--steps",
        "50",
    ]
    assert "args" not in trainer
    # The template itself is left untouched.
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][0] == "python"
    assert "args" in job["spec"]["template"]["spec"]["containers"][0]


def test_the_container_chosen_by_trainer_container_runs_training(make_job: MakeJob) -> None:
    job = make_job(trainerContainer="main", checkpoint={"volume": {"emptyDir": {}}})
    containers = job["spec"]["template"]["spec"]["containers"]
    containers[0]["name"] = "main"
    sidecar = {"name": "trainer", "image": "busybox:sidecar", "command": ["sleep", "inf"]}
    containers.insert(0, sidecar)
    spec = _spec(job)
    first, second = builders.build_worker_pod(job, spec, 0, "worker")["spec"]["containers"]
    # The sidecar, though called `trainer`, is left as it is (but for Pod Security's defaults): `main` gets the
    # launcher, contract and volumes.
    assert {**first, "securityContext": None} == {**sidecar, "securityContext": None}
    assert second["name"] == "main" and second["command"][:4] == list(builders.LAUNCHER)
    assert {"PHALANX_JOB_NAME", "PHALANX_CHECKPOINT_DIR"} <= {entry["name"] for entry in second["env"]}
    assert {mount["mountPath"] for mount in second["volumeMounts"]} >= {"/checkpoints", "/dev/shm"}
    assert builders.build_rendezvous_pod(job, spec)["spec"]["containers"][0]["image"] == "phalanx:dev"


def test_same_inputs_give_the_same_pod(make_job: MakeJob) -> None:
    job = make_job()
    assert builders.build_worker_pod(job, _spec(job), 1, "worker") == builders.build_worker_pod(
        job, _spec(job), 1, "worker"
    )


def test_checkpoint_claim_is_mounted_at_the_path(make_job: MakeJob) -> None:
    job = make_job(checkpoint={"claimName": "ckpt", "path": "/data/ckpt"})
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    assert {"name": "phalanx-checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["spec"][
        "volumes"
    ]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "phalanx-checkpoint", "mountPath": "/data/ckpt"} in mounts
    # A folder of the job's own under the claim: jobs sharing it never prune each other's checkpoints.
    assert _env(pod)["PHALANX_CHECKPOINT_DIR"] == "/data/ckpt/ml/demo"


def test_checkpoint_volume_source(make_job: MakeJob) -> None:
    job = make_job(checkpoint={"volume": {"hostPath": {"path": "/tmp/x"}}})
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    assert {"name": "phalanx-checkpoint", "hostPath": {"path": "/tmp/x"}} in pod["spec"]["volumes"]


def test_one_tier_sets_no_durable_tier(make_job: MakeJob) -> None:
    job = make_job(checkpoint={"claimName": "ckpt", "keep": 4})
    env = _env(builders.build_worker_pod(job, _spec(job), 0, "worker"))
    assert (env["PHALANX_CHECKPOINT_DIR"], env["PHALANX_CHECKPOINT_KEEP"]) == ("/checkpoints/ml/demo", "4")
    assert not {name for name in env if "DURABLE" in name or "LOCAL_TIER" in name}


def test_a_local_tier_commits_on_the_node_and_copies_to_the_claim(make_job: MakeJob) -> None:
    checkpoint = {
        "claimName": "ckpt",
        "keep": 4,
        "durableEvery": 5,
        "localTier": {"enabled": True, "keep": 2, "sizeLimit": "20Gi"},
    }
    job = make_job(checkpoint=checkpoint)
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    env = _env(pod)
    assert env["PHALANX_CHECKPOINT_DIR"] == "/phalanx-local-checkpoints"
    assert env["PHALANX_CHECKPOINT_KEEP"] == "2"
    assert env["PHALANX_CHECKPOINT_LOCAL_TIER"] == "1"
    assert env["PHALANX_CHECKPOINT_DURABLE_URL"] == "/checkpoints/ml/demo"
    assert (env["PHALANX_CHECKPOINT_DURABLE_EVERY"], env["PHALANX_CHECKPOINT_DURABLE_KEEP"]) == ("5", "4")
    volumes = pod["spec"]["volumes"]
    assert {"name": "phalanx-local-checkpoint", "emptyDir": {"sizeLimit": "20Gi"}} in volumes
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "phalanx-local-checkpoint", "mountPath": "/phalanx-local-checkpoints"} in mounts
    assert {"name": "phalanx-checkpoint", "mountPath": "/checkpoints"} in mounts


def test_a_local_tier_on_a_node_folder(make_job: MakeJob) -> None:
    job = make_job(checkpoint={"localTier": {"enabled": True, "hostPath": "/mnt/nvme/phalanx"}})
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    volume = {
        "name": "phalanx-local-checkpoint",
        "hostPath": {"path": "/mnt/nvme/phalanx", "type": "DirectoryOrCreate"},
    }
    assert volume in pod["spec"]["volumes"]


def test_an_object_store_is_the_durable_tier(make_job: MakeJob) -> None:
    store = {
        "url": "s3://bucket/run-1",
        "endpointUrl": "http://minio:9000",
        "secretName": "s3-creds",
        "storageOptions": {"client_kwargs": {"region_name": "eu-west-1"}},
    }
    job = make_job(checkpoint={"localTier": {"enabled": True}, "objectStore": store})
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    env = _env(pod)
    assert env["PHALANX_CHECKPOINT_DURABLE_URL"] == "s3://bucket/run-1/ml/demo"
    assert json.loads(env["PHALANX_CHECKPOINT_STORAGE_OPTIONS"]) == {
        "client_kwargs": {"region_name": "eu-west-1"},
        "endpoint_url": "http://minio:9000",
    }
    # The credentials are files in the trainer, read-only, never its environment.
    trainer = pod["spec"]["containers"][0]
    assert "envFrom" not in trainer
    assert env["PHALANX_CHECKPOINT_CREDENTIALS_DIR"] == "/var/run/secrets/phalanx/object-store"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "phalanx-object-store-credentials")
    assert volume["secret"] == {"secretName": "s3-creds"}
    mount = next(m for m in trainer["volumeMounts"] if m["name"] == "phalanx-object-store-credentials")
    assert mount == {
        "name": "phalanx-object-store-credentials",
        "mountPath": "/var/run/secrets/phalanx/object-store",
        "readOnly": True,
    }
    # Without a local tier, checkpoints commit at `path` and are copied to the store.
    job = make_job(checkpoint={"objectStore": {"url": "s3://bucket/run-1"}})
    env = _env(builders.build_worker_pod(job, _spec(job), 0, "worker"))
    assert (
        env["PHALANX_CHECKPOINT_DIR"] == "/checkpoints/ml/demo"
        and env["PHALANX_CHECKPOINT_LOCAL_TIER"] == "0"
    )
    assert env["PHALANX_CHECKPOINT_DURABLE_URL"] == "s3://bucket/run-1/ml/demo"


@pytest.mark.parametrize(
    ("folder", "directory", "url"),
    [
        ("team/run-7", "/checkpoints/team/run-7", "s3://bucket/team/run-7"),
        (".", "/checkpoints", "s3://bucket/"),
    ],
)
def test_the_job_s_folder_can_be_named_or_be_the_path_itself(
    make_job: MakeJob, folder: str, directory: str, url: str
) -> None:
    job = make_job(checkpoint={"folder": folder, "objectStore": {"url": "s3://bucket/"}})
    env = _env(builders.build_worker_pod(job, _spec(job), 0, "worker"))
    assert (env["PHALANX_CHECKPOINT_DIR"], env["PHALANX_CHECKPOINT_DURABLE_URL"]) == (directory, url)


@pytest.mark.parametrize("folder", ["", "/abs", "a/../b", "..", "a//b", "a/", "./a"])
def test_a_folder_outside_the_path_is_refused(folder: str) -> None:
    with pytest.raises(ValidationError, match="relative, normalised folder"):
        api.CheckpointSpec.model_validate({"folder": folder})


def test_rendezvous_lives_in_its_own_pod_and_service(make_job: MakeJob) -> None:
    job = make_job(rendezvous={"port": 29500})
    spec = _spec(job)
    pod = builders.build_rendezvous_pod(job, spec)
    assert pod["metadata"]["name"] == "demo-rdzv"
    assert pod["metadata"]["labels"]["phalanx.dev/role"] == "rendezvous"
    assert pod["metadata"]["labels"]["phalanx.dev/component"] == "rendezvous"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == [
        "python",
        "-m",
        "phalanx.worker.rendezvous",
        "--host",
        "$(POD_IP)",
        "--port",
        "29500",
    ]
    assert container["image"] == "phalanx:dev"
    service = builders.build_rendezvous_service(job, spec)
    assert service["metadata"]["name"] == "demo-rdzv"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {
        "phalanx.dev/job-name": "demo",
        "phalanx.dev/component": "rendezvous",
    }
    # Worker pods never match the rendezvous Service.
    worker = builders.build_worker_pod(job, spec, 0, "worker")
    labels = worker["metadata"]["labels"]
    assert not all(labels.get(key) == value for key, value in service["spec"]["selector"].items())


def test_workers_service_selects_workers_and_spares(make_job: MakeJob) -> None:
    job = make_job()
    spec = _spec(job)
    service = builders.build_workers_service(job)
    assert service["metadata"]["name"] == "demo-workers"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    for role in ("worker", "spare"):
        labels = builders.build_worker_pod(job, spec, 0, role)["metadata"]["labels"]
        assert all(labels.get(key) == value for key, value in service["spec"]["selector"].items())


def test_worker_rbac_lets_pods_write_leases(make_job: MakeJob) -> None:
    job = make_job()
    account, role, binding = builders.build_worker_rbac(job, _spec(job))
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "demo-worker"
    lease_rule = role["rules"][0]
    assert lease_rule["apiGroups"] == ["coordination.k8s.io"] and "update" in lease_rule["verbs"]
    assert binding["roleRef"]["name"] == "demo-worker"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-worker", "namespace": "ml"}]


def test_worker_rbac_lets_pods_read_and_watch_only_their_own_trainingjob(make_job: MakeJob) -> None:
    job = make_job()
    _, role, _ = builders.build_worker_rbac(job, _spec(job))
    job_rules = [rule for rule in role["rules"] if "trainingjobs" in rule["resources"]]
    # Launchers watch their job (scaling, regroup requests); a watch needs list as well.
    assert job_rules == [
        {
            "apiGroups": ["phalanx.dev"],
            "resources": ["trainingjobs"],
            "resourceNames": ["demo"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_fixed_children_are_all_owned_by_the_job(make_job: MakeJob) -> None:
    job = make_job(gang={"podGroup": "Volcano", "queueName": "q"})
    children = builders.build_fixed_children(job, _spec(job))
    kinds = sorted(child["kind"] for child in children)
    assert kinds == ["PodGroup", "Role", "RoleBinding", "Secret", "Service", "Service", "ServiceAccount"]
    for child in children:
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-123"
        assert child["metadata"]["labels"]["phalanx.dev/job-name"] == "demo"


def test_a_worker_pod_near_a_domain_prefers_it(make_job: MakeJob) -> None:
    job = make_job()
    pod = builders.build_worker_pod(job, _spec(job), 3, "spare", near=("topology.kubernetes.io/zone", "z2"))
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["preference"]["matchExpressions"] == [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z2"]}
    ]
    assert "affinity" not in builders.build_worker_pod(job, _spec(job), 3, "spare")["spec"]


def test_trainers_get_a_memory_backed_dev_shm_unless_they_mount_their_own(make_job: MakeJob) -> None:
    job = make_job()
    pod = builders.build_worker_pod(job, _spec(job), 0, "worker")
    assert {"name": "phalanx-shm", "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    assert {"name": "phalanx-shm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]

    sized = make_job(sharedMemory={"sizeLimit": "8Gi"})
    pod = builders.build_worker_pod(sized, _spec(sized), 0, "spare")
    assert {"name": "phalanx-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["spec"][
        "volumes"
    ]

    off = make_job(sharedMemory={"enabled": False})
    pod = builders.build_worker_pod(off, _spec(off), 0, "worker")
    assert all(volume["name"] != "phalanx-shm" for volume in pod["spec"].get("volumes") or [])

    own = make_job()
    trainer = own["spec"]["template"]["spec"]["containers"][0]
    trainer["volumeMounts"] = [{"name": "mine", "mountPath": "/dev/shm/"}]
    own["spec"]["template"]["spec"]["volumes"] = [{"name": "mine", "emptyDir": {"medium": "Memory"}}]
    pod = builders.build_worker_pod(own, _spec(own), 0, "worker")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["mine", "phalanx-store-secret"]
    assert [m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == [
        "mine",
        "phalanx-store-secret",
    ]
    rendezvous = builders.build_rendezvous_pod(job, _spec(job))
    assert [v["name"] for v in rendezvous["spec"]["volumes"]] == ["phalanx-store-secret"]  # no snapshots


def _every_pod(job: dict[str, Any]) -> list[dict[str, Any]]:
    spec = _spec(job)
    return [
        builders.build_worker_pod(job, spec, 0, "worker"),
        builders.build_worker_pod(job, spec, 1, "spare", near=("zone", "a"), avoid=frozenset({"node-1"})),
        builders.build_rendezvous_pod(job, spec),
    ]


def test_every_pod_the_operator_builds_meets_pod_security_restricted(
    make_job: MakeJob, restricted_violations: Violations
) -> None:
    init = {"name": "fetch", "image": "phalanx:dev", "command": ["true"]}
    sidecar = {"name": "log", "image": "phalanx:dev", "command": ["sleep", "inf"], "restartPolicy": "Always"}
    with_extras = make_job(
        preflight={"enabled": True},
        checkpoint={"claimName": "ckpt", "path": "/ckpt", "localTier": {"enabled": True}},
    )
    with_extras["spec"]["template"]["spec"]["initContainers"] = [init, sidecar]
    jobs = {
        "defaults": make_job(),
        "init containers, claim, local tier in an emptyDir": with_extras,
        "volume and no /dev/shm": make_job(
            checkpoint={"volume": {"emptyDir": {}}}, sharedMemory={"enabled": False}
        ),
    }
    for what, job in jobs.items():
        for pod in _every_pod(job):
            assert restricted_violations(pod) == [], (what, pod["metadata"]["name"])
    # The checker itself finds what breaks the level: the template as the user wrote it does.
    assert restricted_violations({"spec": with_extras["spec"]["template"]["spec"]}) != []


def test_a_local_tier_on_the_host_keeps_the_pod_from_restricted(
    make_job: MakeJob, restricted_violations: Violations
) -> None:
    # A hostPath volume is the user's choice (`checkpoint.localTier.hostPath`): no default can make it restricted.
    job = make_job(checkpoint={"localTier": {"enabled": True, "hostPath": "/var/lib/phalanx"}})
    worker, _, rendezvous = _every_pod(job)
    assert restricted_violations(worker) == ["volume phalanx-local-checkpoint: ['hostPath']"]
    assert restricted_violations(rendezvous) == []


def test_pod_security_defaults_fill_only_what_the_template_left_unset(make_job: MakeJob) -> None:
    job = make_job()
    for pod in _every_pod(job):
        assert pod["spec"]["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in pod["spec"]["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
    assert "securityContext" not in job["spec"]["template"]["spec"]  # the template itself is left untouched

    # What the template sets, it keeps: at the pod and in each container, whatever it asks.
    own = make_job()
    template = own["spec"]["template"]["spec"]
    template["securityContext"] = {
        "runAsNonRoot": False,
        "seccompProfile": {"type": "Unconfined"},
        "fsGroup": 2000,
    }
    trainer = template["containers"][0]
    trainer["securityContext"] = {
        "allowPrivilegeEscalation": True,
        "capabilities": {"add": ["NET_ADMIN"], "drop": ["MKNOD"]},
    }
    privileged = {"name": "debug", "image": "x", "securityContext": {"privileged": True}}
    admin = {"name": "admin", "image": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
    template["containers"] += [privileged, admin]
    worker = builders.build_worker_pod(own, _spec(own), 0, "worker")
    assert worker["spec"]["securityContext"] == template["securityContext"]
    first, second, third = worker["spec"]["containers"]
    assert first["securityContext"] == trainer["securityContext"]
    # No `allowPrivilegeEscalation: false` beside privileged or SYS_ADMIN: the API server refuses that pair.
    assert second["securityContext"] == {"privileged": True, "capabilities": {"drop": ["ALL"]}}
    assert third["securityContext"] == {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}
    rendezvous = builders.build_rendezvous_pod(own, _spec(own))
    assert rendezvous["spec"]["securityContext"] == template["securityContext"]
    assert rendezvous["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_a_template_running_as_root_gets_no_run_as_non_root(make_job: MakeJob) -> None:
    # A root image the template runs as uid 0 must still start: `runAsNonRoot: true` would stop its containers.
    job = make_job()
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    worker, _, rendezvous = _every_pod(job)
    assert "runAsNonRoot" not in worker["spec"]["securityContext"]
    assert worker["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The rendezvous runs the trainer's image, so it runs as the trainer does.
    assert "runAsNonRoot" not in rendezvous["spec"]["securityContext"]
    assert rendezvous["spec"]["containers"][0]["securityContext"]["runAsUser"] == 0

    pod_level = make_job()
    pod_level["spec"]["template"]["spec"]["securityContext"] = {"runAsUser": 0}
    for pod in _every_pod(pod_level):
        assert pod["spec"]["securityContext"] == {
            "runAsUser": 0,
            "seccompProfile": {"type": "RuntimeDefault"},
        }

    # A rendezvous image of its own is not the trainer's: it gets the defaults.
    own_image = make_job(rendezvous={"image": "phalanx:rdzv"})
    own_image["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    rendezvous = builders.build_rendezvous_pod(own_image, _spec(own_image))
    assert rendezvous["spec"]["securityContext"]["runAsNonRoot"] is True
    assert "runAsUser" not in rendezvous["spec"]["containers"][0]["securityContext"]


def test_the_operator_s_labels_win_over_the_template_s(make_job: MakeJob) -> None:
    job = make_job()
    job["spec"]["template"].setdefault("metadata", {})["labels"] = {
        "phalanx.dev/job-name": "victim",
        "app.kubernetes.io/managed-by": "someone-else",
        "phalanx.dev/component": "rendezvous",
        "team": "vision",
    }
    labels = builders.build_worker_pod(job, _spec(job), 0, "worker")["metadata"]["labels"]
    assert (
        labels["phalanx.dev/job-name"] == "demo"
        and labels["app.kubernetes.io/managed-by"] == "phalanx-operator"
    )
    assert labels["phalanx.dev/component"] == "trainer" and labels["team"] == "vision"


def test_a_job_s_network_policy_lets_only_its_own_pods_in_and_metrics_from_one_namespace(
    make_job: MakeJob,
) -> None:
    job = make_job(metricsPort=9400)
    spec = _spec(job)
    closed = builders.build_network_policy(job, spec, builders.NetworkPolicySettings())
    own = {"matchLabels": {"phalanx.dev/job-name": "demo"}}
    assert (
        closed["metadata"]["name"] == "demo-pods"
        and closed["metadata"]["ownerReferences"][0]["uid"] == "uid-123"
    )
    assert closed["spec"] == {
        "podSelector": own,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": own}]}],
    }
    scraped = builders.build_network_policy(
        job, spec, builders.NetworkPolicySettings(metrics_namespace="monitoring")
    )
    (_, metrics) = scraped["spec"]["ingress"]
    assert metrics == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"port": 9400, "protocol": "TCP"}],
    }
    kinds = [
        child["kind"] for child in builders.build_fixed_children(job, spec, builders.NetworkPolicySettings())
    ]
    assert "NetworkPolicy" in kinds
    assert "NetworkPolicy" not in [child["kind"] for child in builders.build_fixed_children(job, spec)]


def test_with_the_chart_s_worker_role_the_job_s_role_grants_no_lease(make_job: MakeJob) -> None:
    job = make_job()
    account, role, binding, leases = builders.build_worker_rbac(job, _spec(job), "phalanx-worker")
    assert [rule["resources"] for rule in role["rules"]] == [["trainingjobs"]]
    assert leases["metadata"]["name"] == "demo-worker-leases"
    assert leases["roleRef"]["kind"] == "ClusterRole" and leases["roleRef"]["name"] == "phalanx-worker"
    assert leases["subjects"] == binding["subjects"]
    assert leases["metadata"]["ownerReferences"] == account["metadata"]["ownerReferences"]


def test_the_trainer_s_metrics_port_is_named(make_job: MakeJob) -> None:
    job = make_job(metricsPort=9400)
    trainer = builders.build_worker_pod(job, _spec(job), 0, "worker")["spec"]["containers"][0]
    assert trainer["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    job = make_job()
    trainer = builders.build_worker_pod(job, _spec(job), 0, "worker")["spec"]["containers"][0]
    assert "ports" not in trainer


def test_the_rendezvous_pod_sets_requests_limits_and_a_restricted_container(make_job: MakeJob) -> None:
    """A namespace whose quota or LimitRange asks for limits admits it; its requests are what it uses (the
    store imports torch); its container meets Pod Security `restricted` as the workers' do."""
    job = make_job()
    (container,) = builders.build_rendezvous_pod(job, _spec(job))["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "640Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    custom = make_job(
        rendezvous={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4", "memory": "8Gi"}}}
    )
    (container,) = builders.build_rendezvous_pod(custom, _spec(custom))["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"cpu": "4", "memory": "8Gi"}}
    unlimited = make_job(rendezvous={"resources": {"limits": {}}})
    (container,) = builders.build_rendezvous_pod(unlimited, _spec(unlimited))["spec"]["containers"]
    assert "limits" not in container["resources"]


def test_a_rendezvous_request_above_its_limit_is_refused_naming_the_field(make_job: MakeJob) -> None:
    job = make_job(rendezvous={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}})
    spec, issues = check(job["spec"], job["metadata"]["name"])
    assert spec is None
    assert [issue.field for issue in issues] == ["spec.rendezvous.resources.requests.cpu"]
    assert "above the limit" in str(issues[0])
    job = make_job(rendezvous={"resources": {"requests": {"cpu": "lots"}}})
    with pytest.raises(ValidationError):
        api.TrainingJobSpec.model_validate(job["spec"])


def test_the_rendezvous_pod_and_every_trainer_get_the_job_s_store_secret(make_job: MakeJob) -> None:
    job = make_job()
    spec = _spec(job)
    volume = {"name": "phalanx-store-secret", "secret": {"secretName": "demo-store"}}
    mount = {"name": "phalanx-store-secret", "mountPath": "/var/run/secrets/phalanx/store", "readOnly": True}
    for pod in (
        builders.build_rendezvous_pod(job, spec),
        builders.build_worker_pod(job, spec, 0, "worker"),
        builders.build_worker_pod(job, spec, 3, "spare"),
    ):
        assert volume in pod["spec"]["volumes"]
        container = pod["spec"]["containers"][0]
        assert mount in container["volumeMounts"]
        env = {entry["name"]: entry.get("value") for entry in container["env"]}
        assert env["PHALANX_STORE_SECRET_FILE"] == "/var/run/secrets/phalanx/store/secret"


def test_the_store_secret_is_drawn_when_it_is_created_never_by_a_plan(make_job: MakeJob) -> None:
    job = make_job()
    secret = builders.build_store_secret(job)
    assert secret == builders.build_store_secret(job)  # plans stay deterministic
    assert "data" not in secret and secret["metadata"]["ownerReferences"][0]["uid"] == "uid-123"
    first, second = kube.with_drawn_secret(secret), kube.with_drawn_secret(secret)
    values = [base64.b64decode(drawn["data"]["secret"]) for drawn in (first, second)]
    assert values[0] != values[1] and min(len(value) for value in values) >= 32
    assert "data" not in secret  # the plan's object is left as it was
    service = builders.build_rendezvous_service(job, _spec(job))
    assert kube.with_drawn_secret(service) is service


def test_the_operator_s_watches_ask_the_api_server_only_for_what_its_handlers_take(make_job: MakeJob) -> None:
    """The server-side selectors must select every Lease and pod the operator reads, or it goes blind to them."""
    from datetime import UTC, datetime

    import kopf
    from kopf._cogs.structs import references

    from phalanx import beatsummary, contract
    from phalanx.operator import handlers, viewclock
    from phalanx.worker import beathub, heartbeat

    settings = kopf.OperatorSettings()
    handlers.configure_kopf(settings, 4)

    def selector(group: str, plural: str) -> list[str]:
        resource = references.Resource(group=group, version="v1", plural=plural, namespaced=True)
        return list(settings.watching.label_selectors.collect(resource))

    def selected(labels: dict[str, str], wanted: list[str]) -> bool:
        (expression,) = wanted
        key, _, value = expression.partition("=")
        return key in labels and (not value or labels[key] == value)

    now = datetime.now(UTC)
    status = heartbeat.PodStatus(phase="training", step=3)
    leases = [
        heartbeat.lease_body(
            pod_name="p", namespace="ml", pod_uid="u", status=status, now=now, lease_duration_seconds=10
        ),
        beathub.summary_lease("demo-rdzv", "ml", "u", beatsummary.encode({}), now, 10),
        viewclock.canary_lease("ml", "operator-0", now, "phalanx"),
    ]
    assert selector("coordination.k8s.io", "leases") == [contract.LEASE_SELECTOR]
    for lease in leases:
        assert selected(lease["metadata"]["labels"], selector("coordination.k8s.io", "leases")), lease
    job = make_job(spares=1)
    spec = _spec(job)
    pods = [
        builders.build_worker_pod(job, spec, 0, "worker"),
        builders.build_worker_pod(job, spec, 1, "spare"),
        builders.build_rendezvous_pod(job, spec),
    ]
    for pod in pods:
        assert selected(pod["metadata"]["labels"], selector("", "pods")), pod["metadata"]["labels"]
    assert selector("", "nodes") == []  # every node: a lost one is read as it goes
    assert not selected(
        {"app.kubernetes.io/managed-by": "kubelet"}, selector("coordination.k8s.io", "leases")
    )
