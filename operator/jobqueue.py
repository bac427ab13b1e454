"""The reconciles that watch events ask for, queued per job: at most one waiting and one running for each job.

A watch handler that waited for its job's reconcile would hold up its own object's stream in kopf: kopf takes
one object's events one at a time, index first, then handlers, so while a pod's handler waits, that pod's index
entry stays where the event before put it. With 1,000 jobs started at once the reconciles the burst asked for
queued for minutes on the handler threads, and the indexes showed pods unscheduled and heartbeats stale for as
long (running gangs were taken for unplaced ones, live workers for silent ones). So a handler only queues its job
and returns. A job already waiting is not queued again: the reconcile that runs reads every index when it
starts, so it covers every event that came before. A job whose reconcile is running is queued once more, to
run after it, as client-go's work queue does: one job's reconciles never hold two threads at once, and the
queue never holds more entries than there are jobs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, ThreadPoolExecutor

LOGGER = logging.getLogger(__name__)


class JobQueue:
    """Per key (a job), the latest reconcile asked for, run on `executor` (kopf's handler threads once the
    operator has started; until then, and in tests, threads of its own)."""

    def __init__(self, fallback_threads: int = 4) -> None:
        self.executor: Executor | None = None
        self._fallback_threads = fallback_threads
        self._fallback: ThreadPoolExecutor | None = None
        self._guard = threading.Condition()
        self._waiting: dict[Hashable, Callable[[], None]] = {}
        """Jobs queued, each with the reconcile to run (the latest asked for)."""
        self._running: set[Hashable] = set()

    def wake(self, key: Hashable, reconcile: Callable[[], None]) -> bool:
        """Ask for `reconcile` of `key`; False when one asked for earlier still waits (this one takes its place,
        and runs as that one would have)."""
        with self._guard:
            covered = key in self._waiting
            self._waiting[key] = reconcile
            # A job whose reconcile runs is submitted again when it ends.
            submit = not covered and key not in self._running
        if submit:
            self._submit(key)
        return not covered

    def depth(self) -> int:
        """Jobs waiting for a thread."""
        with self._guard:
            return len(self._waiting)

    def join(self, timeout: float) -> bool:
        """Wait until nothing waits or runs; False when `timeout` passed first."""
        with self._guard:
            return self._guard.wait_for(lambda: not self._waiting and not self._running, timeout)

    def _submit(self, key: Hashable) -> None:
        executor = self.executor
        if executor is None:
            with self._guard:
                if self._fallback is None:
                    self._fallback = ThreadPoolExecutor(
                        self._fallback_threads, thread_name_prefix="phalanx-queue"
                    )
                executor = self._fallback
        try:
            executor.submit(self._work, key)
        except RuntimeError:
            # The threads are shut down (the operator is stopping): forget the job, or no later wake would queue it.
            with self._guard:
                self._waiting.pop(key, None)
                self._guard.notify_all()
            raise

    def _work(self, key: Hashable) -> None:
        with self._guard:
            reconcile = self._waiting.pop(key)
            self._running.add(key)
        try:
            reconcile()
        except Exception:
            # As kopf does for an event handler that raises: logged, and the next event or tick tries again.
            LOGGER.exception("reconcile of %s failed", key)
        finally:
            with self._guard:
                self._running.discard(key)
                again = key in self._waiting
                self._guard.notify_all()
            if again:
                self._submit(key)
