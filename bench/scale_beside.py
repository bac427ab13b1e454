"""Small jobs beside a big one: the operator's event -> action, memory and status sizes while it runs the scale
benchmark's gang and many small jobs at once.

A platform that runs a 100,000-GPU job runs other teams' small jobs beside it, and the operator serves them all:
the big gang's reconciles must not hold up a small job's replacement, nor the small jobs the big one's. Here the
small jobs are operator-scale's (2 workers each, a `sleep` trainer on the simulated nodes, a Lease per worker
renewed by `HeartbeatSimulator` as launchers would), in a namespace of their own, applied while the gang trains.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from phalanx.bench import operator_scale
from phalanx.bench.cluster import BenchCluster, warning_summary
from phalanx.bench.heartbeats import HeartbeatSimulator
from phalanx.bench.kubeobjects import custom_object, name_of
from phalanx.bench.watch import PodEvent, Watch, pod_watch
from phalanx.operator import statusbudget

WORKERS = 2
"""Workers of each small job."""
RUNNING_WAIT = 600.0
"""Seconds the small jobs have to be Running beside the gang."""
SETTLE_INTERVALS = 2
"""Heartbeat intervals from the small jobs' first heartbeats to the first trial."""


@dataclass
class BesideFigures:
    jobs: int
    to_running: float = 0.0
    """Seconds from the first small job applied to every small job's workers Running."""
    replacements: list[float] = field(default_factory=list)
    """A small job's worker pod deleted -> the operator's replacement pod (seconds; a wait that ran out counts
    as `operator_scale.REPLACE_WAIT`)."""
    replacements_late: int = 0
    verdicts: dict[str, list[float]] = field(default_factory=dict)
    """The gang's launcher verdicts acted on meanwhile (seconds from the report to the operator's Event)."""
    operator_rss_mb: float = 0.0
    largest_status_bytes: int = 0
    """The largest status among the small jobs, as JSON."""
    heartbeat_gap: float = 0.0
    """The longest a small job's Running pod went without a renewal of its Lease (this process falling behind, if
    large)."""
    leaders: list[str] = field(default_factory=list)
    """The operator pod that acted, at the start and at the end (two names: the leadership moved)."""
    operator_warnings: list[str] = field(default_factory=list)
    """The operator's most frequent warnings meanwhile (for a slow replacement's cause)."""


def status_bytes(job: dict[str, Any]) -> int:
    """A TrainingJob's status as JSON, in bytes."""
    return statusbudget.size(job.get("status") or {})


class SmallJobs:
    """`count` small jobs in a namespace of their own, Running with heartbeats for as long as the block lasts."""

    def __init__(self, cluster: BenchCluster, count: int, log: Any) -> None:
        self.cluster = cluster
        self.count = count
        self.log = log
        self.names = [f"small-{index:04d}" for index in range(count)]
        self.namespace = ""
        self.figures = BesideFigures(jobs=count)
        self._pods: Watch[PodEvent] | None = None
        self._since = time.time()
        self._heartbeats: HeartbeatSimulator | None = None

    def __enter__(self) -> SmallJobs:
        cluster = self.cluster
        self._since = time.time()
        self._note_leader()
        self.namespace = cluster.create_namespace("scale-beside")
        self._pods = pod_watch(cluster.new_api_client, self.namespace, operator_scale.TRAINER_SELECTOR)
        self._pods.start()
        started = time.monotonic()
        for name in self.names:
            cluster.custom.create_namespaced_custom_object(
                operator_scale.GROUP,
                operator_scale.VERSION,
                self.namespace,
                operator_scale.PLURAL,
                operator_scale.job_manifest(name, WORKERS),
            )
        # Their launchers beat from their pods' start (`operator_scale.run` says why).
        self._heartbeats = HeartbeatSimulator(
            cluster.new_api_client,
            self.namespace,
            operator_scale.HEARTBEAT_INTERVAL,
            operator_scale.HEARTBEAT_TIMEOUT,
            WORKERS,
        ).start()
        plan = operator_scale.Scale(jobs=self.count, workers=WORKERS, trials=0, window=0, scrape_every=1)
        operator_scale.wait_all_running(self._pods, plan, RUNNING_WAIT)
        self.figures.to_running = time.monotonic() - started
        self.log(f"{self.count} small jobs Running beside the gang in {self.figures.to_running:.1f} s")
        # Steady state, as for the gang: every small job's first Lease created and seen before the trials (the
        # start of 100 jobs at once is `to_running`'s figure).
        time.sleep(SETTLE_INTERVALS * operator_scale.HEARTBEAT_INTERVAL)
        return self

    def _note_leader(self) -> None:
        with contextlib.suppress(Exception):  # diagnostics only
            leader = self.cluster.leader_pod()
            if leader is not None and name_of(leader) not in self.figures.leaders:
                self.figures.leaders.append(name_of(leader))

    def replace_workers(self, trials: int) -> None:
        """Delete a small job's worker pod per trial; the time until the operator's replacement appears."""
        assert self._pods is not None
        plan = operator_scale.Scale(jobs=self.count, workers=WORKERS, trials=trials, window=0, scrape_every=1)
        latencies, late, _ = operator_scale.event_to_action(
            self.cluster, self._pods, self.names, plan, self.namespace
        )
        self.figures.replacements += latencies
        self.figures.replacements_late += late

    def measure_statuses(self) -> None:
        listed = custom_object(
            self.cluster.custom.list_namespaced_custom_object(
                operator_scale.GROUP, operator_scale.VERSION, self.namespace, operator_scale.PLURAL
            )
        )["items"]
        self.figures.largest_status_bytes = max((status_bytes(job) for job in listed), default=0)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self.namespace:
            return
        self._note_leader()
        with contextlib.suppress(Exception):  # diagnostics only
            self.figures.operator_warnings = warning_summary(self.cluster.operator_log_lines(self._since))
        try:
            # Jobs go first: heartbeats that stop while their jobs live would be judged as failures.
            self.cluster.custom.delete_collection_namespaced_custom_object(
                operator_scale.GROUP, operator_scale.VERSION, self.namespace, operator_scale.PLURAL
            )
        finally:
            if self._heartbeats is not None:
                self._heartbeats.stop()
                self.figures.heartbeat_gap = self._heartbeats.max_gap
            if self._pods is not None:
                self._pods.stop()
            self.cluster.delete_namespace(self.namespace, wait=True)
