"""Whether a gang can fit the cluster's schedulable capacity at all (pure functions).

Before a gang's first pod exists, the operator counts how many pods of the gang's shape the nodes it may use
can hold: each node's allocatable pods, CPU, memory and extended resources, less what pods of other
TrainingJobs bound there request. A gang larger than that is held (`GangScheduled=False`, reason
`InsufficientCapacity`) instead of being created as thousands of pods that can never all run; the check runs
again at every reconcile, so the job starts once nodes join or other jobs end. Pods of the job itself are
never counted against it (they are the gang), and pods of other workloads are not observed: a gang that only
waits for them is left to the gang timeout (`gang.scheduleTimeoutSeconds`), as before.

Jobs that arrive together are admitted one by one: the room a job is judged against is what is left once
(1) the other jobs' pods that exist but are not bound yet are placed, with the pods of gangs being
created that the operator has not seen yet (`handlers.unseen_gang_pods`), and (2) every job ranked before it
(higher priority, then older) that waits for its gang to be placed and fits has its gang placed too
(`ClusterView.pending`, `ClusterView.earlier`). Placement is the scheduler's first fit, node by node. Each
reconcile judges from the same ranking, so whichever job's reconcile runs first, the earlier jobs get the
room; an earlier job that does not fit holds nothing, so a small later job may start before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

PODS = "pods"
SCHEDULE_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Gang:
    """A gang that waits to be placed, as another job's capacity check counts it."""

    name: str
    """`namespace/name` of its job (named in messages)."""
    pod_spec: Mapping[str, Any]
    """One of its worker pods' spec (every pod of the gang has this shape)."""
    count: int
    """Pods in the gang (workers and spares)."""


@dataclass(frozen=True)
class ClusterView:
    """The nodes and the pods bound to them, as the operator's indexes hold them."""

    nodes: Mapping[str, dict[str, Any]]
    """Node summaries (`status.summarize_node`) by node name: every node of the cluster."""
    bound: Mapping[str, list[dict[str, str]]] = field(default_factory=dict)
    """By node name, the requests (`status.pod_requests`) of the live pods of other TrainingJobs bound there."""
    pending: Sequence[Mapping[str, str]] = ()
    """The requests of other TrainingJobs' live pods not bound to a node yet: room already promised."""
    earlier: Sequence[Gang] = ()
    """The gangs of the jobs ranked before the one judged (`rank`) that wait to be placed and have no pod
    yet, in rank order: each one that fits is placed before the judged job."""


def rank(priority: int, created: str | None, namespace: str, name: str) -> tuple[int, str, str, str]:
    """The order jobs are admitted in: higher priority first, then the older, then by name."""
    return (-priority, created or "", namespace, name)


@dataclass(frozen=True)
class Fit:
    """Whether `count` pods of one shape fit the cluster, and if not, what is short."""

    fits: bool
    room: int
    """Pods of that shape the nodes the gang may use hold."""
    message: str


def _quantity(value: Any) -> Decimal:
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return Decimal(0)


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod asks of its node, as the scheduler counts it: the sum over its containers (a limit stands
    for a missing request), or the largest init container's when that is more; `pods` is always 1."""
    totals: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            totals[name] = totals.get(name, Decimal(0)) + _quantity(value)
    for container in pod_spec.get("initContainers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            totals[name] = max(totals.get(name, Decimal(0)), _quantity(value))
    totals[PODS] = Decimal(1)
    return {name: amount for name, amount in totals.items() if amount > 0}


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration.get("key") == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _excluded(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> str | None:
    """Why the gang's pods can never land on this node (None: they may)."""
    if node.get("ready") != "True":
        return "not ready"
    if node.get("unschedulable"):
        return "cordoned"
    labels = node.get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return "not matching the nodeSelector"
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.get("taints") or []:
        if taint.get("effect") in SCHEDULE_EFFECTS and not _tolerates(tolerations, taint):
            return "tainted"
    return None


def _room_on_node(
    allocatable: Mapping[str, Any], used: Mapping[str, Decimal], requests: Mapping[str, Decimal]
) -> dict[str, int]:
    """Per requested resource, how many pods of that shape the node's free share holds."""
    room = {}
    for name, amount in requests.items():
        free = _quantity(allocatable.get(name, 0)) - used.get(name, Decimal(0))
        room[name] = max(int(free // amount), 0)
    return room


def _used(bound: Iterable[Mapping[str, str]]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for requests in bound:
        for name, value in requests.items():
            totals[name] = totals.get(name, Decimal(0)) + _quantity(value)
    return totals


def _describe(amount: Decimal, resource: str) -> str:
    if resource == "memory" or resource.endswith("storage"):
        for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size:
                return f"{(amount / size).quantize(Decimal('0.01')).normalize():f}{unit} {resource}"
        return f"{amount:f} bytes of {resource}"
    return f"{amount.normalize():f} {resource}"


def _place(
    nodes: Mapping[str, dict[str, Any]],
    used: dict[str, dict[str, Decimal]],
    pod_spec: Mapping[str, Any] | None,
    requests: Mapping[str, Decimal],
    count: int,
) -> int:
    """Place up to `count` pods of one shape first-fit (nodes by name), adding their requests to `used`;
    returns how many found a node. `pod_spec` None: any ready, schedulable node will do."""
    placed = 0
    for name in sorted(nodes):
        if placed == count:
            break
        node = nodes[name]
        if _excluded(node, pod_spec or {}) is not None:
            continue
        node_used = used.setdefault(name, {})
        fits = min(_room_on_node(node.get("allocatable") or {}, node_used, requests).values(), default=0)
        take = min(fits, count - placed)
        for resource, amount in requests.items():
            node_used[resource] = node_used.get(resource, Decimal(0)) + amount * take
        placed += take
    return placed


def _promised(view: ClusterView) -> tuple[dict[str, dict[str, Decimal]], list[str]]:
    """What each node holds once the pending pods and the earlier gangs that fit are placed, and the names
    of those gangs."""
    used = {name: _used(view.bound.get(name, ())) for name in view.nodes}
    # Alike pods are placed together: one pass over the nodes for a 12,500-pod gang not bound yet, not one each.
    alike: dict[tuple[tuple[str, str], ...], int] = {}
    for pod in view.pending:
        shape = tuple(sorted(pod.items()))
        alike[shape] = alike.get(shape, 0) + 1
    for shape, count in alike.items():
        requests = {name: _quantity(value) for name, value in shape}
        _place(view.nodes, used, None, {**requests, PODS: Decimal(1)}, count)
    admitted: list[str] = []
    for gang in view.earlier:
        trial = {name: dict(amounts) for name, amounts in used.items()}
        if _place(view.nodes, trial, gang.pod_spec, pod_requests(gang.pod_spec), gang.count) == gang.count:
            used = trial
            admitted.append(gang.name)
    return used, admitted


def gang_fit(view: ClusterView, pod_spec: Mapping[str, Any], count: int) -> Fit:
    """Whether `count` pods of `pod_spec` fit the nodes they may use (ready, not cordoned, taints tolerated,
    nodeSelector matched) once the room promised to others is taken (`ClusterView.pending` and `earlier`),
    and otherwise a message naming the resources that are short."""
    if not view.nodes:
        # Nothing observed yet (an operator starting up): no judgement rather than a hold on no evidence.
        return Fit(True, 0, "no node observed: capacity not judged")
    used, admitted = _promised(view)
    requests = pod_requests(pod_spec)
    by_resource = dict.fromkeys(requests, 0)
    excluded: dict[str, int] = {}
    room = 0
    usable = 0
    for name, node in view.nodes.items():
        why = _excluded(node, pod_spec)
        if why is not None:
            excluded[why] = excluded.get(why, 0) + 1
            continue
        usable += 1
        per_resource = _room_on_node(node.get("allocatable") or {}, used.get(name, {}), requests)
        for resource, pods in per_resource.items():
            by_resource[resource] += pods
        room += min(per_resource.values(), default=0)
    if room >= count:
        return Fit(True, room, f"the cluster's schedulable nodes hold {room} pods of the gang's shape")
    left_out = ", ".join(f"{number} {why}" for why, number in sorted(excluded.items()))
    nodes = f"{usable} usable node{'s' if usable != 1 else ''}" + (f" ({left_out})" if left_out else "")
    short = [
        f"{resource}: room for {pods}"
        + (f" at {_describe(requests[resource], resource)} each" if resource != PODS else "")
        for resource, pods in sorted(by_resource.items())
        if pods < count
    ]
    shortage = "; short of " + ", ".join(short) if short and usable else ""
    promised = []
    if view.pending:
        promised.append(f"{len(view.pending)} pods of other jobs not yet bound")
    if admitted:
        promised.append("the gangs of " + ", ".join(admitted) + ", ahead of this job")
    after = f" once room is kept for {' and '.join(promised)}" if promised else ""
    return Fit(
        False,
        room,
        f"the gang needs {count} pods but the cluster's schedulable capacity holds {room}{after}: "
        f"{nodes}{shortage}",
    )
