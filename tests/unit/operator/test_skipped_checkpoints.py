"""Checkpoints the workers' restores passed over: read from the heartbeats, named once in
`status.checkpoint.skipped` (bounded, deduplicated across workers and reconciles) and in one Warning Event
per new set."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator import api, checkpointing
from phalanx.operator import status as observe
from phalanx.operator.reconcile import Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]

TORN = {"step": 30, "tier": "durable", "reason": "Torn", "message": "no manifest (incomplete)"}
CORRUPT = {
    "step": 25,
    "tier": "durable",
    "reason": "Corrupt",
    "message": "state.bin: sha256 mismatch (file corrupt)",
}


def _annotation(*entries: dict[str, Any]) -> str:
    return json.dumps(list(entries), separators=(",", ":"))


def _entry(step: int, tier: str = "durable", reason: str = "Torn", pod: str = "p") -> api.SkippedCheckpoint:
    return api.SkippedCheckpoint(step=step, tier=tier, reason=reason, message="m", pod=pod)


# ------------------------------------------------------------------------------------------ pure parts


def test_the_heartbeat_annotation_is_read_and_what_is_not_an_entry_left_out() -> None:
    lease = {"checkpoint-skipped": _annotation(TORN, CORRUPT)}
    assert observe.skipped_checkpoints(lease) == [TORN, CORRUPT]
    assert observe.skipped_checkpoints(None) == []
    assert observe.skipped_checkpoints({"checkpoint-skipped": ""}) == []
    assert observe.skipped_checkpoints({"checkpoint-skipped": "{not json"}) == []
    assert observe.skipped_checkpoints({"checkpoint-skipped": '{"step": 3}'}) == []
    odd = [
        {"step": "30", "tier": "durable", "reason": "Torn"},
        {"step": True, "tier": "durable", "reason": "Torn"},
        {"step": -1, "tier": "durable", "reason": "Torn"},
        {"step": 4, "tier": "", "reason": "Torn"},
        "step 4",
        {"step": 4, "tier": "durable", "reason": "Corrupt", "message": "x" * 1000},
    ]
    (kept,) = observe.skipped_checkpoints({"checkpoint-skipped": json.dumps(odd)})
    assert kept["step"] == 4 and len(kept["message"]) == observe.MAX_SKIPPED_MESSAGE
    many = [{**TORN, "step": step} for step in range(100)]
    assert len(observe.skipped_checkpoints({"checkpoint-skipped": json.dumps(many)})) == 16


def test_a_new_report_wakes_the_jobs_reconcile() -> None:
    before = observe.heartbeat_signal({"phase": "training", "restored-step": "20"})
    after = observe.heartbeat_signal(
        {"phase": "training", "restored-step": "20", "checkpoint-skipped": _annotation(TORN)}
    )
    assert before != after


def test_each_checkpoint_is_named_once_whoever_reported_it() -> None:
    reported = [
        _entry(30, pod="demo-worker-0"),
        _entry(30, pod="demo-worker-1"),
        # A node's own tier: the same step on two nodes is two checkpoints.
        _entry(20, tier="local", pod="demo-worker-0"),
        _entry(20, tier="local", pod="demo-worker-1"),
        _entry(20, tier="durable", reason="Corrupt", pod="demo-worker-1"),
    ]
    followed = checkpointing.follow_skipped(None, reported)
    assert followed.entries is not None
    assert [(e.step, e.tier, e.reason, e.pod) for e in followed.entries] == [
        (30, "durable", "Torn", "demo-worker-0"),
        (20, "durable", "Corrupt", "demo-worker-1"),
        (20, "local", "Torn", "demo-worker-0"),
        (20, "local", "Torn", "demo-worker-1"),
    ]
    assert followed.event is not None and followed.event.count("step ") == 4
    # The next reconcile sees the same reports: nothing new, no Event, the same list.
    again = checkpointing.follow_skipped(followed.entries, reported)
    assert again.entries == followed.entries and again.event is None
    assert checkpointing.follow_skipped(None, []) == checkpointing.Skipped(None)


def test_the_list_keeps_the_newest_steps_and_what_falls_off_posts_nothing() -> None:
    first = checkpointing.follow_skipped(None, [_entry(step) for step in range(15)])
    assert first.entries is not None
    assert [e.step for e in first.entries] == list(range(14, 4, -1))
    # Workers keep reporting all 15: the five too old to keep are not news.
    same = checkpointing.follow_skipped(first.entries, [_entry(step) for step in range(15)])
    assert same.entries == first.entries and same.event is None
    newer = checkpointing.follow_skipped(first.entries, [_entry(40, reason="Corrupt")])
    assert newer.entries is not None and [e.step for e in newer.entries][:2] == [40, 14]
    assert len(newer.entries) == api.MAX_SKIPPED_CHECKPOINTS
    assert newer.event is not None and "step 40" in newer.event and "step 14" not in newer.event


def test_the_event_names_each_checkpoint_where_and_why_and_stays_short() -> None:
    text = checkpointing.skipped_event(
        [
            api.SkippedCheckpoint(**TORN, pod="demo-worker-0"),
            api.SkippedCheckpoint(**CORRUPT, pod="demo-worker-0"),
        ]
    )
    assert text == (
        "a restore passed over 2 checkpoints newer than the state it restored: "
        "step 30 on the durable tier (Torn: no manifest (incomplete)) by demo-worker-0; "
        "step 25 on the durable tier (Corrupt: state.bin: sha256 mismatch (file corrupt)) by demo-worker-0"
    )
    long = checkpointing.skipped_event(
        [_entry(step).model_copy(update={"message": "x" * 160}) for step in range(10)]
    )
    assert len(long) == checkpointing.MAX_EVENT_MESSAGE and long.endswith("...")


# ------------------------------------------------------------------------------------------ reconcile


def _leases(now: datetime, **skipped: str) -> dict[str, dict[str, Any]]:
    renewed = (now - timedelta(seconds=0.2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    beat = {"phase": "training", "renewTime": renewed, "step": "21", "restored-step": "20"}
    return {
        "demo-worker-0": {**beat, "checkpoint-skipped": skipped.get("worker0", "")},
        "demo-worker-1": {**beat, "checkpoint-skipped": skipped.get("worker1", "")},
    }


def _reconcile(job: dict[str, Any], pods: list[dict[str, Any]], now: datetime, **skipped: str) -> Plan:
    observed = Observed(
        pods=pods, now=now, leases=_leases(now, **skipped), nodes={"node-a": {"ready": "True"}}
    )
    return plan(job, observed)


def _warnings(result: Plan) -> list[str]:
    return [e.message for e in result.events if e.reason == "CheckpointSkipped" and e.type == "Warning"]


def test_the_reconcile_names_the_checkpoints_passed_over_in_the_status_and_one_warning(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-rdzv", role="rendezvous")]
    # Rank 0 (on worker 0) read the shared location; worker 1 restored from its peer and passed over nothing.
    first = _reconcile(job, pods, now, worker0=_annotation(TORN, CORRUPT))
    checkpoint = first.status["checkpoint"]
    seen = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert checkpoint["skipped"] == [
        {**TORN, "pod": "demo-worker-0", "seenAt": seen},
        {**CORRUPT, "pod": "demo-worker-0", "seenAt": seen},
    ]
    assert (checkpoint["mode"], checkpoint["intervalSteps"]) == ("fixed", 100)
    (warning,) = _warnings(first)
    assert "step 30 on the durable tier (Torn: no manifest (incomplete))" in warning
    assert "step 25 on the durable tier (Corrupt: state.bin: sha256 mismatch (file corrupt))" in warning
    # The stored status reads back as the model.
    assert api.TrainingJobStatus.model_validate(first.status).checkpoint is not None

    # Later reconciles: the heartbeats still say so (and the new rank 0 after a restart says it again).
    later = now + timedelta(seconds=30)
    stored = {**job, "status": first.status}
    for reports in ({"worker0": _annotation(TORN, CORRUPT)}, {"worker1": _annotation(CORRUPT, TORN)}, {}):
        again = _reconcile(stored, pods, later, **reports)
        assert again.status["checkpoint"] == checkpoint
        assert not _warnings(again)
        # The interval is judged on its own: the list does not make a fixed interval look changed.
        assert not [e for e in again.events if e.reason == "CheckpointInterval"]

    newer = {"step": 50, "tier": "durable", "reason": "OtherFormat", "message": "unknown manifest format 2"}
    third = _reconcile(stored, pods, later, worker1=_annotation(newer, TORN))
    assert [entry["step"] for entry in third.status["checkpoint"]["skipped"]] == [50, 30, 25]
    assert third.status["checkpoint"]["skipped"][0]["pod"] == "demo-worker-1"
    (warning,) = _warnings(third)
    assert "step 50" in warning and "OtherFormat: unknown manifest format 2" in warning
    assert "step 30" not in warning


def test_a_job_whose_restores_passed_over_nothing_shows_no_list(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    result = _reconcile(make_job(), pods, now)
    assert "skipped" not in result.status["checkpoint"] and not _warnings(result)
