"""The chart's monitoring: its alert rules pass `promtool test rules` (Debian's promtool) case by case, every
series its rules and dashboard read is one the operator exports, and its ServiceMonitor and PodMonitor select
what the operator and its builders make."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from phalanx.devcluster import monitoring
from phalanx.operator import api, builders
from phalanx.operator.metrics import OperatorMetrics

from .test_chart import CHART, _one, _render

HERE = Path(__file__).parent / "monitoring"
ALL_ON = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
SERIES_SUFFIXES = ("", "_total", "_created", "_bucket", "_count", "_sum")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return monitoring.install().promtool


def rule_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return _one(_render(values or ALL_ON), "PrometheusRule")["spec"]


def test_every_alert_fires_when_it_should_and_only_then(promtool: Path, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    shutil.copy(HERE / "rules_test.yaml", tmp_path)
    checked = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [str(promtool), "test", "rules", "rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert of the chart has its case in the rules' tests.
    alerts = {
        rule["alert"] for group in rule_groups()["groups"] for rule in group["rules"] if "alert" in rule
    }
    cases = yaml.safe_load((HERE / "rules_test.yaml").read_text())["tests"]
    tested_alerts = {check["alertname"] for case in cases for check in case.get("alert_rule_test", [])}
    assert alerts and alerts == tested_alerts, (alerts, tested_alerts)


def test_the_thresholds_come_from_the_values(promtool: Path, tmp_path: Path) -> None:
    values = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "stuckFor": "30m",
                "stuckPendingFor": "5m",
                "slowRecoverySeconds": 45,
                "goodputBelow": 0.9,
                "nodeFailures": 5,
                "nodeFailureWindow": "6h",
            }
        }
    }
    text = json.dumps(rule_groups(values))
    for expected in ("[30m]", "offset 30m", '"for": "5m"', "> 45", "< 0.9", "[6h]", ">= 5"):
        assert expected in text, expected
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(values)))
    checked = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _exported() -> set[str]:
    metrics = OperatorMetrics()
    return {family.name + suffix for family in metrics.registry.collect() for suffix in SERIES_SUFFIXES}


def _series_read(expr: str) -> set[str]:
    return set(re.findall(r"\bphalanx[_:][a-z0-9_:]*[a-z0-9]", expr))


def test_rules_and_dashboard_read_only_series_that_exist() -> None:
    groups = rule_groups()["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    known = _exported() | recorded
    exprs = [rule["expr"] for group in groups for rule in group["rules"]]
    configmap = _one(_render(ALL_ON), "ConfigMap", "phx-phalanx-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (dashboard_json,) = configmap["data"].values()
    dashboard = json.loads(dashboard_json)
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [
        variable["query"]["query"]
        for variable in dashboard["templating"]["list"]
        if "query" in variable and isinstance(variable["query"], dict)
    ]
    unknown = {name for expr in exprs for name in _series_read(expr)} - known
    assert not unknown, unknown
    # The per-job series the issue of a team's monitoring asks for are all there.
    for name in (
        "phalanx_job_state",
        "phalanx_job_restarts",
        "phalanx_job_last_recovery_seconds",
        "phalanx_job_goodput_ratio",
        "phalanx_job_step",
    ):
        assert name in known, name


def test_the_service_monitor_scrapes_the_operator_s_named_port() -> None:
    objects = _render(ALL_ON)
    monitor = _one(objects, "ServiceMonitor")
    service = _one(objects, "Service", "phx-phalanx-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(service["metadata"]["labels"].get(key) == value for key, value in selector.items())
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["phalanx-system"]}
    # The per-job series' own `namespace` (the job's) wins over the target's (the operator's).
    assert all(endpoint["honorLabels"] is True for endpoint in monitor["spec"]["endpoints"])
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == [
        port["name"] for port in service["spec"]["ports"]
    ]


def test_the_pod_monitor_selects_the_trainers_metrics_port_and_no_rendezvous(
    make_job: Any,
) -> None:
    monitor = _one(_render(ALL_ON), "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    job = make_job(metricsPort=9400)
    spec = api.TrainingJobSpec.model_validate(job["spec"])
    for role in ("worker", "spare"):
        pod = builders.build_worker_pod(job, spec, 0, role)
        assert all(pod["metadata"]["labels"].get(key) == value for key, value in selector.items()), role
        ports = [port["name"] for port in pod["spec"]["containers"][0]["ports"]]
        assert [endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]] == ports
    rendezvous = builders.build_rendezvous_pod(job, spec)
    assert not all(rendezvous["metadata"]["labels"].get(key) == value for key, value in selector.items())
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    limited = _one(
        _render({"metrics": {"podMonitor": {"enabled": True, "namespaces": ["ml"]}}}), "PodMonitor"
    )
    assert limited["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}


def test_monitoring_objects_are_off_by_default_and_lint_clean_when_on() -> None:
    kinds = {o["kind"] for o in _render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert "ConfigMap" not in kinds
    report = helm_python.lint(CHART, ALL_ON, strict=True, namespace="phalanx-system")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "bad",
    [
        {"prometheusRule": {"goodputBelow": 2}},
        {"prometheusRule": {"stuckFor": "15 minutes"}},
        {"prometheusRule": {"nodeFailures": 0}},
        {"serviceMonitor": {"interval": "often"}},
        {"podMonitor": {"labels": {"release": 1}}},
        {"dashboard": {"enable": True}},
    ],
)
def test_values_schema_refuses_bad_monitoring_values(bad: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        helm_python.Chart.load(CHART).validate_schema({"metrics": bad})
