"""Gang creation at scale: one TrainingJob of 1,000 workers (+ spares) on the local cluster's simulated nodes.

Run 1 (room for everyone): the job is applied and a pod watch records when each trainer pod was created,
bound and Running, as seen by this process (the gang forms behind a scheduling gate: no pod is bound before
every pod exists, and the report gives what that adds); the apiserver's request counters and the operator's metrics
and log show errors and throttling. Run 2 (one pod short): blocker pods leave the chosen simulated nodes
room for exactly one pod less than the gang; the gang must not start, and after its schedule timeout no
pod of the partly placed gang may be left holding capacity.

Gang pods request only memory (no CPU), and the blockers leave less CPU than the job's rendezvous pod
requests, so the rendezvous pod (not a gang member) can never take the last slot on those nodes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from phalanx.bench import prom
from phalanx.bench.cluster import (
    SIMULATED_TOLERATION,
    BenchCluster,
    BenchError,
    memory_bytes,
    problem_lines,
    request_milli,
    wait_for,
    warning_summary,
)
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout
from phalanx.bench.kubeobjects import custom_object, is_terminating, name_of, node_of, phase_of
from phalanx.bench.watch import (
    bound,
    created,
    cumulative,
    first_times,
    per_second,
    pod_watch,
    running,
    thin,
)
from phalanx.operator import api

NAME = "gang-creation"
TITLE = "Gang creation at scale"
GROUP, VERSION, PLURAL = "phalanx.dev", "v1alpha1", "trainingjobs"
TRAINER_SELECTOR = "phalanx.dev/component=trainer"


@dataclass(frozen=True)
class Sizes:
    workers: int
    spares: int
    full_timeout: int
    """Gang schedule timeout of run 1 (generous: it measures, it should never fire)."""
    short_timeout: int
    """Gang schedule timeout of run 2 (it must fire)."""
    wait_seconds: int
    """Longest wait for run 1's pods to run."""

    @property
    def gang(self) -> int:
        return self.workers + self.spares


FULL = Sizes(workers=1000, spares=8, full_timeout=900, short_timeout=30, wait_seconds=900)
QUICK = Sizes(workers=50, spares=2, full_timeout=300, short_timeout=10, wait_seconds=240)
POD_MEMORY = 8 * 2**20
"""Each gang pod requests 8 MiB and no CPU: memory is what the one-short run makes scarce."""
RENDEZVOUS_CPU_MILLI = request_milli(api.RendezvousResources().requests["cpu"])
"""CPU the operator's rendezvous pod requests by default; blocked nodes keep less than this free."""
BACKOFF_SECONDS = 3600
"""After a gang timeout no new attempt starts while the benchmark watches."""
THROTTLE_WORDS = ("429 ", "too many requests", "throttl", "rate limit")


# ------------------------------------------------------------------------------ capacity planning (pure)


@dataclass(frozen=True)
class NodeRoom:
    """What a node can still take, as the scheduler counts it (requests of the pods bound there)."""

    name: str
    cpu_milli: int
    memory: int
    pods: int


@dataclass(frozen=True)
class Blocker:
    """A pod that takes a node's room so that exactly `leaves` gang pods still fit there."""

    node: str
    cpu_milli: int
    memory: int
    leaves: int


def fits(room: NodeRoom, pod_memory: int) -> int:
    """Gang pods that fit beside one blocker pod."""
    return max(0, min(room.pods - 1, room.memory // pod_memory))


def plan_blockers(rooms: list[NodeRoom], want: int, pod_memory: int, keep_cpu_milli: int) -> list[Blocker]:
    """Blockers on the fewest nodes (roomiest first) leaving room for exactly `want` gang pods, and less than
    `keep_cpu_milli` CPU free on each blocked node. Raises ValueError when the nodes cannot hold `want`."""
    ordered = sorted(rooms, key=lambda room: (-fits(room, pod_memory), room.name))
    blockers, left = [], want
    for room in ordered:
        if left <= 0:
            break
        cpu = 0 if room.cpu_milli < keep_cpu_milli else room.cpu_milli - (keep_cpu_milli - 1)
        leaves = min(fits(room, pod_memory), left)
        blockers.append(Blocker(room.name, cpu, room.memory - leaves * pod_memory, leaves))
        left -= leaves
    if left > 0:
        raise ValueError(f"the nodes hold only {want - left} of {want} gang pods")
    return blockers


def node_room(node: Any, pods: list[Any]) -> NodeRoom:
    """Free room of `node` given the (non-finished) pods bound to it (kubernetes client models)."""
    allocatable = node.status.allocatable or {}
    cpu = request_milli(allocatable.get("cpu"))
    memory = memory_bytes(allocatable.get("memory"))
    count = int(allocatable.get("pods", "110"))
    for pod in pods:
        for container in pod.spec.containers:
            requests = (container.resources.requests if container.resources else None) or {}
            cpu -= request_milli(requests.get("cpu"))
            memory -= memory_bytes(requests.get("memory"))
        count -= 1
    return NodeRoom(node.metadata.name, cpu, memory, count)


# ------------------------------------------------------------------------------ manifests


def gang_job(name: str, sizes: Sizes, timeout: int, nodes: list[str] | None = None) -> dict[str, Any]:
    """A TrainingJob whose workers and spares land only on simulated nodes (never run a process)."""
    terms: list[dict[str, Any]] = [{"key": "phalanx.dev/simulated", "operator": "In", "values": ["true"]}]
    heartbeat_interval = max(5, math.ceil(sizes.gang / 100))
    if nodes:
        terms.append({"key": "kubernetes.io/hostname", "operator": "In", "values": nodes})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": sizes.workers,
            "spares": sizes.spares,
            # Within the operator's heartbeat write budget (the chart's heartbeatWritesPerSecond, 100 per job).
            "heartbeat": {"intervalSeconds": heartbeat_interval, "timeoutSeconds": 6 * heartbeat_interval},
            "gang": {
                "scheduleTimeoutSeconds": timeout,
                "backoffSeconds": BACKOFF_SECONDS,
                "maxBackoffSeconds": BACKOFF_SECONDS,
            },
            "template": {
                "spec": {
                    "tolerations": [SIMULATED_TOLERATION],
                    # Affinity, unlike a nodeSelector, is not copied to the rendezvous pod.
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": terms}]
                            }
                        }
                    },
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:bench",
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"memory": f"{POD_MEMORY // 2**20}Mi"}},
                        }
                    ],
                }
            },
        },
    }


def blocker_pod(blocker: Blocker, index: int) -> dict[str, Any]:
    requests = {"memory": str(blocker.memory)}
    if blocker.cpu_milli > 0:
        requests["cpu"] = f"{blocker.cpu_milli}m"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"blocker-{index}", "labels": {"app": "bench-blocker"}},
        "spec": {
            "nodeName": blocker.node,
            "tolerations": [SIMULATED_TOLERATION],
            "containers": [
                {
                    "name": "main",
                    "image": "pause",
                    "command": ["sleep", "infinity"],
                    "resources": {"requests": requests},
                }
            ],
        },
    }


# ------------------------------------------------------------------------------ probes


@dataclass
class Probes:
    """Apiserver and operator counters plus the operator's log, before and after a run."""

    apiserver: dict[prom.Key, float]
    operator: dict[prom.Key, float]
    since: float

    @classmethod
    def take(cls, cluster: BenchCluster) -> Probes:
        return cls(
            prom.parse(cluster.apiserver_metrics()), prom.parse(cluster.operator_metrics()), time.time()
        )

    def changes(self, cluster: BenchCluster) -> dict[str, Any]:
        after = Probes.take(cluster)
        rows = prom.request_deltas(self.apiserver, after.apiserver)
        operator_errors = prom.delta(self.operator, after.operator, "phalanx_api_errors_total")
        log_lines = cluster.operator_log_lines(self.since)
        throttled = [
            line for line in problem_lines(log_lines) if any(word in line.lower() for word in THROTTLE_WORDS)
        ]
        return {
            "apiserver_errors": prom.errors(rows),
            "conflicts": prom.by_resource(rows, lambda row: row.code == "409"),
            "pod_creates": sum(
                row.count
                for row in rows
                if row.verb == "POST" and row.resource == "pods" and not row.subresource
            ),
            "operator_api_errors": {
                dict(labels).get("operation", "?"): value for labels, value in operator_errors.items()
            },
            "operator_throttle_lines": throttled[:10],
            "operator_warnings": warning_summary(log_lines),
        }


def job_status(cluster: BenchCluster, namespace: str, name: str) -> dict[str, Any]:
    job = custom_object(cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    return job.get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def wait_no_terminating(cluster: BenchCluster, nodes: list[str], timeout: float = 300) -> None:
    """Pods still being deleted hold room until they are gone: wait for them before planning."""

    def settled() -> bool:
        for node in nodes:
            pods = cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            if any(is_terminating(pod) for pod in pods):
                return False
        return True

    wait_for(settled, timeout, interval=1.0, message="pods being deleted on the simulated nodes to go")


def rooms(cluster: BenchCluster) -> list[NodeRoom]:
    found = []
    for node in cluster.simulated_nodes():
        pods = cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name_of(node)}").items
        live = [pod for pod in pods if phase_of(pod) not in ("Succeeded", "Failed")]
        found.append(node_room(node, live))
    return found


# ------------------------------------------------------------------------------ runs


def run_full(cluster: BenchCluster, sizes: Sizes, log: Any) -> dict[str, Any]:
    """Run 1: room for all; returns the figures."""
    namespace = cluster.create_namespace("bench-gang")
    name = "gang"
    try:
        probes = Probes.take(cluster)
        with pod_watch(
            cluster.new_api_client, namespace, f"phalanx.dev/job-name={name},{TRAINER_SELECTOR}"
        ) as pods:
            started = time.monotonic()
            cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, gang_job(name, sizes, sizes.full_timeout)
            )

            def all_running() -> bool:
                return len(first_times(pods.events(), running)) >= sizes.gang

            log(f"gang of {sizes.gang} pods applied; waiting for every pod to run")
            try:
                wait_for(
                    all_running, sizes.wait_seconds, interval=0.5, message=f"{sizes.gang} gang pods Running"
                )
            except BenchError as error:
                seen = pods.events()
                counts = [len(first_times(seen, what)) for what in (created, bound, running)]
                state = job_status(cluster, namespace, name).get("state")
                raise BenchError(
                    f"{error}: {counts[0]} created, {counts[1]} bound, {counts[2]} Running; job state {state}"
                ) from None
            finished = time.monotonic()
            events = pods.events()
        changes = probes.changes(cluster)
        status_scheduled = wait_gang_scheduled(cluster, namespace, name, started)
        status = job_status(cluster, namespace, name)
    finally:
        cleanup = cluster.delete_namespace(namespace, timeout=900)
    made, placed, ran = (first_times(events, what) for what in (created, bound, running))
    return {
        "started": started,
        "created": sorted(made.values()),
        "bound": sorted(placed.values()),
        "running": sorted(ran.values()),
        "seconds": finished - started,
        "changes": changes,
        "gang_condition": condition(status, "GangScheduled"),
        "status_scheduled": status_scheduled,
        "cleanup": cleanup.seconds,
        "cleanup_note": cleanup.note("Run 1 cleanup"),
    }


def wait_gang_scheduled(cluster: BenchCluster, namespace: str, name: str, started: float) -> float | None:
    """Seconds from the job's creation until its status says GangScheduled=True (None: not within 300 s)."""

    def scheduled() -> bool:
        found = condition(job_status(cluster, namespace, name), "GangScheduled") or {}
        return found.get("status") == "True"

    try:
        wait_for(scheduled, 300, interval=0.5, message="GangScheduled=True in the job's status")
    except BenchError:
        return None
    return time.monotonic() - started


def short_timeout(sizes: Sizes, all_bound_seconds: float | None) -> int:
    """Run 2's gang timeout: long enough for the scheduler to place all it can (run 1 says how long that
    takes here), so that the timeout judges a gang that is one short, not one still being placed."""
    if all_bound_seconds is None:
        return sizes.short_timeout
    return max(sizes.short_timeout, math.ceil(1.5 * all_bound_seconds + 15))


def run_short(cluster: BenchCluster, sizes: Sizes, timeout: int, log: Any) -> dict[str, Any]:
    """Run 2: room for one pod less than the gang; returns the figures."""
    simulated = [name_of(node) for node in cluster.simulated_nodes()]
    wait_no_terminating(cluster, simulated)
    blockers = plan_blockers(rooms(cluster), sizes.gang - 1, POD_MEMORY, RENDEZVOUS_CPU_MILLI)
    nodes = [blocker.node for blocker in blockers]
    namespace = cluster.create_namespace("bench-gang-short")
    name = "short"
    try:
        cluster.apply([blocker_pod(blocker, index) for index, blocker in enumerate(blockers)], namespace)
        wait_for(
            lambda: all(
                phase_of(pod) == "Running"
                for pod in cluster.core.list_namespaced_pod(
                    namespace, label_selector="app=bench-blocker"
                ).items
            ),
            120,
            message="the blocker pods to run",
        )
        log(f"one short: room for {sizes.gang - 1} of {sizes.gang} gang pods on {', '.join(nodes)}")
        states: list[str] = []
        with pod_watch(
            cluster.new_api_client, namespace, f"phalanx.dev/job-name={name},{TRAINER_SELECTOR}"
        ) as pods:
            started = time.monotonic()
            cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, gang_job(name, sizes, timeout, nodes)
            )

            def timed_out_and_cleared() -> bool:
                status = job_status(cluster, namespace, name)
                states.append(str(status.get("state")))
                gang = condition(status, "GangScheduled") or {}
                live = [
                    pod
                    for pod in cluster.core.list_namespaced_pod(
                        namespace, label_selector=TRAINER_SELECTOR
                    ).items
                    if node_of(pod) and not is_terminating(pod)
                ]
                return gang.get("reason") == "ScheduleTimeout" and not live

            wait_for(
                timed_out_and_cleared,
                timeout + 600,
                interval=0.5,
                message="the gang to time out and its bound pods to be deleted",
            )
            cleared = time.monotonic()
            # The gang stays down during the backoff: nothing may come back and start.
            time.sleep(5)
            events = pods.events()
        status = job_status(cluster, namespace, name)
        states.append(str(status.get("state")))
        left = [
            name_of(pod)
            for pod in cluster.core.list_namespaced_pod(namespace, label_selector=TRAINER_SELECTOR).items
            if node_of(pod) and not is_terminating(pod)
        ]
    finally:
        cleanup = cluster.delete_namespace(namespace, timeout=900)
    placed = first_times(events, bound)
    most_bound = max_concurrently_bound(events)
    return {
        "started": started,
        "cleared": cleared - started,
        "bound": sorted(placed.values()),
        "most_bound": most_bound,
        "left_bound": left,
        "states": sorted(set(states)),
        "nodes": nodes,
        "gang_condition": condition(status, "GangScheduled"),
        "timeout": timeout,
        "cleanup": cleanup.seconds,
        "cleanup_note": cleanup.note("Run 2 cleanup"),
    }


def max_concurrently_bound(events: list[Any]) -> int:
    """The most gang pods bound to a node at one time (pure over the watch's events)."""
    current: set[str] = set()
    most = 0
    for event in events:
        if event.type == "DELETED" or event.deleting:
            current.discard(event.uid)
        elif event.node:
            current.add(event.uid)
        most = max(most, len(current))
    return most


# ------------------------------------------------------------------------------ result


def run(context: Any, quick: bool) -> BenchResult:
    sizes = QUICK if quick else FULL
    cluster = context.cluster()
    if len(cluster.simulated_nodes()) * 249 < sizes.gang:
        raise BenchError(f"the cluster's simulated nodes cannot hold {sizes.gang} pods: start it with more")
    full = run_full(cluster, sizes, context.log)
    all_bound = full["bound"][-1] - full["started"] if len(full["bound"]) >= sizes.gang else None
    short = run_short(cluster, sizes, short_timeout(sizes, all_bound), context.log)
    return result(sizes, full, short, cluster.operator.reconcile_interval if cluster.operator else 5.0)


def result(
    sizes: Sizes, full: dict[str, Any], short: dict[str, Any], reconcile_interval: float
) -> BenchResult:
    origin = full["started"]
    made, placed, ran = full["created"], full["bound"], full["running"]
    end_to_end = len(made) / (made[-1] - origin) if made and made[-1] > origin else 0.0
    windows = per_second(made)
    partial_full = 0.0 if len(ran) >= sizes.gang else 1.0
    partial_short = 1.0 if short["left_bound"] or "Running" in short["states"] else 0.0
    changes = full["changes"]
    errors = sum(changes["apiserver_errors"].values()) + sum(changes["operator_api_errors"].values())
    held = (short["cleared"] - (short["bound"][0] - short["started"])) if short["bound"] else 0.0
    x_made, y_made = thin(*cumulative(made, origin))
    x_bound, y_bound = thin(*cumulative(placed, origin))
    x_ran, y_ran = thin(*cumulative(ran, origin))
    notes = [
        f"Run 1: one TrainingJob of {sizes.workers} workers + {sizes.spares} spares ({sizes.gang} pods) on "
        "simulated nodes (pods become Running without a process); times are when this process's pod watch "
        "saw each change, from the moment the job was created.",
        f"Run 1: apiserver answered {fmt_counts(changes['apiserver_errors']) or 'no'} 429/5xx responses, "
        f"{fmt_counts(changes['conflicts']) or 'no'} conflicts (409); the operator counted "
        f"{fmt_counts(changes['operator_api_errors']) or 'no'} failed API calls and logged "
        f"{len(changes['operator_throttle_lines'])} lines about throttling; the apiserver served "
        f"{changes['pod_creates']:.0f} pod creations.",
        *(f"Run 1 operator log: {line}" for line in changes["operator_warnings"]),
        f"Run 1: GangScheduled {describe_condition(full['gang_condition'])}.",
        f"Run 2 (one short): blockers left room for {sizes.gang - 1} of {sizes.gang} pods on "
        f"{', '.join(short['nodes'])}; at most {short['most_bound']} gang pods were bound at once; the "
        f"gang timed out and its pods were gone {short['cleared']:.1f} s after the job was created; job "
        f"states seen: {', '.join(short['states'])}; GangScheduled {describe_condition(short['gang_condition'])}.",
    ]
    if short["most_bound"] != sizes.gang - 1:
        notes.append(
            f"Run 2: expected {sizes.gang - 1} gang pods bound before the timeout, saw at most "
            f"{short['most_bound']} (the room computed from the nodes' requests was off)."
        )
    notes += [note for note in (full["cleanup_note"], short["cleanup_note"]) if note]
    if short["left_bound"]:
        notes.append(f"Run 2: pods still bound after the timeout: {', '.join(short['left_bound'][:10])}.")
    for line in changes["operator_throttle_lines"][:3]:
        notes.append(f"Operator log: {line[:200]}")
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[
            Metric(
                name="pods created per second",
                unit="pods/s",
                samples=[end_to_end],
                description=f"{len(made)} gang pods over the time from the job's creation to the last pod's",
                target=Target(op=">=", value=100, text=">= 100 pods/s created"),
                baseline=Baseline(text="kube-scheduler gate 100 pods/s; Volcano ~42 pods/s", value=42),
            ),
            Metric(
                name="pods created in each second",
                unit="pods/s",
                samples=windows,
                description="gang pods created in each one-second window from the first to the last",
            ),
            Metric(
                name="job created -> first pod",
                unit="s",
                samples=[made[0] - origin] if made else [],
                description="the operator's reaction to a new TrainingJob",
            ),
            Metric(
                name="job created -> all pods bound",
                unit="s",
                samples=[placed[-1] - origin] if len(placed) >= sizes.gang else [],
                description="until the scheduler bound the last gang pod",
            ),
            Metric(
                name="scheduling gate: last pod created -> first pod bound",
                unit="s",
                samples=[placed[0] - made[-1]] if made and placed else [],
                description="what the gang's scheduling gate adds: no pod is bound before every pod of the gang "
                "exists and the operator lifted the gates (negative: binding began before the last creation)",
            ),
            Metric(
                name="job created -> all pods Running",
                unit="s",
                samples=[ran[-1] - origin] if len(ran) >= sizes.gang else [],
                description="until the last gang pod was Running",
            ),
            Metric(
                name="partially placed gangs left",
                unit="count",
                samples=[partial_full, partial_short],
                description="run 1 (room for all) and run 2 (one short): 1 when some of the gang's pods held "
                "nodes while others could not be placed, once the schedule timeout had passed",
                target=Target(op="<=", value=0, stat="max", text="0 partially placed gangs"),
                baseline=Baseline(text="Volcano and coscheduling: 0 (gang at the scheduler)"),
            ),
            Metric(
                name="job created -> GangScheduled in status",
                unit="s",
                samples=[full["status_scheduled"]] if full["status_scheduled"] is not None else [],
                description="until the operator's status said the whole gang was scheduled",
            ),
            Metric(
                name="job deleted -> its pods and finalizer gone",
                unit="s",
                samples=[full["cleanup"], short["cleanup"]],
                description="run 1 and run 2: deleting the namespace until it was gone (the operator "
                "releases the job's finalizer)",
            ),
            Metric(
                name="API errors and throttling",
                unit="count",
                samples=[errors],
                description="429/5xx from the apiserver plus the operator's failed API calls during run 1",
            ),
            Metric(
                name="partial gang held capacity",
                unit="s",
                samples=[held] if short["bound"] else [],
                description="run 2: from the first gang pod bound to the last one deleted",
            ),
        ],
        timeouts=[
            Timeout(
                name="gang schedule timeout, run 1",
                seconds=sizes.full_timeout,
                source="spec.gang.scheduleTimeoutSeconds",
            ),
            Timeout(
                name="gang schedule timeout, run 2 (1.5x run 1's time to bind all + 15 s)",
                seconds=short["timeout"],
                source="spec.gang.scheduleTimeoutSeconds",
            ),
            Timeout(
                name="gang backoff after a timeout",
                seconds=BACKOFF_SECONDS,
                source="spec.gang.backoffSeconds",
            ),
            Timeout(
                name="operator periodic reconcile",
                seconds=reconcile_interval,
                source="chart reconcileIntervalSeconds",
            ),
        ],
        notes=notes,
        series=[
            Series(
                name="created",
                x=x_made,
                y=y_made,
                x_label="s since the job was created",
                y_label="pods",
                chart="run 1: gang pods",
            ),
            Series(
                name="bound",
                x=x_bound,
                y=y_bound,
                x_label="s since the job was created",
                y_label="pods",
                chart="run 1: gang pods",
            ),
            Series(
                name="Running",
                x=x_ran,
                y=y_ran,
                x_label="s since the job was created",
                y_label="pods",
                chart="run 1: gang pods",
            ),
        ],
        details={
            "gang_pods": sizes.gang,
            "full": {key: value for key, value in full.items() if key not in ("created", "bound", "running")},
            "short": {key: value for key, value in short.items() if key != "bound"},
        },
    )


def fmt_counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{value:.0f} x {key}" for key, value in sorted(counts.items()) if value)


def describe_condition(found: dict[str, Any] | None) -> str:
    if not found:
        return "not set"
    return f"{found.get('status')} ({found.get('reason')}: {found.get('message', '')[:160]})"
