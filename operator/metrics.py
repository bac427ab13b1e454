"""Prometheus metrics of the operator (`phalanx_` prefix, no per-pod labels)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

STATES = (
    "Pending",
    "Scheduling",
    "Backoff",
    "Running",
    "Finishing",
    "Suspended",
    "Succeeded",
    "Failed",
    "Invalid",
)


class OperatorMetrics:
    """The operator's metrics on their own registry (tests create as many as they like)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Gauge("phalanx_jobs", "TrainingJobs by state.", ["state"], registry=self.registry)
        self.reconcile_seconds = Histogram(
            "phalanx_reconcile_duration_seconds",
            "Time of one reconcile of one job, API calls included.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.pods_created = Counter(
            "phalanx_pods_created", "Pods created by the operator.", ["role"], registry=self.registry
        )
        self.pods_deleted = Counter(
            "phalanx_pods_deleted", "Pods deleted by the operator.", registry=self.registry
        )
        self.api_errors = Counter(
            "phalanx_api_errors", "Kubernetes API calls that failed.", ["operation"], registry=self.registry
        )
        self._states: dict[str, str] = {}
        self._lock = threading.Lock()
        for state in STATES:
            self.jobs.labels(state=state).set(0)

    def job_state(self, uid: str, state: str | None) -> None:
        """Record a job's state (None: the job is gone) and refresh the per-state gauge."""
        with self._lock:
            if state is None:
                self._states.pop(uid, None)
            else:
                self._states[uid] = state
            counts = dict.fromkeys(STATES, 0)
            for value in self._states.values():
                counts[value] = counts.get(value, 0) + 1
            for key, count in counts.items():
                self.jobs.labels(state=key).set(count)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
