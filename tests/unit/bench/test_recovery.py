"""The recovery benchmark's analysis: stages of one kill from the Lease timeline, the incident and the
step log; stalls; the metrics it reports."""

from __future__ import annotations

import pytest

from phalanx.bench import faults, peers, recovery
from phalanx.bench.core import BenchResult

T0 = 1_800_000_000.0
KILL = T0 + 10.0


def stamp(offset: float) -> str:
    return faults.stamp_of(T0 + offset)


def beat(seen: float, pod: str, **values: object) -> faults.LeaseSeen:
    """A Lease version seen `seen` seconds after T0; time annotations are given as offsets too."""
    times = ("group-started", "phase-since", "resumed-at")
    annotations = {
        key.replace("_", "-"): stamp(float(value)) if key.replace("_", "-") in times else str(value)  # type: ignore[arg-type]
        for key, value in values.items()
    }
    return faults.LeaseSeen(seen=T0 + seen, pod=pod, values=annotations)


def story() -> tuple[list[faults.LeaseSeen], dict, faults.StepLog]:
    """A hot-spare recovery: w0 killed at 10 s; w1 leaves training at 10.3 s; w1 and the spare start a
    group at 15.5 / 15.6 s, restore at 22.0 s (0.1 s of loading) and finish their first step at 22.3 s."""
    timeline = [
        beat(9, "w1", phase="training", group_started=0, resumed_at=1, step=40),
        beat(10.4, "w1", phase="rendezvous", phase_since=10.3, group_started=0, step=40),
        beat(15.7, "w1", phase="starting", group_started=15.5),
        beat(15.8, "spare", phase="starting", group_started=15.6),
        beat(22.2, "w1", phase="training", phase_since=22.0, group_started=15.5, restored_step=40),
        beat(22.4, "w1", phase="training", group_started=15.5, resumed_at=22.3, step=41),
        beat(22.5, "spare", phase="training", group_started=15.6, resumed_at=22.28, step=41),
    ]
    incident = {
        "podUid": "u0",
        "cause": "Killed",
        "detectedAt": stamp(10.5),
        "occurredAt": stamp(10.2),
        "secondsToRecover": 12.1,
        "stepsLost": 0,
        "restoredStep": 40,
        "restoredFrom": "memory",
    }
    log = faults.StepLog(
        steps=[faults.StepLine(step, T0 + step * 0.25, 1.0, 2) for step in range(1, 41)]
        + [faults.StepLine(41, T0 + 22.3, 1.0, 2)],
        restores=[
            faults.RestoreLine(0, 0, "none", 0.0, T0, "start"),
            faults.RestoreLine(0, 40, "memory", 0.08, T0 + 21.9, "start"),
            faults.RestoreLine(1, 40, "peer", 0.1, T0 + 22.0, "start"),
        ],
    )
    return timeline, incident, log


def test_stages_of_a_recovery_add_up_to_the_total() -> None:
    timeline, incident, log = story()
    trial = recovery.Trial("hot-spare", 1, "w0", 0, KILL)
    recovery.analyse(trial, timeline, ["w1"], incident, T0 + 10.6, log, group_size=2)
    assert trial.error is None
    assert trial.detect == pytest.approx(0.5)
    assert trial.replace == pytest.approx(15.6 - 10.5)
    assert trial.rendezvous == pytest.approx(15.6 - 10.3)
    assert trial.startup == pytest.approx(22.0 - 0.1 - 15.6)
    assert trial.load == pytest.approx(0.1)
    assert trial.first_step == pytest.approx(0.3)
    assert trial.total == pytest.approx(12.3)
    parts = [trial.detect, trial.replace, trial.startup, trial.load, trial.first_step]
    assert sum(p for p in parts if p is not None) == pytest.approx(trial.total)
    assert trial.restored_step == 40 and trial.restore_sources == ["memory", "peer"]
    assert trial.steps_lost_log == 0 and trial.steps_lost == 0
    assert trial.kill_delivered == pytest.approx(0.2)
    assert trial.milestones["group started"] == pytest.approx(5.6)


def test_a_recovery_without_a_full_new_group_is_an_error() -> None:
    timeline, incident, log = story()
    partial = [item for item in timeline if item.pod != "spare"]
    trial = recovery.Trial("hot-spare", 1, "w0", 0, KILL)
    recovery.analyse(trial, partial, ["w1"], incident, None, log, group_size=2)
    assert trial.error is not None and "1 of 2" in trial.error


def test_replayed_steps_are_counted_from_the_step_log() -> None:
    timeline, incident, log = story()
    log.restores[1:] = [
        faults.RestoreLine(0, 20, "disk", 0.05, T0 + 21.9, "start"),
        faults.RestoreLine(1, 20, "disk", 0.05, T0 + 22.0, "start"),
    ]
    trial = recovery.Trial("restart-job", 1, "w0", 0, KILL)
    recovery.analyse(trial, timeline, ["w1"], incident, None, log, group_size=2, checkpoint_interval=20)
    assert trial.restored_step == 20 and trial.restore_sources == ["disk"]
    assert trial.steps_lost_log == 20  # steps 21..40 are done again
    assert trial.steps_since_periodic == 0


def trial_with(number: int, total: float, startup: float) -> recovery.Trial:
    trial = recovery.Trial("hot-spare", number, f"w{number}", 0, KILL)
    trial.detect, trial.replace, trial.startup, trial.load, trial.first_step = 0.3, 5.0, startup, 0.01, 0.3
    trial.total = total
    return trial


def test_a_much_slower_trial_is_reported_with_the_stage_that_holds_the_excess() -> None:
    trials = [trial_with(n, 12.0, 6.4) for n in range(1, 6)] + [trial_with(6, 30.0, 24.4)]
    found = recovery.stalls(trials)
    assert len(found) == 1
    assert "trial 6" in found[0] and "trainer start-up" in found[0]
    assert recovery.stalls(trials[:2]) == []  # too few trials to call one slow


def test_the_replacing_variants_carry_the_targets_and_the_restart_baseline_none() -> None:
    trials = [trial_with(n, 12.0, 6.4) for n in range(1, 4)]
    for trial in trials:
        trial.steps_lost_log = 1
    spare = {m.name: m for m in recovery.metrics_for(recovery.VARIANTS[0], trials)}
    assert spare["hot-spare: kill -> first step"].target.value == 2
    assert spare["hot-spare: kill -> first step (p99)"].target.stat == "p99"
    assert spare["hot-spare: kill -> first step (p99)"].target.value == 5
    assert spare["hot-spare: steps lost"].verdict().met is False  # one replayed step is one too many
    assert spare["hot-spare: kill -> first step"].verdict().met is False
    new_pod = {m.name: m for m in recovery.metrics_for(recovery.VARIANTS[1], trials)}
    assert new_pod["new-pod: kill -> first step"].target.value == 5
    assert new_pod["new-pod: steps lost"].target.value == 0
    baseline = {m.name: m for m in recovery.metrics_for(recovery.VARIANTS[2], trials)}
    assert all(m.target is None for m in baseline.values())
    assert baseline["restart-job: trainer start-up"].samples == [6.4, 6.4, 6.4]


def test_the_restart_everything_baseline_is_set_beside_the_hot_spare_in_the_peers_table() -> None:
    spare_trials = [trial_with(n, 4.0, 1.0) for n in range(1, 4)]
    restart_trials = [trial_with(n, 12.0, 6.4) for n in range(1, 4)]
    result = BenchResult(
        name=recovery.NAME,
        title="",
        started_at="2026-01-01T00:00:00+00:00",
        metrics=recovery.metrics_for(recovery.VARIANTS[0], spare_trials)
        + recovery.metrics_for(recovery.VARIANTS[2], restart_trials),
    )
    rows = {row.metric: row for row in peers.comparison_rows([result], "2026-01-01T00:00:00+00:00")}
    assert set(rows) == {"restart-job: kill -> first step", "restart-job: steps lost"}
    assert rows["restart-job: kill -> first step"].ratio == "3x"
