"""The `Rollback` action of training-health signals: the request to the launchers, the record, the budget,
the history that starts afresh, and where the restarted workers restored from."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import kopf
import pydantic
import pytest

from phalanx.operator import api, handlers, health
from phalanx.operator.health import History, Sample
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Event, Observed, plan
from phalanx.operator.timeutil import format_micro_time

from .conftest import NOW
from .test_health import FakeKube, lease


def nan_history(first_nan: int = 31, last: int = 40) -> History:
    found = History()
    for step in range(1, last + 1):
        found.add("demo-worker-0", Sample(step, loss=math.nan if step >= first_nan else 2.0))
    return found


def rollback_job(make_job: Callable[..., Any], **rollback: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"minSamples": 3, "nonFiniteLoss": {"action": "Rollback"}}
    if rollback:
        spec["rollback"] = rollback
    job = make_job(health=spec)
    job["status"] = {"step": 40}
    return job


def reconcile(job: dict[str, Any], found: History | None, minutes: int = 0, **observed: Any) -> Any:
    observed.setdefault("pods", [])
    return plan(job, Observed(now=NOW + timedelta(minutes=minutes), health=found, **observed))


def health_events(result: Any) -> list[str]:
    return [e.reason for e in result.events if e.reason not in ("CreatedPods",)]


def healthy(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Healthy")


# ------------------------------------------------------------------------------------------- pure parts


def test_the_bound_is_the_step_before_the_anomaly_began() -> None:
    # The last step the heartbeats showed normal (28) may already hold a bad update: one before it.
    assert health.rollback_bound(31, [20, 24, 28, 31, 35], 40) == 27
    assert health.rollback_bound(31, [], 40) == 30  # nothing seen before: the step before the first sign
    assert health.rollback_bound(31, [31, 33], 40) == 30
    assert health.rollback_bound(1, [1], 40) == 0
    assert health.rollback_bound(0, [], 40) == 0
    assert health.rollback_bound(None, [5], 40) == 40
    assert health.rollback_bound(None, [], None) == 0


def test_decide_rollback_asks_for_one_and_records_it() -> None:
    spec = api.HealthSpec.model_validate({"rollback": {"skipBatches": "all"}})
    signal = api.HealthSignal(
        reason="NonFiniteLoss", message="loss nan at step 40 since step 31", since_step=31
    )
    previous = api.RollbackRequest(epoch=4, at_or_before_step=10)
    seen = list(range(20, 41, 2))
    decision = health.decide_rollback(spec, api.HealthStatus(rollbacks=1), previous, signal, 40, NOW, seen)
    assert decision.action == "Rollback"
    assert decision.request == api.RollbackRequest(
        epoch=5,
        at_or_before_step=29,
        skip_batches="all",
        from_step=40,
        reason="NonFiniteLoss: loss nan at step 40 since step 31",
        requested_at=format_micro_time(NOW),
    )
    assert decision.record is not None
    assert (decision.record.epoch, decision.record.signal, decision.record.at_or_before_step) == (
        5,
        "NonFiniteLoss",
        29,
    )
    assert decision.record.restored_step is None
    assert "(action Rollback, 2 of 3)" in decision.event
    assert (
        "at or before step 29 (the heartbeats showed it from step 31, the job was at step 40)"
        in decision.event
    )
    assert "batches the abandoned run trained on after that checkpoint are skipped" in decision.event


def test_a_spent_budget_pauses_instead() -> None:
    spec = api.HealthSpec.model_validate({"rollback": {"maxRollbacks": 2}})
    signal = api.HealthSignal(reason="LossDiverging", message="m", since_step=5)
    decision = health.decide_rollback(spec, api.HealthStatus(rollbacks=2), None, signal, 9, NOW)
    assert decision.action == "Pause" and decision.request is None
    assert "rollback budget is spent (2 of 2)" in decision.event
    never = api.HealthSpec.model_validate({"rollback": {"maxRollbacks": 0}})
    assert health.decide_rollback(never, api.HealthStatus(), None, signal, 9, NOW).action == "Pause"


def test_skip_batches_is_a_count_or_all() -> None:
    assert api.RollbackSpec.model_validate({"skipBatches": "all"}).skip_batches == "all"
    assert api.RollbackSpec.model_validate({"skipBatches": 7}).skip_batches == 7
    assert api.RollbackSpec.model_validate({"skipBatches": "12"}).skip_batches == 12
    assert api.RollbackSpec().skip_batches == 0 and api.RollbackSpec().max_rollbacks == 3
    for bad in (-1, "some", True):
        with pytest.raises(pydantic.ValidationError, match="non-negative integer or 'all'"):
            api.RollbackSpec.model_validate({"skipBatches": bad})


def test_outcome_waits_for_a_group_started_after_the_request() -> None:
    record = api.HealthRollback(
        epoch=1,
        signal="NonFiniteLoss",
        requested_at=format_micro_time(NOW),
        from_step=40,
        at_or_before_step=30,
    )
    before = health.RestoreReport(NOW - timedelta(seconds=1), 38, "memory")
    assert health.rollback_outcome(record, [before], NOW) is None
    after = health.RestoreReport(NOW + timedelta(seconds=3), 30, "durable")
    outcome = health.rollback_outcome(record, [before, after], NOW + timedelta(seconds=5))
    assert outcome is not None
    updated, message, warning = outcome
    assert (updated.restored_step, updated.restored_from, warning) == (30, "durable", False)
    assert "restored step 30 from durable (at or before step 30; the job had reached step 40)" in message
    assert health.rollback_outcome(updated, [after], NOW) is None  # recorded once
    scratch = health.rollback_outcome(
        record, [health.RestoreReport(NOW + timedelta(seconds=2), 0, "none")], NOW
    )
    assert scratch is not None and scratch[2] is True
    assert "no checkpoint at or before step 30 was found" in scratch[1] and "from scratch" in scratch[1]


# ------------------------------------------------------------------------------------------- reconcile


def test_rollback_requests_a_restart_before_the_anomaly(make_job: Callable[..., Any]) -> None:
    job = rollback_job(make_job)
    first = reconcile(job, nan_history())
    assert not first.suspend
    request = first.status["rollback"]
    assert request == {
        "epoch": 1,
        "atOrBeforeStep": 29,
        "skipBatches": 0,
        "fromStep": 40,
        "reason": "NonFiniteLoss: loss nan at step 40 since step 31",
        "requestedAt": format_micro_time(NOW),
    }
    record = first.status["health"]
    assert record["rollbacks"] == 1
    assert record["lastRollback"]["signal"] == "NonFiniteLoss"
    assert record["lastRollback"]["atOrBeforeStep"] == 29 and "restoredStep" not in record["lastRollback"]
    # Judged afresh: the signal is not kept on, so a recurrence starts it (and a rollback) again.
    assert record["signals"] == []
    condition = healthy(first.status)
    assert (condition["status"], condition["reason"]) == ("False", "NonFiniteLoss")
    assert (
        "rolling back to the newest checkpoint at or before step 29 (rollback 1 of 3)" in condition["message"]
    )
    warnings = [e.reason for e in first.events if e.type == "Warning"]
    assert warnings[-2:] == ["NonFiniteLoss", "HealthRollback"]
    assert first.health_rollbacks == ["NonFiniteLoss"] and first.health_started == ["NonFiniteLoss"]
    assert first.health_restart == NOW and first.health_since == NOW


def test_after_a_rollback_the_fresh_history_decides(make_job: Callable[..., Any]) -> None:
    job = rollback_job(make_job)
    job["status"] = reconcile(job, nan_history()).status
    # Nothing judged yet on the resumed run: nothing changes, no second rollback.
    waiting = reconcile(job, History(), minutes=1)
    assert waiting.status["rollback"] == job["status"]["rollback"]
    assert waiting.status["health"]["rollbacks"] == 1 and not health_events(waiting)
    assert waiting.health_since == NOW and waiting.health_restart is None
    # The resumed run trains finitely: healthy again, with its Event.
    calm = History()
    for step in range(29, 40):
        calm.add("demo-worker-0", Sample(step, loss=1.5))
    recovered = reconcile(job, calm, minutes=2)
    assert (healthy(recovered.status)["status"], healthy(recovered.status)["reason"]) == (
        "True",
        "TrainingHealthy",
    )
    assert health_events(recovered) == ["TrainingHealthy"]
    # The anomaly comes back in the resumed run: a second rollback, epoch 2.
    job["status"] = recovered.status
    again = reconcile(job, nan_history(first_nan=35, last=45), minutes=3)
    assert again.status["rollback"]["epoch"] == 2 and again.status["rollback"]["atOrBeforeStep"] == 33
    assert again.status["health"]["rollbacks"] == 2


def test_a_job_that_keeps_diverging_is_paused_once_the_budget_is_spent(make_job: Callable[..., Any]) -> None:
    job = rollback_job(make_job, maxRollbacks=1)
    job["status"] = reconcile(job, nan_history()).status
    job["status"] = reconcile(job, History(), minutes=1).status
    spent = reconcile(job, nan_history(first_nan=33, last=41), minutes=2)
    assert spent.suspend
    assert spent.status["rollback"]["epoch"] == 1  # no new request
    (signal,) = spent.status["health"]["signals"]
    assert signal["action"] == "Pause" and spent.status["health"]["paused"].startswith("NonFiniteLoss: ")
    pause = next(e for e in spent.events if e.reason == "HealthPause")
    assert "its action is Rollback but the rollback budget is spent (1 of 1)" in pause.message
    assert not spent.health_rollbacks and spent.health_restart is None
    # Resumed by someone: the count and the last rollback stay.
    job["status"] = spent.status
    job["spec"]["suspend"] = True
    job["status"] = reconcile(job, History(), minutes=3).status
    job["spec"]["suspend"] = False
    resumed = reconcile(job, History(), minutes=4)
    assert (
        resumed.status["health"]["rollbacks"] == 1 and resumed.status["health"]["lastRollback"]["epoch"] == 1
    )


def test_a_pause_signal_starting_with_a_rollback_one_wins(make_job: Callable[..., Any]) -> None:
    job = make_job(
        health={
            "minSamples": 3,
            "nonFiniteLoss": {"action": "Rollback"},
            "gradNormSpike": {"action": "Pause", "windowSteps": 10, "recentSteps": 5},
        }
    )
    found = History()
    for step in range(1, 41):
        found.add(
            "demo-worker-0",
            Sample(step, loss=math.nan if step == 40 else 2.0, grad_norm=100.0 if step == 40 else 1.0),
        )
    both = reconcile(job, found)
    assert both.suspend and "rollback" not in both.status
    assert "HealthRollback" not in [e.reason for e in both.events]


def test_the_restarted_group_reports_where_it_restored_from(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    job = rollback_job(make_job)
    job["status"] = reconcile(job, nan_history()).status
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1")]
    old = {"phase": "training", "step": "41", "group-started": format_micro_time(NOW - timedelta(minutes=5))}
    stale = {
        name: {**old, "restored-step": "20", "restore-source": "durable"}
        for name in ("demo-worker-0", "demo-worker-1")
    }
    nothing = reconcile(job, History(), minutes=1, pods=pods, leases=stale)
    assert "restoredStep" not in nothing.status["health"]["lastRollback"]
    started = format_micro_time(NOW + timedelta(seconds=4))
    fresh = {
        name: {
            "phase": "training",
            "step": "31",
            "group-started": started,
            "restored-step": "30",
            "restore-source": "durable",
        }
        for name in ("demo-worker-0", "demo-worker-1")
    }
    done = reconcile(job, History(), minutes=1, pods=pods, leases=fresh)
    record = done.status["health"]["lastRollback"]
    assert (record["restoredStep"], record["restoredFrom"]) == (30, "durable") and record["resumedAt"]
    (event,) = [e for e in done.events if e.reason == "RolledBack"]
    assert event.type == "Normal" and "restored step 30 from durable" in event.message
    job["status"] = done.status
    assert not [
        e
        for e in reconcile(job, History(), minutes=2, pods=pods, leases=fresh).events
        if e.reason == "RolledBack"
    ]


# ------------------------------------------------------------------------------------------- monitor, handler


def test_monitor_ignores_the_abandoned_run_after_a_reset() -> None:
    monitor = health.HealthMonitor()
    job = ("ml", "demo")
    before = format_micro_time(NOW - timedelta(seconds=10))
    after = format_micro_time(NOW + timedelta(seconds=2))
    monitor.observe(job, "p", {**lease(5, loss=2.0), "group-started": before})
    monitor.reset(job, since=NOW)
    assert not monitor.observe(job, "p", {**lease(6, loss="nan"), "group-started": before})
    assert monitor.snapshot(job).samples == []
    monitor.observe(job, "p", {**lease(3, loss=2.0), "group-started": after})
    monitor.observe(job, "q", lease(4, loss=2.5))  # a heartbeat that does not say when its group started
    assert [sample.step for sample in monitor.snapshot(job).samples] == [3, 4]
    # A reconcile settling with the stored rollback keeps the filter (an operator restart too).
    fresh = health.HealthMonitor()
    fresh.settle(job, api.HealthSpec(), health.Assessment(), since=NOW)
    assert not fresh.observe(job, "p", {**lease(6, loss=2.0), "group-started": before})


def test_handler_restarts_the_history_once_the_rollback_is_stored(make_job: Callable[..., Any]) -> None:
    job = make_job(health={"minSamples": 3, "nonFiniteLoss": {"action": "Rollback"}})
    kube = FakeKube(job)
    metrics = OperatorMetrics()
    reconciler = handlers.JobReconciler(kube, metrics)  # type: ignore[arg-type]
    started = format_micro_time(NOW - timedelta(hours=1))
    for step in range(1, 41):
        summary = {**lease(step, loss="nan" if step > 30 else 2.0), "group-started": started}
        reconciler.health.observe(("ml", "demo"), "demo-worker-0", summary)
    logger = kopf.LocalObjectLogger(body=job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    assert "status" in kube.calls and "event HealthRollback" in kube.calls and "suspend" not in kube.calls
    assert kube.job["status"]["rollback"]["epoch"] == 1
    assert reconciler.health.snapshot(("ml", "demo")).samples == []
    # Late heartbeats of the abandoned run wake nothing and are not judged.
    assert not reconciler.health.observe(
        ("ml", "demo"), "demo-worker-0", {**lease(41, loss="nan"), "group-started": started}
    )
    assert (
        metrics.registry.get_sample_value("phalanx_health_rollbacks_total", {"signal": "NonFiniteLoss"}) == 1
    )
    count = metrics.registry.get_sample_value(
        "phalanx_job_health_rollbacks", {"namespace": "ml", "trainingjob": "demo"}
    )
    assert count == 1
    reconciler.forget("ml", "demo", "uid-123")
    assert (
        metrics.registry.get_sample_value(
            "phalanx_job_health_rollbacks", {"namespace": "ml", "trainingjob": "demo"}
        )
        is None
    )


def test_events_name_the_rollback(make_job: Callable[..., Any]) -> None:
    job = rollback_job(make_job, skipBatches=8)
    first = reconcile(job, nan_history())
    (event,) = [e for e in first.events if e.reason == "HealthRollback"]
    assert event == Event(
        "Warning",
        "HealthRollback",
        "rolling back after NonFiniteLoss (action Rollback, 1 of 3): every worker restarts from the newest "
        "checkpoint at or before step 29 (the heartbeats showed it from step 31, the job was at step 40); "
        "8 batches are skipped after it",
    )
    assert first.status["rollback"]["skipBatches"] == 8
