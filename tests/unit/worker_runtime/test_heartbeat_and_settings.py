"""Pure logic: status records, the Lease payload, metrics rendering, launcher settings."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from phalanx.worker.checkpoint import skipped
from phalanx.worker.checkpoint.skipped import SkippedCheckpoint
from phalanx.worker.env import SettingsError, parse_nnodes, settings_from
from phalanx.worker.heartbeat import (
    PhaseClock,
    PodStatus,
    RenewalSchedule,
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


def test_the_step_carries_when_it_was_reached() -> None:
    publisher = StatusPublisher.from_env({})
    publisher.publish(phase="training", step=3)
    reached = publisher.record.step_at
    assert reached is not None
    publisher.publish(phase="saving")
    publisher.publish(phase="training", step=3, loss=1.0)
    assert publisher.record.step_at == reached, "the same step again is no new progress"
    publisher.publish(phase="training", step=4)
    assert publisher.record.step_at is not None and publisher.record.step_at >= reached
    # The pod reached its step when the last of its slowest ranks did.
    records = [
        StatusRecord(rank=0, step=9, step_at=100.0, phase="training"),
        StatusRecord(rank=1, step=9, step_at=101.5, phase="training"),
        StatusRecord(rank=2, step=10, step_at=103.0, phase="training"),
    ]
    status = combine(records, None)
    assert (status.step, status.step_at) == (9, 101.5)
    assert lease_annotations(status)["phalanx.dev/step-at"].startswith("1970-01-01T00:01:41.5")


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
            "step-at",
            "loss",
            "step-seconds",
            "samples-per-second",
            "grad-norm",
            "checkpoint-step",
            "rank",
            "world-size",
            "phase",
            "phase-since",
            "group-started",
            "group-restarts",
            "restart-cause",
            "restored-step",
            "restore-source",
            "resumed-at",
            "checkpoint-skipped",
            "compute-seconds",
            "checkpoint-save-seconds",
            "checkpoint-interval",
            "exit-code",
            "fault",
            "fault-rank",
            "fault-since",
            "fault-message",
            "hang-threshold",
            "hang-basis",
            "preflight",
            "preflight-reason",
            "preflight-message",
        )
    }


def test_lease_annotations_carry_the_preflight_and_cut_its_message() -> None:
    status = PodStatus(
        phase="training", preflight="failed", preflight_reason="ResumeMismatch", preflight_message="x" * 2000
    )
    annotations = lease_annotations(status)
    assert annotations["phalanx.dev/preflight"] == "failed"
    assert annotations["phalanx.dev/preflight-reason"] == "ResumeMismatch"
    assert annotations["phalanx.dev/preflight-message"] == "x" * 512


def test_lease_annotations_carry_the_checkpoint_figures_of_the_automatic_interval() -> None:
    status = PodStatus(phase="training", checkpoint_save_seconds=0.0125, checkpoint_interval=40)
    annotations = lease_annotations(status)
    assert annotations["phalanx.dev/checkpoint-save-seconds"] == "0.0125"
    assert annotations["phalanx.dev/checkpoint-interval"] == "40"
    assert lease_annotations(PodStatus(phase="training"))["phalanx.dev/checkpoint-save-seconds"] == ""


def test_lease_annotations_carry_times_restores_and_compute() -> None:
    moment = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC).timestamp()
    status = PodStatus(
        phase="training",
        phase_since=moment,
        group_started=moment - 1.5,
        group_restarts=2,
        restart_cause="preflight: restart from its checkpoint",
        restored_step=40,
        restore_source="disk",
        resumed_at=moment + 0.25,
        compute_seconds=0.125,
    )
    annotations = lease_annotations(status)
    assert annotations["phalanx.dev/phase-since"] == "2025-01-02T03:04:05.678901Z"
    assert annotations["phalanx.dev/group-started"] == "2025-01-02T03:04:04.178901Z"
    assert annotations["phalanx.dev/group-restarts"] == "2"
    # The operator tells the preflight's planned restart from a failure's by it.
    assert annotations["phalanx.dev/restart-cause"] == "preflight: restart from its checkpoint"
    assert annotations["phalanx.dev/restored-step"] == "40"
    assert annotations["phalanx.dev/restore-source"] == "durable"
    assert annotations["phalanx.dev/resumed-at"] == "2025-01-02T03:04:05.928901Z"
    assert annotations["phalanx.dev/compute-seconds"] == "0.125"
    empty = lease_annotations(PodStatus(phase="rendezvous"))
    for key in (
        "phase-since",
        "group-started",
        "restart-cause",
        "restored-step",
        "restore-source",
        "resumed-at",
    ):
        assert empty["phalanx.dev/" + key] == ""


def test_publisher_stamps_phase_changes_and_the_first_step_after_a_restore(tmp_path: Path) -> None:
    env = {"PHALANX_STATUS_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "2", "PHALANX_GROUP_ATTEMPT": "3"}
    publisher = StatusPublisher.from_env(env)
    publisher.publish(phase="restoring")
    entered_restore = publisher.record.phase_since
    publisher.publish(phase="restoring", loss=1.0)
    assert publisher.record.phase_since == entered_restore
    publisher.restored(12, "disk")
    (record,) = read_records(tmp_path)
    assert (record.attempt, record.phase, record.step, record.restored_step, record.restore_source) == (
        3,
        "training",
        12,
        12,
        "durable",
    )
    assert record.resumed_at is None and record.phase_since is not None
    assert entered_restore is not None and record.phase_since >= entered_restore
    publisher.publish(phase="saving")
    publisher.publish(phase="training", step=13)
    resumed = publisher.record.resumed_at
    assert resumed is not None
    publisher.publish(phase="training", step=14)
    assert publisher.record.resumed_at == resumed


def test_combine_ignores_what_an_older_group_restored() -> None:
    old = StatusRecord(
        rank=0, step=30, phase="training", attempt=1, restored_step=10, restore_source="memory"
    )
    # The launcher started attempt 2; its process has not written yet: the step stays, the rest does not.
    status = combine([old], None, attempt=2)
    assert (status.phase, status.step, status.restored_step, status.restore_source) == (
        "starting",
        30,
        None,
        None,
    )
    new = StatusRecord(
        rank=0, step=29, phase="training", phase_since=5.0, attempt=2, restored_step=29, restore_source="peer"
    )
    status = combine([new], None, attempt=2)
    assert (status.phase, status.phase_since, status.step, status.restored_step) == ("training", 5.0, 29, 29)
    # While the launcher re-forms the group, what the last group restored is not reported.
    status = combine([new], "rendezvous", attempt=2, launcher_since=9.0)
    assert (status.phase, status.phase_since, status.step, status.restored_step) == (
        "rendezvous",
        9.0,
        29,
        None,
    )


def test_the_checkpoints_a_restore_passed_over_go_into_the_heartbeat_bounded(tmp_path: Path) -> None:
    env = {"PHALANX_STATUS_DIR": str(tmp_path), "RANK": "0", "WORLD_SIZE": "2", "PHALANX_GROUP_ATTEMPT": "1"}
    publisher = StatusPublisher.from_env(env)
    passed_over = [
        SkippedCheckpoint(30, "durable", "Torn", "no manifest (incomplete)"),
        SkippedCheckpoint(25, "durable", "Corrupt", "state.bin: sha256 mismatch (file corrupt)"),
    ]
    publisher.restored(20, "disk", skipped_checkpoints=passed_over)
    (record,) = read_records(tmp_path)
    status = combine([record, StatusRecord(rank=1, step=20, phase="training", attempt=1)], None, attempt=1)
    text = lease_annotations(status)["phalanx.dev/checkpoint-skipped"]
    assert json.loads(text) == [
        {"step": 30, "tier": "durable", "reason": "Torn", "message": "no manifest (incomplete)"},
        {
            "step": 25,
            "tier": "durable",
            "reason": "Corrupt",
            "message": "state.bin: sha256 mismatch (file corrupt)",
        },
    ]
    assert skipped.decode(text) == passed_over
    # A later restore that passed over nothing says so; so does a pod whose group is re-forming.
    publisher.restored(40, "memory")
    (record,) = read_records(tmp_path)
    assert lease_annotations(combine([record], None, attempt=1))["phalanx.dev/checkpoint-skipped"] == ""
    earlier = StatusRecord(rank=0, step=20, phase="training", attempt=1, checkpoint_skipped=text)
    assert (
        lease_annotations(combine([earlier], "rendezvous", attempt=1))["phalanx.dev/checkpoint-skipped"] == ""
    )
    # Bounded: the newest entries only, each message cut, whatever a restore passed over.
    many = [SkippedCheckpoint(step, "local", "Corrupt", "x" * 1000) for step in range(100)]
    bounded = json.loads(skipped.encode(many))
    assert [entry["step"] for entry in bounded] == list(range(99, 99 - skipped.MAX_ENTRIES, -1))
    assert all(len(entry["message"]) == skipped.MAX_MESSAGE for entry in bounded)
    # Every rank that read a location (each its own node-local tier) is named, once.
    ranks = [
        StatusRecord(rank=0, phase="training", checkpoint_skipped=skipped.encode(many[:2])),
        StatusRecord(rank=1, phase="training", checkpoint_skipped=skipped.encode(many[1:3])),
    ]
    assert [entry.step for entry in skipped.decode(combine(ranks, None).checkpoint_skipped)] == [2, 1, 0]
    assert skipped.decode("not json") == [] and skipped.decode('[{"step": "x"}]') == []


def test_combine_reports_the_busiest_rank_and_when_the_pod_entered_its_phase() -> None:
    records = [
        StatusRecord(rank=0, step=8, phase="training", phase_since=2.0, compute_seconds=0.1),
        StatusRecord(rank=1, step=8, phase="saving", phase_since=3.0, compute_seconds=0.7),
        StatusRecord(rank=2, step=8, phase="saving", phase_since=2.5, compute_seconds=0.2),
    ]
    status = combine(records, None)
    assert (status.phase, status.phase_since, status.compute_seconds) == ("saving", 2.5, 0.7)
    trained = [replace(record, phase="training") for record in records]
    assert combine(trained, None).phase_since == 3.0


def test_phase_clock_keeps_the_time_of_the_change_it_saw() -> None:
    clock = PhaseClock()
    assert clock.observe("starting", None, now=10.0) == 10.0
    assert clock.observe("rendezvous", 10.5, now=11.0) == 10.5
    assert clock.observe("rendezvous", 10.9, now=12.0) == 10.5
    # A source time in the future or before the previous change is not believed.
    assert clock.observe("training", 99.0, now=13.0) == 13.0
    assert clock.observe("restoring", 12.0, now=14.0) == 14.0


def test_renewals_are_prompt_for_the_phases_the_operator_times_and_rate_limited() -> None:
    schedule = RenewalSchedule(interval=5.0, min_gap=0.2)
    assert schedule.due(0.0, "training", None)
    schedule.renewed(0.0)
    # The saving <-> training flip of every step waits for the interval.
    assert not schedule.due(1.0, "saving", None)
    assert not schedule.due(1.1, "training", None)
    assert schedule.due(1.2, "rendezvous", None)
    schedule.renewed(1.2)
    assert not schedule.due(1.3, "restoring", None)  # within the minimum gap: pending
    assert schedule.wait_hint(1.3) == pytest.approx(0.1)
    assert schedule.due(1.45, "restoring", None)
    schedule.renewed(1.45)
    assert not schedule.due(2.0, "restoring", None)
    assert schedule.due(3.0, "training", 2.9)  # left restoring
    schedule.renewed(3.0)
    assert not schedule.due(3.5, "training", 2.9)
    assert schedule.due(4.0, "training", 3.9)  # a new first step after a restore
    schedule.renewed(4.0)
    assert schedule.due(9.0, "training", 3.9)  # the interval


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


@pytest.mark.parametrize(("code", "phase"), [(5, "exiting"), (0, "finished")])
def test_a_launcher_ending_on_its_own_says_so_in_its_last_heartbeat(
    tmp_path: Path, code: int, phase: str
) -> None:
    from phalanx.worker.launch import PodReporter

    env = {"PHALANX_RDZV_ENDPOINT": "rdzv.ns.svc:29400", "PHALANX_JOB_UID": "uid-9", "POD_IP": "127.0.3.4"}
    settings = settings_from(env, {"command": ("python", "train.py")})
    reporter = PodReporter(settings, tmp_path, PodMetrics())
    reporter.start()
    reporter.finish(code)
    annotations = lease_annotations(reporter.current())
    assert annotations["phalanx.dev/phase"] == phase
    assert annotations["phalanx.dev/exit-code"] == str(code)


def test_a_script_that_publishes_nothing_shows_as_training_with_its_step_unknown(tmp_path: Path) -> None:
    from phalanx.worker.launch import SILENT_SCRIPT_SECONDS, PodReporter

    env = {"PHALANX_RDZV_ENDPOINT": "rdzv.ns.svc:29400", "PHALANX_JOB_UID": "uid-9", "POD_IP": "127.0.3.4"}
    settings = settings_from(env, {"command": ("python", "train.py")})
    reporter = PodReporter(settings, tmp_path, PodMetrics())
    reporter.attempt = 1
    reporter.launcher_phase = None  # the group runs
    reporter.group_started = time.time()
    # Its processes may still be starting: not yet taken for a silent script.
    assert reporter.current().phase == "starting" and not reporter.silent_script()
    reporter.group_started = time.time() - SILENT_SCRIPT_SECONDS - 1
    annotations = lease_annotations(reporter.current())
    assert annotations["phalanx.dev/phase"] == "training" and annotations["phalanx.dev/step"] == ""
    # A script that published once speaks for itself from then on.
    publisher = StatusPublisher(tmp_path / "rank-0.json", rank=0, world_size=2, attempt=1)
    publisher.publish(phase="starting")
    assert not reporter.silent_script() and reporter.current().phase == "starting"


def test_between_groups_the_lease_keeps_where_the_latest_group_resumed(tmp_path: Path) -> None:
    # A group that resumed and broke within one look at the records (the spare that took a failed worker's
    # place lost right after the first step): the operator must still learn that training resumed, and when.
    from phalanx.worker.launch import PodReporter

    env = {"PHALANX_RDZV_ENDPOINT": "rdzv.ns.svc:29400", "PHALANX_JOB_UID": "uid-9", "POD_IP": "127.0.3.4"}
    settings = settings_from(env, {"command": ("python", "train.py")})
    reporter = PodReporter(settings, tmp_path, PodMetrics())
    reporter.attempt = 2
    reporter.launcher_phase = None
    started = time.time()
    reporter.group_started = started
    publisher = StatusPublisher(tmp_path / "rank-0.json", rank=0, world_size=2, attempt=2)
    publisher.restored(37, "memory")
    # Re-forming before the group's first step: nothing resumed, nothing to keep.
    reporter.group_started = None
    reporter.launcher_phase = "rendezvous"
    assert lease_annotations(reporter.current())["phalanx.dev/resumed-at"] == ""
    publisher.publish(phase="training", step=38)
    annotations = lease_annotations(reporter.current())
    assert annotations["phalanx.dev/phase"] == "rendezvous"
    assert annotations["phalanx.dev/restored-step"] == "37"
    assert annotations["phalanx.dev/restore-source"] == "memory"
    assert annotations["phalanx.dev/group-started"] and annotations["phalanx.dev/resumed-at"]
    # The next group's own figures replace them once it starts.
    reporter.attempt = 3
    reporter.launcher_phase = None
    reporter.group_started = time.time()
    assert lease_annotations(reporter.current())["phalanx.dev/resumed-at"] == ""


class _Metadata:
    resource_version = "41"


class _StoredLease:
    metadata = _Metadata()


class _Coordination:
    """Leases as the API server keeps them: one of the pod's name exists already (made before the pod)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def create_namespaced_lease(self, namespace: str, body: dict) -> None:
        from kubernetes.client import ApiException

        self.calls.append(("create", body))
        raise ApiException(status=409, reason="AlreadyExists")

    def read_namespaced_lease(self, name: str, namespace: str) -> _StoredLease:
        return _StoredLease()

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict) -> None:
        self.calls.append(("replace", body))

    def patch_namespaced_lease(self, name: str, namespace: str, body: dict) -> None:
        self.calls.append(("patch", body))


def test_a_lease_made_before_the_pod_is_replaced_whole_with_the_pod_as_its_owner() -> None:
    from kubernetes.client import ApiException

    client = LeaseClient.__new__(LeaseClient)
    coordination = _Coordination()
    client.__dict__.update(
        _coordination=coordination, _api_exception=ApiException, pod_name="job-worker-0", namespace="ml",
        _pod_uid="uid-pod", _created=False,
    )  # fmt: skip
    assert client.pod_uid() == "uid-pod"  # from POD_UID: the pod is never read
    body = lease_body(
        pod_name="job-worker-0",
        namespace="ml",
        pod_uid=client.pod_uid(),
        status=PodStatus(phase="training"),
        now=datetime.now(UTC),
        lease_duration_seconds=10,
    )
    client.renew(body)
    client.renew(body)
    (create, replace_call, patch) = coordination.calls
    assert create[0] == "create" and patch[0] == "patch"
    kind, replaced = replace_call
    assert kind == "replace" and replaced["metadata"]["resourceVersion"] == "41"
    assert replaced["metadata"]["ownerReferences"][0]["uid"] == "uid-pod"
    assert replaced["metadata"]["annotations"] == body["metadata"]["annotations"]
