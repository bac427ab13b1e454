"""Pure logic: status records, the Lease payload, metrics rendering, launcher settings."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from phalanx.worker.env import SettingsError, parse_nnodes, settings_from
from phalanx.worker.heartbeat import (
    PodStatus,
    StatusPublisher,
    StatusRecord,
    combine,
    lease_annotations,
    lease_body,
    read_records,
)
from phalanx.worker.lease import LeaseClient
from phalanx.worker.metrics import PodMetrics


def test_publisher_writes_records_the_launcher_reads(tmp_path: Path) -> None:
    env = {"PHALANX_STATUS_DIR": str(tmp_path), "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    publisher = StatusPublisher.from_env(env)
    publisher.publish(phase="training", step=7, loss=1.5)
    publisher.publish(step=8)
    (record,) = read_records(tmp_path)
    assert (record.rank, record.world_size, record.step, record.loss, record.phase) == (
        2,
        4,
        8,
        1.5,
        "training",
    )


def test_publisher_without_a_launcher_does_nothing() -> None:
    publisher = StatusPublisher.from_env({})
    publisher.publish(step=3)
    assert publisher.record.step == 3


def test_combine_takes_the_slowest_step_and_shows_saves() -> None:
    records = [
        StatusRecord(rank=1, step=10, loss=0.5, phase="training"),
        StatusRecord(rank=0, step=9, loss=0.7, phase="saving"),
    ]
    status = combine(records, None)
    assert (status.step, status.loss, status.rank, status.phase) == (9, 0.7, 0, "saving")
    assert combine(records, "rendezvous").phase == "rendezvous"
    assert combine([], None).phase == "starting"


def test_lease_annotations_follow_the_contract() -> None:
    status = PodStatus(phase="training", step=12, loss=0.25, step_seconds=0.5, rank=0, world_size=2)
    annotations = lease_annotations(status)
    assert annotations["phalanx.dev/step"] == "12"
    assert annotations["phalanx.dev/loss"] == "0.25"
    assert annotations["phalanx.dev/phase"] == "training"
    assert annotations["phalanx.dev/grad-norm"] == ""
    assert set(annotations) == {
        "phalanx.dev/" + key
        for key in (
            "step",
            "loss",
            "step-seconds",
            "samples-per-second",
            "grad-norm",
            "checkpoint-step",
            "rank",
            "world-size",
            "phase",
        )
    }


def test_lease_body_is_owned_by_the_pod_and_renewed_now() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    body = lease_body(
        pod_name="w-0",
        namespace="ns",
        pod_uid="uid-1",
        status=PodStatus(phase="standby"),
        now=now,
        lease_duration_seconds=30,
    )
    assert body["spec"] == {
        "holderIdentity": "w-0",
        "leaseDurationSeconds": 30,
        "renewTime": "2025-01-02T03:04:05.678901Z",
    }
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert body["metadata"]["annotations"]["phalanx.dev/phase"] == "standby"


def test_heartbeats_are_off_without_kubernetes() -> None:
    assert not LeaseClient.available({}, "w-0", "ns")
    assert not LeaseClient.available({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "", "ns")
    assert LeaseClient.available({"KUBECONFIG": "/k"}, "w-0", "ns")


def test_metrics_render_the_pod_status() -> None:
    metrics = PodMetrics()
    metrics.update(PodStatus(phase="training", step=5, loss=2.0, checkpoint_stall_seconds=0.01))
    metrics.restarts.labels(cause="restart-epoch").inc()
    text = generate_latest(metrics.registry).decode()
    assert "phalanx_worker_step 5.0" in text
    assert "phalanx_worker_loss 2.0" in text
    assert "phalanx_worker_checkpoint_stall_seconds 0.01" in text
    assert 'phalanx_worker_phase{phase="training"} 1.0' in text
    assert 'phalanx_worker_group_restarts_total{cause="restart-epoch"} 1.0' in text


def test_settings_come_from_env_and_flags_win() -> None:
    env = {
        "PHALANX_RDZV_ENDPOINT": "rdzv.ns.svc:29400",
        "PHALANX_JOB_UID": "uid-9",
        "PHALANX_MIN_NODES": "2",
        "PHALANX_MAX_NODES": "4",
        "PHALANX_ROLE": "spare",
        "PHALANX_RDZV_LAST_CALL_TIMEOUT": "2",
        "POD_IP": "127.0.3.4",
    }
    settings = settings_from(env, {"max_nodes": 3, "command": ("python", "train.py"), "role": None})
    assert (settings.min_nodes, settings.max_nodes, settings.role, settings.run_id) == (
        2,
        3,
        "spare",
        "uid-9",
    )
    assert (settings.rdzv_host, settings.rdzv_port, settings.local_addr) == (
        "rdzv.ns.svc",
        29400,
        "127.0.3.4",
    )
    assert settings.last_call_timeout == 2.0 and settings.join_timeout == 120.0
    assert settings.keepalive_max_attempts == 5


@pytest.mark.parametrize(
    "env",
    [
        {"PHALANX_RDZV_ENDPOINT": "no-port"},
        {"PHALANX_RDZV_ENDPOINT": "h:1", "PHALANX_MIN_NODES": "3", "PHALANX_MAX_NODES": "2"},
        {"PHALANX_RDZV_ENDPOINT": "h:1", "PHALANX_ROLE": "boss"},
        {},
    ],
)
def test_bad_settings_are_rejected(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        settings_from(env, {"command": ("python",)})


def test_nnodes() -> None:
    assert parse_nnodes("2") == (2, 2)
    assert parse_nnodes("1:4") == (1, 4)
    with pytest.raises(SettingsError):
        parse_nnodes("x")
