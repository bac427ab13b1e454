"""Prometheus metrics of the operator (`phalanx_` prefix, no per-pod labels).

Per-job series (`namespace`, `trainingjob` labels: not `job`, which Prometheus sets on every series it scrapes
to the scrape's own name) mirror what the job's stored status says, so a team's existing
monitoring sees the numbers `kubectl get trainingjobs` shows: its state, step, restarts by cause, goodput and
last recovery. They are set after each status write and dropped with the job. A node label appears only on
failures (`phalanx_node_failures_total`): bounded by the nodes, for the repeated-failures alert.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from phalanx.operator import api
from phalanx.operator.health import SIGNALS as HEALTH_SIGNALS
from phalanx.operator.timeutil import parse_time

STATES = api.JOB_STATES
"""Every job state: each has its series, 0 when no job is in it (a state with no series keeps a stale value)."""


class OperatorMetrics:
    """The operator's metrics on their own registry (tests create as many as they like)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Gauge("phalanx_jobs", "TrainingJobs by state.", ["state"], registry=self.registry)
        self.leader = Gauge(
            "phalanx_operator_leader",
            "1 while this replica acts (it holds the operator's Lease, or runs without leader election), 0 while "
            "it stands by.",
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "phalanx_reconcile_duration_seconds",
            "Time of one reconcile of one job, API calls included.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.pods_created = Counter(
            "phalanx_pods_created", "Pods created by the operator.", ["role"], registry=self.registry
        )
        self.reconciles_coalesced = Counter(
            "phalanx_reconciles_coalesced",
            "Reconcile triggers dropped because a reconcile of the same job was already waiting to run (it covers them).",
            registry=self.registry,
        )
        self.reconcile_queue_depth = Gauge(
            "phalanx_reconcile_queue_depth",
            "Jobs whose reconcile, asked for by a watch event, waits for a handler thread.",
            registry=self.registry,
        )
        self.quiet_ticks = Counter(
            "phalanx_quiet_ticks",
            "Periodic reconciles planned from the watched copy of their job that found nothing to do (no read).",
            registry=self.registry,
        )
        self.pods_deleted = Counter(
            "phalanx_pods_deleted", "Pods deleted by the operator.", registry=self.registry
        )
        self.api_errors = Counter(
            "phalanx_api_errors", "Kubernetes API calls that failed.", ["operation"], registry=self.registry
        )
        self.failures = Counter(
            "phalanx_failures", "Failures detected, by cause.", ["cause"], registry=self.registry
        )
        self.recovery_seconds = Histogram(
            "phalanx_recovery_duration_seconds",
            "Seconds from a failure's detection to training passing the step it stopped at.",
            buckets=(1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.spare_swaps = Counter(
            "phalanx_spare_swaps", "Spares promoted into a failed worker's slot.", registry=self.registry
        )
        self.lost_steps = Counter(
            "phalanx_lost_steps", "Training steps done again after recoveries.", registry=self.registry
        )
        self.goodput = Gauge(
            "phalanx_job_goodput_ratio",
            "Productive training time over wall time, per job.",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.checkpoint_interval = Gauge(
            "phalanx_job_checkpoint_interval_steps",
            "Training steps between durable checkpoints in force, per job (`status.checkpoint.intervalSteps`: "
            "the spec's number, or the one chosen by `intervalSteps: auto`).",
            ["namespace", "trainingjob", "mode"],
            registry=self.registry,
        )
        self.health_signal = Gauge(
            "phalanx_job_health_signal",
            "Training-health signals on now (1) or off (0), per job and signal (`spec.health`).",
            ["namespace", "trainingjob", "signal"],
            registry=self.registry,
        )
        self.health_signals_started = Counter(
            "phalanx_health_signals_started",
            "Training-health signals that started, by signal.",
            ["signal"],
            registry=self.registry,
        )
        self.health_rollbacks = Counter(
            "phalanx_health_rollbacks",
            "Rollbacks to a checkpoint before an anomaly asked for by training-health signals (`action: "
            "Rollback`), by signal.",
            ["signal"],
            registry=self.registry,
        )
        self.job_health_rollbacks = Gauge(
            "phalanx_job_health_rollbacks",
            "Rollbacks of a job over its life (`status.health.rollbacks`).",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.job_state_info = Gauge(
            "phalanx_job_state",
            "1 for a job's current state (`status.state`); a state it left has no series.",
            ["namespace", "trainingjob", "state"],
            registry=self.registry,
        )
        self.job_step = Gauge(
            "phalanx_job_step",
            "Latest training step the job's heartbeats reported (`status.step`); its rate is the step rate.",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.job_restarts = Gauge(
            "phalanx_job_restarts",
            "Restarts over the job's life by failure cause (`status.restarts.byCause`; only grows).",
            ["namespace", "trainingjob", "cause"],
            registry=self.registry,
        )
        self.job_last_recovery = Gauge(
            "phalanx_job_last_recovery_seconds",
            "Seconds from the failure to training resumed, of the job's latest closed incident.",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.job_recovery_seconds = Gauge(
            "phalanx_job_recovery_seconds",
            "Seconds spent recovering over the job's life (`status.recoverySeconds`; only grows).",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.job_last_recovery_time = Gauge(
            "phalanx_job_last_recovery_timestamp_seconds",
            "When training resumed after the job's latest closed incident (Unix time).",
            ["namespace", "trainingjob"],
            registry=self.registry,
        )
        self.node_failures = Counter(
            "phalanx_node_failures",
            "Failures detected on a node (the node of the failed pod). Each node that ran a job's pod has its "
            "series from then on, at 0 until its first failure, so that `increase()` counts that one too.",
            ["node"],
            registry=self.registry,
        )
        self._per_job: dict[str, Gauge] = {
            "state": self.job_state_info,
            "step": self.job_step,
            "restarts": self.job_restarts,
            "last_recovery": self.job_last_recovery,
            "last_recovery_time": self.job_last_recovery_time,
            "recovery_seconds": self.job_recovery_seconds,
            "goodput": self.goodput,
        }
        """The series `record_job` mirrors from a job's status, by the name it gives each."""
        self._job_series: dict[tuple[str, str], dict[str, set[tuple[str, ...]]]] = {}
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
            counts: dict[str, int] = dict.fromkeys(STATES, 0)
            for value in self._states.values():
                counts[value] = counts.get(value, 0) + 1
            for key, count in counts.items():
                self.jobs.labels(state=key).set(count)

    def record_recovery(
        self, detected: list[Any], recovered: list[Any], swaps: int, spares_lost: Sequence[str] = ()
    ) -> None:
        """Count what one stored reconcile detected and recovered (incidents as `api.Incident`; the causes
        of the standby spares lost, which open none, are failures too)."""
        for cause in [*(incident.cause for incident in detected), *spares_lost]:
            self.failures.labels(cause=cause).inc()
        for incident in detected:
            if incident.node:
                self.node_failures.labels(node=incident.node).inc()
        for incident in recovered:
            if incident.seconds_to_recover is not None:
                self.recovery_seconds.observe(incident.seconds_to_recover)
            if incident.steps_lost:
                self.lost_steps.inc(incident.steps_lost)
        if swaps:
            self.spare_swaps.inc(swaps)

    def record_job(self, namespace: str, job: str, status: dict[str, Any]) -> None:
        """Set the job's per-job series from its stored status (as the API returns it: camelCase)."""
        restarts = (status.get("restarts") or {}).get("byCause") or {}
        recovered = [
            incident
            for incident in status.get("incidents") or []
            if incident.get("secondsToRecover") is not None
        ]
        resumed = parse_time(recovered[-1].get("resumedAt")) if recovered else None
        state, step, goodput = status.get("state"), status.get("step"), status.get("goodput")
        wanted: dict[str, dict[tuple[str, ...], float]] = {
            "state": {(state,): 1.0} if state else {},
            "step": {(): float(step)} if step is not None else {},
            "restarts": {(cause,): float(count) for cause, count in restarts.items()},
            "last_recovery": {(): float(recovered[-1]["secondsToRecover"])} if recovered else {},
            "last_recovery_time": {(): resumed.timestamp()} if resumed is not None else {},
            "recovery_seconds": {(): float(status.get("recoverySeconds") or 0.0)},
            "goodput": {(): float(goodput)} if goodput is not None else {},
        }
        with self._lock:
            known = self._job_series.setdefault((namespace, job), {})
            for kind, values in wanted.items():
                gauge = self._per_job[kind]
                for stale in known.get(kind, set()) - set(values):
                    with contextlib.suppress(KeyError):
                        gauge.remove(namespace, job, *stale)
                for labels, value in values.items():
                    gauge.labels(namespace, job, *labels).set(value)
                known[kind] = set(values)
        for worker in status.get("workers") or []:
            if worker.get("node"):
                self.node_failures.labels(node=worker["node"])

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop a deleted job's per-job series."""
        with self._lock:
            known = self._job_series.pop((namespace, job), {})
            for kind, series in known.items():
                for labels in series:
                    with contextlib.suppress(KeyError):
                        self._per_job[kind].remove(namespace, job, *labels)

    def job_checkpoint_interval(self, namespace: str, job: str, checkpoint: dict[str, Any] | None) -> None:
        """Set a job's interval from its stored `status.checkpoint` (None: drop it, the job is gone)."""
        for mode in ("auto", "fixed"):
            if checkpoint is None or checkpoint.get("mode") != mode:
                with contextlib.suppress(KeyError):
                    self.checkpoint_interval.remove(namespace, job, mode)
        if checkpoint is not None and checkpoint.get("intervalSteps") is not None:
            gauge = self.checkpoint_interval.labels(
                namespace=namespace, trainingjob=job, mode=checkpoint.get("mode")
            )
            gauge.set(checkpoint["intervalSteps"])

    def record_health(
        self,
        namespace: str,
        job: str,
        status: dict[str, Any],
        started: list[str],
        rolled_back: list[str] | None = None,
    ) -> None:
        """Set a job's per-signal gauges and rollback count from its stored status (`status.health`) and count
        the signals that started and the rollbacks they asked for."""
        stored = status.get("health")
        on = {signal.get("reason") for signal in ((stored or {}).get("signals") or [])}
        if stored is not None:
            for signal in HEALTH_SIGNALS:
                self.health_signal.labels(namespace=namespace, trainingjob=job, signal=signal).set(
                    int(signal in on)
                )
            if stored.get("rollbacks"):
                self.job_health_rollbacks.labels(namespace=namespace, trainingjob=job).set(
                    stored["rollbacks"]
                )
        for signal in started:
            self.health_signals_started.labels(signal=signal).inc()
        for signal in rolled_back or []:
            self.health_rollbacks.labels(signal=signal).inc()

    def forget_job_health(self, namespace: str, job: str) -> None:
        """Drop a deleted job's health gauges."""
        for signal in HEALTH_SIGNALS:
            with contextlib.suppress(KeyError):
                self.health_signal.remove(namespace, job, signal)
        with contextlib.suppress(KeyError):
            self.job_health_rollbacks.remove(namespace, job)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
