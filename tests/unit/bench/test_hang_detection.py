"""The hang-detection benchmark's analysis: which incidents are new, false alarms in a window, latencies."""

from __future__ import annotations

import pytest

from phalanx.bench import faults, hang_detection
from phalanx.bench.hang_detection import Fault, Quiet

DETECTED = "2027-01-15T08:00:20Z"


def incident(uid: str, cause: str, detected: str = DETECTED, worker: str = "w0") -> dict:
    return {"podUid": uid, "cause": cause, "detectedAt": detected, "worker": worker, "message": f"{cause}!"}


def test_new_incidents_are_those_not_seen_before() -> None:
    old = incident("u1", "Killed", "2027-01-15T08:00:01Z")
    before = {hang_detection.incident_key(old)}
    fresh = incident("u2", "NoProgress")
    assert hang_detection.new_incidents(before, [old, fresh]) == [fresh]


def test_false_alarms_are_incidents_that_appeared_inside_the_window() -> None:
    early, inside = incident("u1", "Killed"), incident("u2", "HeartbeatTimeout")
    records = [
        (100.0, "MODIFIED", {"status": {"incidents": [early]}}),
        (150.0, "MODIFIED", {"status": {"incidents": [early]}}),
        (160.0, "MODIFIED", {"status": {"incidents": [early, inside]}}),
        (260.0, "MODIFIED", {"status": {"incidents": [early, inside, incident("u3", "NoProgress")]}}),
    ]
    assert hang_detection.incidents_seen_between(records, 120.0, 200.0) == [inside]
    assert hang_detection.incidents_seen_between(records, 300.0, 400.0) == []


def test_detection_latency_from_the_injection_and_from_the_last_heartbeat() -> None:
    start = faults.parse_stamp(DETECTED) or 0.0
    fault = Fault("frozen pod", 1, "w0", injected=start - 5.2)
    hang_detection.judge_detection(fault, incident("u1", "HeartbeatTimeout"), start + 0.4, start - 5.9)
    assert fault.detect == pytest.approx(5.6)
    assert fault.since_last_heartbeat == pytest.approx(6.3)
    assert fault.cause == "HeartbeatTimeout" and fault.blamed == "w0"
    missing = hang_detection.judge_detection(Fault("hung trainer", 1, "w1", injected=start), None, None, None)
    assert missing.error == "no incident" and missing.detect is None


def test_the_report_judges_each_kind_against_its_own_threshold() -> None:
    frozen = Fault("frozen pod", 1, "w0", injected=0.0, detect=2.5, cause="HeartbeatTimeout", blamed="w0")
    stopped = Fault("stopped trainer", 1, "w1", injected=0.0, detect=0.8, cause="TrainerStopped", blamed="w1")
    hung = Fault("hung trainer", 1, "w1", injected=0.0, detect=14.0, cause="NoProgress", blamed="w0")
    result = hang_detection.result_of(
        Quiet(seconds=60.0), [frozen, stopped, hung], {"replicas": 2, "template": {}}, 5.0
    )
    metrics = {m.name: m for m in result.metrics}
    assert metrics["frozen pod: freeze -> detected"].target.value == 3
    assert metrics["frozen pod: freeze -> detected"].verdict().met is True
    assert metrics["stopped trainer: stop -> detected"].verdict().met is True
    assert metrics["stopped trainer: the stopped pod was blamed"].samples == [1.0]
    assert metrics["hung trainer: hang -> detected"].target.value == 10
    assert metrics["hung trainer: hang -> detected"].verdict().met is False
    assert metrics["hung trainer: the hung pod was blamed"].samples == [0.0]
    assert metrics["false alarms during frequent saves"].samples == [0.0]
    assert metrics["false alarms during frequent saves"].verdict().met is True
    assert any("blamed w0" in note for note in result.notes)
    assert result.timeouts and result.error is None


def test_each_detection_names_the_threshold_it_ran_against() -> None:
    start = faults.parse_stamp(DETECTED) or 0.0
    hung = incident("u1", "NoProgress")
    hung["message"] = (
        "w0: rank 1: no step for 1.52s in training (hang threshold 1.40s: 5x p99 of 0.28s over 40 steps)"
    )
    fault = hang_detection.judge_detection(Fault("hung trainer", 1, "w0", injected=start), hung, start, None)
    assert fault.threshold == "hang threshold 1.40s: 5x p99 of 0.28s over 40 steps"
    fixed = hang_detection.judge_detection(
        Fault("hung trainer", 2, "w0", injected=start), incident("u2", "NoProgress"), start, None
    )
    assert fixed.threshold == "progress timeout 10 s"
    frozen = hang_detection.judge_detection(
        Fault("frozen pod", 1, "w0", injected=start), incident("u3", "HeartbeatTimeout"), start, None
    )
    assert frozen.threshold.startswith("heartbeat timeout 2 s")
