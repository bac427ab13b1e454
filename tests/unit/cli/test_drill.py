"""`phalanx drill`'s pure parts: when it refuses, whom it strikes, which incident it reports and how."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from phalanx import drill
from phalanx.errors import UserFacingError

INJECTED = datetime(2026, 1, 1, 12, 0, 0, 400000, tzinfo=UTC)


def job(allowed: bool = True, state: str | None = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "demo"},
        "spec": {"drills": {"allowed": allowed}},
        "status": {"state": state} if state else {},
    }


def pod(name: str, role: str = "worker", node: str = "node-a", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"phalanx.dev/role": role}},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_drills_are_refused_without_opt_in_or_on_a_job_that_does_not_run() -> None:
    assert drill.refusal(job()) is None
    assert "spec.drills.allowed: true" in (drill.refusal(job(allowed=False)) or "")
    assert "Succeeded, not Running" in (drill.refusal(job(state="Succeeded")) or "")
    assert "not started" in (drill.refusal(job(state=None)) or "")


def test_the_victim_is_a_running_active_worker() -> None:
    pods = [
        pod("demo-worker-2", role="spare"),
        pod("demo-rdzv", role="rendezvous"),
        pod("demo-worker-1", node="node-b"),
        pod("demo-worker-0", phase="Pending"),
    ]
    assert drill.choose_worker(pods, None)["metadata"]["name"] == "demo-worker-1"
    assert drill.choose_worker(pods, "demo-worker-1")["metadata"]["name"] == "demo-worker-1"
    with pytest.raises(UserFacingError, match="running workers: demo-worker-1"):
        drill.choose_worker(pods, "demo-worker-2")  # a spare is no worker to kill
    assert drill.choose_node(pods, None) == "node-b"
    with pytest.raises(UserFacingError, match="runs no worker"):
        drill.choose_node(pods, "node-a")
    assert drill.rendezvous_pod(pods) == "demo-rdzv"
    with pytest.raises(UserFacingError, match="no running worker"):
        drill.choose_worker([pod("demo-worker-0", phase="Pending")], None)


def incident(worker: str, detected: str, **extra: Any) -> dict[str, Any]:
    return {
        "worker": worker,
        "detectedAt": detected,
        "cause": "PodDeleted",
        "action": "ReplaceWorker",
        **extra,
    }


def test_the_reported_incident_is_the_one_after_the_injection_for_the_target() -> None:
    earlier = incident("demo-worker-1", "2026-01-01T11:59:00Z")
    other = incident("demo-worker-0", "2026-01-01T12:00:01Z")
    ours = incident(
        "demo-worker-1",
        "2026-01-01T12:00:00Z",  # stamped to the second: may read before the injection
        resumedAt="2026-01-01T12:00:03.400000Z",
        secondsToRecover=2.9,
        stepsLost=0,
    )
    target = drill.Target(drill.KILL_WORKER, pod="demo-worker-1")
    found = drill.find_incident([earlier, other, ours], target, INJECTED)
    assert found is ours
    result = drill.figures(target, ours, INJECTED)
    assert (result.seconds_to_detect, result.seconds_to_resume) == (0.0, 3.0)
    assert (result.seconds_to_recover, result.steps_lost) == (2.9, 0)
    text = drill.render(result)
    assert "kill-worker on demo-worker-1: PodDeleted -> ReplaceWorker" in text and "3.0 s" in text


def test_a_node_drill_reports_the_node_loss_of_a_worker_on_that_node() -> None:
    lost = incident("demo-worker-1", "2026-01-01T12:00:05Z", cause="NodeLost", node="node-b")
    elsewhere = incident("demo-worker-0", "2026-01-01T12:00:05Z", cause="NodeLost", node="node-a")
    target = drill.Target(drill.CRASH_NODE, node="node-b")
    assert drill.find_incident([elsewhere, lost], target, INJECTED) is lost
    assert drill.figures(target, lost, INJECTED).seconds_to_resume is None


def test_the_command_line_takes_exactly_one_strike() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    drill.register(parser.add_subparsers())
    args = parser.parse_args(["drill", "demo", "--hang-worker"])
    assert (args.hang_worker, args.kill_worker, args.crash_node) == ("", None, None)
    assert (
        parser.parse_args(["drill", "demo", "--hang-worker", "demo-worker-1"]).hang_worker == "demo-worker-1"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["drill", "demo", "--hang-worker", "--kill-rendezvous"])
    with pytest.raises(SystemExit):
        parser.parse_args(["drill", "demo"])


def test_a_hang_drill_reports_the_no_progress_incident_of_its_pod() -> None:
    hung = incident("demo-worker-1", "2026-01-01T12:00:11Z", cause="NoProgress")
    target = drill.Target(drill.HANG_WORKER, pod="demo-worker-1", uid="uid-1")
    assert drill.find_incident([hung], target, INJECTED) is hung
    assert drill.figures(target, hung, INJECTED).seconds_to_detect == 10.6
