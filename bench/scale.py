"""One job at the seeds' scale on the local cluster (`phalanx bench --only scale`).

Each size runs one TrainingJob of N worker pods and N / 64 hot spares (at least one), `nprocPerNode: 8`, one pod
per simulated node of 8 `nvidia.com/gpu`: N = 512 is 4,096 GPUs. The cluster is this benchmark's own: one agent
node for the operator and a simulated node per pod, which beat as kubelets do (a Lease every 10 s, the node
controller's grace 40 s; past 520 nodes more slowly, at most 52 node Leases a second in all, so that the nodes'
own heartbeats leave this 2-core machine's API server to the job). The pods only pretend to run; their launchers
are emulated here through the launcher's own heartbeat code (bench/scale_launchers.py): below 128 pods each
renews its pod's Lease, from 128 each puts its beat into the job's store and the job's heartbeat hub (`python -m
phalanx.worker.beathub`, the rendezvous pod's second container, with the same store behind the same gate) writes
one summary Lease; `heartbeat.reporting: auto` picks the same. The store and the hub run on this machine as the rendezvous pod would run them (that pod
is simulated too), the hub with the cluster's admin credentials.

Measured at each size:
- the gang: the job applied -> every pod bound, and Running; a gang is partial when a pod was bound before the
  last was created;
- steady state over a window: the API server's writes per second (its request counters) beside the job's share
  and the simulated nodes' (both counted from watches: each write to an object is one event of it); the events
  per second the operator's watches deliver (the job's pods, Leases and TrainingJob, and every node); the
  operator's CPU and resident memory;
- detection: one worker's launcher falls silent, as a frozen one does; from its last beat to the operator's
  `HeartbeatTimeout` Event naming it, less the heartbeat timeout.

12,500 pods (100,000 GPUs) is projected from the measured sizes where this machine does not carry it.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from phalanx import contract
from phalanx.bench import operator_scale, prom, scale_beside
from phalanx.bench.cluster import (
    SIMULATED_LABEL,
    SIMULATED_TOLERATION,
    BenchCluster,
    BenchError,
    process_tree_figures,
    wait_for,
)
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout
from phalanx.bench.kubeobjects import is_terminating, name_of, phase_of, uid_of
from phalanx.bench.scale_beside import BesideFigures, SmallJobs
from phalanx.bench.scale_launchers import HANG_THRESHOLD, EmulatedLaunchers
from phalanx.bench.watch import Watch, bound, created, first_times, pod_watch, running, ungated
from phalanx.operator import api, hubview, names, statusbudget

NAME = "scale"
TITLE = "One job at the seeds' scale: N pods of 8 GPUs on simulated nodes, emulated launchers"
JOB = "big"
GPUS_PER_POD = 8
INTERVAL = 2.0
TIMEOUT = 10.0
NODE_HEARTBEAT = 10.0
"""Seconds between the simulated nodes' Lease renewals (a kubelet's default), up to `NODE_LEASES_PER_SECOND`."""
NODE_LEASES_PER_SECOND = 52.0
"""The simulated nodes' Lease renewals per second at most (520 nodes at a kubelet's 10 s): more nodes renew more
slowly, so that the nodes' own heartbeats do not take this machine's whole API server from the job."""
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
VERDICT_REASONS = {"stopped": "TrainerStopped", "hung": "NoProgress"}
"""The launcher's verdicts and the operator's Event reason for each (operator/detection.py)."""
DEFAULT_MAX_GANG_PODS = 2000
"""The chart's `maxGangPods`."""
SEED_SCALE = 12_500
SEED_SCALE_TRIED = (
    "not in the full run: tried alone on this 2-core machine (2026-12-07), 12,695 simulated nodes registered in "
    "416 s; the operator listed them in 3.5 s and created the gang's 12,695 pods in about 2.5 minutes, but the "
    "gate lifts, bindings and Running statuses went at about 15 pods a second with both cores busy (API server 54 %, "
    "scheduler 50 %, controller-manager 41 %, operator 27 %, node agent 16 %, etcd 6 %), so the gang was not bound "
    "within its 600 s schedule timeout and the operator deleted it and made it again, as a gang that cannot be "
    "placed is; what ran out was the machine's CPU, shared by the whole control plane"
)
"""What N = 12,500 met when tried here (the full run stops at 512)."""
"""Pods of a 100,000-GPU job at 8 GPUs a pod."""
WRITES_BOUND = 20.0
DETECTION_BOUND = 3.0
VERDICT_BOUND = 1.0
HUB_HANG_WAIT = (
    "a hang verdict waits until every peer renewed its heartbeat after it (a peer that did not may be the frozen "
    "culprit); the heartbeat hub publishes as soon as they have, so the wait is up to an interval (each launcher "
    "beats at a phase of its own) plus the summary's trip to the operator; the emulated launchers send all 520 "
    "pods' beats from this one process, and a beat late for it (see its rounds longer than the interval) is late "
    "for the verdict too"
)
"""The operator acts on a launcher's news within the API's own p99 bound."""
GANG_BOUND_SECONDS = 180.0
EMULATED_STORE_TIMEOUT = 30.0
"""Seconds an emulated launcher's store connection may take (a real one's: `launch.HUB_STORE_TIMEOUT`, 2 s). Every
emulated launcher reaches the gate through this one process's forwarder, which checks each connection's owner
among the thousands of sockets this process holds: when 520 connect at once, the checks queue for longer than
2 s, and the launchers that gave up would fall back to their own Leases. A real launcher's forwarder serves only
its own few connections."""
HUB_DOWN = 10.0
"""Seconds the killed hub stays down: a container's first restart back-off."""
HUB_LOST_BOUND = hubview.outage_grace_seconds(INTERVAL, TIMEOUT)
"""A worker silenced when the hub is lost is found by then: the gap the operator leaves in its view for a silent
hub closes, and the launchers' own Leases have carried the others since the hub's silence passed their timeout."""
STATUS_BOUND_KIB = 64
"""A TrainingJob's status at most, whatever its gang's size."""
RSS_TARGET = Target(op="<=", value=1024, stat="max", text="<= 1 GiB")
"""The operator's resident memory at the seeds' scale."""
STATUS_TARGET = Target(op="<=", value=STATUS_BOUND_KIB, stat="max", text=f"<= {STATUS_BOUND_KIB} KiB")
HUB_SUMMARY_WAIT = 60.0
RECOVERY_WAIT = 120.0
DETECTION_WAIT = TIMEOUT + 60.0
ENVELOPE = (
    "Kubernetes' scalability envelope: 5,000 nodes, 150,000 pods, API call p99 <= 1 s; each node's heartbeat "
    "Lease every 10 s (500 writes/s at 5,000 nodes)"
)


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    window: float
    """Seconds of the steady-state window."""
    trials: int
    """Silent workers, and group restarts, per size."""
    verdict_trials: int = 2
    """Stopped and hung training processes (each) per size."""
    beside: int = 0
    """Small jobs run beside the largest size's gang (bench/scale_beside.py)."""
    beside_trials: int = 0
    """Their worker pods deleted one at a time, and the gang's stopped trainers, meanwhile."""


FULL = Plan(sizes=(8, 64, 512), window=30.0, trials=3, beside=100, beside_trials=20)
QUICK = Plan(sizes=(64,), window=10.0, trials=1, verdict_trials=1, beside=3, beside_trials=2)


def node_heartbeat_seconds(nodes: int) -> float:
    """The simulated nodes' Lease interval for a cluster of `nodes`."""
    return max(NODE_HEARTBEAT, round(nodes / NODE_LEASES_PER_SECOND))


def spares_for(workers: int) -> int:
    return max(1, workers // 64)


def job_manifest(workers: int, spares: int) -> dict[str, Any]:
    """One job of `workers` pods of 8 GPUs on simulated nodes (its rendezvous pod too: the nodeSelector is copied
    to it)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": JOB},
        "spec": {
            "replicas": workers,
            "spares": spares,
            "nprocPerNode": GPUS_PER_POD,
            "heartbeat": {"intervalSeconds": INTERVAL, "timeoutSeconds": TIMEOUT},
            "failurePolicy": {"maxRestarts": 1000},
            "gang": {"scheduleTimeoutSeconds": 600},
            "template": {
                "spec": {
                    "nodeSelector": {SIMULATED_LABEL: "true"},
                    "tolerations": [SIMULATED_TOLERATION],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:bench",
                            "command": ["python", "train.py"],
                            "resources": {
                                "requests": {"memory": "8Mi", "nvidia.com/gpu": str(GPUS_PER_POD)},
                                "limits": {"nvidia.com/gpu": str(GPUS_PER_POD)},
                            },
                        }
                    ],
                }
            },
        },
    }


# ------------------------------------------------------------------------------ watches that count events


@dataclass(frozen=True)
class Seen:
    """One watch event: when this process got it, and the little the analysis reads."""

    t: float
    type: str
    name: str
    reason: str = ""
    message: str = ""


def seen(kind: str, raw: dict[str, Any], moment: float) -> Seen:
    return Seen(
        moment,
        kind,
        (raw.get("metadata") or {}).get("name", ""),
        raw.get("reason", ""),
        raw.get("message", ""),
    )


def counting_watch(new_api: Callable[[], client.ApiClient], lister: str, *args: Any) -> Watch[Seen]:
    """Every event of a list call of CoreV1Api, CoordinationV1Api or CustomObjectsApi (`lister` names it)."""
    apis = {
        "core": client.CoreV1Api,
        "coordination": client.CoordinationV1Api,
        "custom": client.CustomObjectsApi,
    }
    group, method = lister.split(".")
    return Watch(new_api, lambda api_client: getattr(apis[group](api_client), method), args, seen)


def changes_between(events: list[Seen], start: float, end: float) -> int:
    """Writes seen in [start, end): every event but the first listing."""
    return sum(1 for event in events if event.type != "LISTED" and start <= event.t < end)


# ------------------------------------------------------------------------------ one size


@dataclass
class SizeFigures:
    workers: int
    spares: int
    hub: bool
    gang: dict[str, float] = field(default_factory=dict)
    partial: bool = False
    gang_requests: dict[str, float] = field(default_factory=dict)
    """API writes per pod of the gang while it formed, by `VERB resource[/subresource]`."""
    window: float = 0.0
    writes_total: float = 0.0
    writes_by_resource: dict[str, float] = field(default_factory=dict)
    job_writes: dict[str, float] = field(default_factory=dict)
    node_writes: dict[str, float] = field(default_factory=dict)
    operator_events: dict[str, float] = field(default_factory=dict)
    operator_cpu: float = 0.0
    operator_rss_mb: float = 0.0
    detection: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    launcher_failures: int = 0
    late_rounds: int = 0
    errors: dict[str, float] = field(default_factory=dict)
    false_alarms: list[str] = field(default_factory=list)
    """`HeartbeatTimeout`s of pods whose launchers were not silenced, with what the emulation knew of them."""
    verdicts: dict[str, list[float]] = field(default_factory=dict)
    """Per launcher verdict (`stopped`, `hung`): seconds from the launcher's report to the operator's Event."""
    restart_reports: list[float] = field(default_factory=list)
    """Seconds from a launcher's group restart to its pod's own Lease reaching a watch."""
    hub_lost: list[float] = field(default_factory=list)
    """Seconds from the hub's kill (a worker silenced at once, the hub back `HUB_DOWN` later) to the operator's
    HeartbeatTimeout naming that worker."""
    beside: BesideFigures | None = None
    """The small jobs run beside this size's gang, if any (bench/scale_beside.py)."""
    status_bytes: list[int] = field(default_factory=list)
    """The TrainingJob's status as JSON, in bytes: at the end of the steady window and after the trials."""


class HubSide:
    """The rendezvous pod's two processes run here: the job's store behind its gate, and the heartbeat hub."""

    def __init__(self, cluster: BenchCluster, namespace: str, scratch: Path) -> None:
        from phalanx.bench.rendezvous_scale import start_store
        from phalanx.worker import rendezvous, storegate

        secret = cluster.core.read_namespaced_secret(names.store_secret_name(JOB), namespace)
        secret_file = scratch / f"{namespace}-secret"
        secret_file.write_bytes(base64.b64decode((secret.data or {})[names.STORE_SECRET_KEY]))
        secret_file.chmod(0o600)
        self.store, self.port = start_store(secret_file)
        self.secret = storegate.read_secret(str(secret_file))
        pod = cluster.core.read_namespaced_pod(names.rendezvous_name(JOB), namespace)
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "POD_NAME": name_of(pod),
            "POD_NAMESPACE": namespace,
            "POD_UID": uid_of(pod),
            rendezvous.SECRET_FILE_ENV: str(secret_file),
        }
        self._hub_command = [
            sys.executable, "-m", "phalanx.worker.beathub", "--store", f"127.0.0.1:{self.port}",
            "--job", JOB, "--interval", f"{INTERVAL:g}", "--timeout", f"{TIMEOUT:g}",
        ]  # fmt: skip
        self._hub_env = env
        self._hub_log = (scratch / f"{namespace}-hub.log").open("a")
        self.hub = self.start_hub()

    def start_hub(self) -> subprocess.Popen[bytes]:
        """The hub's container (re)started."""
        self.hub = subprocess.Popen(
            self._hub_command, env=self._hub_env, stdout=subprocess.DEVNULL, stderr=self._hub_log
        )
        return self.hub

    def kill_hub(self) -> None:
        """The hub's container killed (an OOM kill, a crash): SIGKILL, no last summary."""
        self.hub.kill()
        self.hub.wait(15)

    def connect(self) -> Any:
        from phalanx.worker import rendezvous

        return rendezvous.connect("127.0.0.1", self.port, EMULATED_STORE_TIMEOUT, self.secret)

    def close(self) -> None:
        for process in (self.hub, self.store):
            process.terminate()
        for process in (self.hub, self.store):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        self._hub_log.close()


def wait_gang(pods: Watch[Any], count: int, applied: float) -> tuple[dict[str, float], bool]:
    """Seconds from the apply to the last trainer pod created, released from the gang's gate, bound and Running;
    whether the gang was partial."""

    def times(when: Callable[[Any], bool]) -> dict[str, float]:
        trainers = [event for event in pods.events() if event.name != names.rendezvous_name(JOB)]
        return first_times(trainers, when)

    wait_for(lambda: len(times(running)) >= count, 900, interval=1.0, message=f"{count} trainer pods Running")
    made, released, placed, ran = times(created), times(ungated), times(bound), times(running)
    gang = {
        "created": max(made.values()) - applied,
        "ungated": max(released.values()) - applied,
        "bound": max(placed.values()) - applied,
        "running": max(ran.values()) - applied,
    }
    return gang, min(placed.values()) < max(made.values())


GANG_WRITES = ("POST pods", "PATCH pods", "POST pods/binding", "PATCH pods/status", "POST events")
"""The writes a forming gang causes: the operator's creation and gate lift, the scheduler's binding and Event,
the node's status."""
OPERATOR_POD_WRITES = ("POST pods", "PATCH pods")


def gang_requests(before: dict[Any, float], after: dict[Any, float], pods: int) -> dict[str, float]:
    """Per pod of the gang (the rendezvous pod included), the API writes of `GANG_WRITES` between the scrapes."""
    rows = prom.request_deltas(before, after)
    counts = prom.by_resource(rows, lambda row: row.verb.upper() in prom.WRITE_VERBS)
    return {key: counts.get(key, 0.0) / pods for key in GANG_WRITES}


def status_bytes(cluster: BenchCluster, namespace: str) -> int:
    """The size of the job's status as the API server serves it (JSON)."""
    job: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, JOB
    )  # type: ignore[assignment]
    return scale_beside.status_bytes(job)


def operator_figures(cluster: BenchCluster) -> tuple[float, float]:
    rss, cpu = process_tree_figures(cluster.operator_process())
    return rss, cpu


def measure_size(
    cluster: BenchCluster, workers: int, plan: Plan, scratch: Path, log: Callable[[str], None]
) -> SizeFigures:
    spares = spares_for(workers)
    figures = SizeFigures(workers, spares, workers + spares >= api.HUB_FROM_PODS)
    namespace = cluster.create_namespace(f"scale-{workers}")
    new_api = cluster.new_api_client
    watches: dict[str, Watch[Any]] = {
        "pods": pod_watch(new_api, namespace),
        "leases": counting_watch(new_api, "coordination.list_namespaced_lease", namespace),
        "trainingjobs": counting_watch(
            new_api, "custom.list_namespaced_custom_object", api.GROUP, api.VERSION, namespace, api.PLURAL
        ),
        "events": counting_watch(new_api, "core.list_namespaced_event", namespace),
        "nodes": counting_watch(new_api, "core.list_node"),
        "node leases": counting_watch(new_api, "coordination.list_namespaced_lease", "kube-node-lease"),
    }
    hub_side: HubSide | None = None
    launchers: EmulatedLaunchers | None = None
    try:
        for watch in watches.values():
            watch.start()
        log(f"N={workers}: applying a job of {workers} workers and {spares} spares")
        requests_before = prom.parse(cluster.apiserver_metrics(), prom.REQUESTS)
        applied = time.monotonic()
        cluster.apply([job_manifest(workers, spares)], namespace)
        figures.gang, figures.partial = wait_gang(watches["pods"], workers + spares, applied)
        figures.gang_requests = gang_requests(
            requests_before, prom.parse(cluster.apiserver_metrics(), prom.REQUESTS), workers + spares + 1
        )
        log(f"N={workers}: gang Running in {figures.gang['running']:.1f} s")
        if figures.hub:
            wait_for(
                lambda: running(watch_last(watches["pods"], names.rendezvous_name(JOB))),
                120,
                message="the rendezvous pod Running",
            )
            hub_side = HubSide(cluster, namespace, scratch)
        launchers = EmulatedLaunchers(
            new_api,
            namespace,
            JOB,
            INTERVAL,
            TIMEOUT,
            hub_side.connect if hub_side else None,
            replicas=workers,
        ).start()
        if figures.hub:
            wait_for(
                lambda: any(e.name == names.rendezvous_name(JOB) for e in watches["leases"].events()),
                HUB_SUMMARY_WAIT,
                message="the hub's first summary Lease",
            )
        time.sleep(3 * INTERVAL)  # every launcher's first beat and Lease are behind
        steady_window(cluster, figures, watches, plan.window)
        figures.status_bytes.append(status_bytes(cluster, namespace))
        log(f"N={workers}: steady window done ({figures.writes_total:.1f} writes/s in all)")
        trials = Trials(cluster, figures, watches, launchers, namespace, log)
        for trial in range(plan.trials):
            trials.silence(trial)
        for trial in range(plan.trials):
            trials.restart(trial)
        for kind in VERDICT_REASONS:
            for trial in range(plan.verdict_trials):
                trials.verdict(kind, trial)
        if hub_side is not None:
            trials.hub_lost(hub_side)
        figures.status_bytes.append(status_bytes(cluster, namespace))
        if plan.beside and workers == max(plan.sizes):
            figures.beside = beside_the_gang(cluster, trials, plan, log)
        figures.launcher_failures, figures.late_rounds = launchers.failures, launchers.late_rounds
        figures.false_alarms = false_alarms(watches["events"].events(), launchers)
    finally:
        if launchers is not None:
            launchers.stop()
        if hub_side is not None:
            hub_side.close()
        for watch in watches.values():
            watch.stop()
        # Gone before the next size starts: its pods' deletion is no write of the next gang's, nor its load.
        cluster.delete_namespace(namespace, wait=True)
    return figures


def beside_the_gang(
    cluster: BenchCluster, trials: Trials, plan: Plan, log: Callable[[str], None]
) -> BesideFigures:
    """Small jobs applied while the gang trains: their workers replaced one at a time, and the gang's launchers'
    `stopped` verdicts acted on, with both kinds of job in the operator's hands."""
    with SmallJobs(cluster, plan.beside, log) as small:
        small.replace_workers(plan.beside_trials)
        for trial in range(max(1, plan.beside_trials // 4)):
            trials.verdict("stopped", 50 + trial, into=small.figures.verdicts)
        small.figures.operator_rss_mb = operator_figures(cluster)[0]
        small.measure_statuses()
    return small.figures


def watch_last(pods: Watch[Any], name: str) -> Any:
    """The latest event of pod `name` (None: none yet)."""
    return next((event for event in reversed(pods.events()) if event.name == name), None)


def steady_window(
    cluster: BenchCluster, figures: SizeFigures, watches: dict[str, Watch[Any]], seconds: float
) -> None:
    before = prom.parse(cluster.apiserver_metrics(), prom.REQUESTS)
    _, cpu_before = operator_figures(cluster)
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    after = prom.parse(cluster.apiserver_metrics(), prom.REQUESTS)
    rss, cpu_after = operator_figures(cluster)
    span = end - start
    rows = prom.request_deltas(before, after)
    figures.window = span
    figures.writes_total = prom.writes(rows) / span
    figures.writes_by_resource = {
        key: count / span
        for key, count in prom.by_resource(rows, lambda row: row.verb.upper() in prom.WRITE_VERBS).items()
    }
    figures.errors = prom.errors(rows)

    def rate(name: str) -> float:
        return changes_between(watches[name].events(), start, end) / span

    figures.job_writes = {name: rate(name) for name in ("leases", "trainingjobs", "pods")}
    figures.node_writes = {"node leases": rate("node leases"), "nodes": rate("nodes")}
    figures.operator_events = {**figures.job_writes, "nodes": rate("nodes")}
    figures.operator_cpu = (cpu_after - cpu_before) / span
    figures.operator_rss_mb = rss


def false_alarms(events: list[Seen], launchers: EmulatedLaunchers) -> list[str]:
    """The operator's Events blaming a pod's heartbeat or its launcher's verdict where the emulation gave no
    cause (neither silenced nor reported): what the emulation knew of each (its beats' path, its failed beats),
    for finding out which side lost them."""
    found = []
    for event in events:
        if event.reason not in (HEARTBEAT_TIMEOUT, *VERDICT_REASONS.values()) or event.type == "LISTED":
            continue
        pod = event.message.split(":", 1)[0]
        if launchers.was_silenced(pod) or launchers.was_reported(pod):
            continue
        found.append(
            f"{pod} ({event.reason}) at +{event.t - launchers.started:.1f} s: {launchers.describe(pod, event.t)}"
        )
    return found


@dataclass
class Trials:
    """The faults tried on one size's running job, one after another, each timed to what the operator did."""

    cluster: BenchCluster
    figures: SizeFigures
    watches: dict[str, Watch[Any]]
    launchers: EmulatedLaunchers
    namespace: str
    log: Callable[[str], None]

    def silence(self, trial: int) -> None:
        """One worker's launcher falls silent; the time from its last beat to the operator's Event naming it,
        past the timeout. Then wait until the gang is whole again."""
        what = f"trial {trial}"
        picked = self._worker(trial, what)
        if picked is None:
            return
        victim, uid = picked
        since = time.monotonic()
        last = self.launchers.silence(victim, uid)
        event = self._event((HEARTBEAT_TIMEOUT,), victim, since, what)
        if event is None:
            return
        self.figures.detection.append(event.t - (last + TIMEOUT))
        self.log(
            f"N={self.figures.workers}: {victim} silent, found {self.figures.detection[-1]:+.2f} s past the timeout"
        )
        self._wait_whole(what)

    def hub_lost(self, hub: HubSide) -> None:
        """The heartbeat hub is killed and, at the same moment, one worker's launcher falls silent; the hub's
        container is back `HUB_DOWN` seconds later. The time from the kill to the operator's Event naming the
        silent worker: no other worker may be taken for silent meanwhile (`false_alarms`), and the silent one is
        found once the hub is back, at the latest when the gap the operator leaves for a silent hub closes."""
        what = "hub lost"
        picked = self._worker(300, what)
        if picked is None:
            return
        victim, uid = picked
        killed = time.monotonic()
        hub.kill_hub()
        self.launchers.silence(victim, uid)
        time.sleep(HUB_DOWN)
        hub.start_hub()
        event = self._event((HEARTBEAT_TIMEOUT,), victim, killed, what)
        if event is None:
            return
        self.figures.hub_lost.append(event.t - killed)
        self.log(
            f"N={self.figures.workers}: hub killed, {victim} silent: found {event.t - killed:.2f} s after the kill"
        )
        self._wait_whole(what)

    def verdict(self, kind: str, trial: int, into: dict[str, list[float]] | None = None) -> None:
        """One worker's launcher judges a training process `stopped` or `hung` (its step stays); the time from its
        report to the operator's Event naming the pod, into `into` (else the size's figures). Then wait until the
        gang is whole again."""
        what = f"{kind} {trial}"
        picked = self._worker(100 + trial, what)
        if picked is None:
            return
        victim, uid = picked
        self.launchers.freeze(victim, uid)
        if kind == "hung":
            # A launcher calls a rank hung once it waited its hang threshold for the next step.
            time.sleep(HANG_THRESHOLD)
        sent = self.launchers.report(victim, uid, fault=kind)
        event = self._event((VERDICT_REASONS[kind],), victim, sent, what)
        if event is None:
            return
        (self.figures.verdicts if into is None else into).setdefault(kind, []).append(event.t - sent)
        self.log(
            f"N={self.figures.workers}: {victim} {kind}, acted on {event.t - sent:.2f} s after its report"
        )
        self._wait_whole(what)

    def restart(self, trial: int) -> None:
        """One worker's training process dies and its launcher restarts its group: the time from the report to
        the pod's own Lease carrying it reaching a watch of the job's Leases (as the operator's does), with the
        hub too: no wait for the hub's next summary."""
        what = f"restart {trial}"
        picked = self._worker(200 + trial, what)
        if picked is None:
            return
        victim, uid = picked
        sent = self.launchers.report(victim, uid, restarted=True)
        leases = self.watches["leases"]

        def arrived() -> Seen | None:
            return next((e for e in leases.events() if e.t >= sent and e.name == victim), None)

        try:
            event = wait_for(arrived, DETECTION_WAIT, interval=0.05, message=f"{victim}'s restart reported")
        except BenchError as error:
            self.figures.misses.append(f"{what}: {error}")
            return
        self.figures.restart_reports.append(event.t - sent)

    def _worker(self, slot: int, what: str) -> tuple[str, str] | None:
        """A Running worker of the job (name, uid), a different one per `slot`; None (a miss noted) when none
        runs."""
        selector = f"{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
        live = sorted(
            (name_of(pod), uid_of(pod))
            for pod in self.cluster.core.list_namespaced_pod(self.namespace, label_selector=selector).items
            if phase_of(pod) == "Running" and not is_terminating(pod)
        )
        if not live:
            self.figures.misses.append(f"{what}: no Running worker")
            return None
        return live[(slot * 7 + 1) % len(live)]

    def _event(self, reasons: tuple[str, ...], pod: str, since: float, what: str) -> Seen | None:
        """The first Event after `since` of one of `reasons` that names `pod`; None (a miss noted) when none
        comes within `DETECTION_WAIT`."""
        events = self.watches["events"]

        def found() -> Seen | None:
            return next(
                (e for e in events.events() if e.t >= since and e.reason in reasons and pod in e.message),
                None,
            )

        try:
            return wait_for(found, DETECTION_WAIT, interval=0.1, message=f"{'/'.join(reasons)} of {pod}")
        except BenchError as error:
            self.figures.misses.append(f"{what}: {error}")
            return None

    def _wait_whole(self, what: str) -> None:
        """Wait until every trainer pod of the gang is Running again (a miss is noted, not raised)."""
        whole = self.figures.workers + self.figures.spares

        def recovered() -> bool:
            pods = self.cluster.core.list_namespaced_pod(
                self.namespace, label_selector=f"{contract.LABEL_JOB_NAME}={JOB}"
            ).items
            trainers = [
                pod
                for pod in pods
                if name_of(pod) != names.rendezvous_name(JOB)
                and not is_terminating(pod)
                and phase_of(pod) == "Running"
            ]
            return len(trainers) >= whole

        try:
            wait_for(recovered, RECOVERY_WAIT, interval=1.0, message="the gang whole again")
        except BenchError as error:
            self.figures.misses.append(f"{what}: {error}")


# ------------------------------------------------------------------------------ the report


def power_law(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    from phalanx.bench.rendezvous_scale import power_law as fit

    return fit(points)


def projection(label: str, unit: str, points: list[tuple[float, float]]) -> str | None:
    fit = power_law(points)
    if fit is None:
        return None
    value = fit[0] * SEED_SCALE ** fit[1]
    return (
        f"Projection, not a measurement: {label} at N = {SEED_SCALE:,} = {value:.3g} {unit} "
        f"(power law fitted to N = {', '.join(f'{int(x):,}' for x, _ in points)}, exponent {fit[1]:.2f})"
    )


def verdict_target(kind: str) -> Target:
    """A stop is acted on at once; a hang once every peer renewed its heartbeat after the verdict (a peer that
    did not is the likelier culprit: operator/detection.py), one heartbeat interval at most."""
    if kind == "hung":
        return Target(
            op="<=",
            value=INTERVAL + VERDICT_BOUND,
            stat="p99",
            text=f"p99 <= {INTERVAL + VERDICT_BOUND:g} s: every peer's next heartbeat, then at once",
        )
    return Target(op="<=", value=VERDICT_BOUND, stat="p99", text=f"p99 <= {VERDICT_BOUND:g} s")


def metrics_of(measured: dict[int, SizeFigures]) -> list[Metric]:
    metrics: list[Metric] = []
    for workers, figures in measured.items():
        pods = figures.workers + figures.spares
        heartbeat_writes = figures.job_writes.get("leases", 0.0)
        metrics += [
            Metric(
                name=f"gang bound, N={workers}",
                unit="s",
                samples=[figures.gang["bound"]],
                description=f"the job applied -> all {pods} trainer pods bound to nodes",
                target=Target(op="<=", value=GANG_BOUND_SECONDS, stat="max", text="<= 3 min at 12,500 pods")
                if workers >= 512
                else None,
            ),
            Metric(
                name=f"gang's gates lifted, N={workers}",
                unit="s",
                samples=[figures.gang["ungated"]],
                description=f"the job applied -> all {pods} trainer pods released from the gang's scheduling gate",
            ),
            Metric(
                name=f"operator's pod writes per gang pod, N={workers}",
                unit="writes",
                samples=[sum(figures.gang_requests.get(key, 0.0) for key in OPERATOR_POD_WRITES)],
                description="pod creations and pod PATCHes while the gang formed, per pod: one creation and one "
                "gate lift each, none sent again while the operator's pod index catches up",
                target=Target(op="<=", value=2.0, stat="max", text="one creation and one gate lift a pod"),
            ),
            Metric(
                name=f"gang Running, N={workers}",
                unit="s",
                samples=[figures.gang["running"]],
                description=f"the job applied -> all {pods} trainer pods Running (simulated nodes start them at once)",
            ),
            Metric(
                name=f"API writes/s in all, N={workers}",
                unit="writes/s",
                samples=[figures.writes_total],
                description="every write the API server served in the steady window, whoever made it",
            ),
            Metric(
                name=f"the job's heartbeat writes/s, N={workers}",
                unit="writes/s",
                samples=[heartbeat_writes],
                description="writes to the job's Leases in the steady window: "
                + ("the hub's summary (and any pod's own Lease)" if figures.hub else "each pod's own Lease"),
                target=Target(op="<=", value=WRITES_BOUND, stat="max", text="at most 20 for the whole job")
                if workers >= 512
                else None,
                baseline=Baseline(
                    text="each pod renewing its own Lease every interval", value=round(pods / INTERVAL, 1)
                ),
            ),
            Metric(
                name=f"the job's writes/s in all, N={workers}",
                unit="writes/s",
                samples=[sum(figures.job_writes.values())],
                description="the job's Leases, its pods and its TrainingJob (status): the job's share of the writes",
            ),
            Metric(
                name=f"simulated nodes' writes/s, N={workers}",
                unit="writes/s",
                samples=[sum(figures.node_writes.values())],
                description="the node agent's node Lease renewals and node status writes (not the job's)",
            ),
            Metric(
                name=f"operator watch events/s, N={workers}",
                unit="events/s",
                samples=[sum(figures.operator_events.values())],
                description="events the operator's watches deliver: the job's pods, Leases and TrainingJob, every node",
                target=Target(op="<=", value=WRITES_BOUND, stat="max", text="bounded as the writes are")
                if workers >= 512
                else None,
                baseline=Baseline(
                    text="without the server-side Lease selector every node Lease renewal comes too",
                    value=round(
                        sum(figures.operator_events.values()) + figures.node_writes["node leases"], 1
                    ),
                ),
            ),
            Metric(
                name=f"workers judged silent that were not, N={workers}",
                unit="count",
                samples=[float(len(figures.false_alarms))],
                description="HeartbeatTimeouts of pods whose emulated launchers never stopped beating",
                target=Target(op="<=", value=0, stat="max", text="no false alarm"),
            ),
            Metric(
                name=f"operator CPU, N={workers}",
                unit="%",
                samples=[100 * figures.operator_cpu],
                description="the operator's process, CPU time over the steady window",
            ),
            Metric(
                name=f"operator RSS, N={workers}",
                unit="MB",
                samples=[figures.operator_rss_mb],
                description="the operator's resident memory at the end of the steady window",
                target=RSS_TARGET if workers >= 512 else None,
            ),
            Metric(
                name=f"TrainingJob status size, N={workers}",
                unit="KiB",
                samples=[size / 1024 for size in figures.status_bytes],
                description="the job's status as JSON, at the end of the steady window and after the trials "
                "(incidents and Events included): per-worker detail lives in the hub's summary, not here",
                target=STATUS_TARGET if workers >= 512 else None,
            ),
            *[
                Metric(
                    name=f"launcher's verdict '{kind}' acted on, N={workers}",
                    unit="s",
                    samples=samples,
                    description=f"a launcher reports a training process {kind} -> the operator's "
                    f"{VERDICT_REASONS[kind]} Event naming the pod"
                    + (" (the report goes to the pod's own Lease beside the hub)" if figures.hub else ""),
                    target=verdict_target(kind) if workers >= 512 else None,
                    why_missed=HUB_HANG_WAIT if kind == "hung" and figures.hub else "",
                )
                for kind, samples in figures.verdicts.items()
            ],
            Metric(
                name=f"group restart reported, N={workers}",
                unit="s",
                samples=figures.restart_reports,
                description="a launcher restarts its group (a training process died) -> its pod's own Lease "
                "saying so reaches a watch of the job's Leases",
                target=Target(op="<=", value=VERDICT_BOUND, stat="p99", text="p99 <= 1 s")
                if workers >= 512
                else None,
            ),
            Metric(
                name=f"silent worker found past the timeout, N={workers}",
                unit="s",
                samples=figures.detection,
                description="a launcher's last beat + the heartbeat timeout -> the operator's HeartbeatTimeout Event",
                target=Target(op="<=", value=DETECTION_BOUND, stat="p99", text="p99 <= 3 s")
                if workers >= 512
                else None,
            ),
        ]
        if figures.hub_lost:
            metrics.append(
                Metric(
                    name=f"silent worker found with the hub killed, N={workers}",
                    unit="s",
                    samples=figures.hub_lost,
                    description=f"the heartbeat hub SIGKILLed and a worker silenced at once, the hub back "
                    f"{HUB_DOWN:g} s later -> the operator's HeartbeatTimeout naming that worker (no other is "
                    "judged silent: see 'workers judged silent that were not')",
                    target=Target(
                        op="<=",
                        value=HUB_LOST_BOUND,
                        stat="max",
                        text=f"<= {HUB_LOST_BOUND:g} s: 2 x (timeout + interval), when the operator's gap for a "
                        "silent hub closes",
                    ),
                )
            )
        if figures.beside is not None:
            metrics += beside_metrics(workers, figures.beside)
    return metrics


def beside_metrics(workers: int, beside: BesideFigures) -> list[Metric]:
    """The small jobs run beside the gang of `workers`, and the gang's verdicts acted on meanwhile."""
    jobs = f"{beside.jobs} small jobs"
    at_seed_scale = workers >= 512
    return [
        Metric(
            name=f"{jobs} Running beside the gang, N={workers}",
            unit="s",
            samples=[beside.to_running],
            description=f"{jobs} of 2 workers applied while the gang trains -> all their workers Running",
        ),
        Metric(
            name=f"event -> action beside the gang, {jobs}, N={workers}",
            unit="s",
            samples=beside.replacements,
            description="a small job's worker pod deleted -> the operator's replacement pod created (a wait "
            f"that ran out counts as {operator_scale.REPLACE_WAIT:g} s)",
            target=Target(op="<=", value=VERDICT_BOUND, stat="p99", text="p99 <= 1 s")
            if at_seed_scale
            else None,
        ),
        *[
            Metric(
                name=f"launcher's verdict '{kind}' acted on beside {jobs}, N={workers}",
                unit="s",
                samples=samples,
                description=f"the gang's launcher reports a training process {kind} -> the operator's "
                f"{VERDICT_REASONS[kind]} Event naming the pod, while the small jobs run",
                target=verdict_target(kind) if at_seed_scale else None,
            )
            for kind, samples in beside.verdicts.items()
        ],
        Metric(
            name=f"operator RSS beside {jobs}, N={workers}",
            unit="MB",
            samples=[beside.operator_rss_mb],
            description="the operator's resident memory with the gang and the small jobs",
            target=RSS_TARGET if at_seed_scale else None,
        ),
        Metric(
            name=f"largest small job's status beside the gang, N={workers}",
            unit="KiB",
            samples=[beside.largest_status_bytes / 1024],
            description="the largest TrainingJob status among the small jobs, as JSON",
            target=STATUS_TARGET if at_seed_scale else None,
        ),
    ]


def notes_of(measured: dict[int, SizeFigures], stopped: dict[int, str]) -> list[str]:
    notes = [ENVELOPE + "."]
    for workers, figures in measured.items():
        how = "the heartbeat hub" if figures.hub else "each pod's own Lease"
        notes.append(
            f"N = {workers:,} ({workers * GPUS_PER_POD:,} GPUs, {figures.spares} spares), heartbeats through {how}: "
            f"the job's writes/s {fmt_rates(figures.job_writes)}; the simulated nodes' {fmt_rates(figures.node_writes)}; "
            f"the API server's by resource {fmt_rates(top(figures.writes_by_resource))}. While the gang formed, "
            f"writes per pod: {fmt_rates(figures.gang_requests)}; created {figures.gang['created']:.1f} s, gates "
            f"lifted {figures.gang['ungated']:.1f} s, bound {figures.gang['bound']:.1f} s after the apply."
        )
        if figures.false_alarms:
            notes.append(
                f"N = {workers:,}: {len(figures.false_alarms)} pods were judged silent though their launchers had "
                f"not fallen silent: " + "; ".join(figures.false_alarms[:10])
            )
        if figures.partial:
            notes.append(
                f"N = {workers:,}: a pod was bound before the last pod was created (a partial gang)."
            )
        if figures.misses:
            notes.append(f"N = {workers:,}: " + "; ".join(figures.misses))
        if figures.errors:
            notes.append(f"N = {workers:,}: the API server answered {figures.errors} in the window.")
        if figures.beside is not None:
            beside = figures.beside
            notes.append(
                f"N = {workers:,}: beside the gang, {beside.jobs} small jobs of 2 workers in a namespace of their "
                f"own (operator-scale's: a `sleep` trainer, a Lease per worker renewed every "
                f"{operator_scale.HEARTBEAT_INTERVAL} s by this process, its longest gap "
                f"{beside.heartbeat_gap:.1f} s), the trials {scale_beside.SETTLE_INTERVALS} intervals after their "
                f"first heartbeats; {beside.replacements_late} of {len(beside.replacements)} "
                f"replacements waited out; the operator that acted: {' then '.join(beside.leaders) or 'unknown'}. "
                f"The issue's 1,000 small jobs beside a 12,500-pod gang are not carried on this machine."
            )
            if beside.operator_warnings:
                notes.append(
                    f"N = {workers:,}: the operator's warnings while the small jobs ran: "
                    + "; ".join(beside.operator_warnings)
                )
        if figures.launcher_failures or figures.late_rounds:
            notes.append(
                f"N = {workers:,}: the emulated launchers had {figures.launcher_failures} failed beats and "
                f"{figures.late_rounds} rounds longer than the interval (this process, not the job)."
            )
    for workers, why in stopped.items():
        notes.append(f"N = {workers:,} was not carried: {why}")
    points = sorted(measured.items())
    for label, unit, value_of in (
        ("operator CPU", "%", lambda f: 100 * f.operator_cpu),
        ("operator RSS", "MB", lambda f: f.operator_rss_mb),
        ("gang bound", "s", lambda f: f.gang["bound"]),
        (
            f"TrainingJob status size (the operator holds it under {statusbudget.STATUS_BUDGET_BYTES // 1024} KiB "
            "whatever N: operator/statusbudget.py)",
            "KiB",
            lambda f: max(f.status_bytes, default=0) / 1024,
        ),
    ):
        line = projection(label, unit, [(float(n), value_of(f)) for n, f in points])
        if line:
            notes.append(line)
    hub_writes = [f.job_writes.get("leases", 0.0) for f in measured.values() if f.hub]
    if hub_writes:
        notes.append(
            f"The job's heartbeat writes through the hub do not grow with N ({', '.join(f'{w:.2f}' for w in hub_writes)}/s "
            f"at the hub sizes measured): at N = {SEED_SCALE:,} they are one Lease per {INTERVAL:g} s by construction, "
            f"against {SEED_SCALE / INTERVAL:,.0f}/s with each pod's own Lease."
        )
    return notes


def top(rates: dict[str, float], count: int = 6) -> dict[str, float]:
    return dict(sorted(rates.items(), key=lambda item: -item[1])[:count])


def fmt_rates(rates: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in rates.items()) or "none"


def series_of(measured: dict[int, SizeFigures]) -> list[Series]:
    sizes = sorted(measured)
    x = [float(n) for n in sizes]

    def curve(name: str, chart: str, unit: str, values: list[float]) -> Series:
        return Series(name=name, x=x, y=values, x_label="pods (N)", y_label=unit, chart=chart, log_log=True)

    return [
        curve("API writes/s, all", "writes", "writes/s", [measured[n].writes_total for n in sizes]),
        curve(
            "API writes/s, the job's",
            "writes",
            "writes/s",
            [sum(measured[n].job_writes.values()) for n in sizes],
        ),
        curve(
            "operator CPU %", "operator", "% / MB", [max(1e-3, 100 * measured[n].operator_cpu) for n in sizes]
        ),
        curve("operator RSS MB", "operator", "% / MB", [measured[n].operator_rss_mb for n in sizes]),
        curve(
            "silence found past the timeout, s (p50)",
            "detection",
            "s",
            [
                max(1e-3, sorted(measured[n].detection)[len(measured[n].detection) // 2])
                if measured[n].detection
                else 1e-3
                for n in sizes
            ],
        ),
    ]


def run(context: Any, quick: bool) -> BenchResult:
    """Harness entry point (`phalanx bench --only scale`)."""
    plan = QUICK if quick else FULL
    scratch = context.scratch(NAME)
    largest = max(plan.sizes)
    simulated_nodes = largest + spares_for(largest)
    node_heartbeat = node_heartbeat_seconds(simulated_nodes)
    started = time.monotonic()
    cluster = BenchCluster.start(
        None,
        scratch,
        context.log,
        nodes=1,
        simulated_nodes=simulated_nodes,
        gpus_per_node=GPUS_PER_POD,
        node_heartbeat_seconds=node_heartbeat,
    )
    measured: dict[int, SizeFigures] = {}
    stopped: dict[int, str] = {}
    try:
        # The chart's default bound on one job's pods (2,000) stays; a platform that runs bigger jobs raises it.
        cluster.ensure_operator({"maxGangPods": max(DEFAULT_MAX_GANG_PODS, simulated_nodes)})
        for workers in plan.sizes:
            try:
                measured[workers] = measure_size(cluster, workers, plan, scratch, context.log)
            except Exception as error:  # a size this machine does not carry: reported, the rest is kept
                stopped[workers] = f"{type(error).__name__}: {error}"
                break
    finally:
        cluster.close()
    if SEED_SCALE not in measured and SEED_SCALE not in stopped:
        stopped[SEED_SCALE] = SEED_SCALE_TRIED
    return BenchResult(
        name=NAME,
        title=TITLE,
        quick=quick,
        seconds=time.monotonic() - started,
        metrics=metrics_of(measured),
        timeouts=[
            Timeout(name="heartbeat interval", seconds=INTERVAL, source="spec.heartbeat.intervalSeconds"),
            Timeout(name="heartbeat timeout", seconds=TIMEOUT, source="spec.heartbeat.timeoutSeconds"),
            Timeout(name="steady-state window", seconds=plan.window, source="scale"),
            Timeout(
                name="simulated node heartbeat (Lease)", seconds=node_heartbeat, source="scale's cluster"
            ),
            Timeout(name="node monitor grace period", seconds=4 * node_heartbeat, source="scale's cluster"),
            Timeout(name="wait for a silent worker to be found", seconds=DETECTION_WAIT, source="scale"),
        ],
        notes=notes_of(measured, stopped),
        series=series_of(measured) if measured else [],
        error=None if measured else "; ".join(stopped.values()),
        details={str(n): asdict(f) for n, f in measured.items()},
    )
