"""Scripts as users write them, under a TrainingJob through a killed worker.

A plain torchrun script (no Phalanx imports) runs with gang, spare and restart, its progress shown as unknown
and never judged a hang; a loop with `phalanx.worker.session`, a PyTorch Lightning and a Hugging Face Trainer
run with one line each resume from the spare with at most one step lost.
Timeouts (printed with every failure): heartbeat interval 1 s, timeout 5 s, progress timeout 10 s.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_operator import events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

# The progress timeout leaves room for what a recovery costs on this 2-core machine, where every pod shares the
# same cores: the promoted spare starts its framework (Lightning, Transformers) while the replacement spare's
# launcher and interpreters import torch beside it. These tests are about the callbacks resuming, not about
# hang detection (tests/e2e/test_fault_tolerance.py judges that with 10 s).
HEARTBEAT = {"intervalSeconds": 1, "timeoutSeconds": 5, "progressTimeoutSeconds": 30}
STEP_DELAY = 0.1


def example_job(name: str, module: str, steps: int) -> dict[str, Any]:
    """Replicas 2, spares 1, running `python -m phalanx.worker.examples.<module>`."""
    job = trainingjob(name, replicas=2, spares=1)
    job["spec"]["heartbeat"] = HEARTBEAT
    (container,) = job["spec"]["template"]["spec"]["containers"]
    container["command"] = ["python", "-m", f"phalanx.worker.examples.{module}"]
    container["args"] = ["--steps", str(steps), "--step-delay", str(STEP_DELAY)]
    container["resources"]["requests"]["memory"] = "256Mi"
    return job


def lease_of(cluster: Cluster, namespace: str, pod: str) -> dict[str, str]:
    return cluster.get_json("lease", pod, "-n", namespace)["metadata"].get("annotations", {})


def kill_a_training_worker(
    cluster: Cluster, namespace: str, name: str, min_step: int | None
) -> tuple[str, int]:
    """SIGKILL a worker whose heartbeat says it trains (past `min_step` when the script publishes steps);
    the victim and the step its heartbeat last showed."""

    def pick() -> tuple[str, int] | None:
        for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
            lease = lease_of(cluster, namespace, pod.metadata.name)
            step = int(lease.get("phalanx.dev/step") or 0)
            if lease.get("phalanx.dev/phase") == "training" and (min_step is None or step >= min_step):
                return pod.metadata.name, step
        return None

    victim, step = wait_for(pick, 300, message=f"a training worker (step >= {min_step})")
    cluster.kubectl("annotate", "pod", victim, "-n", namespace, "phalanx.dev/kill=now")
    return victim, step


def steps_until_succeeded(cluster: Cluster, namespace: str, name: str) -> tuple[dict[str, Any], list[int]]:
    """The job once it succeeded, and every `status.step` seen on the way (the heartbeats' step, even when it
    went back: a loop that restarted from 0 shows as a drop)."""
    seen: list[int] = []

    def done() -> dict[str, Any] | None:
        job = get_job(cluster, namespace, name)
        if job.get("status", {}).get("step") is not None:
            seen.append(job["status"]["step"])
        return job if job.get("status", {}).get("state") == "Succeeded" else None

    return wait_for(done, 600, message=f"{name} to succeed"), seen


def assert_spare_took_over(
    cluster: Cluster, namespace: str, job: dict[str, Any], victim: str
) -> dict[str, Any]:
    status = job["status"]
    name = job["metadata"]["name"]
    mine = [incident for incident in status.get("incidents", []) if incident.get("worker") == victim]
    assert [incident["cause"] for incident in mine] == ["Killed"], status.get("incidents")
    assert not [i for i in status.get("incidents", []) if i["cause"] == "NoProgress"], status["incidents"]
    assert any(e["reason"] == "SparePromoted" for e in events_for(cluster, namespace, name))
    print(f"{name}: {mine[0]} restarts={status['restarts']} heartbeat={HEARTBEAT}")
    return mine[0]


def run_through_a_kill(
    cluster: Cluster, namespace: str, name: str, module: str, steps: int, min_step: int
) -> dict[str, Any]:
    """Train `module` to `steps` through one killed worker: the incident, after checking the spare took over
    and that at most one step was lost (the step at the kill against the step the group resumed from)."""
    cluster.apply(example_job(name, module, steps), namespace)
    victim, step_at_kill = kill_a_training_worker(cluster, namespace, name, min_step)
    # The job's status may still show an older step than the victim's heartbeat did (it is written at the
    # operator's pace): that is where the steps seen from here start, not a step that went back.
    shown_at_kill = get_job(cluster, namespace, name).get("status", {}).get("step")
    floor = step_at_kill if shown_at_kill is None else min(step_at_kill, shown_at_kill)
    job, seen = steps_until_succeeded(cluster, namespace, name)
    incident = assert_spare_took_over(cluster, namespace, job, victim)
    assert job["status"]["step"] == steps and job["status"]["progress"] == "Reported", job["status"]
    assert incident["stepsLost"] is not None and incident["stepsLost"] <= 1, incident
    # The loop itself went on from there (not only the restored weights): no step seen went further back.
    assert min(seen) >= floor - 1, (step_at_kill, shown_at_kill, seen)
    assert incident.get("restoredFrom") in ("memory", "peer"), incident
    return job


def test_plain_torchrun_script_runs_with_progress_unknown(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = example_job("plain", "plain_ddp", steps=300)
    # Unknown comes one progress timeout into training: well before the script ends, even on a fast machine.
    job["spec"]["heartbeat"] = {**HEARTBEAT, "progressTimeoutSeconds": 10}
    cluster.apply(job, namespace)
    wait_for(
        lambda: get_job(cluster, namespace, "plain").get("status", {}).get("progress") == "Unknown",
        300,
        message="progress Unknown while the plain script trains",
    )
    # Well past the progress timeout without a step: still no hang.
    victim, _ = kill_a_training_worker(cluster, namespace, "plain", min_step=None)
    job = wait_succeeded(cluster, namespace, "plain", timeout=600)
    assert_spare_took_over(cluster, namespace, job, victim)
    assert job["status"]["progress"] == "Unknown" and job["status"].get("step") is None, job["status"]
    table = cluster.kubectl("get", "trainingjobs", "plain", "-n", namespace).stdout.splitlines()
    assert table[0].split()[6] == "PROGRESS" and table[1].split()[-2] == "Unknown", table
    reasons = [event["reason"] for event in events_for(cluster, namespace, "plain")]
    assert "ProgressUnknown" in reasons and "NoProgress" not in reasons, reasons


def test_session_loop_resumes_from_the_spare(cluster: Cluster, operator: Operator, namespace: str) -> None:
    run_through_a_kill(cluster, namespace, "session", "session_loop", steps=150, min_step=20)


def test_lightning_callback_resumes_from_the_spare(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    run_through_a_kill(cluster, namespace, "lightning", "lightning_loop", steps=150, min_step=20)


@pytest.mark.long
def test_huggingface_callback_resumes_from_the_spare(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    run_through_a_kill(cluster, namespace, "huggingface", "hf_trainer", steps=150, min_step=20)


def test_a_training_process_that_lingers_after_it_finished_is_ended_and_the_job_succeeds(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    """A teardown that never ends (a collective library's, an interpreter's exit) after the run said
    `finished`, which comes after its last save: the launcher ends the process `PHALANX_FINISHED_GRACE`
    seconds later (3 s here, 30 s by default) and the pod and the job succeed, not wait in Finishing."""
    job = example_job("linger", "session_loop", steps=30)
    job["spec"]["spares"] = 0
    (container,) = job["spec"]["template"]["spec"]["containers"]
    container["args"] += ["--hang-at-exit", "1"]
    container["env"] = [{"name": "PHALANX_FINISHED_GRACE", "value": "3"}]
    cluster.apply(job, namespace)
    # Without the bound the rank-1 pod would run until the test's timeout; the others' exit barrier is 120 s.
    job = wait_succeeded(cluster, namespace, "linger", timeout=110)
    assert job["status"]["step"] == 30, job["status"]
    logs = {
        pod.metadata.name: cluster.kubectl("logs", "-n", namespace, pod.metadata.name).stdout
        for pod in job_pods(cluster, namespace, "linger", "phalanx.dev/role=worker")
    }
    ended = [pod for pod, log in logs.items() if "ending the training processes: every one published" in log]
    told = "\n".join(f"--- {pod}\n{log}" for pod, log in logs.items())
    assert len(ended) == 1, told
    assert "hanging after the run finished" in logs[ended[0]], told
    assert not [e for e in events_for(cluster, namespace, "linger") if e["type"] == "Warning"]
