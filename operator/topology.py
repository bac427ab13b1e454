"""Topology hints: scheduling constraints that pack the gang into one domain or spread it (pure functions).

Pack uses pod affinity to the job's own trainer pods over `topology.key`: Kubernetes lets the first pod of a
group that matches its own affinity term schedule anywhere, and every later pod (spares included, since they
carry the same labels) follows it into that domain. Spread uses topologySpreadConstraints with maxSkew 1.
A spare refilling the pool after a swap prefers the domain of the worker it stands in for (`prefer_domain`).
A pod created while a node of the job is lost must not land there (`avoid_nodes`): the operator sees the loss
seconds before the node controller taints the node, and the scheduler still counts it healthy until then.

Every shape built here is one the API server accepts: a `matchFields` requirement holds exactly one value,
and a spread constraint's (topologyKey, whenUnsatisfiable) pair may appear once per pod.
"""

from __future__ import annotations

from typing import Any

from phalanx.operator import api, names
from phalanx.operator.plaincopy import plain_copy

# The domain label when the job sets no topology.
DEFAULT_DOMAIN_KEY = "topology.kubernetes.io/zone"
# Weight of the preference for the failed worker's domain (the highest a preference may have).
DOMAIN_PREFERENCE_WEIGHT = 100


def _selector(job_name: str) -> dict[str, Any]:
    return {"matchLabels": names.trainer_selector(job_name)}


def pack_affinity(job_name: str, topology: api.TopologySpec) -> dict[str, Any]:
    """Pod affinity putting every trainer pod of the job in the same domain."""
    term = {"labelSelector": _selector(job_name), "topologyKey": topology.key}
    if topology.required:
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    weighted = {"weight": 100, "podAffinityTerm": term}
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}}


def spread_constraints(job_name: str, topology: api.TopologySpec) -> list[dict[str, Any]]:
    """Even spread of the trainer pods over the domains (at most one pod of difference)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": topology.key,
            "whenUnsatisfiable": "DoNotSchedule" if topology.required else "ScheduleAnyway",
            "labelSelector": _selector(job_name),
        }
    ]


def _merge_affinity(existing: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = plain_copy(existing)
    for kind, rules in extra.items():
        target = merged.setdefault(kind, {})
        for strength, terms in rules.items():
            target.setdefault(strength, []).extend(terms)
    return merged


def _spread_slot(constraint: dict[str, Any]) -> tuple[Any, Any]:
    return constraint.get("topologyKey"), constraint.get("whenUnsatisfiable")


def apply_topology(
    pod_spec: dict[str, Any], job_name: str, topology: api.TopologySpec | None
) -> dict[str, Any]:
    """A copy of `pod_spec` with the job's topology hints added to whatever the user already set.

    The API server refuses a pod with two spread constraints of the same topology key and
    `whenUnsatisfiable`: where the template already has one, it is kept and ours is left out."""
    result = plain_copy(pod_spec)
    add_topology(result, job_name, topology)
    return result


def add_topology(pod_spec: dict[str, Any], job_name: str, topology: api.TopologySpec | None) -> None:
    """`apply_topology` on `pod_spec` itself (one the caller owns)."""
    if topology is None:
        return
    if topology.policy == "Pack":
        pod_spec["affinity"] = _merge_affinity(
            pod_spec.get("affinity") or {}, pack_affinity(job_name, topology)
        )
    else:
        constraints = list(pod_spec.get("topologySpreadConstraints") or [])
        taken = {_spread_slot(constraint) for constraint in constraints}
        ours = [c for c in spread_constraints(job_name, topology) if _spread_slot(c) not in taken]
        pod_spec["topologySpreadConstraints"] = constraints + ours


def domain_key(topology: api.TopologySpec | None) -> str:
    """The node label whose values are the job's domains: the topology key, else the zone label."""
    return topology.key if topology is not None else DEFAULT_DOMAIN_KEY


def zone_of(node_labels: dict[str, str] | None, topology: api.TopologySpec | None) -> str | None:
    """The domain of a node: its value of the topology key (the zone label when no topology is set)."""
    return (node_labels or {}).get(domain_key(topology))


def prefer_domain(pod_spec: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """A copy of `pod_spec` preferring nodes whose label `key` is `value` (a preference, never a
    requirement: a spare elsewhere is better than none)."""
    result = plain_copy(pod_spec)
    add_domain_preference(result, key, value)
    return result


def add_domain_preference(pod_spec: dict[str, Any], key: str, value: str) -> None:
    """`prefer_domain` on `pod_spec` itself (one the caller owns)."""
    term = {
        "weight": DOMAIN_PREFERENCE_WEIGHT,
        "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]},
    }
    extra = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
    pod_spec["affinity"] = _merge_affinity(pod_spec.get("affinity") or {}, extra)


def avoid_nodes(pod_spec: dict[str, Any], nodes: frozenset[str]) -> dict[str, Any]:
    """A copy of `pod_spec` that may not be scheduled onto any of `nodes` (by node name, a requirement).

    The API server allows exactly one value in a `matchFields` requirement, so each node is a `NotIn`
    requirement of its own; the requirements of one term must all hold. Required node selector terms are
    alternatives (any one may match), so the exclusions join each of the user's terms; without any, they make
    the only term."""
    result = plain_copy(pod_spec)
    add_node_exclusions(result, nodes)
    return result


def add_node_exclusions(pod_spec: dict[str, Any], nodes: frozenset[str]) -> None:
    """`avoid_nodes` on `pod_spec` itself (one the caller owns)."""
    if not nodes:
        return
    exclusions = [{"key": "metadata.name", "operator": "NotIn", "values": [node]} for node in sorted(nodes)]
    node_affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), *exclusions]
    required["nodeSelectorTerms"] = terms


def avoided_nodes(pod_spec: dict[str, Any]) -> frozenset[str]:
    """The nodes `avoid_nodes` kept the pod off (those every required term excludes by name, whether one
    requirement names them one by one or together)."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    excluded: list[set[str]] = []
    for term in required.get("nodeSelectorTerms") or []:
        names_out: set[str] = set()
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "NotIn":
                names_out.update(field.get("values") or [])
        excluded.append(names_out)
    return frozenset(set.intersection(*excluded)) if excluded else frozenset()
