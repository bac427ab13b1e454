"""Training-health signals: the history, every signal and threshold, the monitor, and what a reconcile makes
of them (condition, status, Events, Pause)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException

from phalanx.operator import api, handlers, health
from phalanx.operator.health import History, Sample
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Event, Observed, plan

from .conftest import NOW

SPEC = api.HealthSpec()


def history(samples: list[Sample]) -> History:
    found = History()
    for sample in samples:
        found.add("pod-0", sample)
    return found


def losses(values: list[float], start: int = 1, every: int = 1) -> list[Sample]:
    return [Sample(step=start + i * every, loss=value) for i, value in enumerate(values)]


def lease(step: int, **figures: Any) -> dict[str, Any]:
    summary = {"phase": "training", "step": str(step), "restored-step": "0"}
    summary.update({key.replace("_", "-"): str(value) for key, value in figures.items()})
    return summary


# ------------------------------------------------------------------------------------------- samples


def test_a_sample_comes_only_from_a_trained_step() -> None:
    assert health.sample_from_lease(lease(12, loss=2.5, grad_norm=0.7, step_seconds=0.3)) == Sample(
        12, 2.5, 0.7, 0.3
    )
    assert health.sample_from_lease({**lease(12, loss=2.5), "phase": "saving"}) is not None
    assert health.sample_from_lease({**lease(12, loss=2.5), "phase": "restoring"}) is None
    assert health.sample_from_lease({**lease(12, loss=2.5), "phase": "standby"}) is None
    # At the restored step the figures are those of the step before the restore.
    assert health.sample_from_lease({**lease(40, loss=2.5), "restored-step": "40"}) is None
    assert health.sample_from_lease({"phase": "training", "step": "", "loss": "2"}) is None
    assert health.sample_from_lease({"phase": "training", "step": "3", "loss": ""}) is None
    nan = health.sample_from_lease(lease(7, loss="nan"))
    assert nan is not None and nan.loss is not None and math.isnan(nan.loss)


def test_history_keeps_one_sample_per_step_in_order() -> None:
    found = History()
    assert found.add("pod-0", Sample(10, loss=2.0, grad_norm=1.0, step_seconds=0.2))
    assert found.add("pod-1", Sample(9, loss=2.1, step_seconds=0.2))  # a pod a step behind: no restore
    assert found.add("pod-1", Sample(10, grad_norm=3.0, step_seconds=0.5))
    assert not found.add("pod-1", Sample(10, grad_norm=3.0, step_seconds=0.5))
    assert [s.step for s in found.samples] == [9, 10]
    # Same step from two pods: the newest loss, the highest gradient norm and step time.
    assert found.samples[-1] == Sample(10, loss=2.0, grad_norm=3.0, step_seconds=0.5)
    assert found.first_step == 9


def test_a_non_finite_figure_is_never_hidden_by_a_merge() -> None:
    found = History()
    found.add("pod-0", Sample(5, grad_norm=float("nan")))
    found.add("pod-1", Sample(5, grad_norm=2.0))
    assert math.isnan(found.samples[0].grad_norm or 0.0)


def test_a_pod_going_back_drops_the_steps_after_its_restore() -> None:
    found = history(losses([3.0] * 30))
    assert found.add("pod-0", Sample(20, loss=2.5))
    assert [s.step for s in found.samples][-1] == 20 and len(found.samples) == 20
    assert found.samples[-1].loss == 2.5
    assert found.first_step == 1


def test_history_is_bounded() -> None:
    found = History(max_samples=10)
    for step in range(1, 30):
        found.add("pod-0", Sample(step, loss=1.0))
    assert [s.step for s in found.samples] == list(range(20, 30))
    copy = found.copy()
    copy.add("pod-0", Sample(30, loss=1.0))
    assert len(found.samples) == 10 and found.samples[-1].step == 29


# ------------------------------------------------------------------------------------------- signals


def test_non_finite_loss() -> None:
    assert health.non_finite_loss([]).state == "unknown"
    assert health.non_finite_loss(losses([2.0, 1.9])).state == "clear"
    verdict = health.non_finite_loss(losses([2.0, 1.9, float("nan"), float("inf")]))
    assert verdict.state == "active" and verdict.since_step == 3
    assert verdict.message == "loss inf at step 4 since step 3"
    # Finite again (a rollback trained past it): clear.
    assert health.non_finite_loss(losses([2.0, float("nan"), 1.9])).state == "clear"


DIVERGENCE = api.LossDivergenceSpec(recent_steps=10, reference_steps=20, factor=1.5)


def test_loss_divergence_compares_the_recent_mean_with_the_window_before() -> None:
    samples = losses([2.0] * 20 + [5.0] * 10)
    verdict = health.loss_divergence(samples, DIVERGENCE, 5)
    assert verdict.state == "active" and verdict.since_step == 21
    assert verdict.message == "mean loss 5.00 over steps 21-30 vs 2.00 over steps 1-20 (threshold 1.5x)"


def test_loss_divergence_threshold() -> None:
    assert health.loss_divergence(losses([2.0] * 20 + [2.9] * 10), DIVERGENCE, 5).state == "clear"
    assert health.loss_divergence(losses([2.0] * 20 + [3.1] * 10), DIVERGENCE, 5).state == "active"
    # A negative reference: 50% above it in magnitude.
    assert health.loss_divergence(losses([-2.0] * 20 + [-1.1] * 10), DIVERGENCE, 5).state == "clear"
    assert health.loss_divergence(losses([-2.0] * 20 + [-0.9] * 10), DIVERGENCE, 5).state == "active"
    # Non-finite losses are the other signal's business.
    nan_tail = losses([2.0] * 20 + [2.0] * 9 + [float("nan")])
    assert health.loss_divergence(nan_tail, DIVERGENCE, 5).state == "clear"


def test_loss_divergence_needs_enough_samples_in_both_windows() -> None:
    assert health.loss_divergence([], DIVERGENCE, 5).state == "unknown"
    assert health.loss_divergence(losses([5.0] * 12), DIVERGENCE, 5).state == "unknown"
    # Every fifth step sampled: 2 samples in the recent window.
    sparse = losses([2.0] * 4 + [5.0] * 2, every=5)
    assert health.loss_divergence(sparse, DIVERGENCE, 5).state == "unknown"
    assert health.loss_divergence(sparse, DIVERGENCE, 2).state == "active"


STAGNATION = api.LossStagnationSpec(window_steps=100, min_improvement=0.01)


def test_loss_stagnation() -> None:
    falling = losses([3.0 - 0.01 * i for i in range(101)])
    assert health.loss_stagnation(falling, STAGNATION, 5).state == "clear"
    flat = losses([2.0 + 0.001 * (i % 2) for i in range(101)])
    verdict = health.loss_stagnation(flat, STAGNATION, 5)
    assert verdict.state == "active" and verdict.since_step == 2
    assert "under 1.00%" in verdict.message and "over steps 82-101" in verdict.message
    # Rising counts too: no improvement.
    assert (
        health.loss_stagnation(losses([2.0 + 0.01 * i for i in range(101)]), STAGNATION, 5).state == "active"
    )
    # The window is not covered yet.
    assert health.loss_stagnation(losses([2.0] * 60), STAGNATION, 5).state == "unknown"
    lenient = STAGNATION.model_copy(update={"min_improvement": 0.0})
    assert health.loss_stagnation(losses([2.0] * 101), lenient, 5).state == "active"
    assert health.loss_stagnation(falling, lenient, 5).state == "clear"


SPIKE = api.GradNormSpikeSpec(factor=10, window_steps=20, recent_steps=5)


def grads(values: list[float]) -> list[Sample]:
    return [Sample(step=i + 1, grad_norm=value) for i, value in enumerate(values)]


def test_grad_norm_spike() -> None:
    assert health.grad_norm_spike([], SPIKE, 5).state == "unknown"
    assert health.grad_norm_spike(grads([1.0] * 3), SPIKE, 5).state == "unknown"
    calm = grads([1.0, 1.2, 0.9] * 8)
    assert health.grad_norm_spike(calm, SPIKE, 5).state == "clear"
    spiked = grads([1.0] * 20 + [12.0, 1.0, 1.0])
    verdict = health.grad_norm_spike(spiked, SPIKE, 5)
    assert verdict.state == "active" and verdict.since_step == 21
    assert verdict.message == "gradient norm 12 at step 21, 12.0x the median 1 of steps 1-20 (threshold 10x)"
    # 9x is below the factor.
    assert health.grad_norm_spike(grads([1.0] * 20 + [9.0]), SPIKE, 5).state == "clear"
    # The spike left the recent window: clear again.
    assert health.grad_norm_spike(grads([1.0] * 20 + [12.0] + [1.0] * 5), SPIKE, 5).state == "clear"


DRIFT = api.StepTimeDriftSpec(warmup_steps=5, baseline_steps=10, window_steps=10, slowdown=0.15)


def times(values: list[float], start: int = 1) -> list[Sample]:
    return [Sample(step=start + i, step_seconds=value) for i, value in enumerate(values)]


def test_step_time_baseline_is_measured_once_its_window_is_complete() -> None:
    warm = [5.0] * 6  # the first step seen and 5 more are left out
    assert health.step_time_baseline(times(warm + [1.0] * 10), 1, DRIFT, 5) is None
    baseline = health.step_time_baseline(times(warm + [1.0] * 9 + [3.0] + [1.0]), 1, DRIFT, 5)
    assert baseline == health.Baseline(1.0, 7, 16)
    assert baseline.steps == "7-16"
    # The warm-up counts from the first step seen (a run resumed at step 100).
    resumed = health.step_time_baseline(times(warm + [2.0] * 11, start=100), 100, DRIFT, 5)
    assert resumed == health.Baseline(2.0, 106, 115)
    # Sparse samples: the first `minSamples` after the warm-up.
    sparse = [Sample(step, step_seconds=float(step)) for step in (1, 8, 14, 20, 26, 32)]
    assert health.step_time_baseline(sparse, 1, DRIFT, 3) == health.Baseline(14.0, 8, 20)
    assert health.step_time_baseline(sparse[:3], 1, DRIFT, 3) is None


def test_step_time_drift() -> None:
    baseline = health.Baseline(1.0, 6, 15)
    assert health.step_time_drift(times([1.0] * 30), None, DRIFT, 5).state == "unknown"
    assert health.step_time_drift(times([1.0] * 30), baseline, DRIFT, 5).state == "clear"
    assert health.step_time_drift(times([1.0] * 20 + [1.1] * 10), baseline, DRIFT, 5).state == "clear"
    verdict = health.step_time_drift(times([1.0] * 20 + [1.2] * 10), baseline, DRIFT, 5)
    assert verdict.state == "active" and verdict.since_step == 21
    assert verdict.message == (
        "median step time 1.2 s over steps 21-30 vs baseline 1 s (steps 6-15): 20% slower, threshold 15%"
    )
    # Exactly 15% slower counts.
    assert health.step_time_drift(times([1.0] * 20 + [1.15] * 10), baseline, DRIFT, 5).state == "active"
    # The recent window never reaches back into the baseline window.
    assert health.step_time_drift(times([1.0] * 17), baseline, DRIFT, 5).state == "unknown"


def test_evaluate_skips_disabled_signals_and_keeps_a_known_baseline() -> None:
    samples = [Sample(step, loss=2.0, grad_norm=1.0, step_seconds=1.0) for step in range(1, 200)]
    every = health.evaluate(history(samples), SPEC)
    assert [v.signal for v in every.verdicts] == list(health.SIGNALS)
    assert every.baseline == health.Baseline(1.0, 22, 121)
    assert every.judged and not every.active
    off = SPEC.model_copy(
        update={
            "step_time_drift": api.StepTimeDriftSpec(enabled=False),
            "loss_stagnation": api.LossStagnationSpec(enabled=False),
        }
    )
    some = health.evaluate(history(samples), off)
    assert [v.signal for v in some.verdicts] == [
        health.NON_FINITE_LOSS,
        health.LOSS_DIVERGING,
        health.GRAD_NORM_SPIKE,
    ]
    assert some.baseline is None
    known = health.Baseline(0.5, 10, 20)
    drifting = health.evaluate(history(samples), SPEC, known)
    assert drifting.baseline == known
    assert [v.signal for v in drifting.active] == [health.STEP_TIME_DRIFT]
    assert not health.evaluate(History(), SPEC).judged


def test_action_of_and_baseline_from_status() -> None:
    spec = api.HealthSpec(loss_divergence=api.LossDivergenceSpec(action="Pause"))
    assert health.action_of(spec, health.LOSS_DIVERGING) == "Pause"
    assert health.action_of(spec, health.NON_FINITE_LOSS) == "None"
    assert health.baseline_from_status(None) is None
    stored = api.HealthStatus(baseline_step_seconds=0.4, baseline_steps="21-120")
    assert health.baseline_from_status(stored) == health.Baseline(0.4, 21, 120)


# ------------------------------------------------------------------------------------------- monitor


def test_monitor_wakes_a_job_only_when_a_signal_changes_state() -> None:
    monitor = health.HealthMonitor()
    job = ("ml", "demo")
    spec = api.HealthSpec(min_samples=2)
    # Before the job's first reconcile nothing is judged.
    assert not monitor.observe(job, "pod-0", lease(1, loss=2.0))
    monitor.settle(job, spec, health.evaluate(monitor.snapshot(job), spec))
    assert not monitor.observe(job, "pod-0", lease(1, loss=2.0))  # nothing new
    assert not monitor.observe(job, "pod-0", {**lease(2, loss=2.0), "phase": "restoring"})
    assert not monitor.observe(job, "pod-0", lease(2, loss=2.0))  # still clear
    assert monitor.observe(job, "pod-0", lease(3, loss="nan"))  # NonFiniteLoss starts
    assert not monitor.observe(job, "pod-0", lease(4, loss="nan"))  # still on
    assert monitor.observe(job, "pod-0", lease(5, loss=1.9))  # over
    assert [s.step for s in monitor.snapshot(job).samples] == [1, 2, 3, 4, 5]
    monitor.reset(job)
    assert monitor.snapshot(job).samples == []
    monitor.forget(job)
    assert not monitor.observe(job, "pod-0", lease(6, loss="nan"))  # forgotten: no spec to judge with


# ------------------------------------------------------------------------------------------- reconcile


def running_job(make_job: Callable[..., Any], **health_spec: Any) -> dict[str, Any]:
    job = make_job(health={"minSamples": 3, **health_spec})
    return job


def reconcile(job: dict[str, Any], found: History | None, minutes: int = 0) -> Any:
    return plan(job, Observed(pods=[], now=NOW + timedelta(minutes=minutes), health=found))


def diverged() -> History:
    return history(losses([2.0] * 100 + [6.0] * 50))


def test_a_signal_sets_healthy_false_once_with_one_event(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job)
    first = reconcile(job, diverged())
    healthy = next(c for c in first.status["conditions"] if c["type"] == "Healthy")
    assert healthy["status"] == "False" and healthy["reason"] == "LossDiverging"
    assert healthy["message"].startswith(
        "LossDiverging: mean loss 6.00 over steps 101-150 vs 2.00 over steps"
    )
    assert [e for e in first.events if e.reason == "LossDiverging"] == [
        Event("Warning", "LossDiverging", first.status["health"]["signals"][0]["message"])
    ]
    assert first.status["health"]["signals"][0]["sinceStep"] == 101
    assert first.health_started == ["LossDiverging"] and not first.suspend
    # The next reconcile sees the same signal (with other numbers): no Event, no change of the status.
    job["status"] = first.status
    worse = history(losses([2.0] * 100 + [7.0] * 60))
    second = reconcile(job, worse, minutes=1)
    assert not [e for e in second.events if e.reason == "LossDiverging"]
    assert second.status["health"] == first.status["health"]
    assert second.status["conditions"] == first.status["conditions"]


def test_healthy_true_once_judged_and_an_event_when_it_comes_back(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job)
    unknown = reconcile(job, History())
    assert "health" not in unknown.status
    assert not [c for c in unknown.status["conditions"] if c["type"] == "Healthy"]
    calm = history(losses([2.0 - 0.001 * i for i in range(150)]))
    first = reconcile(job, calm)
    healthy = next(c for c in first.status["conditions"] if c["type"] == "Healthy")
    assert (healthy["status"], healthy["reason"]) == ("True", "TrainingHealthy")
    assert not [e for e in first.events if e.reason == "TrainingHealthy"]
    job["status"] = reconcile(job, diverged()).status
    back = reconcile(job, calm, minutes=2)
    assert next(c for c in back.status["conditions"] if c["type"] == "Healthy")["status"] == "True"
    assert back.status["health"]["signals"] == []
    assert [e.reason for e in back.events if e.reason == "TrainingHealthy"] == ["TrainingHealthy"]


def test_unknown_keeps_the_last_state_and_no_history_changes_nothing(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job)
    job["status"] = reconcile(job, diverged()).status
    # An operator restart: the history is empty again.
    again = reconcile(job, History(), minutes=1)
    assert again.status["health"] == job["status"]["health"]
    assert again.status["conditions"] == job["status"]["conditions"]
    assert not [e for e in again.events if e.reason in health.SIGNALS]
    unobserved = reconcile(job, None, minutes=1)
    assert unobserved.status["health"] == job["status"]["health"]


def test_pause_suspends_the_job_and_records_why(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job, lossDivergence={"action": "Pause"})
    first = reconcile(job, diverged())
    assert first.suspend
    signal = first.status["health"]["signals"][0]
    assert signal["action"] == "Pause"
    assert first.status["health"]["paused"].startswith("LossDiverging: mean loss 6.00")
    assert [e.reason for e in first.events if e.type == "Warning"][-2:] == ["LossDiverging", "HealthPause"]
    # The patched spec comes back: the suspend path runs and says why; the history restarts.
    job["status"] = first.status
    job["spec"]["suspend"] = True
    suspended = reconcile(job, diverged(), minutes=1)
    assert suspended.health_reset and not suspended.suspend
    condition = next(c for c in suspended.status["conditions"] if c["type"] == "Suspended")
    assert "paused by the operator after LossDiverging: mean loss 6.00" in condition["message"]
    # Resumed: judged afresh (no Healthy until enough data), the baseline kept.
    job["status"] = suspended.status
    job["status"]["health"]["baselineStepSeconds"] = 0.5
    job["status"]["health"]["baselineSteps"] = "21-120"
    job["spec"]["suspend"] = False
    resumed = reconcile(job, History(), minutes=2)
    assert resumed.status["health"] == {"signals": [], "baselineStepSeconds": 0.5, "baselineSteps": "21-120"}
    assert not [c for c in resumed.status["conditions"] if c["type"] == "Healthy"]
    # The same signal again after the resume is a new start: Event and Pause again.
    job["status"] = resumed.status
    again = reconcile(job, diverged(), minutes=3)
    assert again.suspend and "LossDiverging" in [e.reason for e in again.events]


def test_a_baseline_found_is_kept_in_the_status(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job)
    samples = [Sample(step, loss=2.0, step_seconds=0.5) for step in range(1, 200)]
    first = reconcile(job, history(samples))
    assert first.status["health"]["baselineStepSeconds"] == 0.5
    assert first.status["health"]["baselineSteps"] == "22-121"
    # After an operator restart the stored baseline judges the new heartbeats.
    job["status"] = first.status
    slower = history([Sample(step, loss=2.0, step_seconds=0.6) for step in range(500, 560)])
    later = reconcile(job, slower, minutes=5)
    assert [s["reason"] for s in later.status["health"]["signals"]] == ["StepTimeDrift"]
    assert later.status["health"]["baselineSteps"] == "22-121"


def test_several_signals_name_the_most_urgent_first(make_job: Callable[..., Any]) -> None:
    job = running_job(make_job, nonFiniteLoss={"action": "Pause"}, lossDivergence={"action": "Pause"})
    found = history(losses([2.0] * 100 + [6.0] * 49 + [float("nan")]))
    first = reconcile(job, found)
    healthy = next(c for c in first.status["conditions"] if c["type"] == "Healthy")
    assert healthy["reason"] == "NonFiniteLoss"
    assert "; LossDiverging: " in healthy["message"]
    # One Pause, for the first signal.
    assert [s.get("action") for s in first.status["health"]["signals"]] == ["Pause", None]
    assert [e.reason for e in first.events].count("HealthPause") == 1


# ------------------------------------------------------------------------------------------- handlers


class FakeKube:
    def __init__(self, job: dict[str, Any], suspend_error: int | None = None) -> None:
        self.job = job
        self.calls: list[str] = []
        self.suspend_error = suspend_error

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.job

    def ensure(self, obj: dict[str, Any]) -> None:
        pass

    def forget(self, namespace: str, name: str, keep: Collection[str] = ()) -> None:
        pass

    def create(self, obj: dict[str, Any]) -> bool:
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        pass

    def ungate_pod(self, namespace: str, name: str, gate: str) -> None:
        self.calls.append(("ungate", name))

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        pass

    def suspend_job(self, job: dict[str, Any]) -> None:
        if self.suspend_error:
            raise ApiException(status=self.suspend_error, reason="Conflict")
        self.calls.append("suspend")

    def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        self.calls.append("status")
        self.job = {**job, "status": status}

    def post_event(self, job: dict[str, Any], event: Event) -> None:
        self.calls.append(f"event {event.reason}")


def feed(reconciler: handlers.JobReconciler, values: list[float]) -> None:
    for step, value in enumerate(values, start=1):
        reconciler.health.observe(("ml", "demo"), "demo-worker-0", lease(step, loss=value))


@pytest.mark.parametrize("error", [None, 409])
def test_handler_suspends_before_the_status_write(make_job: Callable[..., Any], error: int | None) -> None:
    job = make_job(health={"minSamples": 3, "lossDivergence": {"action": "Pause"}})
    kube = FakeKube(job, suspend_error=error)
    metrics = OperatorMetrics()
    reconciler = handlers.JobReconciler(kube, metrics)  # type: ignore[arg-type]
    feed(reconciler, [2.0] * 100 + [6.0] * 50)
    logger = kopf.LocalObjectLogger(body=job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    if error:
        # Not suspended: the status does not say so, and the next reconcile tries again.
        assert kube.calls == []
        return
    assert kube.calls[:2] == ["suspend", "status"]
    assert "event LossDiverging" in kube.calls and "event HealthPause" in kube.calls
    value = metrics.registry.get_sample_value(
        "phalanx_job_health_signal", {"namespace": "ml", "trainingjob": "demo", "signal": "LossDiverging"}
    )
    assert value == 1
    started = metrics.registry.get_sample_value(
        "phalanx_health_signals_started_total", {"signal": "LossDiverging"}
    )
    assert started == 1
    off = metrics.registry.get_sample_value(
        "phalanx_job_health_signal", {"namespace": "ml", "trainingjob": "demo", "signal": "NonFiniteLoss"}
    )
    assert off == 0
    # Once settled, heartbeats that keep the same state wake nothing.
    assert not reconciler.health.observe(("ml", "demo"), "demo-worker-0", lease(151, loss=6.0))
    reconciler.forget("ml", "demo", "uid-123")
    gone = metrics.registry.get_sample_value(
        "phalanx_job_health_signal", {"namespace": "ml", "trainingjob": "demo", "signal": "LossDiverging"}
    )
    assert gone is None
