"""The launcher's hang-drill hook: which request it honours, and that it really stops the training processes
(and their children) once, leaving everything else alone. Real processes, no cluster."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.worker.drillhook import DRILL_HANG_ANNOTATION, HangDrill, hang_target, is_hang_requested


def job_with(annotation: str | None, allowed: bool = True) -> dict:
    annotations = {} if annotation is None else {DRILL_HANG_ANNOTATION: annotation}
    return {
        "metadata": {"name": "demo", "annotations": annotations},
        "spec": {"drills": {"allowed": allowed}},
    }


def test_only_the_named_pod_of_that_uid_is_asked_to_hang() -> None:
    assert is_hang_requested(job_with("demo-worker-1/uid-1"), "demo-worker-1", "uid-1")
    assert not is_hang_requested(job_with("demo-worker-1/uid-1"), "demo-worker-1", "uid-2")  # a later pod
    assert not is_hang_requested(job_with("demo-worker-1/uid-1"), "demo-worker-0", "uid-1")
    assert not is_hang_requested(job_with(None), "demo-worker-1", "uid-1")
    assert not is_hang_requested(None, "demo-worker-1", "uid-1")
    assert not is_hang_requested(job_with("/"), "", "")  # outside a pod nothing hangs
    # A job that does not allow drills never hangs, whoever annotated it.
    assert not is_hang_requested(job_with("demo-worker-1/uid-1", allowed=False), "demo-worker-1", "uid-1")
    assert hang_target("demo-worker-1", "uid-1") == "demo-worker-1/uid-1"


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_for_state(pid: int, wanted: str, patience: float = 10.0) -> str:
    deadline = time.monotonic() + patience
    while (state := state_of(pid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


@pytest.fixture
def trainer() -> subprocess.Popen[bytes]:
    """A stand-in training process with a child of its own (a data loader worker)."""
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", script])
    yield process
    process.kill()
    process.wait()


def test_the_training_processes_and_their_children_are_stopped_once(trainer: subprocess.Popen[bytes]) -> None:
    import psutil

    deadline = time.monotonic() + 10
    while not psutil.Process(trainer.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = psutil.Process(trainer.pid).children()
    job = job_with(None)
    drill = HangDrill(lambda: job, lambda: [trainer.pid], "demo-worker-1", "uid-1", interval=60)

    assert drill.tick() == []  # no request: nothing happens
    assert state_of(trainer.pid) != "T"

    job = job_with(hang_target("demo-worker-1", "uid-1"))
    assert sorted(drill.tick()) == sorted([trainer.pid, child.pid])
    assert wait_for_state(trainer.pid, "T") == "T"
    assert wait_for_state(child.pid, "T") == "T"

    # Honoured once: a thaw by someone else is not undone by the next look.
    psutil.Process(trainer.pid).resume()
    drill.tick()
    assert wait_for_state(trainer.pid, "S") == "S"
    child.kill()


def test_a_request_before_any_group_runs_waits_for_one() -> None:
    pids: list[int] = []
    drill = HangDrill(lambda: job_with("w/u"), lambda: pids, "w", "u", interval=60)
    assert drill.tick() == [] and drill.frozen == []
