"""Pack and Spread affinity shapes, required vs preferred, merged with the user's own."""

from __future__ import annotations

from phalanx.operator import api
from phalanx.operator.topology import (
    apply_topology,
    avoid_nodes,
    avoided_nodes,
    domain_key,
    prefer_domain,
    zone_of,
)

SELECTOR = {"matchLabels": {"phalanx.dev/job-name": "demo", "phalanx.dev/component": "trainer"}}


def test_pack_required_is_a_hard_pod_affinity_on_the_key() -> None:
    spec = apply_topology({}, "demo", api.TopologySpec(key="rack", policy="Pack", required=True))
    terms = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"labelSelector": SELECTOR, "topologyKey": "rack"}]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["podAffinity"]


def test_pack_preferred_is_a_weighted_preference() -> None:
    spec = apply_topology({}, "demo", api.TopologySpec(policy="Pack"))
    (term,) = spec["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"]["topologyKey"] == "topology.kubernetes.io/zone"


def test_spread_uses_topology_spread_constraints() -> None:
    hard = apply_topology({}, "demo", api.TopologySpec(policy="Spread", required=True))
    soft = apply_topology({}, "demo", api.TopologySpec(policy="Spread"))
    (constraint,) = hard["topologySpreadConstraints"]
    assert constraint["maxSkew"] == 1 and constraint["whenUnsatisfiable"] == "DoNotSchedule"
    assert constraint["labelSelector"] == SELECTOR
    assert soft["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    assert "affinity" not in hard


def test_spread_leaves_out_a_constraint_the_template_already_has_for_the_key() -> None:
    # The API server refuses two spread constraints with the same topology key and whenUnsatisfiable.
    users = {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "ml"}},
    }
    spec = apply_topology(
        {"topologySpreadConstraints": [users]}, "demo", api.TopologySpec(policy="Spread", required=True)
    )
    assert spec["topologySpreadConstraints"] == [users]
    soft = apply_topology({"topologySpreadConstraints": [users]}, "demo", api.TopologySpec(policy="Spread"))
    assert [c["whenUnsatisfiable"] for c in soft["topologySpreadConstraints"]] == [
        "DoNotSchedule",
        "ScheduleAnyway",
    ]


def test_users_affinity_is_kept_and_extended() -> None:
    user_term = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    pod_spec = {
        "affinity": {
            "nodeAffinity": node_affinity,
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [user_term]},
        }
    }
    merged = apply_topology(pod_spec, "demo", api.TopologySpec(key="rack", required=True))
    terms = merged["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0] == user_term and terms[1]["topologyKey"] == "rack"
    assert merged["affinity"]["nodeAffinity"] == node_affinity
    assert len(pod_spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]) == 1


def test_no_topology_changes_nothing() -> None:
    assert apply_topology({"containers": []}, "demo", None) == {"containers": []}


def test_zone_of_reads_the_topology_key() -> None:
    labels = {"topology.kubernetes.io/zone": "z1", "rack": "r7"}
    assert zone_of(labels, None) == "z1"
    assert zone_of(labels, api.TopologySpec(key="rack")) == "r7"
    assert zone_of(None, None) is None


def test_prefer_domain_adds_a_node_preference_next_to_the_users_affinity() -> None:
    user_node = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"x": 1}]}}
    packed = apply_topology({"affinity": {"nodeAffinity": user_node}}, "demo", api.TopologySpec(key="rack"))
    spec = prefer_domain(packed, "rack", "r7")
    node_affinity = spec["affinity"]["nodeAffinity"]
    assert (
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        == user_node["requiredDuringSchedulingIgnoredDuringExecution"]
    )
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 100,
            "preference": {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r7"]}]},
        }
    ]
    # The pack affinity stays, and the input is not changed.
    assert spec["affinity"]["podAffinity"] == packed["affinity"]["podAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in packed["affinity"]["nodeAffinity"]


def test_domain_key_is_the_topology_key_else_the_zone() -> None:
    assert domain_key(None) == "topology.kubernetes.io/zone"
    assert domain_key(api.TopologySpec(key="rack")) == "rack"


def test_avoiding_nodes_joins_every_required_term_of_the_users() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]},
    ]
    user = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}
    user["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] = user_terms
    spec = avoid_nodes(user, frozenset({"node-b", "node-a"}))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # The API server takes one value per field requirement: one NotIn per node, all in every term.
    exclusions = [
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]},
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]},
    ]
    assert [term["matchFields"] for term in terms] == [exclusions, exclusions]
    assert [term["matchExpressions"] for term in terms] == [t["matchExpressions"] for t in user_terms]
    assert "matchFields" not in user_terms[0]  # the template is not changed
    assert avoided_nodes(spec) == {"node-a", "node-b"}


def test_every_field_requirement_holds_one_value_and_the_users_own_stay() -> None:
    user_field = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    user = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [user_field]}]
                }
            }
        }
    }
    spec = avoid_nodes(user, frozenset({"node-c", "node-b", "node-d"}))
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"][0] == user_field
    assert all(len(field["values"]) == 1 for field in term["matchFields"])
    assert avoided_nodes(spec) == {"node-b", "node-c", "node-d"}


def test_avoiding_no_node_adds_nothing() -> None:
    assert avoid_nodes({"containers": []}, frozenset()) == {"containers": []}
    alone = avoid_nodes({}, frozenset({"node-b"}))
    (term,) = alone["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}
    assert avoided_nodes({}) == frozenset() and avoided_nodes(alone) == {"node-b"}
