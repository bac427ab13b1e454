"""Desired Kubernetes objects of a TrainingJob (pure functions: spec in, dicts out).

Every child is owned by the job (collected with it), labelled `phalanx.dev/job-name` and named
deterministically, so creating "what is missing" is idempotent across operator restarts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from phalanx.operator import api, gang, names, topology
from phalanx.operator.plaincopy import plain_copy
from phalanx.operator.validation import trainer_container_index

LAUNCHER = ("python", "-m", "phalanx.worker.launch", "--")
RENDEZVOUS_SERVER = ("python", "-m", "phalanx.worker.rendezvous")
HEARTBEAT_HUB = ("python", "-m", "phalanx.worker.beathub")


def _meta(job: dict[str, Any], name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    job_meta = job["metadata"]
    return {
        "name": name,
        "namespace": job_meta["namespace"],
        # The operator's labels win: a template label naming another job must not make the pod that job's.
        "labels": {**(labels or {}), **names.job_labels(job_meta["name"])},
        "ownerReferences": [names.owner_reference(job)],
    }


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


DOWNWARD_ENV = (
    _field_env("POD_NAME", "metadata.name"),
    _field_env("POD_NAMESPACE", "metadata.namespace"),
    _field_env("POD_UID", "metadata.uid"),
    _field_env("POD_IP", "status.podIP"),
    _field_env("NODE_NAME", "spec.nodeName"),
)


def preflight_steps(job: dict[str, Any], spec: api.TrainingJobSpec) -> int:
    """Steps of the preflight the job's new pods run: 0 when it is off or has passed already (pods created
    later, e.g. on new nodes whose local storage holds no verdict, must not run it again)."""
    passed = ((job.get("status") or {}).get("preflight") or {}).get("state") == "Passed"
    return spec.preflight.steps if spec.preflight.enabled and not passed else 0


def contract_env(job: dict[str, Any], spec: api.TrainingJobSpec, role: names.Role) -> list[dict[str, Any]]:
    """The environment of the trainer container (docs/ARCHITECTURE.md, "Operator -> worker contract")."""
    meta = job["metadata"]
    rendezvous = spec.rendezvous
    values = {
        "PHALANX_JOB_NAME": meta["name"],
        "PHALANX_JOB_NAMESPACE": meta["namespace"],
        "PHALANX_JOB_UID": meta["uid"],
        "PHALANX_RDZV_ENDPOINT": names.rendezvous_endpoint(meta["name"], meta["namespace"], rendezvous.port),
        "PHALANX_MIN_NODES": spec.effective_min_replicas,
        "PHALANX_MAX_NODES": spec.replicas,
        "PHALANX_NPROC_PER_NODE": spec.nproc_per_node,
        "PHALANX_ROLE": role,
        "PHALANX_RDZV_PROTOCOL": spec.rendezvous_protocol,
        "PHALANX_RDZV_JOIN_TIMEOUT": rendezvous.join_timeout_seconds,
        "PHALANX_RDZV_LAST_CALL_TIMEOUT": rendezvous.last_call_timeout_seconds,
        "PHALANX_RDZV_KEEPALIVE_INTERVAL": rendezvous.keepalive_interval_seconds,
        "PHALANX_RDZV_KEEPALIVE_TIMEOUT": rendezvous.keepalive_timeout_seconds,
        **checkpoint_tier_env(spec.checkpoint, spec.checkpoint.folder_of(meta["namespace"], meta["name"])),
        "PHALANX_CHECKPOINT_INTERVAL": spec.checkpoint.interval_steps,
        "PHALANX_SNAPSHOT_SLOTS": spec.shared_memory.snapshot_slots,
        "PHALANX_HEARTBEAT_INTERVAL": f"{spec.heartbeat.interval_seconds:g}",
        "PHALANX_HEARTBEAT_TIMEOUT": spec.heartbeat.timeout_seconds,
        "PHALANX_HEARTBEAT_REPORTING": spec.heartbeat_reporting,
        "PHALANX_HANG_FACTOR": f"{spec.heartbeat.hang_factor:g}",
        "PHALANX_HANG_FLOOR": f"{spec.heartbeat.hang_floor_seconds:g}",
        "PHALANX_METRICS_PORT": spec.metrics_port,
        "PHALANX_COLLECTIVE_TIMEOUT": spec.collective_timeout_seconds,
        "PHALANX_PREFLIGHT_STEPS": preflight_steps(job, spec),
        "PHALANX_PREFLIGHT_TOLERANCE": spec.preflight.tolerance,
        "PHALANX_STORE_SECRET_FILE": names.STORE_SECRET_FILE,
    }
    return [
        *plain_copy(DOWNWARD_ENV),
        *({"name": key, "value": str(value)} for key, value in values.items()),
    ]


def _under(base: str, folder: str) -> str:
    return f"{base.rstrip('/')}/{folder}" if folder else base


def checkpoint_tier_env(checkpoint: api.CheckpointSpec, folder: str = "") -> dict[str, Any]:
    """Where the worker commits checkpoints (the fast tier) and where it copies them (the durable tier):
    worker/checkpoint/tiers.py. `folder`: the job's own folder under each shared tier (`folder_of`); the local
    tier is the pod's or the node's alone already."""
    local = checkpoint.local_tier
    env: dict[str, Any] = {
        "PHALANX_CHECKPOINT_DIR": local.path if local.enabled else _under(checkpoint.path, folder),
        "PHALANX_CHECKPOINT_KEEP": local.keep if local.enabled else checkpoint.keep,
    }
    if checkpoint.accept_other_jobs:
        env["PHALANX_CHECKPOINT_ACCEPT_OTHER_JOBS"] = 1
    store = checkpoint.object_store
    durable_url = (
        _under(store.url, folder) if store else (_under(checkpoint.path, folder) if local.enabled else None)
    )
    if durable_url is None:
        return env
    env.update(
        PHALANX_CHECKPOINT_LOCAL_TIER=int(local.enabled),
        PHALANX_CHECKPOINT_DURABLE_URL=durable_url,
        PHALANX_CHECKPOINT_DURABLE_EVERY=checkpoint.durable_every,
        PHALANX_CHECKPOINT_DURABLE_KEEP=checkpoint.keep,
    )
    if store is not None:
        options = dict(store.storage_options or {})
        if store.endpoint_url:
            options.setdefault("endpoint_url", store.endpoint_url)
        env["PHALANX_CHECKPOINT_STORAGE_OPTIONS"] = json.dumps(options, sort_keys=True)
        if store.secret_name:
            env["PHALANX_CHECKPOINT_CREDENTIALS_DIR"] = names.OBJECT_STORE_CREDENTIALS_PATH
    return env


def _checkpoint_volumes(spec: api.TrainingJobSpec) -> list[tuple[dict[str, Any], str]]:
    """The checkpoint volumes of a trainer pod and where each is mounted."""
    checkpoint = spec.checkpoint
    volumes: list[tuple[dict[str, Any], str]] = []
    if checkpoint.claim_name:
        claim = {
            "name": names.CHECKPOINT_VOLUME,
            "persistentVolumeClaim": {"claimName": checkpoint.claim_name},
        }
        volumes.append((claim, checkpoint.path))
    elif checkpoint.volume:
        source = {key: value for key, value in checkpoint.volume.items() if key != "name"}
        volumes.append(({"name": names.CHECKPOINT_VOLUME, **plain_copy(source)}, checkpoint.path))
    store = checkpoint.object_store
    if store is not None and store.secret_name:
        # Files, not the environment: read where a filesystem is built, never inherited by every process.
        credentials = {
            "name": names.OBJECT_STORE_CREDENTIALS_VOLUME,
            "secret": {"secretName": store.secret_name},
        }
        volumes.append((credentials, names.OBJECT_STORE_CREDENTIALS_PATH))
    local = checkpoint.local_tier
    if local.enabled:
        if local.host_path:
            source = {"hostPath": {"path": local.host_path, "type": "DirectoryOrCreate"}}
        else:
            source = {"emptyDir": {"sizeLimit": local.size_limit} if local.size_limit else {}}
        volumes.append(({"name": names.LOCAL_CHECKPOINT_VOLUME, **source}, local.path))
    return volumes


SHARED_MEMORY_PATH = "/dev/shm"


def _mounts_shared_memory(container: dict[str, Any]) -> bool:
    """Whether the user's container already mounts its own volume at /dev/shm (theirs is kept)."""
    return any(
        (mount.get("mountPath") or "").rstrip("/") == SHARED_MEMORY_PATH
        for mount in container.get("volumeMounts") or []
    )


def _mount(container: dict[str, Any], volumes: list[tuple[dict[str, Any], str]]) -> None:
    """Mount the operator's `volumes` into `container`, in place of the user's mounts of the same names."""
    ours = {volume["name"] for volume, _ in volumes}
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") not in ours]
    container["volumeMounts"] = [
        *mounts,
        *(
            {"name": v["name"], "mountPath": path, **({"readOnly": True} if "secret" in v else {})}
            for v, path in volumes
        ),
    ]


def _add_volumes(pod_spec: dict[str, Any], volumes: list[tuple[dict[str, Any], str]]) -> None:
    """Add the operator's `volumes` to `pod_spec`, in place of the user's volumes of the same names."""
    ours = {volume["name"] for volume, _ in volumes}
    pod_spec["volumes"] = [
        *(v for v in pod_spec.get("volumes") or [] if v.get("name") not in ours),
        *(volume for volume, _ in volumes),
    ]


def store_secret_volume(job_name: str) -> tuple[dict[str, Any], str]:
    """The job's store secret as a volume, and where it is mounted (its rendezvous pod and its trainers)."""
    volume = {
        "name": names.STORE_SECRET_VOLUME,
        "secret": {"secretName": names.store_secret_name(job_name)},
    }
    return volume, names.STORE_SECRET_DIR


def _trainer_volumes(
    job_name: str, spec: api.TrainingJobSpec, own_shm: bool
) -> list[tuple[dict[str, Any], str]]:
    """The volumes the operator adds to a trainer pod and where each is mounted: the store secret, the
    checkpoint volumes and, unless the user mounts their own (`own_shm`), a memory-backed /dev/shm."""
    volumes = [store_secret_volume(job_name), *_checkpoint_volumes(spec)]
    shared = spec.shared_memory
    if shared.enabled and not own_shm:
        source: dict[str, Any] = {"medium": "Memory"}
        if shared.size_limit:
            source["sizeLimit"] = shared.size_limit
        volumes.append(({"name": names.SHARED_MEMORY_VOLUME, "emptyDir": source}, SHARED_MEMORY_PATH))
    return volumes


def _wrap_trainer(
    container: dict[str, Any],
    env: list[dict[str, Any]],
    volumes: list[tuple[dict[str, Any], str]],
    spec: api.TrainingJobSpec,
) -> None:
    user_command = [*container.get("command", []), *container.get("args", [])]
    container["command"] = [*LAUNCHER, *user_command]
    container.pop("args", None)
    ours = {entry["name"] for entry in env}
    # The contract's variables win over the user's: the launcher must see what the operator decided.
    container["env"] = [entry for entry in container.get("env") or [] if entry.get("name") not in ours] + env
    _mount(container, volumes)
    if spec.metrics_port:
        # Named, so that a PodMonitor (or a Service) can select it by name whatever the port number.
        ports = [
            port for port in container.get("ports") or [] if port.get("containerPort") != spec.metrics_port
        ]
        taken = {port.get("name") for port in ports}
        if METRICS_PORT_NAME not in taken:
            ports.append({"name": METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"})
            container["ports"] = ports


METRICS_PORT_NAME = "metrics"
"""The name of the trainer's metrics port (`spec.metricsPort`), as the operator's own is named."""
RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}
DROP_ALL = ["ALL"]
CONTAINER_KINDS = ("initContainers", "containers")
TRAINER_IDENTITY = ("runAsUser", "runAsGroup", "runAsNonRoot")
"""The trainer container's settings the rendezvous container takes over when it runs the trainer's image."""
_SYS_ADMIN = frozenset({"SYS_ADMIN", "CAP_SYS_ADMIN"})


def _runs_as_root(pod_spec: dict[str, Any]) -> bool:
    """Whether the template asks for uid 0 somewhere (pod or any container): `runAsNonRoot: true` would stop it."""
    contexts = [pod_spec.get("securityContext") or {}]
    for kind in CONTAINER_KINDS:
        contexts.extend(c.get("securityContext") or {} for c in pod_spec.get(kind) or [])
    return any(context.get("runAsUser") == 0 for context in contexts)


def _restrict_container(container: dict[str, Any]) -> None:
    context = container["securityContext"] = container.get("securityContext") or {}
    capabilities = context["capabilities"] = context.get("capabilities") or {}
    if capabilities.get("drop") is None:
        capabilities["drop"] = list(DROP_ALL)
    # The API server refuses `allowPrivilegeEscalation: false` beside `privileged: true` or an added
    # SYS_ADMIN: those containers asked for more, and keep it unset.
    escalates = context.get("privileged") is True or _SYS_ADMIN & set(capabilities.get("add") or [])
    if "allowPrivilegeEscalation" not in context and not escalates:
        context["allowPrivilegeEscalation"] = False


def restrict_pod_spec(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """Fill in what Pod Security's `restricted` level asks, where the template left it unset (in place; also
    returned): the pod runs as non-root with the runtime's default seccomp profile, and every container and
    init container (restricted checks each, sidecars too) drops all capabilities and cannot escalate its
    privileges. A field the template sets is kept, whatever it says: the user asked otherwise. So is root:
    a template with `runAsUser: 0` anywhere gets no `runAsNonRoot`. Windows pods get only `runAsNonRoot`
    (the others are Linux-only fields the API server refuses on them). A `hostPath` volume, such as
    `checkpoint.localTier.hostPath` makes, still keeps the pod from `restricted`; nothing here changes it."""
    context = pod_spec["securityContext"] = pod_spec.get("securityContext") or {}
    if "runAsNonRoot" not in context and not _runs_as_root(pod_spec):
        context["runAsNonRoot"] = True
    if (pod_spec.get("os") or {}).get("name") == "windows":
        return pod_spec
    if "seccompProfile" not in context:
        context["seccompProfile"] = dict(RUNTIME_DEFAULT_SECCOMP)
    for kind in CONTAINER_KINDS:
        for container in pod_spec.get(kind) or []:
            _restrict_container(container)
    return pod_spec


def _trainer_index(spec: api.TrainingJobSpec) -> int:
    index = trainer_container_index(spec.template, spec.trainer_container)
    # Pods are built only from a validated spec, and validation refuses a template without the container.
    assert index is not None, f"no container {spec.trainer_container!r} in a validated template"
    return index


def build_worker_pod(
    job: dict[str, Any],
    spec: api.TrainingJobSpec,
    index: int,
    role: names.Role,
    near: tuple[str, str] | None = None,
    avoid: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Worker or spare pod number `index`: the user's template with the launcher, contract env, DNS name,
    checkpoint volume, topology hints and gang-scheduler metadata added.

    `near`: (node label, value) of a domain the pod prefers (a spare standing in for a failed worker
    prefers that worker's domain). `avoid`: nodes the pod may not be scheduled onto (lost ones)."""
    job_name = job["metadata"]["name"]
    template = plain_copy(spec.template)
    template_meta = template.get("metadata") or {}
    pod_spec = template["spec"]
    group_labels, group_annotations = gang.pod_group_metadata(job_name, spec)
    name = names.worker_pod_name(job_name, index)
    labels = {
        **(template_meta.get("labels") or {}),
        **group_labels,
        names.LABEL_COMPONENT: names.COMPONENT_TRAINER,
        names.LABEL_ROLE: role,
        names.LABEL_INDEX: str(index),
    }
    metadata = _meta(job, name, labels)
    annotations = {**(template_meta.get("annotations") or {}), **group_annotations}
    if annotations:
        metadata["annotations"] = annotations

    trainer = pod_spec["containers"][_trainer_index(spec)]
    own_shm = _mounts_shared_memory(trainer)
    volumes = _trainer_volumes(job_name, spec, own_shm)
    _wrap_trainer(trainer, contract_env(job, spec, role), volumes, spec)
    _add_volumes(pod_spec, volumes)
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = names.workers_service_name(job_name)
    # The operator replaces failed pods itself (with a spare first); the kubelet must not restart them.
    pod_spec["restartPolicy"] = "Never"
    restrict_pod_spec(pod_spec)
    pod_spec.setdefault("serviceAccountName", names.worker_account_name(job_name))
    if gang.scheduler_name(spec) and not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = gang.scheduler_name(spec)
    # `pod_spec` is this pod's own copy of the template's: the hints go straight into it.
    topology.add_topology(pod_spec, job_name, spec.topology)
    if near is not None:
        topology.add_domain_preference(pod_spec, *near)
    topology.add_node_exclusions(pod_spec, avoid)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_rendezvous_pod(
    job: dict[str, Any], spec: api.TrainingJobSpec, avoid: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The rendezvous store's own pod: no worker's death can take the rendezvous down with it. `avoid`:
    nodes it may not be scheduled onto (lost ones)."""
    job_name = job["metadata"]["name"]
    template_spec = spec.template["spec"]
    trainer = template_spec["containers"][_trainer_index(spec)]
    port = spec.rendezvous.port
    container: dict[str, Any] = {
        "name": names.RENDEZVOUS_CONTAINER,
        "image": spec.rendezvous.image or trainer["image"],
        # $(POD_IP) is expanded by the kubelet: the store binds to the pod's own address.
        "command": [*RENDEZVOUS_SERVER, "--host", "$(POD_IP)", "--port", str(port)],
        "env": [
            _field_env("POD_IP", "status.podIP"),
            {"name": "PHALANX_STORE_SECRET_FILE", "value": names.STORE_SECRET_FILE},
        ],
        "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}],
        "resources": {
            kind: dict(amounts) for kind, amounts in spec.rendezvous.resources.model_dump().items() if amounts
        },
    }
    if trainer.get("imagePullPolicy"):
        container["imagePullPolicy"] = trainer["imagePullPolicy"]
    identity = {
        key: value
        for key, value in (trainer.get("securityContext") or {}).items()
        if key in TRAINER_IDENTITY and not spec.rendezvous.image
    }
    if identity:
        # The trainer's image, run as the trainer is: a root image the template lets run as root still runs.
        container["securityContext"] = plain_copy(identity)
    secret = [store_secret_volume(job_name)]
    _mount(container, secret)
    containers = [container]
    hub = spec.heartbeat_reporting == "hub"
    if hub:
        containers.append(_heartbeat_hub(job, spec, container, secret))
    pod_spec: dict[str, Any] = {
        "containers": containers,
        "volumes": [volume for volume, _ in secret],
        # In place restarts keep the pod (and its DNS name); the operator recreates it when it is deleted.
        "restartPolicy": "Always",
        "serviceAccountName": names.worker_account_name(job_name),
        # Only the heartbeat hub talks to the API server (its summary Lease, the one the account's admission
        # policy lets this pod write).
        "automountServiceAccountToken": hub,
    }
    for key in ("nodeSelector", "tolerations", "imagePullSecrets", "securityContext", "priorityClassName"):
        if template_spec.get(key):
            pod_spec[key] = plain_copy(template_spec[key])
    restrict_pod_spec(pod_spec)
    labels = {names.LABEL_COMPONENT: names.COMPONENT_RENDEZVOUS, names.LABEL_ROLE: names.ROLE_RENDEZVOUS}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, names.rendezvous_name(job_name), labels),
        "spec": topology.avoid_nodes(pod_spec, avoid),
    }


def _heartbeat_hub(
    job: dict[str, Any],
    spec: api.TrainingJobSpec,
    store: dict[str, Any],
    secret: list[tuple[dict[str, Any], str]],
) -> dict[str, Any]:
    """The heartbeat hub beside the store (worker/beathub.py): its own container, so that its failure is not the
    store's; it reaches the store through the gate, as any of the job's clients."""
    job_name = job["metadata"]["name"]
    heartbeat = spec.heartbeat
    hub: dict[str, Any] = {
        "name": names.HEARTBEAT_HUB_CONTAINER,
        "image": store["image"],
        "command": [
            *HEARTBEAT_HUB,
            "--store",
            f"$(POD_IP):{spec.rendezvous.port}",
            "--job",
            job_name,
            "--interval",
            f"{heartbeat.interval_seconds:g}",
            "--timeout",
            str(heartbeat.timeout_seconds),
        ],
        "env": [
            *plain_copy(DOWNWARD_ENV),
            {"name": "PHALANX_STORE_SECRET_FILE", "value": names.STORE_SECRET_FILE},
        ],
        "resources": plain_copy(store.get("resources") or {}),
    }
    for key in ("imagePullPolicy", "securityContext"):
        if store.get(key):
            hub[key] = plain_copy(store[key])
    _mount(hub, secret)
    return hub


def _headless_service(
    job: dict[str, Any], name: str, selector: dict[str, str], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterIP": "None",
        "selector": selector,
        # Rendezvous and peers must resolve pods before they are Ready (they become ready by training).
        "publishNotReadyAddresses": True,
    }
    if ports:
        spec["ports"] = ports
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, name), "spec": spec}


def build_rendezvous_service(job: dict[str, Any], spec: api.TrainingJobSpec) -> dict[str, Any]:
    job_name = job["metadata"]["name"]
    selector = {names.LABEL_JOB_NAME: job_name, names.LABEL_COMPONENT: names.COMPONENT_RENDEZVOUS}
    port = spec.rendezvous.port
    ports = [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}]
    return _headless_service(job, names.rendezvous_name(job_name), selector, ports)


def build_workers_service(job: dict[str, Any]) -> dict[str, Any]:
    job_name = job["metadata"]["name"]
    return _headless_service(job, names.workers_service_name(job_name), names.trainer_selector(job_name), [])


LEASE_RULE = {
    "apiGroups": ["coordination.k8s.io"],
    "resources": ["leases"],
    "verbs": ["get", "create", "update", "patch"],
}
"""What a worker needs for its heartbeat: every Lease of the namespace (a Role cannot name Leases before they
exist), narrowed to the job's own pods' Leases by the chart's admission policy (templates/leasepolicy.yaml)."""


def build_worker_rbac(
    job: dict[str, Any], spec: api.TrainingJobSpec, lease_role: str | None = None
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding letting the job's pods write their own heartbeat Leases and
    read their own TrainingJob. `lease_role`: the chart's worker ClusterRole, which grants the Lease verbs
    (`LEASE_RULE`) through a second RoleBinding, so that the operator needs only `bind` on it, never the verbs
    themselves; None: the job's Role grants them (the operator must then hold them)."""
    job_name = job["metadata"]["name"]
    namespace = job["metadata"]["namespace"]
    name = names.worker_account_name(job_name)
    account = spec.template["spec"].get("serviceAccountName") or name
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    rules = [
        # The launcher follows its job (desired replicas after `kubectl scale`, `status.regroup` after a
        # failure) by watching it: only this job, read-only.
        {
            "apiGroups": [api.GROUP],
            "resources": [api.PLURAL],
            "resourceNames": [job_name],
            "verbs": ["get", "list", "watch"],
        },
    ]
    leases: list[dict[str, Any]] = []
    if lease_role is None:
        rules.insert(0, plain_copy(LEASE_RULE))
    else:
        leases.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _meta(job, names.worker_leases_binding_name(job_name)),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": lease_role,
                },
                "subjects": plain_copy(subjects),
            }
        )
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, name)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(job, name),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(job, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects,
        },
        *leases,
    ]


@dataclass(frozen=True)
class NetworkPolicySettings:
    """The operator's `networkPolicy` and `metricsNamespace` (operator/settings.py)."""

    metrics_namespace: str = ""
    """The namespace whose pods may reach the workers' metrics port; empty: none outside the job."""


def build_network_policy(
    job: dict[str, Any], spec: api.TrainingJobSpec, settings: NetworkPolicySettings
) -> dict[str, Any]:
    """Only the job's own pods reach its pods (its rendezvous, torch's stores and collectives, on any port),
    plus the workers' metrics port from `settings.metrics_namespace`."""
    job_name = job["metadata"]["name"]
    own = {"matchLabels": {names.LABEL_JOB_NAME: job_name}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": own}]}]
    if settings.metrics_namespace and spec.metrics_port:
        metrics_from = {"matchLabels": {"kubernetes.io/metadata.name": settings.metrics_namespace}}
        ingress.append(
            {
                "from": [{"namespaceSelector": metrics_from}],
                "ports": [{"port": spec.metrics_port, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, names.network_policy_name(job_name)),
        "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_store_secret(job: dict[str, Any]) -> dict[str, Any]:
    """The job's store secret (worker/storegate.py). It carries no value here: the value is drawn when the
    Secret is created (`kube.Kube.create`), never by a plan, and a Secret that exists is never changed."""
    name = names.store_secret_name(job["metadata"]["name"])
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(job, name), "type": "Opaque"}


def build_fixed_children(
    job: dict[str, Any],
    spec: api.TrainingJobSpec,
    network: NetworkPolicySettings | None = None,
    lease_role: str | None = None,
) -> list[dict[str, Any]]:
    """Children that exist once per job whatever its state (before any pod): RBAC (`lease_role`: see
    `build_worker_rbac`), the store secret, Services, PodGroup, and the NetworkPolicy when the operator makes
    one (`network`)."""
    children = [
        *build_worker_rbac(job, spec, lease_role),
        build_store_secret(job),
        build_rendezvous_service(job, spec),
        build_workers_service(job),
    ]
    if network is not None:
        children.append(build_network_policy(job, spec, network))
    pod_group = gang.build_pod_group(job, spec)
    if pod_group is not None:
        children.append(pod_group)
    return children
