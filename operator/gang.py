"""All-or-nothing gang scheduling (pure functions).

Without a gang scheduler (`gang.podGroup: None`) the operator enforces it itself. Every pod of a gang being
formed (workers, spares and the rendezvous) is created behind a scheduling gate, and the gates are lifted
together once all of them exist: the scheduler binds no pod of a gang that could not be created whole (a
refused creation, the operator stopped half-way). If every pod of the gang is not bound to a node within
`scheduleTimeoutSeconds`, all of them are deleted so no partial gang holds capacity, and a new attempt starts
after an exponential backoff. With a gang scheduler,
the operator only labels the pods (and creates the PodGroup) the way that scheduler expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from phalanx.operator import api, names
from phalanx.operator.timeutil import parse_time

GangAction = Literal["Scheduled", "Wait", "DeleteAll"]

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"


@dataclass(frozen=True)
class GangDecision:
    """What to do with the gang now, and why (reason and message feed the GangScheduled condition)."""

    action: GangAction
    reason: str
    message: str
    retry_after: datetime | None = None


SCHEDULING_GATE = "phalanx.dev/gang"
"""The scheduling gate a forming gang's pods are created behind (Kubernetes 1.30+: `spec.schedulingGates`)."""


def gated(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` (a manifest about to be created) behind the gang's scheduling gate."""
    free = ungated(pod)
    spec = free["spec"]
    return {
        **free,
        "spec": {**spec, "schedulingGates": [*spec["schedulingGates"], {"name": SCHEDULING_GATE}]},
    }


def ungated(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` without the gang's scheduling gate (any other gate kept)."""
    spec = pod.get("spec") or {}
    gates = [gate for gate in spec.get("schedulingGates") or [] if gate.get("name") != SCHEDULING_GATE]
    return {**pod, "spec": {**spec, "schedulingGates": gates}}


def is_gated(pod: dict[str, Any]) -> bool:
    """Whether the pod still waits at the gang's scheduling gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == SCHEDULING_GATE for gate in gates)


def is_whole(members: list[dict[str, Any]], expected: int, rendezvous: list[dict[str, Any]]) -> bool:
    """Whether every pod of the gang exists: `expected` workers and spares (`members`, none leaving) and the
    rendezvous pod."""
    return len(members) >= expected and bool(rendezvous)


def to_ungate(members: list[dict[str, Any]], expected: int, rendezvous: list[dict[str, Any]]) -> list[str]:
    """The gang's pods to release from the gate: all of them once the gang is whole; none before."""
    if not is_whole(members, expected, rendezvous):
        return []
    return [pod["metadata"]["name"] for pod in [*rendezvous, *members] if is_gated(pod)]


def is_scheduled(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def is_unschedulable(pod: dict[str, Any]) -> bool:
    """Whether the scheduler found no node for the pod (so far)."""
    return not is_scheduled(pod) and any(
        condition.get("type") == "PodScheduled"
        and condition.get("status") == "False"
        and condition.get("reason") == "Unschedulable"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )


def _unschedulable_message(pods: list[dict[str, Any]]) -> str:
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                text = condition.get("message") or condition.get("reason")
                if text:
                    return f" (scheduler: {text})"
    return ""


def backoff_seconds(attempts: int, gang: api.GangSpec) -> int:
    """Wait before attempt number `attempts + 1`: doubles per failed attempt, capped."""
    return min(gang.backoff_seconds * 2 ** max(attempts - 1, 0), gang.max_backoff_seconds)


def decide(
    pods: list[dict[str, Any]], expected: int, gang: api.GangSpec, attempts: int, now: datetime
) -> GangDecision:
    """Judge the gang's live pods (workers and spares, none terminating) against the timeout."""
    scheduled = [pod for pod in pods if is_scheduled(pod)]
    if len(pods) >= expected and len(scheduled) == len(pods):
        return GangDecision("Scheduled", "AllScheduled", f"all {len(pods)} pods of the gang are scheduled")
    created = [parse_time(pod["metadata"].get("creationTimestamp")) for pod in pods]
    oldest = min((time for time in created if time is not None), default=now)
    waited = (now - oldest).total_seconds()
    summary = f"{len(scheduled)} of {expected} pods of the gang scheduled"
    if pods and waited >= gang.schedule_timeout_seconds:
        pending = [pod for pod in pods if not is_scheduled(pod)]
        delay = backoff_seconds(attempts + 1, gang)
        message = (
            f"{summary} after {gang.schedule_timeout_seconds}s{_unschedulable_message(pending)}; "
            f"deleted all and retrying in {delay}s"
        )
        return GangDecision("DeleteAll", "ScheduleTimeout", message, now + timedelta(seconds=delay))
    return GangDecision(
        "Wait", "Scheduling", f"{summary} ({int(waited)}s of {gang.schedule_timeout_seconds}s)"
    )


# ------------------------------------------------------------------------------ gang scheduler integrations


def pod_group_metadata(job_name: str, spec: api.TrainingJobSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations a worker pod needs for the configured gang scheduler."""
    gang = spec.gang
    group = names.pod_group_name(job_name)
    if gang.pod_group == "Coscheduling":
        return {COSCHEDULING_LABEL: group}, {}
    if gang.pod_group == "Volcano":
        return {}, {VOLCANO_ANNOTATION: group}
    if gang.pod_group == "Kueue":
        labels = {KUEUE_GROUP_LABEL: group}
        if gang.queue_name:
            labels[KUEUE_QUEUE_LABEL] = gang.queue_name
        return labels, {KUEUE_TOTAL_ANNOTATION: str(spec.replicas + spec.spares)}
    return {}, {}


def scheduler_name(spec: api.TrainingJobSpec) -> str | None:
    """Scheduler the pods must name, when the integration requires one and the template names none."""
    return VOLCANO_SCHEDULER if spec.gang.pod_group == "Volcano" else None


def build_pod_group(job: dict[str, Any], spec: api.TrainingJobSpec) -> dict[str, Any] | None:
    """The PodGroup object of Coscheduling or Volcano (None for the others)."""
    meta = job["metadata"]
    members = spec.replicas + spec.spares
    metadata = {
        "name": names.pod_group_name(meta["name"]),
        "namespace": meta["namespace"],
        "labels": names.job_labels(meta["name"]),
        "ownerReferences": [names.owner_reference(job)],
    }
    if spec.gang.pod_group == "Coscheduling":
        return {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": metadata,
            "spec": {"minMember": members, "scheduleTimeoutSeconds": spec.gang.schedule_timeout_seconds},
        }
    if spec.gang.pod_group == "Volcano":
        group_spec: dict[str, Any] = {"minMember": members}
        if spec.gang.queue_name:
            group_spec["queue"] = spec.gang.queue_name
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": metadata,
            "spec": group_spec,
        }
    return None
