"""Training health end to end: real training on the local cluster, one anomaly per test.

A learning-rate spike makes the loss diverge, a NaN loss trained through stays NaN, a burst of huge gradients
spikes the gradient norm, a learning rate dropped to 0 stalls the loss, a worker slowed from a given step drifts
the step time: each raises its signal (condition `Healthy`, one Event, `status.health`) and
takes its action (`Pause`: the job is suspended and its workers save a checkpoint on the way out; `Rollback`:
every worker restarts from a checkpoint before the anomaly and training goes on by itself).
Every test turns the other signals off and uses small windows, so the jobs stay short.
"""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.worker.checkpoint import durable

from .conftest import Cluster, Operator, wait_for
from .test_fault_scenarios import _checkpoint_claim, _claim_directory
from .test_operator import condition, events_for, get_job, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

SIGNALS = ("lossDivergence", "nonFiniteLoss", "lossStagnation", "gradNormSpike", "stepTimeDrift")
TRAINER_LABELS = "phalanx.dev/component=trainer"


def health(**signals: dict[str, Any]) -> dict[str, Any]:
    """Every signal off but those given; three samples make a window."""
    spec: dict[str, Any] = {"minSamples": 3, **{name: {"enabled": False} for name in SIGNALS}}
    spec.update(signals)
    return spec


def args_of(job: dict[str, Any]) -> list[str]:
    return job["spec"]["template"]["spec"]["containers"][0]["args"]


def reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [event["reason"] for event in events_for(cluster, namespace, name)]


def wait_paused(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    cluster.kubectl(
        "wait", "--for=condition=Suspended", f"trainingjob/{name}", "-n", namespace, "--timeout=300s",
        timeout=310,
    )  # fmt: skip
    # Suspended means no worker runs, terminating ones included: each one's save on SIGTERM is done, and the
    # caller reads the checkpoint next, as a user who waited for the condition would.
    selector = f"phalanx.dev/job-name={name},{TRAINER_LABELS}"
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
    running = [
        (pod.metadata.name, pod.status.phase)
        for pod in pods
        if pod.status.phase not in ("Succeeded", "Failed")
    ]
    assert not running, f"Suspended while workers still run: {running}"
    return get_job(cluster, namespace, name)


def assert_paused_by(cluster: Cluster, namespace: str, job: dict[str, Any], signal: str) -> dict[str, Any]:
    """The job was suspended by the operator for `signal`; its record of it."""
    name, status = job["metadata"]["name"], job["status"]
    print(f"{name}: {status.get('health')} {condition(job, 'Healthy')}")
    assert job["spec"]["suspend"] is True
    healthy = condition(job, "Healthy")
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == signal, healthy
    (record,) = [s for s in status["health"]["signals"] if s["reason"] == signal]
    assert record["action"] == "Pause" and record["message"] in healthy["message"]
    assert status["health"]["paused"].startswith(f"{signal}: ")
    suspended = condition(job, "Suspended")
    assert suspended is not None and f"paused by the operator after {signal}" in suspended["message"]
    seen = reasons(cluster, namespace, name)
    assert seen.count(signal) == 1 and seen.count("HealthPause") == 1, seen
    return record


def test_loss_divergence_pauses_the_job_with_a_checkpoint(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(_checkpoint_claim(), namespace)
    divergence = {"recentSteps": 10, "referenceSteps": 30, "factor": 1.5, "action": "Pause"}
    job = trainingjob(
        "diverge",
        replicas=2,
        steps=400,
        step_delay=0.25,
        health=health(lossDivergence=divergence),
        # No periodic durable save before the end: a checkpoint in the claim is the one taken on pause.
        checkpoint={"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 1000},
    )
    args_of(job).extend(["--lr-spike-at-step", "60"])
    cluster.apply(job, namespace)
    paused = wait_paused(cluster, namespace, "diverge")
    record = assert_paused_by(cluster, namespace, paused, "LossDiverging")
    # The signal dates itself from the first heartbeat sample of the recent window that caught the spike.
    assert record["sinceStep"] > 60 - divergence["recentSteps"], record
    assert "mean loss" in record["message"] and "over steps" in record["message"]
    saved = durable.complete_steps(_claim_directory(cluster, namespace, "diverge"))
    assert saved and saved[0] >= record["sinceStep"], saved


def test_nan_loss_pauses_the_job(cluster: Cluster, operator: Operator, namespace: str) -> None:
    job = trainingjob(
        "nanloss", replicas=2, steps=400, step_delay=0.25, health=health(nonFiniteLoss={"action": "Pause"})
    )
    args_of(job).extend(["--nan-at-step", "25", "--no-loss-guard"])
    cluster.apply(job, namespace)
    paused = wait_paused(cluster, namespace, "nanloss")
    record = assert_paused_by(cluster, namespace, paused, "NonFiniteLoss")
    assert record["message"].startswith("loss nan at step"), record
    assert record["sinceStep"] >= 25, record


def test_slowed_worker_raises_step_time_drift_and_the_job_goes_on(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    drift = {"warmupSteps": 5, "baselineSteps": 30, "windowSteps": 20, "slowdown": 0.5}
    job = trainingjob("drift", replicas=2, steps=130, step_delay=0.2, health=health(stepTimeDrift=drift))
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "PHALANX_EXAMPLE_SLOW_POD", "value": "drift-worker-1"},
        {"name": "PHALANX_EXAMPLE_SLOW_SECONDS", "value": "0.4"},
    ]
    args_of(job).extend(["--slow-from-step", "75"])
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "drift", timeout=400)
    status = final["status"]
    print(f"drift: {status.get('health')} {condition(final, 'Healthy')}")
    assert status["step"] == 130
    healthy = condition(final, "Healthy")
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == "StepTimeDrift"
    (record,) = status["health"]["signals"]
    assert record["reason"] == "StepTimeDrift" and record.get("action") is None
    # The window that shows it (its first step is `sinceStep`) is mostly after the slow-down began.
    assert record["sinceStep"] > 75 - drift["windowSteps"], record
    assert "slower, threshold 50%" in record["message"]
    baseline = status["health"]["baselineStepSeconds"]
    assert baseline > 0 and f"baseline {baseline:.3g} s" in record["message"]
    first, last = (int(step) for step in status["health"]["baselineSteps"].split("-"))
    assert first < last < 75
    seen = reasons(cluster, namespace, "drift")
    assert seen.count("StepTimeDrift") == 1 and "HealthPause" not in seen, seen
    assert not final["spec"].get("suspend")


@pytest.mark.long
def test_a_gradient_burst_raises_grad_norm_spike_until_it_is_behind_the_run(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # Steps 70-77 have their gradients multiplied by 1000 (the clipping keeps the weights from them).
    spike = {"factor": 10, "windowSteps": 40, "recentSteps": 30}
    job = trainingjob("gradspike", replicas=2, steps=150, step_delay=0.2, health=health(gradNormSpike=spike))
    args_of(job).extend(["--grad-spike-at-step", "70", "--grad-spike-steps", "8"])
    cluster.apply(job, namespace)

    def spiking() -> dict[str, Any] | None:
        found = get_job(cluster, namespace, "gradspike")
        healthy = condition(found, "Healthy")
        return found if healthy is not None and healthy["reason"] == "GradNormSpike" else None

    during = wait_for(spiking, 240, message="the gradient-norm spike flagged while it is recent")
    healthy = condition(during, "Healthy")
    print(f"gradspike: {during['status'].get('health')} {healthy}")
    assert healthy is not None and healthy["status"] == "False"
    (record,) = during["status"]["health"]["signals"]
    assert record["reason"] == "GradNormSpike" and record.get("action") is None
    assert 70 <= record["sinceStep"] < 78, record
    assert f"at step {record['sinceStep']}" in record["message"] and "threshold 10x" in record["message"]
    # Thirty steps after the burst it is no longer recent: the job is healthy again, and trained to the end.
    final = wait_succeeded(cluster, namespace, "gradspike", timeout=400)
    healthy = condition(final, "Healthy")
    assert healthy is not None and (healthy["status"], healthy["reason"]) == ("True", "TrainingHealthy"), (
        healthy
    )
    assert final["status"]["health"]["signals"] == []
    seen = reasons(cluster, namespace, "gradspike")
    assert seen.count("GradNormSpike") == 1 and "HealthPause" not in seen, seen


@pytest.mark.long
def test_a_loss_that_stops_falling_raises_loss_stagnation(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The learning rate drops to 0 at step 60: the loss, falling until then, stays where it is.
    stagnation = {"windowSteps": 100, "minImprovement": 0.05}
    job = trainingjob(
        "stagnant", replicas=2, steps=220, step_delay=0.2, health=health(lossStagnation=stagnation)
    )
    args_of(job).extend(["--lr-spike-at-step", "60", "--lr-spike-factor", "0"])
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "stagnant", timeout=400)
    status = final["status"]
    print(f"stagnant: {status.get('health')} {condition(final, 'Healthy')}")
    healthy = condition(final, "Healthy")
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == "LossStagnating"
    (record,) = status["health"]["signals"]
    assert record["reason"] == "LossStagnating" and record.get("action") is None
    assert "under 5.00%" in record["message"], record
    # The newest fifth of the window that shows it lies wholly after the learning rate went to 0.
    latest_first = int(record["message"].split(" over steps ")[1].split("-")[0])
    assert latest_first > 60, record
    seen = reasons(cluster, namespace, "stagnant")
    assert seen.count("LossStagnating") == 1 and "HealthPause" not in seen, seen


def test_nan_loss_rollback_restores_a_checkpoint_before_it_and_training_finishes(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(_checkpoint_claim(), namespace)
    # The global batch of step 30 gives a NaN loss whenever it is trained (a bad batch; trained through,
    # every later loss stays NaN). Rolled back and that batch skipped (`skipBatches: all`), it never returns.
    job = trainingjob(
        "rollback",
        replicas=2,
        steps=100,
        step_delay=0.25,
        health=health(nonFiniteLoss={"action": "Rollback"}, rollback={"skipBatches": "all"}),
        checkpoint={"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 10, "keep": 5},
    )
    args_of(job).extend(["--nan-batch-of-step", "30", "--no-loss-guard"])
    cluster.apply(job, namespace)
    final = wait_succeeded(cluster, namespace, "rollback", timeout=600)
    status = final["status"]
    print(f"rollback: {status.get('rollback')} {status.get('health')} {condition(final, 'Healthy')}")
    assert status["step"] == 100 and not final["spec"].get("suspend")
    request = status["rollback"]
    assert request["epoch"] == 1 and request["skipBatches"] == "all"
    # The heartbeats showed the NaN at step 30 at the earliest: the bound is before it.
    assert request["atOrBeforeStep"] < 30 <= request["fromStep"], request
    record = status["health"]["lastRollback"]
    assert status["health"]["rollbacks"] == 1 and record["signal"] == "NonFiniteLoss"
    assert record["atOrBeforeStep"] == request["atOrBeforeStep"]
    # Memory held only the last few (NaN) steps: the newest durable checkpoint at or before the bound.
    assert record["restoredFrom"] == "durable" and 10 <= record["restoredStep"] <= record["atOrBeforeStep"], (
        record
    )
    assert record["restoredStep"] % 10 == 0
    healthy = condition(final, "Healthy")
    assert healthy is not None and (healthy["status"], healthy["reason"]) == ("True", "TrainingHealthy"), (
        healthy
    )
    assert status["health"]["signals"] == []
    seen = reasons(cluster, namespace, "rollback")
    assert seen.count("NonFiniteLoss") == 1 and seen.count("HealthRollback") == 1, seen
    assert seen.count("RolledBack") == 1 and "HealthPause" not in seen, seen
    # The abandoned run's checkpoints are set aside; the new run's reach the final step.
    directory = _claim_directory(cluster, namespace, "rollback")
    steps = durable.complete_steps(directory)
    assert steps[0] == 100, steps
    set_aside = sorted(path.name for path in (directory / "rolled-back" / "epoch-1").iterdir())
    assert set_aside and all(int(name.split("-")[1]) > record["restoredStep"] for name in set_aside), (
        set_aside
    )
