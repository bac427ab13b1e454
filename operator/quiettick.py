"""When a periodic reconcile may plan from kopf's copy of the job instead of reading it from the API server.

Every reconcile an event calls for reads the stored job first: a watch event may lag behind the operator's own
last status write. The periodic reconcile (every job every `reconcileIntervalSeconds`: 20 a second at 100 jobs,
200 at 1,000) mostly finds nothing to do, and its read is most of its cost to the API server and etcd. So a tick
plans from the copy kopf keeps current from the TrainingJob watch; only a plan that would do something (write,
create, delete, post an Event) is thrown away, and the job read and planned again, so nothing is ever done on the
strength of a copy. A tick reads the job anyway once its last read is `fresh_read_seconds` old: a watch that
stopped delivering without an error would otherwise leave the ticks planning from an old copy, and a copy that
only lags (the operator's own last write not in it yet) at worst plans something, and is read again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from phalanx.operator import spread, stepreport
from phalanx.operator.reconcile import Plan

FRESH_READ_SECONDS = 30.0
"""A periodic reconcile reads the job from the API server at least this often (up to half as long again, by job,
so that jobs started together do not come due together)."""


def quiet(plan: Plan, stored_status: dict[str, Any], step_deferred: Callable[[], bool]) -> bool:
    """Whether carrying out `plan` over a job whose stored status is `stored_status` would change nothing in the
    cluster: no pod, Workload, Event or job write, and a status that is the stored one or differs only in a
    step whose report waits (`step_deferred`). Creating the job's fixed children (`ensure`) does not count: they
    are the same whatever the copy, and the API client checks them on its own schedule."""
    acts = (
        plan.delete_job
        or plan.suspend
        or plan.create_pods
        or plan.delete_pods
        or plan.force_delete_pods
        or plan.relabel_pods
        or plan.ungate_pods
        or plan.workload_ops
        or plan.events
        or plan.detected
        or plan.recovered
        or plan.spare_swaps
        or plan.spares_lost
        or plan.health_started
        or plan.health_rollbacks
        or plan.health_restart is not None
    )
    if acts:
        return False
    return plan.status == stored_status or (
        stepreport.progress_only(stored_status, plan.status) and step_deferred()
    )


class FreshReads:
    """Per job, when a periodic reconcile last read it from the API server (thread-safe)."""

    def __init__(
        self, fresh_read_seconds: float = FRESH_READ_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self.fresh_read_seconds = fresh_read_seconds
        self._clock = clock
        self._read: dict[tuple[str, str], float] = {}
        self._guard = threading.Lock()

    def due(self, key: tuple[str, str]) -> bool:
        """Whether the job's next reconcile must read it (never read, or read too long ago)."""
        with self._guard:
            read = self._read.get(key)
        return read is None or self._clock() - read >= spread.period_of(
            self.fresh_read_seconds, "/".join(key)
        )

    def read(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._read[key] = self._clock()

    def forget(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._read.pop(key, None)
