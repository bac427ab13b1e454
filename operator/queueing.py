"""Kueue's job contract for a TrainingJob labelled `kueue.x-k8s.io/queue-name` (pure functions).

Phalanx is the TrainingJob's job controller in Kueue's sense: an external framework, named
`TrainingJob.v1alpha1.phalanx.dev` in Kueue's `integrations.externalFrameworks`. It does for a TrainingJob what
Kueue's own job framework (`pkg/controller/jobframework/reconciler.go`) does for a batch Job:

- creates the job's Workload: one pod set per role (`workers`, spares included, and `rendezvous`) with the pod
  templates and requests Phalanx will create, the queue from the label, the priority from the job's
  WorkloadPriorityClass label or its template's PriorityClass;
- runs no pod until Kueue admits the Workload, then builds the pods on the admitted flavors (their node labels
  as node selectors, their tolerations);
- when Kueue evicts the Workload (preemption, deactivation, ...), deletes the pods gracefully (each worker
  saves a checkpoint on SIGTERM) and, once none is left, gives the quota back (the Workload's admission is
  cleared, `Requeued` set), so that a new admission resumes from that save;
- declares the Workload finished with the job and drops its finalizer.

The job's own `spec.suspend` stays the user's (and a training-health Pause's): suspending a queued job
deactivates its Workload, which releases its quota; resuming activates it again. A Workload someone else
deactivated stays so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from phalanx.operator import api, builders, names

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The job label that hands a TrainingJob to Kueue (the LocalQueue's name)."""
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""The job label naming a WorkloadPriorityClass."""
GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSION = "v1beta2"
WORKLOAD_API_VERSION = f"{GROUP}/{WORKLOAD_VERSION}"
"""The Workload version Phalanx writes (Kueue's storage version since v0.15)."""
FINALIZER = f"{GROUP}/resource-in-use"
"""Kept on the Workload while its pods may hold the quota (Kueue's own job controllers add it too)."""
JOB_UID_LABEL = f"{GROUP}/job-uid"
PODSET_LABEL = f"{GROUP}/podset"
"""The pod label naming the pod set it was admitted in."""
DEACTIVATED_ANNOTATION = "phalanx.dev/deactivated-by-suspend"
"""On a Workload Phalanx deactivated because the job was suspended: resuming the job activates it again."""
WORKERS = "workers"
RENDEZVOUS = "rendezvous"
MAX_WORKLOAD_NAME = 253
HASH_LENGTH = 5
REQUEUED_AFTER = ("Preempted", "NodeFailures")
"""Eviction reasons after which Kueue sets `Requeued` to true when the quota is given back."""

# Conditions of the TrainingJob.
ADMITTED = "Admitted"
REASON_ADMITTED = "Admitted"
REASON_PENDING = "Pending"
REASON_ADMISSION_CHECKS = "WaitingForAdmissionChecks"
REASON_EVICTED = "Evicted"
REASON_WORKLOAD_FINISHED = "WorkloadFinished"
REASON_WORKLOAD_DELETED = "WorkloadDeleted"
REASON_DEACTIVATED = "Deactivated"
REASON_SCALE_NOT_ADMITTED = "ScaleNotAdmitted"
REASON_PENDING_DEACTIVATION = "PendingDeactivation"


def queue_name(job: dict[str, Any]) -> str | None:
    """The LocalQueue the job is handed to, None when Kueue does not manage it."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return value or None


def workload_name(job: dict[str, Any]) -> str:
    """Kueue's name for the job's Workload (`GetWorkloadNameForOwnerWithGVK`): `trainingjob-<name>-<hash>`, the
    hash over kind, group, name and UID, so a job recreated under the same name gets a new Workload."""
    meta = job["metadata"]
    # Kueue's own naming (sha1), not a security use.
    digest = hashlib.sha1(
        "\n".join((api.KIND, api.GROUP, meta["name"], meta.get("uid") or "")).encode()
    ).hexdigest()
    prefix = f"{api.KIND.lower()}-{meta['name']}"[: MAX_WORKLOAD_NAME - 1 - HASH_LENGTH]
    return f"{prefix}-{digest[:HASH_LENGTH]}"


def owner_job(workload: dict[str, Any]) -> str | None:
    """The name of the TrainingJob a Workload belongs to (None: another kind's)."""
    for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if (
            owner.get("kind") == api.KIND
            and owner.get("apiVersion") == api.API_VERSION
            and owner.get("controller")
        ):
            return str(owner["name"])
    return None


def _template(pod: dict[str, Any]) -> dict[str, Any]:
    """A built pod as a Workload's pod template: what Kueue weighs (requests, node selectors, tolerations,
    affinity) without what is the one pod's own (its host name)."""
    spec = {key: value for key, value in pod["spec"].items() if key != "hostname"}
    labels = {
        key: value for key, value in (pod["metadata"].get("labels") or {}).items() if key != names.LABEL_INDEX
    }
    return {"metadata": {"labels": labels}, "spec": spec}


def pod_sets(job: dict[str, Any], spec: api.TrainingJobSpec) -> list[dict[str, Any]]:
    """The Workload's pod sets: the workers with their spares, and the rendezvous pod."""
    worker = builders.build_worker_pod(job, spec, 0, names.ROLE_WORKER)
    rendezvous = builders.build_rendezvous_pod(job, spec)
    return [
        {"name": WORKERS, "count": spec.replicas + spec.spares, "template": _template(worker)},
        {"name": RENDEZVOUS, "count": 1, "template": _template(rendezvous)},
    ]


@dataclass(frozen=True)
class Priority:
    """The Workload's priority and where it came from."""

    value: int
    kind: Literal["WorkloadPriorityClass", "PriorityClass"] | None = None
    name: str | None = None

    def ref(self) -> dict[str, str] | None:
        if self.kind is None or self.name is None:
            return None
        group = GROUP if self.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
        return {"group": group, "kind": self.kind, "name": self.name}


def build_workload(job: dict[str, Any], spec: api.TrainingJobSpec, priority: Priority) -> dict[str, Any]:
    """The job's Workload as Kueue's job framework would construct it."""
    meta = job["metadata"]
    workload_spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": pod_sets(job, spec),
        "priority": priority.value,
        "active": not spec.suspend,
    }
    if (ref := priority.ref()) is not None:
        workload_spec["priorityClassRef"] = ref
    metadata: dict[str, Any] = {
        "name": workload_name(job),
        "namespace": meta["namespace"],
        "labels": {JOB_UID_LABEL: meta["uid"]},
        "finalizers": [FINALIZER],
        "ownerReferences": [names.owner_reference(job)],
    }
    if spec.suspend:
        metadata["annotations"] = {DEACTIVATED_ANNOTATION: "true"}
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": metadata,
        "spec": workload_spec,
    }


@dataclass(frozen=True)
class Placement:
    """What an admitted flavor adds to a pod set's pods."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


def placements(workload: dict[str, Any], flavors: dict[str, dict[str, Any]]) -> dict[str, Placement]:
    """Per pod set, the admitted flavors' node labels and tolerations (`podset.FromAssignment`). `flavors`:
    ResourceFlavor specs by name."""
    admission = (workload.get("status") or {}).get("admission") or {}
    result: dict[str, Placement] = {}
    for assignment in admission.get("podSetAssignments") or []:
        selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for flavor_name in dict.fromkeys((assignment.get("flavors") or {}).values()):
            flavor = flavors.get(flavor_name) or {}
            selector.update(flavor.get("nodeLabels") or {})
            tolerations.extend(t for t in flavor.get("tolerations") or [] if t not in tolerations)
        result[assignment["name"]] = Placement(selector, tuple(tolerations))
    return result


def admitted_flavors(workload: dict[str, Any] | None) -> list[str]:
    """The ResourceFlavors an admitted Workload's pod sets were given."""
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    named = (
        flavor
        for assignment in admission.get("podSetAssignments") or []
        for flavor in (assignment.get("flavors") or {}).values()
    )
    return list(dict.fromkeys(named))


def place(pod: dict[str, Any], pod_set: str, placement: Placement | None) -> dict[str, Any]:
    """A built pod on its admitted flavor: the flavor's node labels join the pod's node selector (the
    template's own keys win, as in Kueue's `podset.Merge`, which refuses a conflict instead), its tolerations
    join the pod's, and the pod is labelled with its pod set."""
    labels = {**(pod["metadata"].get("labels") or {}), PODSET_LABEL: pod_set}
    pod = {**pod, "metadata": {**pod["metadata"], "labels": labels}}
    if placement is None:
        return pod
    spec = dict(pod["spec"])
    if placement.node_selector:
        spec["nodeSelector"] = {**placement.node_selector, **(spec.get("nodeSelector") or {})}
    if placement.tolerations:
        present = list(spec.get("tolerations") or [])
        spec["tolerations"] = present + [t for t in placement.tolerations if t not in present]
    return {**pod, "spec": spec}


def _condition(workload: dict[str, Any], condition_type: str) -> dict[str, Any] | None:
    return next(
        (
            c
            for c in (workload.get("status") or {}).get("conditions") or []
            if c.get("type") == condition_type
        ),
        None,
    )


def _is_true(workload: dict[str, Any], condition_type: str) -> bool:
    condition = _condition(workload, condition_type)
    return condition is not None and condition.get("status") == "True"


def is_finished(workload: dict[str, Any]) -> bool:
    return _is_true(workload, "Finished")


def _assigned_count(workload: dict[str, Any], pod_set: str) -> int | None:
    admission = (workload.get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == pod_set:
            count = assignment.get("count")
            if count is not None:
                return int(count)
    for declared in (workload.get("spec") or {}).get("podSets") or []:
        if declared.get("name") == pod_set:
            return int(declared.get("count") or 0)
    return None


@dataclass(frozen=True)
class WorkloadOp:
    """One write to the job's Workload, carried out by the handler (`Kube.workload_*`)."""

    kind: Literal["create", "pod_sets", "activate", "deactivate", "release_quota", "finish", "drop_finalizer"]
    body: dict[str, Any] = field(default_factory=dict)
    """`create`: the Workload; `pod_sets`: the new `spec.podSets`; `release_quota`, `finish`: the new
    `status.conditions` (and `release_quota` clears `status.admission`)."""
    target: dict[str, Any] = field(default_factory=dict)
    """The metadata of the Workload as observed (name, namespace, resourceVersion, finalizers): a write is
    guarded by its resourceVersion."""


@dataclass
class Decision:
    """What Kueue's state of the Workload means for one reconcile of a queued job."""

    run: bool
    """Whether the gang may have pods now."""
    reason: str
    message: str
    ops: list[WorkloadOp] = field(default_factory=list)
    admitted: bool = False
    """The `Admitted` condition's status."""
    workers: int | None = None
    """The most active workers the admission covers (spares come out of the same pod set), when admitted."""
    placement: dict[str, Placement] = field(default_factory=dict)
    cluster_queue: str | None = None
    evicted: bool = False


def _set_condition(
    conditions: list[dict[str, Any]], condition_type: str, status: bool, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    wanted = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == condition_type), None)
    transition = (
        now if previous is None or previous.get("status") != wanted else previous["lastTransitionTime"]
    )
    updated = {
        "type": condition_type,
        "status": wanted,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": transition,
    }
    kept = [c for c in conditions if c.get("type") != condition_type]
    return [*kept, updated]


def released_conditions(workload: dict[str, Any], now: str) -> list[dict[str, Any]]:
    """The Workload's conditions once an evicted job's pods are gone and its quota is given back (Kueue's
    `UnsetQuotaReservationWithCondition` with `SetRequeuedCondition`)."""
    evicted = _condition(workload, "Evicted") or {}
    message = evicted.get("message") or "the job was stopped"
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    conditions = _set_condition(
        conditions,
        "Requeued",
        evicted.get("reason") in REQUEUED_AFTER,
        evicted.get("reason") or "Evicted",
        message,
        now,
    )
    conditions = _set_condition(conditions, "QuotaReserved", False, "Pending", message, now)
    return _set_condition(
        conditions, "Admitted", False, "NoReservation", "The workload has no reservation", now
    )


def finished_conditions(
    workload: dict[str, Any], succeeded: bool, message: str, now: str
) -> list[dict[str, Any]]:
    conditions = list((workload.get("status") or {}).get("conditions") or [])
    return _set_condition(conditions, "Finished", True, "Succeeded" if succeeded else "Failed", message, now)


def _shape(pod_sets_: list[dict[str, Any]]) -> dict[str, tuple[int, list[Any]]]:
    """What Kueue weighs of each pod set: its count and its containers' requests (a full comparison of the
    templates would see the API server's defaults as changes)."""

    def requests(pod_set: dict[str, Any]) -> list[Any]:
        spec = (pod_set.get("template") or {}).get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        return [(c.get("resources") or {}).get("requests") or {} for c in containers]

    return {str(ps.get("name")): (int(ps.get("count") or 0), requests(ps)) for ps in pod_sets_}


def decide(
    job: dict[str, Any],
    spec: api.TrainingJobSpec,
    workload: dict[str, Any] | None,
    flavors: dict[str, dict[str, Any]],
    priority: Priority,
    pods_left: bool,
    now: str,
) -> Decision:
    """The queued job's next step, from its Workload as observed (None: none exists). `pods_left`: whether any
    of the job's pods still exists (the quota is given back only once none does)."""
    queue = queue_name(job)
    if workload is None:
        return Decision(
            False,
            REASON_PENDING,
            f"waiting for Kueue: creating Workload {workload_name(job)} in LocalQueue {queue}",
            [WorkloadOp("create", build_workload(job, spec, priority))],
        )
    meta = workload["metadata"]
    name = meta["name"]
    ops: list[WorkloadOp] = []
    if (workload.get("metadata") or {}).get("deletionTimestamp"):
        if not pods_left:
            ops.append(WorkloadOp("drop_finalizer", target=meta))
        return Decision(
            False, REASON_WORKLOAD_DELETED, f"Workload {name} is being deleted; a new one follows", ops
        )
    if is_finished(workload):
        finished = _condition(workload, "Finished") or {}
        message = (
            f"Workload {name} was declared finished: {finished.get('message') or finished.get('reason')}"
        )
        return Decision(False, REASON_WORKLOAD_FINISHED, message)

    active = (workload.get("spec") or {}).get("active", True) is not False
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    if spec.suspend and active:
        ops.append(WorkloadOp("deactivate", target=meta))
    elif not spec.suspend and not active and annotations.get(DEACTIVATED_ANNOTATION):
        ops.append(WorkloadOp("activate", target=meta))

    reserved = _is_true(workload, "QuotaReserved")
    evicted = _condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True" and reserved:
        if not pods_left:
            ops.append(WorkloadOp("release_quota", {"conditions": released_conditions(workload, now)}, meta))
        message = f"Workload {name} was evicted ({evicted.get('reason')}): {evicted.get('message')}"
        return Decision(False, REASON_EVICTED, message, ops, evicted=True)

    desired = pod_sets(job, spec)
    if not reserved:
        if _shape(desired) != _shape((workload.get("spec") or {}).get("podSets") or []):
            ops.append(WorkloadOp("pod_sets", {"podSets": desired}, meta))
        if not active:
            why = "the job is suspended" if spec.suspend else "the Workload was deactivated"
            return Decision(False, REASON_DEACTIVATED, f"Workload {name} is inactive: {why}", ops)
        pending = _condition(workload, "QuotaReserved")
        if pending is not None and pending.get("message"):
            message = f"Workload {name} in LocalQueue {queue}: {pending['message']}"
            return Decision(False, str(pending.get("reason") or REASON_PENDING), message, ops)
        return Decision(False, REASON_PENDING, f"Workload {name} waits for Kueue in LocalQueue {queue}", ops)

    admission = (workload.get("status") or {}).get("admission") or {}
    cluster_queue = admission.get("clusterQueue")
    if not _is_true(workload, "Admitted"):
        message = (
            f"quota reserved in ClusterQueue {cluster_queue}; waiting for Workload {name}'s admission checks"
        )
        return Decision(False, REASON_ADMISSION_CHECKS, message, ops, cluster_queue=cluster_queue)
    if spec.suspend:
        # Deactivated just now: Kueue evicts it next, and the pods go meanwhile.
        return Decision(
            False, REASON_PENDING_DEACTIVATION, f"the job is suspended: Workload {name} is deactivated", ops
        )
    pods_admitted = _assigned_count(workload, WORKERS) or 0
    workers = max(0, pods_admitted - spec.spares)
    message = f"admitted by ClusterQueue {cluster_queue} (Workload {name})"
    reason = REASON_ADMITTED
    if spec.replicas > workers:
        reason = REASON_SCALE_NOT_ADMITTED
        message = (
            f"admitted by ClusterQueue {cluster_queue} for {workers} workers and {spec.spares} spares; "
            f"spec.replicas {spec.replicas} needs a new admission, and an admitted Workload's pod sets cannot "
            f"change: {workers} workers run (suspend and resume the job to queue it again at the new size)"
        )
    return Decision(
        True,
        reason,
        message,
        ops,
        admitted=True,
        workers=workers,
        placement=placements(workload, flavors),
        cluster_queue=cluster_queue,
    )


def finish(
    job: dict[str, Any],
    workload: dict[str, Any] | None,
    succeeded: bool,
    message: str,
    pods_left: bool,
    now: str,
) -> list[WorkloadOp]:
    """A finished job's Workload: declared finished (Kueue frees its quota), then, once the job's pods are
    gone, without its finalizer."""
    if workload is None:
        return []
    meta = workload["metadata"]
    ops: list[WorkloadOp] = []
    if not is_finished(workload):
        ops.append(
            WorkloadOp("finish", {"conditions": finished_conditions(workload, succeeded, message, now)}, meta)
        )
    elif FINALIZER in (meta.get("finalizers") or []) and not pods_left:
        # After the `finish` write is stored (each write is guarded by the version it was planned from).
        ops.append(WorkloadOp("drop_finalizer", target=meta))
    return ops
