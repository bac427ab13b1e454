"""Noticing that the operator's pod watch has stopped, so that the operator restarts instead of acting blind.

kopf's watch of pods can end for good after the operator was frozen (seen after a 60 s SIGSTOP: the stream
stopped and was never started again, while the other watches went on). The pod index then never changes: a
worker's failure is never seen. The evidence used here is a pod the API server says exists (it answered the
operator's creation, or answered AlreadyExists to it) and the index still does not show after `limit` seconds:
when that pod is the job's own, the watch is dead. A restart
starts every watch afresh (and the operator re-reads everything before it acts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

JobKey = tuple[str, str]


class UnseenPods:
    """Per job, the pods a creation found existing and the pod index has not shown since (thread-safe)."""

    def __init__(self, limit_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_seconds = limit_seconds
        self._clock = clock
        self._first: dict[JobKey, dict[str, float]] = {}
        self._guard = threading.Lock()

    def found_existing(self, job: JobKey, pods: Iterable[str]) -> None:
        """The API server created these pods, or answered AlreadyExists for them; the index did not show them."""
        now = self._clock()
        with self._guard:
            first = self._first.setdefault(job, {})
            for pod in pods:
                first.setdefault(pod, now)

    def seen(self, job: JobKey, pods: Iterable[str]) -> None:
        """The index shows these pods of the job."""
        with self._guard:
            first = self._first.get(job)
            if first is None:
                return
            for pod in pods:
                first.pop(pod, None)
            if not first:
                del self._first[job]

    def overdue(self, job: JobKey) -> list[str]:
        """The job's pods unseen for longer than the limit since a creation found them."""
        now = self._clock()
        with self._guard:
            first = self._first.get(job, {})
            return sorted(pod for pod, since in first.items() if now - since > self.limit_seconds)

    def forget(self, job: JobKey, pods: Iterable[str] | None = None) -> None:
        """Drop the job (or only `pods` of it): deleted, or pods that turned out not to be the job's."""
        with self._guard:
            if pods is None:
                self._first.pop(job, None)
                return
            first = self._first.get(job)
            if first is None:
                return
            for pod in pods:
                first.pop(pod, None)
            if not first:
                del self._first[job]
