"""Operator settings from the environment, and the metrics."""

from __future__ import annotations

from typing import get_args

import pytest
from prometheus_client import generate_latest

from phalanx.errors import UserFacingError
from phalanx.operator import api
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.settings import OperatorSettings, settings_from


def test_defaults_are_cluster_wide_and_standalone() -> None:
    settings = settings_from({})
    assert settings.clusterwide and settings.peering == ""
    assert settings.liveness_endpoint == "http://0.0.0.0:8081/healthz"


def test_environment_then_flags() -> None:
    env = {
        "PHALANX_OPERATOR_NAMESPACES": "a, b",
        "PHALANX_OPERATOR_METRICS_PORT": "9100",
        "PHALANX_OPERATOR_PEERING": "phalanx",
        "PHALANX_OPERATOR_BIND_HOST": "127.0.0.5",
    }
    settings = settings_from(env, {"metrics_port": 9200, "priority": None})
    assert settings.namespaces == ("a", "b") and not settings.clusterwide
    assert settings.metrics_port == 9200 and settings.peering == "phalanx"
    assert settings.liveness_endpoint == "http://127.0.0.5:8081/healthz"
    assert settings_from({"PHALANX_OPERATOR_LIVENESS_PORT": "0"}).liveness_endpoint is None


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(UserFacingError, match="PHALANX_OPERATOR_METRICS_PORT"):
        settings_from({"PHALANX_OPERATOR_METRICS_PORT": "lots"})


def test_every_setting_is_documented() -> None:
    for name, field in OperatorSettings.model_fields.items():
        assert field.description, name


def test_metrics_names_and_job_states() -> None:
    metrics = OperatorMetrics()
    metrics.job_state("a", "Running")
    metrics.job_state("b", "Running")
    metrics.job_state("c", "Pending")
    metrics.job_state("b", None)
    metrics.pods_created.labels(role="worker").inc(3)
    metrics.reconcile_seconds.observe(0.02)
    text = generate_latest(metrics.registry).decode()
    assert 'phalanx_jobs{state="Running"} 1.0' in text
    assert 'phalanx_jobs{state="Pending"} 1.0' in text
    assert 'phalanx_jobs{state="Succeeded"} 0.0' in text
    # Every state the status may say has its series: one that leaves a state sets it back to 0.
    metrics.job_state("c", "Unschedulable")
    metrics.job_state("c", "Queued")
    text = generate_latest(metrics.registry).decode()
    for state in get_args(api.JobState):
        assert f'phalanx_jobs{{state="{state}"}}' in text, state
    assert 'phalanx_jobs{state="Unschedulable"} 0.0' in text and 'phalanx_jobs{state="Queued"} 1.0' in text
    assert 'phalanx_pods_created_total{role="worker"} 3.0' in text
    assert "phalanx_reconcile_duration_seconds_count 1.0" in text
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    assert all(name.startswith("phalanx_") for name in names)


def test_identical_replicas_get_different_peering_priorities() -> None:
    from phalanx.operator.main import peering_priority

    settings = settings_from({"PHALANX_OPERATOR_PEERING": "phalanx"})
    priorities = {peering_priority(settings) for _ in range(20)}
    assert len(priorities) > 1 and all(priority > 0 for priority in priorities)
    assert peering_priority(settings_from({"PHALANX_OPERATOR_PRIORITY": "7"})) == 7


def test_the_view_canary_goes_where_the_operator_watches() -> None:
    from phalanx.operator.settings import settings_from

    assert settings_from({"PHALANX_OPERATOR_VIEW_NAMESPACE": "phalanx-system"}).view_namespaces == (
        "phalanx-system",
    )
    assert settings_from({}).view_namespaces == ("default",)
    scoped = settings_from({"PHALANX_OPERATOR_NAMESPACES": "team-a, team-*,team-b"})
    assert scoped.view_namespaces == ("team-a", "team-b")
    assert settings_from({"PHALANX_OPERATOR_VIEW_INTERVAL_SECONDS": "0"}).view_namespaces == ()


def test_json_logs_are_one_object_per_line_with_the_record_s_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    import logging

    from phalanx.operator import logformat

    settings = settings_from({"PHALANX_OPERATOR_LOG_FORMAT": "json"})
    logformat.configure("INFO", settings.log_format)
    try:
        logging.getLogger("phalanx.test").warning("pod %s refused", "a-0", extra={"job": "ml/a"})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("phalanx.test").exception("failed")
    finally:
        logformat.configure("WARNING", "text")
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["level"] == "WARNING" and first["logger"] == "phalanx.test"
    assert (
        first["message"] == "pod a-0 refused" and first["job"] == "ml/a" and first["time"].endswith("+00:00")
    )
    assert second["message"] == "failed" and "RuntimeError: boom" in second["exception"]
    with pytest.raises(UserFacingError, match="LOG_FORMAT"):
        settings_from({"PHALANX_OPERATOR_LOG_FORMAT": "xml"})


def test_per_job_series_follow_the_stored_status_and_go_with_the_job() -> None:
    metrics = OperatorMetrics()
    status = {
        "state": "Running",
        "step": 120,
        "restarts": {"total": 3, "byCause": {"Killed": 2, "NodeLost": 1}},
        "incidents": [
            {"cause": "Killed", "secondsToRecover": 4.5},
            {"cause": "NodeLost", "secondsToRecover": 9.25, "resumedAt": "2026-11-27T10:00:00.500000Z"},
            {"cause": "Killed"},  # still recovering: the last closed one counts
        ],
        "goodput": 0.97,
        "recoverySeconds": 13.75,
        "workers": [{"name": "llm-worker-0", "node": "node-1"}, {"name": "llm-worker-1"}],
    }
    metrics.record_job("team-a", "llm", status)
    text = generate_latest(metrics.registry).decode()
    for line in (
        'phalanx_job_state{namespace="team-a",state="Running",trainingjob="llm"} 1.0',
        'phalanx_job_step{namespace="team-a",trainingjob="llm"} 120.0',
        'phalanx_job_restarts{cause="Killed",namespace="team-a",trainingjob="llm"} 2.0',
        'phalanx_job_restarts{cause="NodeLost",namespace="team-a",trainingjob="llm"} 1.0',
        'phalanx_job_last_recovery_seconds{namespace="team-a",trainingjob="llm"} 9.25',
        'phalanx_job_recovery_seconds{namespace="team-a",trainingjob="llm"} 13.75',
        'phalanx_job_goodput_ratio{namespace="team-a",trainingjob="llm"} 0.97',
        'phalanx_job_last_recovery_timestamp_seconds{namespace="team-a",trainingjob="llm"} 1.7957736005e+09',
        # The node has its failure counter from its first pod on.
        'phalanx_node_failures_total{node="node-1"} 0.0',
    ):
        assert line in text, line
    # A state left has no series (an alert on `state="Running"` stops at once).
    metrics.record_job("team-a", "llm", {**status, "state": "Succeeded"})
    text = generate_latest(metrics.registry).decode()
    assert 'namespace="team-a",state="Running"' not in text
    assert 'phalanx_job_state{namespace="team-a",state="Succeeded",trainingjob="llm"} 1.0' in text
    metrics.forget_job("team-a", "llm")
    text = generate_latest(metrics.registry).decode()
    assert 'trainingjob="llm"' not in text


def test_failures_are_counted_per_node_for_the_repeated_failures_alert() -> None:
    metrics = OperatorMetrics()
    incidents = [
        api.Incident(cause="Killed", worker="w-0", node="node-3"),
        api.Incident(cause="NodeLost", worker="w-1", node="node-3"),
        api.Incident(cause="Killed", worker="w-2"),  # the node unknown: no node series
    ]
    metrics.record_recovery(incidents, [], swaps=0)
    text = generate_latest(metrics.registry).decode()
    assert 'phalanx_node_failures_total{node="node-3"} 2.0' in text
    assert text.count("phalanx_node_failures_total{") == 1
