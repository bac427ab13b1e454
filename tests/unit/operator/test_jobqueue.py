"""The queue of event-driven reconciles: one waiting and one running per job, never two at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from phalanx.operator.jobqueue import JobQueue


class Recorder:
    """Reconciles that record what ran, and may block until released."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.running: dict[str, int] = {}
        self.overlapped = False
        self.release = threading.Event()
        self.started = threading.Event()
        self._guard = threading.Lock()

    def reconcile(self, key: str, label: str, block: bool = False) -> object:
        def work() -> None:
            with self._guard:
                self.running[key] = self.running.get(key, 0) + 1
                self.overlapped = self.overlapped or self.running[key] > 1
            self.started.set()
            if block:
                assert self.release.wait(10)
            with self._guard:
                self.ran.append(label)
                self.running[key] -= 1

        return work


def test_wakes_while_a_job_waits_are_one_reconcile_the_latest_asked_for() -> None:
    queue = JobQueue()
    recorder = Recorder()
    gate = threading.Event()
    # One thread, held: every wake below finds the job waiting for it.
    with ThreadPoolExecutor(1) as threads:
        queue.executor = threads
        threads.submit(gate.wait, 10)
        assert queue.wake("a", recorder.reconcile("a", "a1"))  # type: ignore[arg-type]
        assert not queue.wake("a", recorder.reconcile("a", "a2"))  # type: ignore[arg-type]
        assert not queue.wake("a", recorder.reconcile("a", "a3"))  # type: ignore[arg-type]
        assert queue.wake("b", recorder.reconcile("b", "b1"))  # type: ignore[arg-type]
        assert queue.depth() == 2
        gate.set()
        assert queue.join(10)
    assert recorder.ran == ["a3", "b1"]


def test_a_wake_while_its_job_runs_runs_once_after_it_never_beside_it() -> None:
    queue = JobQueue(fallback_threads=4)
    recorder = Recorder()
    queue.wake("a", recorder.reconcile("a", "first", block=True))  # type: ignore[arg-type]
    assert recorder.started.wait(10)
    # Four threads are free, yet none takes the job's next reconcile while its first runs.
    assert queue.wake("a", recorder.reconcile("a", "second"))  # type: ignore[arg-type]
    assert not queue.wake("a", recorder.reconcile("a", "third"))  # type: ignore[arg-type]
    time.sleep(0.2)
    assert recorder.ran == [] and queue.depth() == 1
    recorder.release.set()
    assert queue.join(10)
    assert recorder.ran == ["first", "third"] and not recorder.overlapped


def test_other_jobs_run_while_one_job_s_reconcile_is_held() -> None:
    queue = JobQueue(fallback_threads=2)
    recorder = Recorder()
    queue.wake("a", recorder.reconcile("a", "a", block=True))  # type: ignore[arg-type]
    assert recorder.started.wait(10)
    queue.wake("b", recorder.reconcile("b", "b"))  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while "b" not in recorder.ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.ran == ["b"]
    recorder.release.set()
    assert queue.join(10)


def test_a_reconcile_that_raises_is_logged_and_its_job_is_queued_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = JobQueue()
    ran: list[int] = []

    def failing() -> None:
        ran.append(1)
        raise RuntimeError("the API server refused")

    queue.wake("a", failing)
    assert queue.join(10)
    assert "reconcile of a failed" in caplog.text
    assert queue.wake("a", lambda: ran.append(2))
    assert queue.join(10) and ran == [1, 2]


def test_a_job_whose_threads_are_gone_is_not_left_waiting_for_ever() -> None:
    queue = JobQueue()
    threads = ThreadPoolExecutor(1)
    threads.shutdown()
    queue.executor = threads
    with pytest.raises(RuntimeError):
        queue.wake("a", lambda: None)
    assert queue.depth() == 0
    queue.executor = None
    assert queue.wake("a", lambda: None) and queue.join(10)
