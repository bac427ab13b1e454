"""How often a running job's status is written for its step alone.

A training job's heartbeats move `status.step` on between any two reconciles, so a status written whenever it
differs is written at every periodic reconcile of every training job: 20 writes a second at 100 jobs, 200 at
1,000, each one an etcd write and a watch event for every client of TrainingJobs, this operator included, for a
figure that `kubectl get` shows and nothing acts on (the operator's own metrics carry the live step). So a
status that differs from the stored one only in its step waits until the job's last status write is
`interval_seconds` old (up to half as long again, by job: jobs started together would otherwise write their
steps together, one burst every interval); any other change is written at once and carries the step with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from phalanx.operator import spread

PROGRESS_FIELDS = frozenset({"step"})
"""Status fields that move with training alone."""


def progress_only(stored: dict[str, Any], planned: dict[str, Any]) -> bool:
    """Whether `planned` differs from `stored` in progress fields alone (and in something)."""
    changed = {key for key in stored.keys() | planned.keys() if stored.get(key) != planned.get(key)}
    return bool(changed) and changed <= PROGRESS_FIELDS


class StepReports:
    """Per job, when its status was last written by this process (a restarted operator writes at once)."""

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._written: dict[tuple[str, str], float] = {}
        self._guard = threading.Lock()

    def defer(self, key: tuple[str, str], stored: dict[str, Any], planned: dict[str, Any]) -> bool:
        """Whether writing `planned` over `stored` waits: only the step moved, and not long ago."""
        if not progress_only(stored, planned):
            return False
        with self._guard:
            written = self._written.get(key)
        return written is not None and self._clock() - written < self.interval_of(key)

    def interval_of(self, key: tuple[str, str]) -> float:
        """This job's own interval: the same at every reconcile, different from job to job."""
        return spread.period_of(self.interval_seconds, "/".join(key))

    def wrote(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._written[key] = self._clock()

    def forget(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._written.pop(key, None)
