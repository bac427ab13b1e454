"""What the fault benchmarks (recovery, hang detection, goodput) share: injecting faults into real training
pods of the local cluster, recording the heartbeat Leases and the TrainingJob, and reading the step log.

Injection: the node agent's annotations (pod `phalanx.dev/kill`, pod `phalanx.dev/freeze`, node
`phalanx.dev/crash`), with the same signal sent from here to the pod's training processes (found by
`POD_NAME` in /proc/<pid>/environ), which torchrun starts in sessions of their own, out of the reach of
the agent's process-group signals. A hung trainer is SIGSTOP to the training processes alone, so the pod's
launcher keeps renewing its Lease while the step stands still.
Every injection returns the wall-clock time taken right before the request, on this machine.

Clocks: the pods are processes of this machine, so the heartbeat stamps (`phase-since`, `group-started`,
`resumed-at`), the step log's times and the injection times all read one clock. The operator's
`detectedAt` is written to the second (truncated); where a benchmark times detection it bounds the true
moment by the end of that second and by when the incident reached this process's watch.

The pure part (parsing, timeline queries, step-log reading) is at the top; Kubernetes calls below it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phalanx.bench.core import Timeout
from phalanx.bench.kubeobjects import custom_object, is_terminating, labels_of

GROUP, VERSION, PLURAL = "phalanx.dev", "v1alpha1", "trainingjobs"
PREFIX = "phalanx.dev/"
KILL_ANNOTATION = "phalanx.dev/kill"
FREEZE_ANNOTATION = "phalanx.dev/freeze"
CRASH_ANNOTATION = "phalanx.dev/crash"
TRAINER_MODULE = "phalanx.worker.examples.tinygpt"
LAUNCHER_MODULE = "phalanx.worker.launch"
IMAGE = "phalanx:bench"
ACTIVE_PHASES = ("training", "saving", "restoring")
RECOVERING_ACTIONS = ("ReplaceWorker", "RestartJob", "ReplaceRendezvous")
STANDBY = ("standby", "rendezvous")
"""Phases of a spare standing by (it polls the rendezvous now and then)."""
CLAIM = "checkpoints"
CHECKPOINT_PATH = "/ckpt"
STEP_LOG_NAME = "steps.jsonl"
"""The tiny GPT's step log, on the shared claim (rank 0's steps, every rank's restores)."""
NODE_MONITOR_GRACE_SECONDS = 8.0
"""The local cluster's node-lifecycle grace period (kube-controller-manager flag, devcluster/controlplane.py)."""
NODE_LEASE_SECONDS = 2.0
"""How often the node agent renews each node's Lease (devcluster/agent/config.py)."""
LAUNCHER_MONITOR_SECONDS = 0.2
"""How often the launcher checks its training processes (worker/env.py default)."""


# ---------------------------------------------------------------------------------------------- time


def parse_stamp(text: str | None) -> float | None:
    """A Unix time from an RFC 3339 stamp (`Z` or an offset, with or without fractions); None if empty."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def whole_second(text: str | None) -> bool:
    """Whether a stamp is written to the second (it then stands for any moment of that second)."""
    return bool(text) and "." not in (text or "").split("T", 1)[-1]


def stamp_of(moment: float) -> str:
    """RFC 3339 UTC with microseconds."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------- leases


@dataclass(frozen=True)
class LeaseSeen:
    """One version of a worker's heartbeat Lease, as it reached this process."""

    seen: float
    """time.time() when the watch delivered it."""
    pod: str
    values: dict[str, str]
    """The heartbeat annotations without their `phalanx.dev/` prefix."""
    renewed: float | None = None
    """spec.renewTime as a Unix time."""
    deleted: bool = False

    def text(self, key: str) -> str:
        return self.values.get(key, "") or ""

    def number(self, key: str) -> float | None:
        try:
            return float(self.values[key])
        except (KeyError, TypeError, ValueError):
            return None

    def moment(self, key: str) -> float | None:
        return parse_stamp(self.values.get(key))

    @property
    def phase(self) -> str:
        return self.text("phase")

    @property
    def step(self) -> int | None:
        value = self.number("step")
        return None if value is None else int(value)

    @property
    def group_started(self) -> float | None:
        return self.moment("group-started")

    @property
    def phase_since(self) -> float | None:
        return self.moment("phase-since")

    @property
    def resumed_at(self) -> float | None:
        return self.moment("resumed-at")

    @property
    def restored_step(self) -> int | None:
        value = self.number("restored-step")
        return None if value is None else int(value)


def lease_seen(raw: dict[str, Any], seen: float, deleted: bool = False) -> LeaseSeen:
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return LeaseSeen(
        seen=seen,
        pod=meta.get("name", ""),
        values={key[len(PREFIX) :]: value for key, value in annotations.items() if key.startswith(PREFIX)},
        renewed=parse_stamp((raw.get("spec") or {}).get("renewTime")),
        deleted=deleted,
    )


def versions_of(timeline: Iterable[LeaseSeen], pod: str) -> list[LeaseSeen]:
    return [item for item in timeline if item.pod == pod and not item.deleted]


def latest(timeline: Iterable[LeaseSeen], before: float | None = None) -> dict[str, LeaseSeen]:
    """Each pod's last Lease version seen (before `before`, when given); deleted Leases are dropped."""
    found: dict[str, LeaseSeen] = {}
    for item in timeline:
        if before is not None and item.seen > before:
            continue
        if item.deleted:
            found.pop(item.pod, None)
        else:
            found[item.pod] = item
    return found


# ---------------------------------------------------------------------------------------------- recoveries


def open_incidents(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Incidents the operator still recovers from (no `resumedAt` yet)."""
    return [
        incident
        for incident in status.get("incidents") or []
        if incident.get("action") in RECOVERING_ACTIONS and not incident.get("resumedAt")
    ]


def detection_moment(detected_at: str | None, first_seen: float | None) -> float | None:
    """The latest moment the operator can have detected the failure: `detectedAt` is written to the second
    (truncated), so the end of that second, or when its incident reached this process if that is earlier."""
    stamp = parse_stamp(detected_at)
    if stamp is None:
        return first_seen
    upper = stamp + 1.0 if whole_second(detected_at) else stamp
    return min(upper, first_seen) if first_seen is not None else upper


def group_starts(timeline: list[LeaseSeen], after: float) -> dict[str, float]:
    """Per pod, the first worker group its Lease shows started after `after`."""
    found: dict[str, float] = {}
    for item in timeline:
        started = item.group_started
        if item.deleted or item.pod in found or started is None or started <= after:
            continue
        found[item.pod] = started
    return found


def resumed_times(timeline: list[LeaseSeen], starts: dict[str, float]) -> dict[str, float]:
    """Per pod of the new group, its `resumed-at` for that group."""
    found: dict[str, float] = {}
    for item in timeline:
        started = starts.get(item.pod)
        if started is None or item.pod in found or item.group_started != started:
            continue
        resumed = item.resumed_at
        if resumed is not None and resumed >= started:
            found[item.pod] = resumed
    return found


def training_since(timeline: list[LeaseSeen], starts: dict[str, float]) -> dict[str, float]:
    """Per pod of the new group, when its first Lease in an active phase says that phase began."""
    found: dict[str, float] = {}
    for item in timeline:
        started = starts.get(item.pod)
        if started is None or item.pod in found or item.group_started != started:
            continue
        if item.phase in ("training", "saving") and item.phase_since is not None:
            found[item.pod] = item.phase_since
    return found


def left_training(timeline: list[LeaseSeen], survivors: list[str], kill: float) -> float | None:
    """When the first survivor left training after the kill (its Lease's first idle phase's `phase-since`)."""
    moments = []
    for pod in survivors:
        for item in versions_of(timeline, pod):
            since = item.phase_since
            if item.seen < kill or since is None or since < kill - 1.0:
                continue
            if item.phase in ("rendezvous", "standby", "starting"):
                moments.append(since)
                break
    return min(moments) if moments else None


# ---------------------------------------------------------------------------------------------- step log


@dataclass(frozen=True)
class StepLine:
    """One completed step, written by rank 0 of the group that did it."""

    step: int
    time: float
    loss: float
    world_size: int


@dataclass(frozen=True)
class RestoreLine:
    """One rank's restore (at start, after a regroup, or a rollback)."""

    rank: int
    step: int
    source: str
    seconds: float
    time: float
    """When the restore ended."""
    reason: str


@dataclass
class StepLog:
    steps: list[StepLine] = field(default_factory=list)
    restores: list[RestoreLine] = field(default_factory=list)


def parse_step_log(text: str) -> StepLog:
    """The tiny GPT's `--log-file` (one JSON object a line); a line torn by a kill is skipped."""
    log = StepLog()
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if record.get("event") == "restore":
                log.restores.append(
                    RestoreLine(
                        rank=int(record["rank"]),
                        step=int(record["step"]),
                        source=str(record.get("source") or "none"),
                        seconds=float(record.get("seconds") or 0.0),
                        time=float(record["time"]),
                        reason=str(record.get("reason") or ""),
                    )
                )
            elif "step" in record:
                log.steps.append(
                    StepLine(
                        step=int(record["step"]),
                        time=float(record["time"]),
                        loss=float(record["loss"]),
                        world_size=int(record.get("world_size") or 0),
                    )
                )
    log.steps.sort(key=lambda line: line.time)
    log.restores.sort(key=lambda line: line.time)
    return log


def read_step_log(path: Path) -> StepLog:
    try:
        return parse_step_log(path.read_text(errors="replace"))
    except OSError:
        return StepLog()


def highest_step_before(log: StepLog, moment: float) -> int | None:
    """The highest step the group running at `moment` had completed by then: steps logged after the last
    restore before `moment` (earlier lines may show higher steps of a run that was rolled back)."""
    restores = [line.time for line in log.restores if line.time < moment]
    since = max(restores) if restores else float("-inf")
    steps = [line.step for line in log.steps if since < line.time <= moment]
    return max(steps) if steps else None


# ---------------------------------------------------------------------------------------------- manifests


def tinygpt_job(
    name: str,
    *,
    replicas: int,
    spares: int,
    steps: int,
    step_delay: float,
    heartbeat: dict[str, Any],
    checkpoint: dict[str, Any],
    min_replicas: int | None = None,
    failure_rules: list[dict[str, Any]] | None = None,
    log_file: str | None = None,
    cpu: str = "100m",
    width: int = 32,
    layers: int = 1,
) -> dict[str, Any]:
    """A TrainingJob that trains the tiny GPT (the e2e tests' workload) for `steps` steps."""
    args = [
        "--steps",
        str(steps),
        "--width",
        str(width),
        "--layers",
        str(layers),
        "--step-delay",
        str(step_delay),
    ]
    if log_file:
        args += ["--log-file", log_file]
    spec: dict[str, Any] = {
        "replicas": replicas,
        "spares": spares,
        "checkpoint": checkpoint,
        "heartbeat": heartbeat,
        "gang": {"scheduleTimeoutSeconds": 120},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": IMAGE,
                        "command": ["python", "-m", TRAINER_MODULE],
                        "args": args,
                        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                    }
                ]
            }
        },
    }
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    if failure_rules:
        spec["failurePolicy"] = {"maxRestarts": 1000, "rules": failure_rules}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def endless_job(name: str, *, replicas: int, checkpoint_interval: int, **settings: Any) -> dict[str, Any]:
    """A tiny GPT job for the fault benchmarks: it trains until deleted at `replicas` workers (never fewer),
    keeps its durable checkpoints every `checkpoint_interval` steps and rank 0's step log on the shared claim.
    `settings`: the rest of `tinygpt_job`'s (spares, step_delay, heartbeat, ...)."""
    return tinygpt_job(
        name,
        replicas=replicas,
        min_replicas=replicas,
        steps=10**7,
        checkpoint={"claimName": CLAIM, "path": CHECKPOINT_PATH, "intervalSteps": checkpoint_interval},
        log_file=f"{CHECKPOINT_PATH}/{STEP_LOG_NAME}",
        **settings,
    )


def checkpoint_claim(name: str) -> dict[str, Any]:
    """A claim of the local cluster's default StorageClass (a host folder every pod of the job shares)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def timeouts_in_force(spec: dict[str, Any], reconcile_interval: float | None) -> list[Timeout]:
    """Every timeout and interval that bounds detection and recovery of a job with this spec."""
    from phalanx.operator import api

    model = api.TrainingJobSpec.model_validate(spec)
    beat, rdzv = model.heartbeat, model.rendezvous
    rows = [
        ("heartbeat interval", beat.interval_seconds, "spec.heartbeat.intervalSeconds"),
        ("heartbeat timeout", beat.timeout_seconds, "spec.heartbeat.timeoutSeconds"),
        (
            "progress timeout (hung trainer)",
            beat.progress_timeout_seconds,
            "spec.heartbeat.progressTimeoutSeconds",
        ),
        ("rendezvous join timeout", rdzv.join_timeout_seconds, "spec.rendezvous.joinTimeoutSeconds"),
        ("rendezvous last call", rdzv.last_call_timeout_seconds, "spec.rendezvous.lastCallTimeoutSeconds"),
        (
            "rendezvous keep-alive interval",
            rdzv.keepalive_interval_seconds,
            "spec.rendezvous.keepaliveIntervalSeconds",
        ),
        (
            "rendezvous keep-alive timeout",
            rdzv.keepalive_timeout_seconds,
            "spec.rendezvous.keepaliveTimeoutSeconds",
        ),
        ("collective timeout (watchdog)", model.collective_timeout_seconds, "spec.collectiveTimeoutSeconds"),
        ("launcher monitor interval", LAUNCHER_MONITOR_SECONDS, "launcher default (--monitor-interval)"),
        ("node-lifecycle grace period", NODE_MONITOR_GRACE_SECONDS, "local cluster kube-controller-manager"),
        ("node Lease renewal", NODE_LEASE_SECONDS, "local cluster node agent"),
        ("pod deletion grace period", 30, "pod default terminationGracePeriodSeconds (graceful deletions)"),
    ]
    if reconcile_interval is not None:
        rows.append(("operator periodic reconcile", reconcile_interval, "chart reconcileIntervalSeconds"))
    return [Timeout(name=name, seconds=float(seconds), source=source) for name, seconds, source in rows]


# ---------------------------------------------------------------------------------------------- processes


def pod_processes(pod: str, namespace: str) -> list[int]:
    """Processes of a pod of the local cluster (pods are local processes carrying POD_NAME)."""
    from phalanx.devcluster.agent.runtime import processes_with_environment

    return processes_with_environment({"POD_NAME": pod, "POD_NAMESPACE": namespace})


def command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    parts = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    # A process that set its title (a warm training process names its command so) shows one string.
    return parts[0].split(" ") if len(parts) == 1 else parts


def is_trainer(argv: list[str]) -> bool:
    """A training process runs the trainer module itself; the launcher's command line only carries it
    after `--` (python -m phalanx.worker.launch -- python -m <trainer> ...)."""
    return TRAINER_MODULE in argv and LAUNCHER_MODULE not in argv


def trainer_processes(pod: str, namespace: str) -> list[int]:
    """The pod's training processes (not its launcher, sandbox or checkpoint saver)."""
    return [pid for pid in pod_processes(pod, namespace) if is_trainer(command_line(pid))]


def signal_all(pids: Iterable[int], signum: int) -> list[int]:
    """Send `signum` to each pid; the ones that still existed."""
    reached = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            reached.append(pid)
    return reached


# ---------------------------------------------------------------------------------------------- Kubernetes


def _patch_annotations(
    cluster: Any,
    kind: str,
    name: str,
    namespace: str | None,
    values: dict[str, Any],
    trainers: list[int],
    signum: int,
) -> float:
    """Signal the given training processes, then set (or, with None, remove) annotations; the wall time
    right before both."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api)
    body = {"metadata": {"annotations": values}}
    moment = time.time()
    signal_all(trainers, signum)
    if kind == "node":
        core.patch_node(name, body)
    elif namespace is not None:
        core.patch_namespaced_pod(name, namespace, body)
    else:
        raise ValueError(f"pod {name} named without its namespace")
    return moment


# The node agent signals a container's process group, but torchrun's agent starts each training process in
# a session of its own: the agent's SIGKILL or SIGSTOP reaches the launcher and not the training processes
# (a "frozen" pod would go on training; a "killed" one would leave them running). So the training
# processes, found by their POD_NAME, get the same signal from here, in the same instant.


def kill_pod(cluster: Any, namespace: str, pod: str) -> float:
    """SIGKILL every process of the pod; the time right before the signals and the request."""
    trainers = trainer_processes(pod, namespace)
    return _patch_annotations(
        cluster, "pod", pod, namespace, {KILL_ANNOTATION: "bench"}, trainers, signal.SIGKILL
    )


def freeze_pod(cluster: Any, namespace: str, pod: str, frozen: bool = True) -> float:
    """SIGSTOP (or SIGCONT) every process of the pod, the launcher and its kin before the training processes:
    a whole pod freezes at once, and a launcher that outlived its trainers by a moment would report them
    stopped (a stopped trainer, not a frozen pod)."""
    trainers = trainer_processes(pod, namespace)
    others = [pid for pid in pod_processes(pod, namespace) if pid not in trainers]
    value = {FREEZE_ANNOTATION: "true" if frozen else "false"}
    return _patch_annotations(
        cluster,
        "pod",
        pod,
        namespace,
        value,
        [*others, *trainers],
        signal.SIGSTOP if frozen else signal.SIGCONT,
    )


def crash_node(cluster: Any, node: str, crashed: bool = True, pods: Iterable[tuple[str, str]] = ()) -> float:
    """A node whose processes die and which stops heartbeating; `crashed=False` brings it back. `pods`:
    (namespace, pod) of the pods on it whose training processes die with it."""
    trainers = (
        [pid for namespace, pod in pods for pid in trainer_processes(pod, namespace)] if crashed else []
    )
    value = {CRASH_ANNOTATION: "true" if crashed else None}
    return _patch_annotations(cluster, "node", node, None, value, trainers, signal.SIGKILL)


def hang_trainer(namespace: str, pod: str) -> tuple[float, list[int]]:
    """SIGSTOP the pod's training processes only: its launcher keeps renewing the Lease with a step that
    does not move (a hung trainer). Returns the time right before the signals and the stopped pids."""
    pids = trainer_processes(pod, namespace)
    moment = time.time()
    return moment, signal_all(pids, signal.SIGSTOP)


def release_trainer(pids: Iterable[int]) -> None:
    signal_all(pids, signal.SIGCONT)


Record = tuple[float, str, dict[str, Any]]
"""(wall-clock time it reached this process, event type, the object) of one watched change."""


def _record(kind: str, raw: dict[str, Any], moment: float) -> Record:
    # The harness's watches stamp events with time.monotonic(); Lease stamps and the step log are wall-clock.
    return moment + (time.time() - time.monotonic()), kind, raw


def lease_watch(cluster: Any, namespace: str) -> Any:
    """Every change of the namespace's Leases (`phalanx.bench.watch.Watch` of `Record`s)."""
    from kubernetes import client

    from phalanx.bench.watch import Watch

    return Watch(
        cluster.new_api_client,
        lambda api: client.CoordinationV1Api(api).list_namespaced_lease,
        (namespace,),
        _record,
    )


def job_watch(cluster: Any, namespace: str) -> Any:
    """Every change of the namespace's TrainingJobs."""
    from kubernetes import client

    from phalanx.bench.watch import Watch

    return Watch(
        cluster.new_api_client,
        lambda api: client.CustomObjectsApi(api).list_namespaced_custom_object,
        (GROUP, VERSION, namespace, PLURAL),
        _record,
    )


def lease_timeline(records: Iterable[Record]) -> list[LeaseSeen]:
    """Heartbeat Lease versions (Leases without a phase annotation, e.g. the operator's, are left out)."""
    timeline = []
    for seen, kind, raw in records:
        annotations = (raw.get("metadata") or {}).get("annotations") or {}
        if PREFIX + "phase" in annotations:
            timeline.append(lease_seen(raw, seen, deleted=kind == "DELETED"))
    return timeline


def incident_first_seen(
    records: Iterable[Record], match: Callable[[dict[str, Any]], bool]
) -> tuple[float, dict[str, Any]] | None:
    """When this process first saw an incident matching `match` in a TrainingJob's status, and that incident."""
    for seen, _kind, raw in records:
        for incident in (raw.get("status") or {}).get("incidents") or []:
            if match(incident):
                return seen, incident
    return None


def get_job(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    return custom_object(
        client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    )


def job_pods(cluster: Any, namespace: str, name: str) -> list[Any]:
    """The job's live trainer pods (not terminating)."""
    from kubernetes import client

    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"phalanx.dev/job-name={name},phalanx.dev/component=trainer"
    )
    return [pod for pod in pods.items if not is_terminating(pod)]


def role_of(pod: Any) -> str:
    return labels_of(pod).get("phalanx.dev/role", "")


def claim_path(cluster: Any, namespace: str, claim: str) -> Path | None:
    """The host folder behind a bound claim (the local provisioner's hostPath volume)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api)
    bound = core.read_namespaced_persistent_volume_claim(claim, namespace)
    volume_name = bound.spec.volume_name if bound.spec is not None else None
    if not volume_name:
        return None
    volume = core.read_persistent_volume(volume_name)
    host_path = volume.spec.host_path if volume.spec is not None else None
    return Path(host_path.path) if host_path is not None else None


@dataclass(frozen=True)
class Worker:
    """An active worker pod at one moment."""

    pod: str
    uid: str
    rank: int | None
    node: str | None


SAME_GROUP_SECONDS = 1.0
"""Launchers of one group stamp its start within the rendezvous' polling of each other (tens of ms, more on a
loaded machine); groups of different rounds start seconds apart."""


def same_group(starts: list[float | None]) -> bool:
    """Whether these group-start stamps are of one worker group (none missing)."""
    if not starts or any(start is None for start in starts):
        return False
    stamps = [start for start in starts if start is not None]
    return max(stamps) - min(stamps) <= SAME_GROUP_SECONDS


class TrainingRun:
    """One TrainingJob of the tiny GPT in a namespace of its own: watches of its heartbeat Leases and of
    the job, the shared claim its checkpoints and step log live on, and the questions the fault benchmarks
    ask (is it steady, which incident, did a new group resume)."""

    def __init__(self, cluster: Any, prefix: str, job: dict[str, Any]) -> None:
        self.cluster = cluster
        self.job = job
        self.name: str = job["metadata"]["name"]
        self.replicas: int = job["spec"]["replicas"]
        self.spares: int = job["spec"].get("spares", 0)
        self.namespace: str = cluster.create_namespace(prefix)
        self.leases = lease_watch(cluster, self.namespace)
        self.jobs = job_watch(cluster, self.namespace)
        self.claim_dir: Path | None = None
        self.started_at: float | None = None

    def start(self) -> TrainingRun:
        self.leases.start()
        self.jobs.start()
        self.cluster.apply([checkpoint_claim(CLAIM)], self.namespace)
        self.started_at = time.time()
        self.cluster.apply([self.job], self.namespace)
        from phalanx.bench.cluster import wait_for

        self.claim_dir = wait_for(
            lambda: claim_path(self.cluster, self.namespace, CLAIM), 120, message="the claim's folder"
        )
        return self

    def close(self) -> None:
        self.leases.stop()
        self.jobs.stop()
        self.cluster.delete_namespace(self.namespace, wait=False)

    # ------------------------------------------------------------------ observations
    def timeline(self) -> list[LeaseSeen]:
        return lease_timeline(self.leases.events())

    def step_log(self) -> StepLog:
        return read_step_log(self.claim_dir / STEP_LOG_NAME) if self.claim_dir else StepLog()

    def status(self) -> dict[str, Any]:
        return get_job(self.cluster, self.namespace, self.name).get("status") or {}

    def pods(self) -> list[Any]:
        return job_pods(self.cluster, self.namespace, self.name)

    def steady(self, min_step: int = 0) -> list[Worker] | None:
        """The active workers when the job is steady: every worker training in one group (at `min_step` or
        beyond), every spare standing by, no incident open; None otherwise."""
        if open_incidents(self.status()):
            return None
        running = [p for p in self.pods() if p.status.phase == "Running"]
        workers = [p for p in running if role_of(p) == "worker"]
        spares = [p for p in running if role_of(p) == "spare"]
        if len(workers) != self.replicas or len(spares) != self.spares:
            return None
        now = latest(self.timeline())
        beats = [now.get(p.metadata.name) for p in workers]
        if any(b is None or b.phase not in ("training", "saving") or b.resumed_at is None for b in beats):
            return None
        if not same_group([b.group_started for b in beats if b is not None]):
            return None
        if min((b.step or 0) for b in beats if b is not None) < min_step:
            return None
        if any((lease := now.get(p.metadata.name)) is None or lease.phase not in STANDBY for p in spares):
            return None
        found = []
        for pod, beat in zip(workers, beats, strict=True):
            rank = beat.number("rank") if beat is not None else None
            found.append(
                Worker(
                    pod.metadata.name,
                    pod.metadata.uid,
                    None if rank is None else int(rank),
                    pod.spec.node_name,
                )
            )
        return found

    def wait_steady(self, min_step: int = 0, timeout: float = 300.0) -> list[Worker]:
        from phalanx.bench.cluster import wait_for

        return wait_for(lambda: self.steady(min_step), timeout, interval=0.5, message=f"{self.name} steady")

    def lowest_step(self, pods: Iterable[str]) -> int:
        now = latest(self.timeline())
        return min(((now[p].step or 0) if p in now else 0 for p in pods), default=0)

    def highest_step(self) -> int:
        return max(((beat.step or 0) for beat in latest(self.timeline()).values()), default=0)

    def wait_step(self, pods: list[str], step: int, timeout: float = 300.0) -> None:
        from phalanx.bench.cluster import wait_for

        wait_for(lambda: self.lowest_step(pods) >= step, timeout, interval=0.2, message=f"step {step}")

    def incident(self, match: Callable[[dict[str, Any]], bool]) -> tuple[float | None, dict[str, Any] | None]:
        """When the first incident matching `match` reached this process, and its current record."""
        seen = incident_first_seen(self.jobs.events(), match)
        current = next((i for i in self.status().get("incidents") or [] if match(i)), None)
        return (seen[0] if seen else None), current

    def resumed_after(self, moment: float) -> bool:
        """Whether a full worker group started after `moment` has completed its first step."""
        timeline = self.timeline()
        starts = group_starts(timeline, moment)
        return len(starts) >= self.replicas and len(resumed_times(timeline, starts)) >= self.replicas

    def diagnose(self) -> dict[str, Any]:
        """What the job looks like now (for a wait that timed out): its state, conditions, open incidents,
        pods and their heartbeats, and the launchers' last lines."""
        status = self.status()
        now = latest(self.timeline())
        pods = self.pods()
        return {
            "state": status.get("state"),
            "conditions": {
                c.get("type"): f"{c.get('status')} {c.get('reason')}: {c.get('message')}"
                for c in status.get("conditions") or []
            },
            "open incidents": open_incidents(status),
            "replicas": status.get("replicas"),
            "pods": {
                p.metadata.name: {
                    "role": role_of(p),
                    "phase": p.status.phase,
                    "node": p.spec.node_name,
                    "heartbeat": {
                        key: now[p.metadata.name].values.get(key) for key in ("phase", "step", "rank")
                    }
                    if p.metadata.name in now
                    else None,
                }
                for p in pods
            },
            "launcher lines": self.launcher_lines(
                time.time() - 60, [p.metadata.name for p in pods], limit=60
            ),
        }

    def launcher_lines(self, since: float, pods: Iterable[str], limit: int = 80) -> list[str]:
        """The launchers' log lines (and the trainers' own) since `since`, from pods that still exist."""
        lines = []
        for pod in pods:
            result = self.cluster.kubectl(
                "logs", "-n", self.namespace, pod, "-c", "trainer", "--timestamps",
                f"--since-time={stamp_of(since)}", check=False, timeout=30,
            )  # fmt: skip
            lines += [
                f"{pod}: {line}"
                for line in result.stdout.splitlines()
                if "phalanx" in line and "FutureWarning" not in line
            ]
        return lines[:limit]
