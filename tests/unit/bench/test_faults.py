"""The pure parts of the fault benchmarks' shared helpers: stamps, Lease timelines, the step log, manifests."""

from __future__ import annotations

import json

import pytest

from phalanx.bench import faults

T0 = 1_800_000_000.0


def stamp(offset: float) -> str:
    return faults.stamp_of(T0 + offset)


def beat(seen: float, pod: str, deleted: bool = False, **values: object) -> faults.LeaseSeen:
    """A Lease version seen `seen` seconds after T0; time annotations are given as offsets too."""
    annotations: dict[str, str] = {}
    for key, value in values.items():
        name = key.replace("_", "-")
        if name in ("group-started", "phase-since", "resumed-at"):
            annotations[name] = stamp(float(value))  # type: ignore[arg-type]
        else:
            annotations[name] = str(value)
    return faults.LeaseSeen(seen=T0 + seen, pod=pod, values=annotations, deleted=deleted)


# ------------------------------------------------------------------------------ stamps


def test_stamps_round_trip_with_microseconds() -> None:
    assert faults.parse_stamp(faults.stamp_of(T0 + 0.123456)) == pytest.approx(T0 + 0.123456, abs=1e-6)
    assert faults.parse_stamp("2027-01-15T08:00:00Z") == faults.parse_stamp("2027-01-15T08:00:00+00:00")
    assert faults.parse_stamp("") is None and faults.parse_stamp(None) is None
    assert faults.parse_stamp("not a time") is None


def test_a_stamp_written_to_the_second_is_told_apart() -> None:
    assert faults.whole_second("2027-01-15T08:00:00Z")
    assert not faults.whole_second("2027-01-15T08:00:00.250000Z")
    assert not faults.whole_second(None)


def test_detection_is_bounded_by_the_end_of_its_second_and_by_when_it_was_seen() -> None:
    second = "2027-01-15T08:00:05Z"
    start = faults.parse_stamp(second)
    assert start is not None
    assert faults.detection_moment(second, None) == start + 1.0
    assert faults.detection_moment(second, start + 0.3) == start + 0.3
    assert faults.detection_moment(second, start + 4.0) == start + 1.0
    precise = "2027-01-15T08:00:05.400000Z"
    assert faults.detection_moment(precise, start + 2.0) == pytest.approx(start + 0.4)
    assert faults.detection_moment(None, 12.0) == 12.0


# ------------------------------------------------------------------------------ Lease timelines


def test_lease_versions_keep_only_the_heartbeat_annotations() -> None:
    raw = {
        "metadata": {
            "name": "job-worker-0",
            "annotations": {"phalanx.dev/step": "12", "phalanx.dev/phase": "training", "other/x": "1"},
        },
        "spec": {"renewTime": stamp(3.5)},
    }
    seen = faults.lease_seen(raw, T0 + 4.0)
    assert seen.pod == "job-worker-0" and seen.step == 12 and seen.phase == "training"
    assert "other/x" not in seen.values and "x" not in seen.values
    assert seen.renewed == pytest.approx(T0 + 3.5)
    assert seen.group_started is None and seen.resumed_at is None
    operator_lease = {"metadata": {"name": "peering", "annotations": {}}, "spec": {}}
    timeline = faults.lease_timeline([(T0, "ADDED", raw), (T0, "ADDED", operator_lease)])
    assert [item.pod for item in timeline] == ["job-worker-0"]


def test_latest_forgets_deleted_leases_and_honours_a_cut_off() -> None:
    timeline = [
        beat(1, "a", step=1),
        beat(2, "b", step=1),
        beat(3, "a", step=2),
        beat(4, "b", deleted=True),
    ]
    assert {pod: item.step for pod, item in faults.latest(timeline).items()} == {"a": 2}
    assert {pod: item.step for pod, item in faults.latest(timeline, before=T0 + 2.5).items()} == {
        "a": 1,
        "b": 1,
    }


def test_a_new_group_is_found_with_its_resume_and_its_restore_end() -> None:
    kill = T0 + 10
    timeline = [
        beat(5, "w0", phase="training", group_started=0, resumed_at=1),
        beat(11, "w0", phase="rendezvous", phase_since=10.4, group_started=0),
        beat(15, "w0", phase="starting", group_started=14.9),
        beat(15, "spare", phase="starting", group_started=15.0),
        beat(20, "w0", phase="training", phase_since=19.5, group_started=14.9),
        beat(20.5, "spare", phase="training", phase_since=19.6, group_started=15.0, resumed_at=19.9),
        beat(21, "w0", phase="training", phase_since=20.8, group_started=14.9, resumed_at=19.95),
    ]
    starts = faults.group_starts(timeline, kill)
    assert starts == pytest.approx({"w0": T0 + 14.9, "spare": T0 + 15.0})
    assert faults.resumed_times(timeline, starts) == pytest.approx({"spare": T0 + 19.9, "w0": T0 + 19.95})
    # The first active-phase version of the group says when the restore ended (later flips do not count).
    assert faults.training_since(timeline, starts) == pytest.approx({"w0": T0 + 19.5, "spare": T0 + 19.6})
    assert faults.left_training(timeline, ["w0"], kill) == pytest.approx(T0 + 10.4)
    assert faults.left_training(timeline, ["w9"], kill) is None


def test_open_incidents_are_those_still_recovering() -> None:
    status = {
        "incidents": [
            {"cause": "Killed", "action": "ReplaceWorker", "resumedAt": "2027-01-15T08:00:05Z"},
            {"cause": "Killed", "action": "ReplaceWorker"},
            {"cause": "ExitCode", "action": "Ignore"},
            {"cause": "RendezvousLost", "action": "ReplaceRendezvous"},
        ]
    }
    assert [i["cause"] for i in faults.open_incidents(status)] == ["Killed", "RendezvousLost"]
    assert faults.open_incidents({}) == []


def test_incident_first_seen_is_the_first_record_that_shows_it() -> None:
    incident = {"podUid": "u1", "cause": "Killed"}
    records = [
        (T0 + 1, "MODIFIED", {"status": {"incidents": []}}),
        (T0 + 2, "MODIFIED", {"status": {"incidents": [incident]}}),
        (T0 + 3, "MODIFIED", {"status": {"incidents": [incident]}}),
    ]
    found = faults.incident_first_seen(records, lambda i: i.get("podUid") == "u1")
    assert found == (T0 + 2, incident)
    assert faults.incident_first_seen(records, lambda i: i.get("podUid") == "u2") is None


# ------------------------------------------------------------------------------ the step log


def test_the_step_log_is_read_with_torn_lines_skipped() -> None:
    lines = [
        json.dumps({"event": "restore", "reason": "start", "rank": 1, "step": 0, "source": "none",
                    "seconds": 0.01, "time": T0}),
        json.dumps({"step": 1, "loss": 4.2, "world_size": 2, "time": T0 + 1}),
        '{"step": 2, "loss": 4.1, "wor',
        json.dumps({"step": 2, "loss": 4.0, "world_size": 2, "time": T0 + 2}),
        json.dumps([1, 2]),
    ]  # fmt: skip
    log = faults.parse_step_log("\n".join(lines))
    assert [line.step for line in log.steps] == [1, 2]
    assert [(r.rank, r.step, r.source) for r in log.restores] == [(1, 0, "none")]


def test_highest_step_before_ignores_a_run_that_was_rolled_back() -> None:
    log = faults.StepLog(
        steps=[faults.StepLine(step, T0 + step, 1.0, 2) for step in range(1, 11)]
        + [faults.StepLine(step, T0 + 20 + step, 1.0, 2) for step in range(6, 9)],
        restores=[
            faults.RestoreLine(0, 0, "none", 0.0, T0, "start"),
            faults.RestoreLine(0, 5, "disk", 0.0, T0 + 25, "start"),
        ],
    )
    assert faults.highest_step_before(log, T0 + 15) == 10
    # After the resume from step 5 the group has done 6..8; the old run's 9 and 10 do not count.
    assert faults.highest_step_before(log, T0 + 30) == 8
    assert faults.highest_step_before(faults.StepLog(), T0) is None


# ------------------------------------------------------------------------------ processes and manifests


def test_only_the_training_process_is_a_trainer_not_its_launcher() -> None:
    trainer = ["python", "-m", faults.TRAINER_MODULE, "--steps", "10"]
    launcher = ["python", "-m", faults.LAUNCHER_MODULE, "--", *trainer]
    assert faults.is_trainer(trainer)
    assert not faults.is_trainer(launcher)
    assert not faults.is_trainer(["python", "-m", "phalanx.worker.checkpoint.persister"])


def test_the_job_manifest_carries_the_fault_settings() -> None:
    job = faults.tinygpt_job(
        "j",
        replicas=2,
        spares=1,
        steps=100,
        step_delay=0.5,
        heartbeat={"intervalSeconds": 1},
        checkpoint={"claimName": "c", "path": "/ckpt", "intervalSteps": 2},
        min_replicas=2,
        failure_rules=[{"match": {"exitCodes": [137]}, "action": "RestartJob"}],
        log_file="/ckpt/steps.jsonl",
        width=64,
    )
    spec = job["spec"]
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-file") + 1] == "/ckpt/steps.jsonl"
    assert args[args.index("--width") + 1] == "64" and args[args.index("--step-delay") + 1] == "0.5"
    assert spec["minReplicas"] == 2 and spec["failurePolicy"]["rules"][0]["action"] == "RestartJob"


def test_every_timeout_in_force_is_listed_with_the_spec_defaults_filled_in() -> None:
    spec = faults.tinygpt_job(
        "j", replicas=2, spares=1, steps=1, step_delay=0, heartbeat={"intervalSeconds": 2}, checkpoint={}
    )["spec"]
    timeouts = {t.name: t.seconds for t in faults.timeouts_in_force(spec, 5.0)}
    assert timeouts["heartbeat interval"] == 2
    assert timeouts["heartbeat timeout"] == 30  # the API's default
    assert timeouts["rendezvous keep-alive timeout"] == 5
    assert timeouts["operator periodic reconcile"] == 5
    assert "node-lifecycle grace period" in timeouts
    assert "operator periodic reconcile" not in {t.name for t in faults.timeouts_in_force(spec, None)}


def test_group_starts_a_few_ms_apart_are_one_group_even_across_a_tenth_of_a_second() -> None:
    from phalanx.bench.faults import same_group

    # Rounding to a tenth once split 42.94 and 42.96 into two groups and kept a steady job "unsteady".
    assert same_group([1_700_000_042.94, 1_700_000_042.96])
    assert not same_group([1_700_000_042.9, 1_700_000_050.1])  # a worker left in an older group
    assert not same_group([1_700_000_042.9, None])
    assert not same_group([])
