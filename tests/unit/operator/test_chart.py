"""The Helm chart lints clean with Helm's SDK and renders what the operator needs, least privilege."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from phalanx.devcluster.binaries import KUBERNETES_VERSION
from phalanx.operator import api, builders, crd, handlers, names, viewclock

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "phalanx"
WARNING = 2


def _render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(values or {}, name="phx", namespace="phalanx-system", is_install=True)
    objects = []
    for path, text in rendered.items():
        if path.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, [o["metadata"]["name"] for o in matches]
    return matches[0]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "scope": "namespace",
            "watchNamespaces": ["a", "b"],
            "replicaCount": 2,
            "peering": {"enabled": True},
        },
        {"metrics": {"enabled": False}},
        {"replicaCount": 1, "leaderElection": {"enabled": False}},
    ],
)
def test_lint_reports_no_warning_or_error(values: dict[str, Any]) -> None:
    report = helm_python.lint(
        CHART, values, strict=True, namespace="phalanx-system", kube_version=f"v{KUBERNETES_VERSION}"
    )
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert serious == [], serious
    assert report["total_charts_linted"] == 1


def test_lint_does_report_a_broken_chart(tmp_path: Path) -> None:
    broken = tmp_path / "phalanx"
    broken.mkdir()
    (broken / "Chart.yaml").write_text("apiVersion: v2\nname: phalanx\n")  # no version
    report = helm_python.lint(broken)
    assert report["errors"] or any(m["severity"] >= WARNING for m in report["messages"])


def test_chart_crds_are_the_generated_ones() -> None:
    assert (CHART / "crds" / crd.CRD_FILE).read_text() == crd.render_crd()
    assert (CHART / "crds" / "kopf-peering.yaml").read_text() == (
        ROOT / "crds" / "kopf-peering.yaml"
    ).read_text()


def test_every_object_has_the_recommended_labels() -> None:
    for obj in _render():
        labels = obj["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"):
            assert key in labels, (obj["kind"], obj["metadata"]["name"], key)


def test_deployment_runs_the_operator_non_root_with_a_liveness_probe() -> None:
    deployment = _one(_render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["phalanx", "operator", "run"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["resources"]["limits"] and container["resources"]["requests"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["serviceAccountName"] == "phx-phalanx"
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert env["PHALANX_OPERATOR_METRICS_PORT"] == "8080"
    assert "PHALANX_OPERATOR_NAMESPACES" not in env and "PHALANX_OPERATOR_PEERING" not in env


def test_the_operator_pod_meets_pod_security_restricted(
    restricted_violations: Callable[[dict[str, Any]], list[str]],
) -> None:
    assert restricted_violations(_one(_render(), "Deployment")["spec"]["template"]) == []
    # The check can fail: values a user may set take the pod out of the level.
    loose = _render({"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}})
    assert restricted_violations(_one(loose, "Deployment")["spec"]["template"]) != []


def test_the_gang_limits_and_the_step_report_reach_the_operator_and_their_defaults_agree() -> None:
    from phalanx.operator.settings import OperatorSettings, settings_from

    def env_of(values: dict[str, Any] | None = None) -> dict[str, str]:
        (container,) = _one(_render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
        return {entry["name"]: entry["value"] for entry in container["env"] if "value" in entry}

    chart = {key: value for key, value in env_of().items() if "GANG" in key or "CREATE" in key}
    defaults = OperatorSettings()
    settings = settings_from(chart)
    assert settings.max_gang_pods == defaults.max_gang_pods == 2000
    assert settings.create_batch == defaults.create_batch
    assert settings.create_backoff_seconds == defaults.create_backoff_seconds
    assert settings.create_max_backoff_seconds == defaults.create_max_backoff_seconds
    assert env_of({"maxGangPods": 64})["PHALANX_OPERATOR_MAX_GANG_PODS"] == "64"
    step_report = env_of()["PHALANX_OPERATOR_STEP_REPORT_SECONDS"]
    assert settings_from({"PHALANX_OPERATOR_STEP_REPORT_SECONDS": step_report}).step_report_seconds == 30
    assert defaults.step_report_seconds == 30
    assert env_of({"stepReportSeconds": 0})["PHALANX_OPERATOR_STEP_REPORT_SECONDS"] == "0"


def test_a_lost_node_holds_the_operator_seconds_not_minutes() -> None:
    extra = {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
    pod = _one(_render({"tolerations": [extra]}), "Deployment")["spec"]["template"]["spec"]
    node_loss = {
        t["key"]: t["tolerationSeconds"] for t in pod["tolerations"] if t.get("effect") == "NoExecute"
    }
    assert node_loss == {"node.kubernetes.io/not-ready": 10, "node.kubernetes.io/unreachable": 10}
    assert extra in pod["tolerations"]


def test_metrics_service_selects_the_operator() -> None:
    objects = _render()
    service = _one(objects, "Service", "phx-phalanx-metrics")
    labels = _one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(labels[key] == value for key, value in service["spec"]["selector"].items())


WORKER_ROLE = "phx-phalanx-worker"


def _rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's rules in the objects of `kind` (the workers' ClusterRole is not the operator's)."""
    return [
        rule
        for o in objects
        if o["kind"] == kind and o["metadata"]["name"] != WORKER_ROLE
        for rule in o["rules"]
    ]


def _allows(
    rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None = None
) -> bool:
    """Whether `rules` allow `verb` on `resource` (named `name`; None: on any object of it)."""
    return any(
        group in rule["apiGroups"]
        and resource in rule["resources"]
        and verb in rule["verbs"]
        and ("resourceNames" not in rule or (name is not None and name in rule["resourceNames"]))
        for rule in rules
    )


def test_cluster_scope_rbac_is_enough_and_least_privilege(make_job: Any) -> None:
    objects = _render()
    rules = _rules(objects, "ClusterRole")
    needed = [
        ("phalanx.dev", "trainingjobs", "watch"),
        ("phalanx.dev", "trainingjobs/status", "update"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "services", "create"),
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "watch"),
        ("", "nodes", "watch"),
        ("kopf.dev", "clusterkopfpeerings", "patch"),
    ]
    for group, resource, verb in needed:
        assert _allows(rules, group, resource, verb), (group, resource, verb)
    # Every kind of child whose deletion the operator watches (and no Secret: below).
    for group, _, plural in handlers.WATCHED_CHILDREN.values():
        for verb in ("get", "list", "watch", "create"):
            assert _allows(rules, group, plural, verb), (group, plural, verb)
    # What the operator grants its workers in their job's Role it must hold itself (RBAC forbids escalation);
    # their Lease writes come from the chart's worker ClusterRole, which it may only bind.
    job = make_job()
    from phalanx.operator.validation import check

    spec, _ = check(job["spec"], "demo")
    env = {
        e["name"]: e.get("value")
        for e in _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PHALANX_OPERATOR_WORKER_LEASE_ROLE"] == WORKER_ROLE
    _, role, _, leases = builders.build_worker_rbac(job, spec, WORKER_ROLE)
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert _allows(rules, group, resource, verb, "demo"), (group, resource, verb)
    assert leases["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": WORKER_ROLE,
    }
    assert _allows(rules, "rbac.authorization.k8s.io", "clusterroles", "bind", WORKER_ROLE)
    assert not _allows(rules, "rbac.authorization.k8s.io", "clusterroles", "bind", "admin")
    worker_rules = _one(objects, "ClusterRole", WORKER_ROLE)["rules"]
    assert _allows(worker_rules, "coordination.k8s.io", "leases", "update")
    # The operator writes no Lease but its view canary.
    assert not _allows(rules, "coordination.k8s.io", "leases", "update", "demo-worker-0")
    assert _allows(rules, "coordination.k8s.io", "leases", "update", viewclock.CANARY_NAME)
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in rules)
    # Secrets: the job's store secret is created, and read by name only to check whose it is; the operator
    # can neither list Secrets nor change one.
    assert _allows(rules, "", "secrets", "create") and _allows(rules, "", "secrets", "get")
    for verb in ("list", "watch", "update", "patch", "delete"):
        assert not _allows(rules, "", "secrets", verb), verb
    assert not _allows(rules, "", "nodes", "delete")


def test_namespace_scope_has_a_role_per_namespace_and_peering_when_asked() -> None:
    objects = _render(
        {"scope": "namespace", "watchNamespaces": ["team-a", "team-b"], "peering": {"enabled": True}}
    )
    roles = [o for o in objects if o["kind"] == "Role" and not o["metadata"]["name"].endswith("-leader")]
    assert sorted(o["metadata"]["namespace"] for o in roles) == ["team-a", "team-b"]
    for group, _, plural in handlers.WATCHED_CHILDREN.values():
        assert all(_allows(role["rules"], group, plural, "watch") for role in roles), plural
    # Cluster-wide: what the operator reads of nodes, and the roles tenants get through namespaced bindings.
    assert sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole") == sorted(
        ["phx-phalanx-cluster", WORKER_ROLE, "phx-phalanx-edit", "phx-phalanx-view"]
    )
    peerings = [o for o in objects if o["kind"] == "KopfPeering"]
    assert sorted(o["metadata"]["namespace"] for o in peerings) == ["team-a", "team-b"]
    container = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert env["PHALANX_OPERATOR_NAMESPACES"] == "team-a,team-b"
    assert env["PHALANX_OPERATOR_PEERING"] == "phalanx"


def test_values_schema_refuses_bad_values() -> None:
    chart = helm_python.Chart.load(CHART)
    chart.validate_schema({})
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"scope": "galaxy"})
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"replicaCount": 0})
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"maxGangPods": 0})


POLICY = "phx-phalanx-worker-leases"


def _lease_policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        _one(objects, "ValidatingAdmissionPolicy", POLICY),
        _one(objects, "ValidatingAdmissionPolicyBinding", POLICY),
    )


def test_the_lease_policy_is_installed_by_default_and_denies_what_it_refuses() -> None:
    policy, binding = _lease_policy(_render())
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    assert binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    # Cluster scope: jobs run in every namespace, so the policy applies in every one.
    assert "matchResources" not in binding["spec"]
    for validation in policy["spec"]["validations"]:
        assert validation["reason"] == "Forbidden"
        assert validation["message"].startswith("phalanx: ")


def test_the_lease_policy_applies_to_the_worker_accounts_only_not_the_operators() -> None:
    (condition,) = _lease_policy(_render({"serviceAccount": {"name": "ops-worker"}}))[0]["spec"][
        "matchConditions"
    ]
    expression = " ".join(condition["expression"].split())
    # The suffix the policy recognises is the one the operator names its per-job accounts with, and the Lease
    # names it allows (`<account>-<index>`) are the operator's pod names, hence the launcher's Lease names.
    assert names.worker_account_name("job") == "job" + "-worker"
    assert "endsWith('-worker')" in expression
    assert names.worker_pod_name("job", 12) == names.worker_account_name("job") + "-12"
    # An operator account that happens to end in `-worker` is still left alone.
    assert "username != 'system:serviceaccount:phalanx-system:ops-worker'" in expression


def test_the_lease_policy_can_be_left_out() -> None:
    kinds = {o["kind"] for o in _render({"leasePolicy": {"enabled": False}})}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_the_lease_policy_follows_the_watched_namespaces_or_the_given_selector() -> None:
    _, binding = _lease_policy(_render({"scope": "namespace", "watchNamespaces": ["team-a", "team-b"]}))
    (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expression == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["team-a", "team-b"],
    }
    _, binding = _lease_policy(_render({"scope": "namespace"}))
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "phalanx-system"
    ]
    selector = {"matchLabels": {"phalanx.dev/training": "true"}}
    _, binding = _lease_policy(_render({"leasePolicy": {"namespaceSelector": selector}}))
    assert binding["spec"]["matchResources"] == {"namespaceSelector": selector}


@pytest.mark.parametrize(
    "values",
    [
        {"leasePolicy": {"enabled": False}},
        {"leasePolicy": {"namespaceSelector": {"matchLabels": {"team": "a"}}}},
        {"scope": "namespace", "watchNamespaces": ["a", "b"]},
    ],
)
def test_lint_with_the_lease_policy_options(values: dict[str, Any]) -> None:
    report = helm_python.lint(
        CHART, values, strict=True, namespace="phalanx-system", kube_version=f"v{KUBERNETES_VERSION}"
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= WARNING] == []


def test_values_schema_refuses_bad_lease_policy_values() -> None:
    chart = helm_python.Chart.load(CHART)
    chart.validate_schema(
        {"leasePolicy": {"enabled": True, "namespaceSelector": {"matchLabels": {"a": "b"}}}}
    )
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"leasePolicy": {"enabled": "yes"}})
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"leasePolicy": {"namespaceSelector": {"team": "a"}}})


def test_tenant_roles_fold_into_kubernetes_edit_and_view_and_can_be_left_out() -> None:
    objects = _render()
    edit = _one(objects, "ClusterRole", "phx-phalanx-edit")
    view = _one(objects, "ClusterRole", "phx-phalanx-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]

    def granted(role: dict[str, Any], resource: str) -> set[str]:
        return {
            verb
            for rule in role["rules"]
            if resource in rule["resources"] and rule["apiGroups"] == [api.GROUP]
            for verb in rule["verbs"]
        }

    assert {"create", "update", "patch", "delete"} <= granted(edit, "trainingjobs")
    assert {"update", "patch"} <= granted(edit, "trainingjobs/scale")
    # The status is the operator's: tenants read it, never write it.
    assert granted(edit, "trainingjobs/status") == {"get", "list", "watch"}
    for resource in ("trainingjobs", "trainingjobs/status", "trainingjobs/scale"):
        assert granted(view, resource) == {"get", "list", "watch"}
    assert not [
        o
        for o in _render({"tenantRoles": {"enabled": False}})
        if o["metadata"]["name"].endswith(("-edit", "-view"))
    ]


def test_two_replicas_by_default_elect_a_leader_over_a_lease_of_their_own_with_a_disruption_budget() -> None:
    objects = _render()
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    env = {entry["name"]: entry for entry in pod["containers"][0]["env"]}
    assert env["PHALANX_OPERATOR_LEADER_ELECTION"]["value"] == "true"
    assert env["PHALANX_OPERATOR_LEADER_ELECTION_NAME"]["value"] == "phx-phalanx-leader"
    assert env["PHALANX_OPERATOR_LEADER_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PHALANX_OPERATOR_LEADER_ELECTION_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    # The chart's times are the operator's defaults, and pass its own check of their order.
    from phalanx.operator.settings import settings_from

    settings = settings_from({name: entry["value"] for name, entry in env.items() if "value" in entry})
    assert (
        settings.lease_duration_seconds,
        settings.lease_renew_deadline_seconds,
        settings.lease_retry_seconds,
    ) == (
        8,
        6,
        1,
    )
    assert not [o for o in objects if o["kind"] in ("KopfPeering", "ClusterKopfPeering")]
    assert "PHALANX_OPERATOR_PEERING" not in env
    # The replicas spread over nodes where they can.
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    budget = _one(objects, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    # The Lease's Role: create (which cannot be narrowed by name), then only that Lease.
    role = _one(objects, "Role", "phx-phalanx-leader")
    assert role["metadata"]["namespace"] == "phalanx-system"
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in role[
        "rules"
    ]
    named = next(rule for rule in role["rules"] if rule.get("resourceNames"))
    assert named["resourceNames"] == ["phx-phalanx-leader"] and set(named["verbs"]) == {"get", "update"}
    binding = _one(objects, "RoleBinding", "phx-phalanx-leader")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "phx-phalanx", "namespace": "phalanx-system"}
    ]


def test_one_replica_has_no_disruption_budget_and_leader_election_can_be_turned_off() -> None:
    one = _render({"replicaCount": 1})
    assert not [o for o in one if o["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in _one(one, "Deployment")["spec"]["template"]["spec"]
    off = _render({"replicaCount": 1, "leaderElection": {"enabled": False}})
    env = {e["name"] for e in _one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "PHALANX_OPERATOR_LEADER_ELECTION" not in env
    assert not [o for o in off if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader")]
