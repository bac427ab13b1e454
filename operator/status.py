"""Observed state of a job's pods and heartbeats, summarised for its status (pure functions).

Pods reach these functions as the small summaries kept by the operator's pod index (`summarize_pod`), so
memory stays small with many jobs.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from phalanx import beatsummary, contract
from phalanx.operator import api, capacity, names, topology
from phalanx.operator.timeutil import parse_time

FINISHED_PHASES = ("Succeeded", "Failed")
LEASE_ANNOTATION_PREFIX = contract.LEASE_ANNOTATION_PREFIX
TERMINATION_MESSAGE_CHARS = 1024
"""What the operator keeps of a container's termination message (it goes into conditions and Events)."""


CONTROLLER_UID = "controllerUid"
"""In a pod's summary: the uid of the object its controller ownerReference names (None: no controller)."""


def controller_reference(meta: dict[str, Any]) -> dict[str, Any] | None:
    """An object's ownerReference with `controller: true`, if any."""
    return next(
        (ref for ref in meta.get("ownerReferences") or [] if isinstance(ref, dict) and ref.get("controller")),
        None,
    )


def controller_uid(meta: dict[str, Any]) -> str | None:
    """The uid of an object's controller, if any."""
    uid = (controller_reference(meta) or {}).get("uid")
    return str(uid) if uid else None


def owned_by(pod: dict[str, Any], uid: str | None) -> bool:
    """Whether a summarized pod is the job's with `uid`: claimed by its controller ownerReference, never by
    its labels alone."""
    return uid is not None and (pod.get("metadata") or {}).get(CONTROLLER_UID) == uid


def summarize_pod(body: dict[str, Any]) -> dict[str, Any]:
    """The fields of a pod the operator decides on (kept in the pod index)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    containers = []
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        entry: dict[str, Any] = {"name": container.get("name"), "ready": bool(container.get("ready"))}
        if terminated:
            entry["terminated"] = {
                "exitCode": terminated.get("exitCode"),
                "reason": terminated.get("reason"),
                # When the failure happened (a regroup asks only groups older than that to re-form).
                "finishedAt": terminated.get("finishedAt"),
            }
            if terminated.get("message"):
                # The launcher's own words on why it stopped (its termination message, worker/termination.py).
                entry["terminated"]["message"] = str(terminated["message"])[:TERMINATION_MESSAGE_CHARS]
        if container.get("restartCount"):
            entry["restartCount"] = container["restartCount"]
            last = (container.get("lastState") or {}).get("terminated") or {}
            entry["lastExitCode"] = last.get("exitCode")
            entry["lastFinishedAt"] = last.get("finishedAt")
        containers.append(entry)
    return {
        "metadata": {
            **{
                key: meta.get(key)
                for key in ("name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp")
                if meta.get(key) is not None
            },
            # Whose pod it is: the job label alone can be set by anyone who can create pods.
            CONTROLLER_UID: controller_uid(meta),
        },
        "spec": {
            key: value
            for key, value in (
                ("nodeName", spec.get("nodeName")),
                ("avoidNodes", sorted(topology.avoided_nodes(spec))),
                # A forming gang's pods wait at the scheduling gate until the operator lifts it.
                (
                    "schedulingGates",
                    [{"name": gate.get("name")} for gate in spec.get("schedulingGates") or []],
                ),
                # What the pod holds on its node, for other jobs' capacity checks.
                (
                    "requests",
                    {
                        name: str(amount)
                        for name, amount in capacity.pod_requests(spec).items()
                        if name != capacity.PODS
                    },
                ),
            )
            if value
        },
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "podIP": status.get("podIP"),
            "conditions": [
                {
                    key: condition.get(key)
                    for key in ("type", "status", "reason", "message", "lastTransitionTime")
                }
                for condition in status.get("conditions") or []
            ],
            "containerStatuses": containers,
        },
    }


MAX_LEASE_VALUE = beatsummary.MAX_LEASE_VALUE
MAX_LEASE_SUMMARY = beatsummary.MAX_LEASE_SUMMARY
summarize_lease = beatsummary.lease_summary
"""Heartbeat fields of a worker's Lease (`beatsummary.lease_summary`: a launcher's beat is the same)."""


SKIPPED_ANNOTATION = "checkpoint-skipped"
"""A worker's Lease annotation (without the prefix) naming the checkpoints its latest restore passed over."""
MAX_SKIPPED_PER_LEASE = 16
"""Entries read from one Lease at most (the worker sends 8): a bigger one is not the worker's."""
MAX_SKIPPED_MESSAGE = 160


def skipped_checkpoints(lease: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The checkpoints a worker's latest restore passed over, from its heartbeat (`checkpoint-skipped`: a JSON
    list of `{step, tier, reason, message}`); what does not parse as such is left out."""
    text = (lease or {}).get(SKIPPED_ANNOTATION)
    if not text:
        return []
    try:
        raw = json.loads(text)
    except (TypeError, ValueError):
        return []
    found = []
    for item in (raw if isinstance(raw, list) else [])[:MAX_SKIPPED_PER_LEASE]:
        if not isinstance(item, dict):
            continue
        step, tier, reason = item.get("step"), item.get("tier"), item.get("reason")
        message = item.get("message")
        valid_step = isinstance(step, int) and not isinstance(step, bool) and step >= 0
        if valid_step and isinstance(tier, str) and isinstance(reason, str) and tier and reason:
            found.append(
                {
                    "step": step,
                    "tier": tier[:32],
                    "reason": reason[:64],
                    "message": str(message or "")[:MAX_SKIPPED_MESSAGE],
                }
            )
    return found


def summarize_node(body: dict[str, Any]) -> dict[str, Any]:
    """What the operator needs of a node: its labels, its Ready status (and since when the node last said
    so), and its NoExecute taints (and since when)."""
    meta = body.get("metadata") or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    no_execute = [
        taint for taint in (body.get("spec") or {}).get("taints") or [] if taint.get("effect") == "NoExecute"
    ]
    added = sorted(taint["timeAdded"] for taint in no_execute if taint.get("timeAdded"))
    return {
        "labels": dict(meta.get("labels") or {}),
        "ready": ready.get("status"),
        "readyHeartbeat": ready.get("lastHeartbeatTime"),
        "readySince": ready.get("lastTransitionTime"),
        "noExecute": [taint.get("key") for taint in no_execute],
        "noExecuteSince": added[0] if added else None,
        "drillCrash": (meta.get("annotations") or {}).get(DRILL_CRASH_ANNOTATION),
        # What the gang capacity check needs (`capacity.gang_fit`).
        "allocatable": dict((body.get("status") or {}).get("allocatable") or {}),
        "unschedulable": bool((body.get("spec") or {}).get("unschedulable")),
        "taints": [
            {key: taint.get(key) for key in ("key", "value", "effect")}
            for taint in (body.get("spec") or {}).get("taints") or []
            if taint.get("effect") in capacity.SCHEDULE_EFFECTS
        ],
    }


DRILL_CRASH_ANNOTATION = "phalanx.dev/drill-crash"
"""On a node, `<namespace>/<job>`: `phalanx drill --crash-node` takes the node away from that job only."""


def node_for_job(summary: dict[str, Any], namespace: str, job: str, drills_allowed: bool) -> dict[str, Any]:
    """A node's summary as one job sees it: `drill` is set when a drill took the node away from this job,
    and only when the job allows drills (`spec.drills.allowed`): whoever may annotate nodes must not be able
    to take one away from a job that never agreed to drills."""
    return {**summary, "drill": drills_allowed and summary.get("drillCrash") == f"{namespace}/{job}"}


# Heartbeat fields whose change the operator acts on at once (roles, group changes, resumption, the
# launcher's verdict on its training processes). The step,
# timings and the renew time move with every heartbeat and are left to the periodic reconcile.
SIGNAL_FIELDS = (
    "phase",
    "rank",
    "world-size",
    "group-started",
    "group-restarts",
    "resumed-at",
    "restored-step",
    "restore-source",
    SKIPPED_ANNOTATION,
    "preflight",
    "fault",
    "ownerUid",
)


# A worker in a group flips between these with every step it snapshots: one state as far as waking goes.
IN_GROUP_PHASES = contract.IN_GROUP_PHASES


def heartbeat_signal(summary: dict[str, Any]) -> tuple[str | None, ...]:
    """The part of a Lease summary that should wake its job's reconcile when it changes."""
    values = {key: summary.get(key) or None for key in SIGNAL_FIELDS}
    if values["phase"] in IN_GROUP_PHASES:
        values["phase"] = "in-group"
    return tuple(values.values())


def pod_name(pod: dict[str, Any]) -> str:
    return pod["metadata"]["name"]


def label(pod: dict[str, Any], key: str) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(key)


def role(pod: dict[str, Any]) -> str | None:
    return label(pod, names.LABEL_ROLE)


def index(pod: dict[str, Any]) -> int:
    try:
        return int(label(pod, names.LABEL_INDEX) or -1)
    except ValueError:
        return -1


def phase(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("phase")


def is_terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_trainer(pod: dict[str, Any]) -> bool:
    return label(pod, names.LABEL_COMPONENT) == names.COMPONENT_TRAINER


def is_rendezvous(pod: dict[str, Any]) -> bool:
    return label(pod, names.LABEL_COMPONENT) == names.COMPONENT_RENDEZVOUS


def container_status(pod: dict[str, Any], container_name: str) -> dict[str, Any]:
    """The pod's status of the named container ({} before the kubelet reports it)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == container_name:
            return container
    return {}


def exit_code_of(container: dict[str, Any], pod_phase: str | None) -> int | None:
    """The exit code of a container (its `container_status`) once it has terminated, 0 for any container of a
    pod that succeeded, else None (it runs)."""
    terminated = container.get("terminated")
    if terminated:
        code = terminated.get("exitCode")
        return int(code) if code is not None else None
    return 0 if pod_phase == "Succeeded" else None


def trainer_exit_code(pod: dict[str, Any], trainer_name: str) -> int | None:
    """Exit code of the trainer container once it has terminated (None while it runs)."""
    return exit_code_of(container_status(pod, trainer_name), phase(pod))


def is_live(pod: dict[str, Any], trainer_name: str | None = None) -> bool:
    """Exists, is not being deleted and has not finished (its trainer is still running)."""
    if is_terminating(pod) or phase(pod) in FINISHED_PHASES:
        return False
    return trainer_name is None or trainer_exit_code(pod, trainer_name) is None


def is_running(pod: dict[str, Any]) -> bool:
    return phase(pod) == "Running" and not is_terminating(pod)


def _lease_int(lease: dict[str, Any] | None, key: str) -> int | None:
    try:
        return int(float((lease or {})[key]))
    except (KeyError, TypeError, ValueError):
        return None


def latest_step(trainers: list[dict[str, Any]], leases: dict[str, dict[str, Any]]) -> int | None:
    """Highest step reported by the job's workers' heartbeats."""
    steps = [_lease_int(leases.get(pod_name(pod)), "step") for pod in trainers]
    known = [step for step in steps if step is not None]
    return max(known) if known else None


ACTIVE_PHASES = (*contract.IN_GROUP_PHASES, contract.PHASE_FINISHED)
JOINING_PHASE = contract.PHASE_RENDEZVOUS
"""The heartbeat phase of a launcher joining a round (not standing by: the round has room for it)."""

PROGRESS_REPORTED = "Reported"
PROGRESS_UNKNOWN = "Unknown"


def progress_kind(
    trainers: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    step: int | None,
    previous: str | None,
    now: datetime,
    window_seconds: float,
) -> str | None:
    """Whether the job's progress is known: `Reported` once any step was seen, `Unknown` once a worker has
    trained for `window_seconds` (the progress timeout) since its group started without a step ever published
    (a script that does not use StatusPublisher), else what it was.

    Before the window a worker in training without a step is only slow to its first one (a model being built
    or compiled): a script that publishes steps publishes one within the progress timeout, or it is hung."""
    if step is not None:
        return PROGRESS_REPORTED
    for pod in trainers:
        lease = leases.get(pod_name(pod)) or {}
        if lease.get("phase") not in ACTIVE_PHASES:
            continue
        started = parse_time(lease.get("group-started")) or parse_time(lease.get("phase-since"))
        if started is not None and (now - started).total_seconds() >= window_seconds:
            return PROGRESS_UNKNOWN
    return previous


def observed_role(pod: dict[str, Any], lease: dict[str, Any] | None) -> str:
    """The role the worker really plays: torch promotes a standby on its own, ahead of the pod's label."""
    heartbeat_phase = (lease or {}).get("phase")
    if heartbeat_phase == contract.PHASE_STANDBY:
        return names.ROLE_SPARE
    if heartbeat_phase in ACTIVE_PHASES:
        return names.ROLE_WORKER
    return role(pod) or names.ROLE_WORKER


def standing_by(pod: dict[str, Any], lease: dict[str, Any] | None) -> bool:
    """Whether the pod is a spare standing by, so that losing it disrupts no training. A spare whose launcher
    left standby (heartbeat phase `rendezvous`: it is joining a round that has room for it) is being promoted
    into a group that waits for it, whatever its label still says: its loss is a worker's."""
    if (lease or {}).get("phase") == JOINING_PHASE:
        return False
    return observed_role(pod, lease) == names.ROLE_SPARE


MAX_LISTED_WORKERS = 64
"""Pods `status.workers` lists at most, whatever the gang's size (a 12,500-pod list alone would pass etcd's
limit on an object): every pod's detail is on the pod itself (`kubectl get pods -l phalanx.dev/job-name=...`)."""


def worker_statuses(
    trainers: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    node_labels: dict[str, dict[str, str]],
    topology_spec: api.TopologySpec | None,
) -> tuple[list[api.WorkerStatus], int | None]:
    """Where each worker and spare runs, in index order, and how many were left out: at most
    `MAX_LISTED_WORKERS`, those not running first, then the spares, then the lowest indices (None: none left out)."""
    ordered = sorted(trainers, key=index)
    listed = ordered
    if len(ordered) > MAX_LISTED_WORKERS:
        # Only the listed pods become models: a 12,500-pod gang's status lists 64.
        order = sorted(
            range(len(ordered)),
            key=lambda at: (
                phase(ordered[at]) == "Running",
                observed_role(ordered[at], leases.get(pod_name(ordered[at]))) != names.ROLE_SPARE,
                at,
            ),
        )
        listed = [ordered[at] for at in sorted(order[:MAX_LISTED_WORKERS])]
    result = []
    for pod in listed:
        node = (pod.get("spec") or {}).get("nodeName")
        result.append(
            api.WorkerStatus(
                name=pod_name(pod),
                node=node,
                zone=topology.zone_of(node_labels.get(node or ""), topology_spec),
                rank=_lease_int(leases.get(pod_name(pod)), "rank"),
                role=observed_role(pod, leases.get(pod_name(pod))),
                phase=phase(pod),
            )
        )
    return result, (len(ordered) - len(listed)) or None


def replica_counts(desired: int, trainers: list[dict[str, Any]], trainer_name: str) -> api.ReplicaCounts:
    active = ready = spares = 0
    for pod in trainers:
        pod_role = role(pod)
        if pod_role not in (names.ROLE_WORKER, names.ROLE_SPARE) or is_terminating(pod):
            continue
        # `is_live` and `is_running`, with the phase read once.
        pod_phase = phase(pod)
        if pod_phase in FINISHED_PHASES or trainer_exit_code(pod, trainer_name) is not None:
            continue
        running = pod_phase == "Running"
        if pod_role == names.ROLE_WORKER:
            active += 1
            ready += running
        else:
            spares += running
    return api.ReplicaCounts(desired=desired, active=active, ready=ready, spares=spares)
