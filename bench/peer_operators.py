"""Kubernetes-native training operators measured here: Kubeflow Trainer v2 (TrainJob) and JobSet.

Both run as their releases ship them: the controllers built from their pinned Go modules and started as host
processes of the local cluster with their own CRDs, webhooks and runtimes (`phalanx.devcluster.peers`). Each
runs the tiny GPT the recovery benchmark trains, unmodified, under torchrun (`python -m torch.distributed.run`,
torchrun's own entry point: 2 nodes of 1 process, static rendezvous at node 0, gloo on CPU), with durable
checkpoints every `CHECKPOINT_INTERVAL` steps and the step log on a claim both pods share, as Phalanx's:

- `peer-kubeflow`: a TrainJob of Kubeflow's `torch-distributed` ClusterTrainingRuntime, as its docs write
  one (runtimeRef, trainer image/command/numNodes), the claim mounted through `runtimePatches`. The runtime
  sets no failure policy: its JobSet fails with its first failed Job, and each Job's pods restart in place
  (restartPolicy OnFailure, JobSet's default) up to the Job's default backoffLimit (6).
- `peer-jobset`: a JobSet as JobSet's docs recommend for PyTorch: one replicated Job of 2 indexed pods,
  `failurePolicy.maxRestarts` > 0 (any failed Job restarts the whole JobSet, every pod recreated), pods
  restartPolicy Never, backoffLimit 0.

Trials, on one job (a new one when a trial leaves it failed): wait until it trains steadily, then SIGKILL every
process of a random worker pod (`faults.kill_pod`); the trial ends at the first step completed after a restore
that followed the kill (the step log's own clock: this machine's). Steps lost: the highest step completed before
the kill minus the step restored. Pods recreated: the job's pods with a UID not there before the kill. Then a
frozen worker (SIGSTOP of the pod, `faults.freeze_pod`): the time until the system notices (a pod of the job
recreated or restarted, or the JobSet restarted or failed), or "never" within the cap. The report sets these
beside Phalanx's hot-spare and new-pod recovery (`recovery`) and frozen-pod detection (`hang-detection`).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx.bench import faults
from phalanx.bench.core import BenchResult, Metric, Timeout, Versus

CHECKPOINT_INTERVAL = 20
STEP_DELAY = 0.25
SETTLE_STEPS = 5
NODES = 2
MASTER_PORT = 29500
"""Kubeflow's torch plugin sets PET_MASTER_PORT to 29500 (constants.ContainerTrainerPort); the JobSet uses it too."""
CLAIM = "checkpoints"
MOUNT = "/ckpt"
FULL_TRIALS = 20
QUICK_TRIALS = 2
FULL_FREEZE_CAP = 600.0
QUICK_FREEZE_CAP = 30.0
START_TIMEOUT = 300.0
TRIAL_TIMEOUT = 240.0
JOBSET_MAX_RESTARTS = 1000
"""The JobSet's failurePolicy.maxRestarts: more than the trials, so the policy (not a budget) is measured."""
JOB_BACKOFF_LIMIT_DEFAULT = 6
"""Kubernetes' default Job backoffLimit, which the torch-distributed runtime leaves in force."""
SEED = 20261126
POD_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""JobSet labels every pod with its JobSet's name; a TrainJob's JobSet has the TrainJob's name."""
TRAINER_ARGS = (
    "--steps", "10000000", "--width", "32", "--layers", "1", "--step-delay", str(STEP_DELAY),
    "--checkpoint-dir", MOUNT, "--checkpoint-interval", str(CHECKPOINT_INTERVAL),
    "--log-file", f"{MOUNT}/{faults.STEP_LOG_NAME}",
)  # fmt: skip
"""The tiny GPT's arguments: those of the recovery benchmark's job (faults.endless_job)."""
TORCHRUN = ("python", "-m", "torch.distributed.run")


@dataclass(frozen=True)
class Peer:
    name: str
    """The benchmark's registry name."""
    label: str
    """How metrics name the peer."""
    controllers: tuple[str, ...]
    """peerbuild.MODULE_BUILDS names to run, in start order."""
    title: str


KUBEFLOW = Peer(
    "peer-kubeflow",
    "kubeflow",
    ("jobset", "kubeflow-trainer"),
    "Kubeflow Trainer v2 measured here: TrainJob (torch-distributed runtime), worker SIGKILLed / frozen",
)
JOBSET = Peer(
    "peer-jobset",
    "jobset",
    ("jobset",),
    "JobSet measured here: JobSet with a restart failure policy, worker SIGKILLed / frozen",
)


# ---------------------------------------------------------------------------------------------- manifests


def torchrun_command() -> list[str]:
    """torchrun with the tiny GPT: the node count, rank and master come from PET_* variables, as Kubeflow's
    torch plugin sets them."""
    return [*TORCHRUN, "-m", faults.TRAINER_MODULE, *TRAINER_ARGS]


def claim_volume() -> dict[str, Any]:
    return {"name": CLAIM, "persistentVolumeClaim": {"claimName": CLAIM}}


def trainjob_manifest(name: str) -> dict[str, Any]:
    """A TrainJob of the torch-distributed runtime training the tiny GPT on `NODES` nodes."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": faults.IMAGE,
                "command": torchrun_command(),
                "numNodes": NODES,
                "numProcPerNode": 1,
                "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            },
            "runtimePatches": [
                {
                    "manager": "phalanx.dev/bench",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "spec": {
                                                        "volumes": [claim_volume()],
                                                        "containers": [
                                                            {
                                                                "name": "node",
                                                                "volumeMounts": [
                                                                    {"name": CLAIM, "mountPath": MOUNT}
                                                                ],
                                                            }
                                                        ],
                                                    }
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def jobset_manifest(name: str) -> dict[str, Any]:
    """A JobSet of one Indexed Job of `NODES` pods running torchrun; any failed Job restarts the JobSet."""
    env = [
        {"name": "PET_NNODES", "value": str(NODES)},
        {"name": "PET_NPROC_PER_NODE", "value": "1"},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        # Pod DNS from the JobSet's headless Service: <jobset>-<replicated job>-<job index>-<pod index>.<jobset>.
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
    ]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": {"maxRestarts": JOBSET_MAX_RESTARTS},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": NODES,
                            "completions": NODES,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "volumes": [claim_volume()],
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": faults.IMAGE,
                                            "command": torchrun_command(),
                                            "env": env,
                                            "ports": [{"containerPort": MASTER_PORT}],
                                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                                            "volumeMounts": [{"name": CLAIM, "mountPath": MOUNT}],
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


# ---------------------------------------------------------------------------------------------- analysis


@dataclass
class Trial:
    """One fault and what followed; seconds after the fault (None: not seen)."""

    kind: str
    """`kill` or `freeze`."""
    number: int
    victim: str
    moment: float
    """Unix time right before the fault was injected."""
    seconds: float | None = None
    """kill: to the first step after the resume; freeze: to the system noticing."""
    steps_lost: int | None = None
    restored_step: int | None = None
    pods_recreated: int | None = None
    container_restarts: int | None = None
    jobset_restarts: int | None = None
    how: str = ""
    """What the system did (in-place restart, JobSet restart, job failed, nothing)."""
    error: str | None = None


@dataclass(frozen=True)
class Resumed:
    """The first step of a new group after a moment, from the step log."""

    first_step_time: float
    restored_step: int


def resumed_after(log: faults.StepLog, moment: float) -> Resumed | None:
    """The first step completed after a restore that came after `moment`, and the step every rank restored
    (the lowest); None until there is one."""
    restores = [line for line in log.restores if line.time > moment]
    if not restores:
        return None
    first_restore = min(line.time for line in restores)
    after = [line for line in log.steps if line.time > first_restore]
    if not after:
        return None
    first = min(after, key=lambda line: line.time)
    group = [line for line in restores if line.time <= first.time]
    return Resumed(first.time, min(line.step for line in group))


def steps_lost(log: faults.StepLog, moment: float, restored: int) -> int | None:
    reached = faults.highest_step_before(log, moment)
    return None if reached is None else max(reached - restored, 0)


@dataclass(frozen=True)
class PodsSeen:
    """The job's pods at one moment: uid -> (name, restart count)."""

    pods: dict[str, tuple[str, int]] = field(default_factory=dict)

    def recreated_since(self, before: PodsSeen) -> int:
        return len(set(self.pods) - set(before.pods))

    def restarts_since(self, before: PodsSeen) -> int:
        return sum(
            max(count - before.pods[uid][1], 0) for uid, (_, count) in self.pods.items() if uid in before.pods
        )


def noticed(before: PodsSeen, now: PodsSeen, restarts_before: int, restarts_now: int, failed: bool) -> str:
    """What shows the system acted on a frozen pod ("" while nothing does)."""
    if failed:
        return "the job failed"
    if restarts_now > restarts_before:
        return "the JobSet restarted"
    if now.recreated_since(before) or set(before.pods) - set(now.pods):
        return "pods recreated"
    if now.restarts_since(before):
        return "a container restarted"
    return ""


def values(trials: list[Trial], name: str) -> list[float]:
    return [float(v) for t in trials if t.error is None and (v := getattr(t, name)) is not None]


def metrics_for(peer: Peer, kills: list[Trial], freezes: list[Trial]) -> list[Metric]:
    label = peer.label
    total = values(kills, "seconds")
    found = [
        Metric(
            name=f"{label}: kill -> first step",
            unit="s",
            samples=total,
            description="SIGKILL of a worker pod's processes -> the first step completed after the resume",
            versus=Versus(benchmark="recovery", metric="hot-spare: kill -> first step"),
        ),
        Metric(
            name=f"{label}: kill -> first step (vs new pod)",
            unit="s",
            samples=total,
            description="the same samples, set beside Phalanx without a spare",
            versus=Versus(benchmark="recovery", metric="new-pod: kill -> first step"),
        ),
        Metric(
            name=f"{label}: steps lost",
            unit="count",
            samples=values(kills, "steps_lost"),
            description="highest step completed before the kill - the step restored (replayed steps)",
            versus=Versus(benchmark="recovery", metric="hot-spare: steps lost", stat="max"),
        ),
        Metric(
            name=f"{label}: pods recreated per kill",
            unit="count",
            samples=values(kills, "pods_recreated"),
            description="the job's pods with a new UID by the time training resumed",
        ),
        Metric(
            name=f"{label}: container restarts per kill",
            unit="count",
            samples=values(kills, "container_restarts"),
            description="restarts in place (restartCount) of the job's surviving pods by the time training resumed",
        ),
        Metric(
            name=f"{label}: frozen worker -> noticed",
            unit="s",
            samples=values(freezes, "seconds"),
            description="SIGSTOP of a worker pod -> a pod of the job recreated or restarted, or the JobSet "
            "restarted or failed",
            versus=Versus(benchmark="hang-detection", metric="frozen pod: freeze -> detected"),
        ),
    ]
    return found


def never_texts(peer: Peer, freezes: list[Trial], cap: float) -> dict[str, str]:
    """For the report: a frozen worker the system never noticed within the cap."""
    missed = [t for t in freezes if t.error is None and t.seconds is None]
    if not missed:
        return {}
    return {
        f"{peer.label}: frozen worker -> noticed": f"never within {cap:.0f} s ({len(missed)} of {len(freezes)} trials)"
    }


def _median(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f}" if samples else "-"


# ---------------------------------------------------------------------------------------------- running


class PeerJob:
    """One TrainJob or JobSet of the tiny GPT in its own namespace, with the shared claim."""

    def __init__(self, cluster: Any, peer: Peer, namespace: str, number: int) -> None:
        self.cluster, self.peer, self.namespace = cluster, peer, namespace
        self.name = f"tinygpt-{number}"
        self.manifest = trainjob_manifest(self.name) if peer is KUBEFLOW else jobset_manifest(self.name)
        self.claim_dir: Any = None

    def start(self) -> PeerJob:
        from phalanx.bench.cluster import wait_for

        self.cluster.apply([self.manifest], self.namespace)
        self.claim_dir = wait_for(
            lambda: faults.claim_path(self.cluster, self.namespace, CLAIM), 120, message="the claim's folder"
        )
        return self

    def delete(self) -> None:
        kind = self.manifest["kind"].lower()
        self.cluster.kubectl(
            "delete", "-n", self.namespace, kind, self.name, "--ignore-not-found", "--wait=true",
            "--timeout=120s", check=False,
        )  # fmt: skip
        from phalanx.bench.cluster import wait_for

        wait_for(lambda: not self.pods().pods, 180, message=f"the pods of {self.name} to be gone")

    def step_log(self) -> faults.StepLog:
        if self.claim_dir is None:
            return faults.StepLog()
        return faults.read_step_log(self.claim_dir / faults.STEP_LOG_NAME)

    def pods(self) -> PodsSeen:
        listed = self.cluster.core.list_namespaced_pod(
            self.namespace, label_selector=f"{POD_LABEL}={self.name}"
        )
        seen = {}
        for pod in listed.items:
            if pod.metadata.deletion_timestamp is not None:
                continue
            count = sum(status.restart_count or 0 for status in (pod.status.container_statuses or []))
            seen[pod.metadata.uid] = (pod.metadata.name, count)
        return PodsSeen(seen)

    def running_pods(self) -> list[str]:
        listed = self.cluster.core.list_namespaced_pod(
            self.namespace, label_selector=f"{POD_LABEL}={self.name}"
        )
        return sorted(
            pod.metadata.name
            for pod in listed.items
            if pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
        )

    def jobset(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.cluster.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets", self.name
            )
        except Exception:
            return {}
        return found

    def restarts(self) -> int:
        return int(self.jobset().get("status", {}).get("restarts") or 0)

    def failed(self) -> str:
        """Why the job failed, or ""."""
        status = self.jobset().get("status", {})
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                return f"{condition.get('reason')}: {condition.get('message')}"
        return ""

    def wait_steady(self, min_step: int, timeout: float) -> int:
        """Wait until both pods run and the group since the last restore has completed `SETTLE_STEPS` steps
        and at least `min_step`; returns the step reached."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            why = self.failed()
            if why:
                raise JobFailed(why)
            log = self.step_log()
            if len(self.running_pods()) == NODES and log.steps:
                since = max((line.time for line in log.restores), default=0.0)
                restored = max((line.step for line in log.restores if line.time == since), default=0)
                steps = [line.step for line in log.steps if line.time > since]
                if steps and max(steps) >= max(min_step, restored + SETTLE_STEPS):
                    return max(steps)
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not train steadily within {timeout:.0f} s")

    def wait_step(self, step: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.step_log()
            if log.steps and log.steps[-1].step >= step:
                return
            if self.failed():
                raise JobFailed(self.failed())
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not reach step {step} within {timeout:.0f} s")


class JobFailed(Exception):
    """The peer gave the job up."""


def kill_trial(job: PeerJob, number: int, rng: random.Random, settled: int) -> Trial:
    reached = job.wait_steady(settled, START_TIMEOUT)
    job.wait_step(reached + rng.randrange(CHECKPOINT_INTERVAL), START_TIMEOUT)
    victim = rng.choice(job.running_pods())
    before, restarts = job.pods(), job.restarts()
    moment = faults.kill_pod(job.cluster, job.namespace, victim)
    trial = Trial("kill", number, victim, moment)
    deadline = time.monotonic() + TRIAL_TIMEOUT
    while time.monotonic() < deadline:
        resumed = resumed_after(job.step_log(), moment)
        if resumed is not None:
            now = job.pods()
            trial.seconds = round(resumed.first_step_time - moment, 3)
            trial.restored_step = resumed.restored_step
            trial.steps_lost = steps_lost(job.step_log(), moment, resumed.restored_step)
            trial.pods_recreated = now.recreated_since(before)
            trial.container_restarts = now.restarts_since(before)
            trial.jobset_restarts = job.restarts() - restarts
            trial.how = "JobSet restarted" if trial.jobset_restarts else "containers restarted in place"
            return trial
        why = job.failed()
        if why:
            trial.error = f"the job failed instead of recovering: {why}"
            trial.how = "job failed"
            return trial
        time.sleep(0.25)
    trial.error = f"no step after a resume within {TRIAL_TIMEOUT:.0f} s"
    return trial


def freeze_trial(job: PeerJob, number: int, rng: random.Random, cap: float) -> Trial:
    job.wait_steady(0, START_TIMEOUT)
    victim = rng.choice(job.running_pods())
    before, restarts = job.pods(), job.restarts()
    moment = faults.freeze_pod(job.cluster, job.namespace, victim)
    trial = Trial("freeze", number, victim, moment)
    try:
        while time.time() - moment < cap:
            what = noticed(before, job.pods(), restarts, job.restarts(), bool(job.failed()))
            if what:
                trial.seconds = round(time.time() - moment, 3)
                trial.how = what
                return trial
            time.sleep(0.5)
        trial.how = f"nothing within {cap:.0f} s"
        return trial
    finally:
        # Thaw whatever is left of the pod, so its deletion is not held by stopped processes.
        faults.freeze_pod(job.cluster, job.namespace, victim, frozen=False)


def timeouts(peer: Peer, cap: float) -> list[Timeout]:
    rows = [
        Timeout(
            name="frozen worker: cap of the wait", seconds=cap, source="this benchmark (--quick: shorter)"
        ),
        Timeout(
            name="tiny GPT collective watchdog (ends a process stuck in a collective)",
            seconds=300.0,
            source="worker/guards.py DEFAULT_COLLECTIVE_TIMEOUT, the script's own",
        ),
        Timeout(name="pod restart back-off (first restart)", seconds=1.0, source="local node agent"),
        Timeout(
            name="node-lifecycle grace period",
            seconds=faults.NODE_MONITOR_GRACE_SECONDS,
            source="local cluster",
        ),
    ]
    if peer is KUBEFLOW:
        rows.append(
            Timeout(
                name="Job backoffLimit (restarts before the Job fails)",
                seconds=float(JOB_BACKOFF_LIMIT_DEFAULT),
                source="Kubernetes default; the torch-distributed runtime sets none (a count, not seconds)",
            )
        )
    else:
        rows.append(
            Timeout(
                name="JobSet failurePolicy.maxRestarts",
                seconds=float(JOBSET_MAX_RESTARTS),
                source="this benchmark's JobSet (a count, not seconds)",
            )
        )
    return rows


def run_peer(peer: Peer, context: Any, quick: bool) -> BenchResult:
    from phalanx.devcluster import peerconfig
    from phalanx.devcluster.binaries import cache_dir
    from phalanx.devcluster.peers import PeerControllers

    cap = QUICK_FREEZE_CAP if quick else FULL_FREEZE_CAP
    trials = QUICK_TRIALS if quick else FULL_TRIALS
    versions = {name: peerconfig.CONTROLLERS[name].build for name in peer.controllers}
    version_text = ", ".join(f"{b.module} {b.version}" for b in versions.values())
    result = BenchResult(name=peer.name, title=peer.title, timeouts=timeouts(peer, cap))
    result.details = {"versions": {b.module: b.version for b in versions.values()}}
    cluster = context.cluster()
    controllers = PeerControllers(
        names=peer.controllers,
        kubectl=cluster.kubectl,
        kubeconfig=cluster.kubeconfig,
        workdir=context.workdir / f"{peer.name}-controllers",
        cache=cache_dir(),
        log=context.log,
    )
    try:
        controllers.start()
    except Exception as error:  # the report must say why the peer could not run, with its versions
        result.details["unavailable"] = f"{version_text}: {type(error).__name__}: {error}"
        result.metrics = metrics_for(peer, [], [])
        return result
    kills: list[Trial] = []
    freezes: list[Trial] = []
    jobs_started = 0
    namespace = cluster.create_namespace(f"bench-{peer.name}")
    try:
        cluster.apply([faults.checkpoint_claim(CLAIM)], namespace)
        rng = random.Random(f"{SEED}-{peer.name}")
        job: PeerJob | None = None
        settled = CHECKPOINT_INTERVAL
        for number in range(1, trials + 2):
            if job is None:
                jobs_started += 1
                job = PeerJob(cluster, peer, namespace, jobs_started).start()
                settled = CHECKPOINT_INTERVAL
            try:
                if number <= trials:
                    trial = kill_trial(job, number, rng, settled)
                    kills.append(trial)
                else:
                    trial = freeze_trial(job, number, rng, cap)
                    freezes.append(trial)
            except (JobFailed, TimeoutError) as error:
                trial = Trial("kill" if number <= trials else "freeze", number, "-", time.time())
                trial.error = f"{type(error).__name__}: {error}"
                (kills if number <= trials else freezes).append(trial)
            context.log(
                f"{peer.name} {trial.kind} trial {number}: "
                + (f"failed: {trial.error}" if trial.error else f"{trial.seconds} s ({trial.how})")
            )
            if trial.error or trial.kind == "freeze":
                job.delete()
                job = None
            else:
                settled = job.step_log().steps[-1].step if job.step_log().steps else 0
                settled += SETTLE_STEPS
    finally:
        cluster.delete_namespace(namespace, wait=True, timeout=300)
        controllers.stop()
    result.metrics = metrics_for(peer, kills, freezes)
    result.details.update(
        {
            "never": never_texts(peer, freezes, cap),
            "trials": [asdict(t) for t in kills + freezes],
            "jobs started": jobs_started,
            "manifest": trainjob_manifest("tinygpt") if peer is KUBEFLOW else jobset_manifest("tinygpt"),
        }
    )
    result.notes = notes(peer, kills, freezes, cap, version_text, jobs_started)
    if kills and all(t.error for t in kills):
        result.error = f"every kill trial failed; first: {kills[0].error}"
    return result


def notes(
    peer: Peer, kills: list[Trial], freezes: list[Trial], cap: float, versions: str, jobs: int
) -> list[str]:
    ok = [t for t in kills if t.error is None]
    hows = sorted({t.how for t in ok})
    lines = [
        f"{versions}, built from their Go modules and run as host processes of the local cluster (webhooks as "
        "url: clientConfigs with a local certificate); CRDs and runtimes from the modules' own manifests.",
        f"The tiny GPT under torchrun ({NODES} pods x 1 process, gloo on CPU, {STEP_DELAY} s sleep per step, "
        f"durable checkpoints every {CHECKPOINT_INTERVAL} steps on a shared claim), the same script and "
        "arguments as the recovery benchmark's, without the Phalanx launcher.",
        f"{len(ok)} of {len(kills)} kills recovered ({', '.join(hows) or '-'}); {jobs} job(s) started "
        f"(a new one after a trial that left the job failed); median kill -> first step "
        f"{_median(values(ok, 'seconds'))} s, steps lost {_median(values(ok, 'steps_lost'))}.",
    ]
    emergency = [t for t in ok if t.restored_step is not None and t.restored_step % CHECKPOINT_INTERVAL]
    if emergency:
        lines.append(
            f"{len(emergency)} of {len(ok)} resumes loaded a save that is not a multiple of the interval: the "
            "tiny GPT's emergency save, written when torchrun sent SIGTERM to a surviving training process."
        )
    for trial in kills:
        if trial.error:
            lines.append(f"kill trial {trial.number} (victim {trial.victim}) did not recover: {trial.error}")
    for trial in freezes:
        outcome = (
            f"failed: {trial.error}"
            if trial.error
            else f"noticed after {trial.seconds} s ({trial.how})"
            if trial.seconds is not None
            else f"never noticed within {cap:.0f} s"
        )
        lines.append(f"frozen worker (victim {trial.victim}): {outcome}.")
    lines.append(
        "Neither peer watches training progress: a frozen worker is noticed only when a process exits (the "
        "survivor's collective fails or the tiny GPT's own 300 s watchdog ends it) and its pod is restarted."
    )
    return lines
