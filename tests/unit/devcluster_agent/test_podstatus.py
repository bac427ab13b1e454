"""Pod phase and status as a kubelet reports them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from phalanx.devcluster.agent.podstatus import (
    ContainerRecord,
    PodRecord,
    Terminated,
    build_status,
    phase,
)
from phalanx.devcluster.agent.podworker import LOST_MESSAGE, adopt_records

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POD = {"metadata": {"name": "p"}, "status": {}}


def running(name: str = "c") -> ContainerRecord:
    return ContainerRecord(name, "img", running_since=T0, container_id=f"phalanx://u/{name}/0")


def exited(code: int, name: str = "c") -> ContainerRecord:
    record = running(name)
    record.terminated = Terminated(code, "Completed" if code == 0 else "Error", T0, T0 + timedelta(seconds=3))
    return record


@pytest.mark.parametrize(
    ("policy", "containers", "expected"),
    [
        ("Always", [ContainerRecord("c", "img")], "Pending"),
        ("Always", [running()], "Running"),
        ("Never", [exited(0)], "Succeeded"),
        ("Never", [exited(2)], "Failed"),
        ("Never", [exited(0, "a"), running("b")], "Running"),
        ("Never", [exited(0, "a"), exited(1, "b")], "Failed"),
        ("OnFailure", [exited(0)], "Succeeded"),
        ("OnFailure", [exited(1)], "Running"),
        ("Always", [exited(0)], "Running"),
    ],
)
def test_phase(policy: str, containers: list[ContainerRecord], expected: str) -> None:
    assert phase(PodRecord(policy, containers=containers)) == expected


def test_container_waiting_for_a_restart_keeps_the_pod_running() -> None:
    record = ContainerRecord("c", "img", restart_count=0, waiting_reason="CrashLoopBackOff")
    record.last_terminated = Terminated(137, "Error", T0, T0)
    assert phase(PodRecord("Always", containers=[record])) == "Running"


def test_init_containers_gate_the_pod() -> None:
    record = PodRecord("Never", init_containers=[running("init")], containers=[ContainerRecord("c", "img")])
    assert phase(record) == "Pending"
    record.init_containers = [exited(1, "init")]
    assert phase(record) == "Failed"
    record.restart_policy = "OnFailure"
    assert phase(record) == "Pending"


def test_running_status_has_conditions_addresses_and_container_state() -> None:
    record = PodRecord(
        "Always", containers=[running()], pod_ip="127.1.0.2", host_ip="127.0.0.1", start_time=T0
    )
    status = build_status(POD, record, T0)
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.1.0.2"
    assert status["podIPs"] == [{"ip": "127.1.0.2"}]
    assert status["hostIP"] == "127.0.0.1"
    assert status["startTime"] == "2026-01-01T00:00:00Z"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    (container,) = status["containerStatuses"]
    assert container["state"] == {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    assert container["ready"] is True
    assert container["imageID"] == "phalanx-local://img"
    assert container["containerID"] == "phalanx://u/c/0"


def test_terminated_status_reports_exit_code_reason_and_times() -> None:
    record = PodRecord("Never", containers=[exited(3)], pod_ip="127.1.0.2", start_time=T0)
    status = build_status(POD, record, T0)
    assert status["phase"] == "Failed"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert terminated["startedAt"] == "2026-01-01T00:00:00Z"
    assert terminated["finishedAt"] == "2026-01-01T00:00:03Z"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")


def test_transition_times_are_kept_while_a_condition_does_not_change() -> None:
    earlier = "2025-12-31T00:00:00Z"
    pod = {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": earlier}]}}
    record = PodRecord("Always", containers=[running()])
    ready = next(c for c in build_status(pod, record, T0)["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == earlier
    record.containers[0].terminated = Terminated(1, "Error", T0, T0)
    ready = next(c for c in build_status(pod, record, T0)["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_invalid_spec_fails_the_pod_with_its_message() -> None:
    record = PodRecord("Always", containers=[ContainerRecord("c", "img")])
    record.failure_reason, record.failure_message = "InvalidSpec", "no command"
    status = build_status(POD, record, T0)
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "InvalidSpec", "no command")


def test_restart_shows_last_state_and_count() -> None:
    record = running()
    record.restart_count = 2
    record.last_terminated = Terminated(137, "Error", T0, T0 + timedelta(seconds=1))
    status = build_status(POD, PodRecord("Always", containers=[record]), T0)["containerStatuses"][0]
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 137


def test_a_previous_agents_running_containers_are_adopted_as_lost() -> None:
    records = [ContainerRecord("a", "img"), ContainerRecord("b", "img")]
    statuses = [
        {"name": "a", "restartCount": 4, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
        {"name": "b", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
    ]
    adopt_records(records, statuses)
    assert records[0].restart_count == 4
    assert records[0].terminated is not None
    assert records[0].terminated.exit_code == 137
    assert records[0].terminated.message == LOST_MESSAGE
    assert records[1].terminated is not None
    assert records[1].terminated.exit_code == 0
