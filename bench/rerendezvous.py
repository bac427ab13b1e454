"""Re-rendezvous after a membership change: real training pods on the local cluster's agent nodes.

A small tinygpt TrainingJob (2 workers, elastic 1..3) trains with each pod's Prometheus endpoint on. The
job is scaled 2 -> 3 -> 2 a few times (the scale subresource, as `kubectl scale` does). For each change
this process polls every active worker's endpoint and records:
- the re-rendezvous as the launchers measure it (`phalanx_worker_rendezvous_seconds`, the longest among
  the workers that re-formed the group), with the configured last-call wait shown apart;
- the time from the scale call until every active worker trains at the new world size past the step
  training had reached (for a grow this includes starting the new pod's process).
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from phalanx.bench import prom
from phalanx.bench.cluster import BenchCluster, BenchError, wait_for
from phalanx.bench.core import Baseline, BenchResult, Metric, Target, Timeout
from phalanx.bench.kubeobjects import is_terminating, name_of, phase_of, pod_ip_of

NAME = "rerendezvous"
TITLE = "Re-rendezvous after a membership change"
GROUP, VERSION, PLURAL = "phalanx.dev", "v1alpha1", "trainingjobs"
JOB = "rdzv"
METRICS_PORT = 9400
LAST_CALL = 1
JOIN_TIMEOUT = 120
KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT = 1, 5
HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT = 1, 10
LAUNCHER_MONITOR_INTERVAL = 0.2
"""The launcher's own default (worker/README.md): how often it looks for waiting nodes and epoch changes."""
CYCLES, QUICK_CYCLES = 5, 1
CHANGE_TIMEOUT = 240


def job_manifest() -> dict[str, Any]:
    args = ["--steps", "10000000", "--width", "32", "--layers", "1", "--step-delay", "0.05"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "replicas": 2,
            "minReplicas": 1,
            "maxReplicas": 3,
            "spares": 0,
            "metricsPort": METRICS_PORT,
            "checkpoint": {"volume": {"emptyDir": {}}, "path": "/checkpoints", "intervalSteps": 200},
            "heartbeat": {"intervalSeconds": HEARTBEAT_INTERVAL, "timeoutSeconds": HEARTBEAT_TIMEOUT},
            "rendezvous": {
                "lastCallTimeoutSeconds": LAST_CALL,
                "joinTimeoutSeconds": JOIN_TIMEOUT,
                "keepaliveIntervalSeconds": KEEPALIVE_INTERVAL,
                "keepaliveTimeoutSeconds": KEEPALIVE_TIMEOUT,
            },
            "gang": {"scheduleTimeoutSeconds": 120},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:bench",
                            "command": ["python", "-m", "phalanx.worker.examples.tinygpt"],
                            "args": args,
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ]
                }
            },
        },
    }


# ------------------------------------------------------------------------------ worker views (pure)


@dataclass(frozen=True)
class WorkerView:
    """What one worker pod's metrics endpoint says."""

    pod: str
    step: float
    world_size: float
    phase: str
    rendezvous_seconds: float
    restarts: float


def worker_view(pod: str, text: str) -> WorkerView:
    samples = prom.parse(text)
    phases = prom.select(samples, "phalanx_worker_phase")
    phase = next((dict(labels)["phase"] for labels, value in phases.items() if value == 1), "")
    return WorkerView(
        pod=pod,
        step=prom.total(samples, "phalanx_worker_step"),
        world_size=prom.total(samples, "phalanx_worker_world_size"),
        phase=phase,
        rendezvous_seconds=prom.total(samples, "phalanx_worker_rendezvous_seconds"),
        restarts=prom.total(samples, "phalanx_worker_group_restarts_total"),
    )


def training_at(views: dict[str, WorkerView], size: int, past_step: float) -> bool:
    """Every active worker trains in a group of `size`, beyond `past_step`."""
    return len(views) == size and all(
        view.phase == "training" and view.world_size == size and view.step > past_step
        for view in views.values()
    )


def rerendezvous_seconds(before: dict[str, WorkerView], after: dict[str, WorkerView]) -> float | None:
    """The longest rendezvous among the workers that were there before and re-formed the group since."""
    redone = [
        view.rendezvous_seconds
        for pod, view in after.items()
        if pod in before and view.restarts > before[pod].restarts
    ]
    return max(redone) if redone else None


# ------------------------------------------------------------------------------ the run


def active_workers(cluster: BenchCluster, namespace: str) -> dict[str, str]:
    """Pod name -> pod IP of the job's active worker pods that run."""
    pods = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"phalanx.dev/job-name={JOB},phalanx.dev/role=worker"
    ).items
    return {
        name_of(pod): ip
        for pod in pods
        if not is_terminating(pod) and phase_of(pod) == "Running" and (ip := pod_ip_of(pod))
    }


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}:{METRICS_PORT}/metrics", timeout=2) as response:
        return response.read().decode()


def observe(cluster: BenchCluster, namespace: str) -> dict[str, WorkerView]:
    """Every active worker's view; a worker whose endpoint does not answer yet is left out."""
    views = {}
    for pod, address in active_workers(cluster, namespace).items():
        try:
            views[pod] = worker_view(pod, scrape(address))
        except OSError:
            continue
    return views


@dataclass
class Change:
    kind: str
    size: int
    to_training: float
    rendezvous: float | None
    new_pod_running: float | None


def scale_to(cluster: BenchCluster, namespace: str, size: int, kind: str) -> Change:
    before = observe(cluster, namespace)
    past = max((view.step for view in before.values()), default=0.0)
    known = set(before)
    started = time.monotonic()
    cluster.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, JOB, {"spec": {"replicas": size}}
    )
    new_pod_running: float | None = None
    deadline = started + CHANGE_TIMEOUT
    while time.monotonic() < deadline:
        views = observe(cluster, namespace)
        if new_pod_running is None and set(views) - known:
            new_pod_running = time.monotonic() - started
        if training_at(views, size, past):
            return Change(
                kind, size, time.monotonic() - started, rerendezvous_seconds(before, views), new_pod_running
            )
        time.sleep(0.2)
    views = observe(cluster, namespace)
    raise BenchError(
        f"{kind} to {size}: workers not training at world size {size} within {CHANGE_TIMEOUT} s: "
        + ", ".join(f"{v.pod} {v.phase} size {v.world_size:.0f} step {v.step:.0f}" for v in views.values())
    )


def run(context: Any, quick: bool) -> BenchResult:
    cluster = context.cluster()
    namespace = cluster.create_namespace("bench-rdzv")
    changes: list[Change] = []
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job_manifest())
        context.log("tinygpt job of 2 workers applied; waiting for it to train")
        wait_for(
            lambda: training_at(observe(cluster, namespace), 2, 0),
            CHANGE_TIMEOUT,
            interval=1.0,
            message="two workers training at world size 2",
        )
        for cycle in range(QUICK_CYCLES if quick else CYCLES):
            changes.append(scale_to(cluster, namespace, 3, "grow"))
            context.log(f"cycle {cycle + 1}: grew to 3 in {changes[-1].to_training:.1f} s")
            time.sleep(2)
            changes.append(scale_to(cluster, namespace, 2, "shrink"))
            context.log(f"cycle {cycle + 1}: shrank to 2 in {changes[-1].to_training:.1f} s")
            time.sleep(2)
    finally:
        cluster.delete_namespace(namespace, timeout=300)
    return result(changes, cluster.operator.reconcile_interval if cluster.operator else 5.0)


def result(changes: list[Change], reconcile_interval: float) -> BenchResult:
    grows = [change for change in changes if change.kind == "grow"]
    shrinks = [change for change in changes if change.kind == "shrink"]
    rendezvous = [change.rendezvous for change in changes if change.rendezvous is not None]
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[
            Metric(
                name="re-rendezvous",
                unit="s",
                samples=rendezvous,
                description="the launchers' own measure of the round after a change (longest among the "
                "workers that re-formed), last-call wait included when the round used it",
                target=Target(
                    op="<=",
                    value=3 + LAST_CALL,
                    stat="p95",
                    text=f"<= 3 s plus the configured last-call wait ({LAST_CALL} s)",
                ),
                baseline=Baseline(
                    text="torchelastic ~10 s at 4k hosts; torch's default last call alone is 30 s"
                ),
            ),
            Metric(
                name="scale to 3 -> training at 3",
                unit="s",
                samples=[change.to_training for change in grows],
                description="from the scale call to every worker training at world size 3 past the step "
                "reached before (includes the new pod's start)",
            ),
            Metric(
                name="scale to 3 -> new worker's launcher up",
                unit="s",
                samples=[change.new_pod_running for change in grows if change.new_pod_running is not None],
                description="from the scale call to the new pod's launcher answering on its metrics port "
                "(pod creation and the process start inside the above)",
            ),
            Metric(
                name="scale to 2 -> training at 2",
                unit="s",
                samples=[change.to_training for change in shrinks],
                description="from the scale call to the remaining workers training at world size 2",
            ),
        ],
        timeouts=[
            Timeout(
                name="rendezvous last call",
                seconds=LAST_CALL,
                source="spec.rendezvous.lastCallTimeoutSeconds",
            ),
            Timeout(
                name="rendezvous join timeout",
                seconds=JOIN_TIMEOUT,
                source="spec.rendezvous.joinTimeoutSeconds",
            ),
            Timeout(
                name="rendezvous keep-alive interval",
                seconds=KEEPALIVE_INTERVAL,
                source="spec.rendezvous.keepaliveIntervalSeconds",
            ),
            Timeout(
                name="rendezvous keep-alive timeout",
                seconds=KEEPALIVE_TIMEOUT,
                source="spec.rendezvous.keepaliveTimeoutSeconds",
            ),
            Timeout(
                name="heartbeat interval (launchers read the desired size this often)",
                seconds=HEARTBEAT_INTERVAL,
                source="spec.heartbeat.intervalSeconds",
            ),
            Timeout(
                name="heartbeat timeout", seconds=HEARTBEAT_TIMEOUT, source="spec.heartbeat.timeoutSeconds"
            ),
            Timeout(
                name="launcher monitor interval", seconds=LAUNCHER_MONITOR_INTERVAL, source="launcher default"
            ),
            Timeout(
                name="operator periodic reconcile",
                seconds=reconcile_interval,
                source="chart reconcileIntervalSeconds",
            ),
        ],
        notes=[
            f"tinygpt (width 32, 1 layer, 0.05 s sleep per step) with 2 workers, elastic 1..3, no spares, on the "
            f"local cluster's agent nodes (pods are local processes); {len(grows)} grows 2 -> 3 and "
            f"{len(shrinks)} shrinks 3 -> 2 through the scale subresource.",
            f"The configured last-call wait is {LAST_CALL} s; a round that reaches the maximum size closes "
            "without waiting for it, so it is a bound, not a fixed cost.",
            "Each worker's metrics endpoint was polled every 0.2 s; times are from the scale call as this "
            "process saw them.",
        ],
        details={"changes": [change.__dict__ for change in changes]},
    )
