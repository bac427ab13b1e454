"""Operator takeover: the acting replica killed or stopped, the standby acting in its place.

Part of ``phalanx bench`` (``--only operator-takeover``). The operator runs as the chart's two replicas under
leader election (operator/leadership.py) while a small TrainingJob trains on the local cluster's agent nodes.
Each cycle ends the acting replica one of two ways and measures, from that moment:
- ``killed``: its pod force-deleted, its process killed with it (no SIGTERM, so the Lease is not released: the
  standby waits it out), as when its node dies;
- ``stopped``: its pod deleted as a rolling update or a drain deletes it (SIGTERM: it releases the Lease);
the time until the standby holds the Lease, and until it acts: the job's status, which only the acting replica
writes, shows a step past the one training had reached. The Deployment's replacement pod becomes the next
standby before the next cycle. The operator's replica count is put back as it was afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from phalanx.bench.cluster import OPERATOR_NAMESPACE, BenchCluster, BenchError, is_ready, wait_for
from phalanx.bench.core import Baseline, BenchResult, Metric, Target, Timeout
from phalanx.bench.faults import tinygpt_job
from phalanx.bench.kubeobjects import name_of

NAME = "operator-takeover"
TITLE = "Operator takeover: the acting replica killed or stopped"
GROUP, VERSION, PLURAL = "phalanx.dev", "v1alpha1", "trainingjobs"
JOB = "takeover"
CYCLES, QUICK_CYCLES = 5, 1
TAKEOVER_TIMEOUT = 120
TARGET_SECONDS = 15.0


def job_manifest() -> dict[str, Any]:
    return tinygpt_job(
        JOB,
        replicas=2,
        spares=0,
        steps=10_000_000,
        step_delay=0.05,
        heartbeat={"intervalSeconds": 1, "timeoutSeconds": 30, "progressTimeoutSeconds": 120},
        checkpoint={"volume": {"emptyDir": {}}, "path": "/checkpoints", "intervalSteps": 500},
    )


@dataclass
class Takeover:
    how: str
    holds: float
    """Seconds until the standby held the Lease."""
    acts: float
    """Seconds until the job's status showed a step past the one reached at the end."""


def job_step(cluster: BenchCluster, namespace: str) -> int:
    job: dict[str, Any] = cluster.custom.get_namespaced_custom_object(  # type: ignore[assignment]
        GROUP, VERSION, namespace, PLURAL, JOB
    )
    return int((job.get("status") or {}).get("step") or 0)


def holder(cluster: BenchCluster) -> str | None:
    leader = cluster.leader_pod()
    return None if leader is None else name_of(leader)


def end_leader(cluster: BenchCluster, namespace: str, how: str) -> Takeover:
    wait_for(
        lambda: len([p for p in cluster.operator_pods() if is_ready(p)]) == 2 and holder(cluster) is not None,
        TAKEOVER_TIMEOUT,
        message="two operator replicas, one acting",
    )
    leader = holder(cluster)
    reached = job_step(cluster, namespace)
    started = time.monotonic()
    cluster.core.delete_namespaced_pod(
        str(leader), OPERATOR_NAMESPACE, grace_period_seconds=0 if how == "killed" else None
    )
    # The successor is the standby, or the Deployment's replacement pod when it reads a released Lease first.
    wait_for(
        lambda: holder(cluster) not in (None, leader),
        TAKEOVER_TIMEOUT,
        interval=0.1,
        message=f"another replica than {leader} to lead",
    )
    holds = time.monotonic() - started
    wait_for(
        lambda: job_step(cluster, namespace) > reached,
        TAKEOVER_TIMEOUT,
        interval=0.1,
        message="the new leader to write the job's status",
    )
    return Takeover(how, holds, time.monotonic() - started)


def run(context: Any, quick: bool) -> BenchResult:
    cluster = context.cluster()
    operator = cluster.ensure_operator()
    replicas_before = len(cluster.operator_pods())
    lease = {
        key: float(operator.settings.get(f"PHALANX_OPERATOR_LEASE_{key}_SECONDS", default))
        for key, default in (("DURATION", 8), ("RENEW_DEADLINE", 6), ("RETRY", 1))
    }
    if operator.settings.get("PHALANX_OPERATOR_LEADER_ELECTION") != "true":
        raise BenchError("the operator runs without leader election (leaderElection.enabled=false)")
    cluster.scale_operator(2)
    namespace = cluster.create_namespace("bench-takeover")
    takeovers: list[Takeover] = []
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job_manifest())
        wait_for(lambda: job_step(cluster, namespace) >= 5, 240, interval=1.0, message="the job to train")
        for cycle in range(QUICK_CYCLES if quick else CYCLES):
            for how in ("killed", "stopped"):
                takeovers.append(end_leader(cluster, namespace, how))
                context.log(
                    f"cycle {cycle + 1}, leader {how}: the standby held the Lease after "
                    f"{takeovers[-1].holds:.1f} s and acted after {takeovers[-1].acts:.1f} s"
                )
    finally:
        cluster.delete_namespace(namespace, timeout=300)
        if replicas_before != 2:
            cluster.scale_operator(replicas_before)
    return result(takeovers, lease, operator.reconcile_interval)


def result(takeovers: list[Takeover], lease: dict[str, float], reconcile_interval: float) -> BenchResult:
    def samples(how: str, field: str) -> list[float]:
        return [getattr(t, field) for t in takeovers if t.how == how]

    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[
            Metric(
                name="leader killed -> standby acts",
                unit="s",
                samples=samples("killed", "acts"),
                description="from the force-deletion of the acting replica's pod to the job's status written by "
                "the standby with a newer step",
                target=Target(op="<=", value=TARGET_SECONDS, stat="p95", text="<= 15 s (issue 28)"),
                baseline=Baseline(
                    text="kopf peering (what the chart ran before): up to 60 s; client-go's default leader "
                    "election: a 15 s lease plus a 2 s retry before the successor even starts"
                ),
            ),
            Metric(
                name="leader killed -> standby holds the Lease",
                unit="s",
                samples=samples("killed", "holds"),
                description="from the force-deletion to the Lease naming the standby (bounded by the lease "
                "duration plus one retry)",
            ),
            Metric(
                name="leader stopped -> standby acts",
                unit="s",
                samples=samples("stopped", "acts"),
                description="from a graceful deletion (SIGTERM: the leader releases the Lease) to the job's "
                "status written by the standby",
            ),
            Metric(
                name="leader stopped -> standby holds the Lease",
                unit="s",
                samples=samples("stopped", "holds"),
                description="from the graceful deletion to the Lease naming the standby",
            ),
        ],
        timeouts=[
            Timeout(
                name="lease duration",
                seconds=lease["DURATION"],
                source="chart leaderElection.leaseDurationSeconds",
            ),
            Timeout(
                name="renew deadline",
                seconds=lease["RENEW_DEADLINE"],
                source="chart leaderElection.renewDeadlineSeconds",
            ),
            Timeout(name="lease retry", seconds=lease["RETRY"], source="chart leaderElection.retrySeconds"),
            Timeout(
                name="operator periodic reconcile",
                seconds=reconcile_interval,
                source="chart reconcileIntervalSeconds",
            ),
        ],
        notes=[
            "Two operator replicas (the chart's default) on the local cluster's agent nodes, with a tinygpt job of 2 "
            "workers training meanwhile; each cycle kills the acting replica, then stops the next one gracefully.",
            "The job's status is written only by the acting replica: a newer step there is the new leader acting "
            "(its first reconcile follows its start, which lists every job, pod and Lease).",
        ],
        details={"takeovers": [t.__dict__ for t in takeovers]},
    )
