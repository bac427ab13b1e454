"""The operator at 100 jobs: event -> action latency, its memory and CPU, API writes in steady state.

100 TrainingJobs of 2 workers run on simulated nodes, and this process renews a heartbeat Lease for every
worker at the jobs' heartbeat interval, as launchers would. Then:
- steady state: over a quiet window the apiserver's `apiserver_request_total` counters (scraped every few
  seconds) give the writes per second by resource; the operator's process (a local process on this
  cluster) gives its resident memory and CPU time; heartbeats must not turn into Events or status churn;
- event -> action: a worker pod is deleted, and the latency is from the pod's DELETED watch event to the
  ADDED event of the replacement pod the operator creates, both seen by the same watch in this process;
- the same trials again beside absurd jobs: one asking for 100,000 workers (a typo: the operator refuses it
  over its gang limit) and one over what the simulated nodes hold but under that limit (held for capacity);
  the healthy jobs' latency must not move, and the absurd jobs must never get a pod.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiException

from phalanx.bench import prom
from phalanx.bench.cluster import (
    SIMULATED_TOLERATION,
    BenchCluster,
    BenchError,
    Cleanup,
    process_tree_figures,
    wait_for,
    warning_summary,
)
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout
from phalanx.bench.heartbeats import HeartbeatSimulator
from phalanx.bench.kubeobjects import custom_object, is_terminating, name_of, phase_of, uid_of
from phalanx.bench.watch import PodEvent, Watch, churn, custom_watch, first_times, pod_watch, running, thin

NAME = "operator-scale"
TITLE = "Operator at 100 jobs"
GROUP, VERSION, PLURAL = "phalanx.dev", "v1alpha1", "trainingjobs"
TRAINER_SELECTOR = "phalanx.dev/component=trainer"
JOB_LABEL = "phalanx.dev/job-name"
OPERATOR_RESOURCES = frozenset(
    {"trainingjobs", "pods", "services", "serviceaccounts", "secrets", "roles", "rolebindings", "podgroups"}
)
"""What the operator writes besides Events (counted from the Events themselves: controllers post Events
too). Leases (heartbeats, node agent) and nodes (node agent) are others' writes."""
OPERATOR_READS = frozenset(
    {"trainingjobs", "services", "serviceaccounts", "secrets", "roles", "rolebindings", "networkpolicies"}
)
"""Kinds only the operator reads one by one (GET) here: its jobs and their children. Pods are read by the node
agent too."""
OPERATOR_COMPONENT = "phalanx-operator"
HEARTBEAT_INTERVAL = 5
HEARTBEAT_TIMEOUT = 30
PROGRESS_TIMEOUT = 600
TRIALS_BUDGET = 600
REPLACE_WAIT = 30.0
"""Seconds a trial waits for the replacement pod."""
"""Seconds the event -> action trials may take in all (an overloaded operator would take forever)."""


@dataclass(frozen=True)
class Scale:
    jobs: int
    workers: int
    trials: int
    window: int
    """Seconds of the steady-state window."""
    scrape_every: int
    """Seconds between apiserver scrapes inside the window."""


FULL = Scale(jobs=100, workers=2, trials=60, window=90, scrape_every=10)
QUICK = Scale(jobs=5, workers=2, trials=5, window=15, scrape_every=5)


def job_manifest(name: str, workers: int) -> dict[str, Any]:
    """A TrainingJob on simulated nodes (its rendezvous pod too: the nodeSelector is copied to it)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": workers,
            "spares": 0,
            "heartbeat": {
                "intervalSeconds": HEARTBEAT_INTERVAL,
                "timeoutSeconds": HEARTBEAT_TIMEOUT,
                "progressTimeoutSeconds": PROGRESS_TIMEOUT,
            },
            "failurePolicy": {"maxRestarts": 1000},
            "template": {
                "spec": {
                    "nodeSelector": {"phalanx.dev/simulated": "true"},
                    "tolerations": [SIMULATED_TOLERATION],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:bench",
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"memory": "8Mi"}},
                        }
                    ],
                }
            },
        },
    }


# ------------------------------------------------------------------------------ analysis (pure)


def operator_writes(rows: list[prom.RequestCount]) -> float:
    return prom.writes(rows, lambda row: row.resource in OPERATOR_RESOURCES)


def operator_reads(rows: list[prom.RequestCount]) -> float:
    return sum(row.count for row in rows if _operator_read(row))


def _operator_read(row: prom.RequestCount) -> bool:
    return row.verb.upper() == "GET" and row.resource in OPERATOR_READS


def status_writes(rows: list[prom.RequestCount]) -> float:
    return prom.writes(rows, lambda row: row.resource == "trainingjobs")


def replacement_latency(events: list[PodEvent], job: str, victim_uid: str, since: float) -> float | None:
    """Seconds from the victim's DELETED event (or `since`) to the first new pod of `job` added after it."""
    known = {event.uid for event in events if event.labels.get(JOB_LABEL) == job and event.t <= since}
    deleted = next(
        (e.t for e in events if e.uid == victim_uid and e.type == "DELETED" and e.t >= since), None
    )
    start = deleted if deleted is not None else since
    added = next(
        (
            event.t
            for event in events
            if event.type == "ADDED"
            and event.labels.get(JOB_LABEL) == job
            and event.uid not in known
            and event.t >= since
        ),
        None,
    )
    return None if added is None else max(0.0, added - start)


def histogram_quantile(buckets: dict[float, float], fraction: float) -> float | None:
    """Prometheus-style quantile from cumulative bucket counts {upper bound: count} (linear inside a bucket)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = fraction * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            inside = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / inside if inside else 0.0)
        lower_bound, lower_count = bound, count
    return bounds[-1]


def reconcile_buckets(before: dict[prom.Key, float], after: dict[prom.Key, float]) -> dict[float, float]:
    found: dict[float, float] = {}
    for labels, increase in prom.delta(before, after, "phalanx_reconcile_duration_seconds_bucket").items():
        found[float(dict(labels)["le"])] = increase
    for labels in prom.select(after, "phalanx_reconcile_duration_seconds_bucket"):
        found.setdefault(float(dict(labels)["le"]), 0.0)
    return found


# ------------------------------------------------------------------------------ the run


class ProcessSampler:
    """Samples the operator's resident memory every second in a thread."""

    def __init__(self, cluster: BenchCluster) -> None:
        self.process = cluster.operator_process()
        self.rss: list[float] = []
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator-sampler", daemon=True)
        self.origin = time.monotonic()

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, _ = process_tree_figures(self.process)
            self.rss.append(rss)
            self.times.append(time.monotonic() - self.origin)
            self._stop.wait(1.0)


def wait_all_running(pods: Watch[PodEvent], scale: Scale, timeout: float) -> float:
    expected = scale.jobs * scale.workers

    def ready() -> bool:
        return len(first_times(pods.events(), running)) >= expected

    started = time.monotonic()
    try:
        wait_for(ready, timeout, interval=0.5, message=f"{expected} worker pods Running")
    except BenchError as error:
        raise BenchError(f"{error}: {len(first_times(pods.events(), running))} Running") from None
    return time.monotonic() - started


@dataclass(frozen=True)
class Scrape:
    """One look at the counters during the steady window."""

    t: float
    requests: dict[prom.Key, float]
    operator_cpu: float
    events: dict[tuple[bool, str], float]
    """Events in the namespace by (posted by the operator?, reason), each counted `count` times."""


def event_counts(cluster: BenchCluster, namespace: str) -> dict[tuple[bool, str], float]:
    """Events in `namespace` by (posted by the operator?, reason), each counted `count` times."""
    counts: dict[tuple[bool, str], float] = {}
    for event in cluster.core.list_namespaced_event(namespace).items:
        source = (event.source.component if event.source else None) or event.reporting_component
        key = (source == OPERATOR_COMPONENT, event.reason or "")
        counts[key] = counts.get(key, 0.0) + (event.count or 1)
    return counts


def scrape(cluster: BenchCluster, namespace: str, process: Any) -> Scrape:
    return Scrape(
        time.monotonic(),
        prom.parse(cluster.apiserver_metrics(), prom.REQUESTS),
        process_tree_figures(process)[1],
        event_counts(cluster, namespace),
    )


def reasons_posted(
    before: dict[tuple[bool, str], float], after: dict[tuple[bool, str], float], mine: bool
) -> dict[str, float]:
    """Events posted between two looks, by reason (the operator's or the others')."""
    found = {}
    for (ours, reason), count in after.items():
        increase = count - before.get((ours, reason), 0.0)
        if ours == mine and increase > 0:
            found[reason] = increase
    return found


def steady_window(cluster: BenchCluster, scale: Scale, namespace: str) -> dict[str, Any]:
    """Scrape every `scrape_every` seconds over the window: writes, Events, the operator's CPU; and the
    TrainingJobs' changes (which fields each status write changed)."""
    process = cluster.operator_process()
    operator_before = prom.parse(cluster.operator_metrics())
    with custom_watch(cluster.new_api_client, GROUP, VERSION, namespace, PLURAL) as jobs:
        scrapes = [scrape(cluster, namespace, process)]
        deadline = scrapes[0].t + scale.window
        while time.monotonic() < deadline - 0.5:
            time.sleep(min(scale.scrape_every, max(0.0, deadline - time.monotonic())))
            scrapes.append(scrape(cluster, namespace, process))
        job_events = jobs.events()
    operator_after = prom.parse(cluster.operator_metrics())
    per_window: dict[str, list[float]] = {
        key: [] for key in ("operator", "status", "all", "events", "cpu", "reads")
    }
    for before, after in itertools.pairwise(scrapes):
        span = after.t - before.t
        rows = prom.request_deltas(before.requests, after.requests)
        posted = sum(reasons_posted(before.events, after.events, mine=True).values())
        per_window["operator"].append((operator_writes(rows) + posted) / span)
        per_window["status"].append(status_writes(rows) / span)
        per_window["all"].append(prom.writes(rows) / span)
        per_window["events"].append(posted)
        per_window["reads"].append(operator_reads(rows) / span)
        per_window["cpu"].append((after.operator_cpu - before.operator_cpu) / span * 100)
    rows = prom.request_deltas(scrapes[0].requests, scrapes[-1].requests)
    seconds = scrapes[-1].t - scrapes[0].t
    writes_by_resource = prom.by_resource(rows, lambda row: row.verb.upper() in prom.WRITE_VERBS)
    reads_by_resource = prom.by_resource(rows, _operator_read)
    buckets = reconcile_buckets(operator_before, operator_after)
    updates, fields = churn(job_events, scrapes[0].t, scrapes[-1].t)
    return {
        "per_window": per_window,
        "seconds": seconds,
        "writes_per_second_by_resource": {
            key: round(value / seconds, 2) for key, value in sorted(writes_by_resource.items())
        },
        "reads_per_second_by_resource": {
            key: round(value / seconds, 2) for key, value in sorted(reads_by_resource.items())
        },
        "operator_event_reasons": reasons_posted(scrapes[0].events, scrapes[-1].events, mine=True),
        "other_event_reasons": reasons_posted(scrapes[0].events, scrapes[-1].events, mine=False),
        "job_updates": updates,
        "changed_fields": dict(sorted(fields.items(), key=lambda item: -item[1])),
        "reconcile_p50": histogram_quantile(buckets, 0.5),
        "reconcile_p99": histogram_quantile(buckets, 0.99),
        "reconciles": max(buckets.values(), default=0.0),
    }


def event_to_action(
    cluster: BenchCluster, pods: Watch[PodEvent], jobs: list[str], scale: Scale, namespace: str
) -> tuple[list[float], int, int]:
    """Delete one worker pod per trial; the latency until the operator's replacement pod appears. A
    replacement that does not come within `REPLACE_WAIT` counts as that long (the tail stays honest).
    Returns (latencies, trials that hit the wait, trials skipped: no running worker, or it went first)."""
    rng = random.Random(7)
    latencies: list[float] = []
    timed_out = skipped = 0
    deadline = time.monotonic() + TRIALS_BUDGET
    for trial in range(scale.trials):
        if time.monotonic() > deadline:
            break
        job = jobs[trial % len(jobs)] if scale.trials <= len(jobs) else rng.choice(jobs)
        live = cluster.core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}={job},phalanx.dev/role=worker"
        ).items
        live = [pod for pod in live if phase_of(pod) == "Running" and not is_terminating(pod)]
        if not live:
            skipped += 1
            continue
        victim = rng.choice(live)
        since = time.monotonic()
        try:
            cluster.core.delete_namespaced_pod(name_of(victim), namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:  # the operator replaced it meanwhile: no trial
                raise
            skipped += 1
            continue

        def replaced(job: str = job, uid: str = uid_of(victim), since: float = since) -> float | None:
            return replacement_latency(pods.events(), job, uid, since)

        try:
            latencies.append(
                wait_for(replaced, REPLACE_WAIT, interval=0.05, message=f"a replacement for {job}")
            )
        except BenchError:
            latencies.append(REPLACE_WAIT)
            timed_out += 1
        time.sleep(0.5)
    return latencies, timed_out, skipped


ABSURD_REPLICAS = 100_000
ABSURD_SETTLE = 60.0
"""Seconds the absurd jobs have to be refused or held."""


def absurd_manifests(simulated_pod_slots: int) -> list[dict[str, Any]]:
    """A 100,000-worker typo, and a job one pod over what the simulated nodes hold (the capacity check's
    case while that is under the operator's gang limit; the limit's otherwise)."""
    typo = job_manifest("absurd-typo", ABSURD_REPLICAS)
    typo["spec"]["maxReplicas"] = ABSURD_REPLICAS
    return [typo, job_manifest("absurd-oversized", simulated_pod_slots + 1)]


def stopped_without_pods(job: dict[str, Any]) -> bool:
    """Whether an absurd job was refused (InvalidSpec) or held (InsufficientCapacity)."""
    found = {
        (condition.get("type"), condition.get("status"), condition.get("reason"))
        for condition in (job.get("status") or {}).get("conditions") or []
    }
    return ("Failed", "True", "InvalidSpec") in found or (
        "GangScheduled",
        "False",
        "InsufficientCapacity",
    ) in found


def pods_of(events: list[PodEvent], jobs: list[str]) -> int:
    """Pods of `jobs` that ever appeared (ADDED events)."""
    return len(
        {event.uid for event in events if event.type == "ADDED" and event.labels.get(JOB_LABEL) in jobs}
    )


def simulated_pod_slots(cluster: BenchCluster) -> int:
    nodes = cluster.core.list_node(label_selector="phalanx.dev/simulated=true").items
    return sum(
        int((node.status.allocatable or {}).get("pods", 0)) if node.status is not None else 0
        for node in nodes
    )


def event_to_action_metric(name: str, samples: list[float], description: str, target: str) -> Metric:
    """An event -> action latency against the operator's target and the API server's SLO (p99 <= 1 s)."""
    return Metric(
        name=name,
        unit="s",
        samples=samples,
        description=description,
        target=Target(op="<=", value=1.0, stat="p99", text=target),
        baseline=Baseline(text="Kubernetes API SLO: p99 <= 1 s per call", value=1.0),
    )


def beside_absurd_jobs(
    cluster: BenchCluster, pods: Watch[PodEvent], jobs: list[str], scale: Scale, namespace: str
) -> tuple[list[float], tuple[int, int], dict[str, Any]]:
    """The event -> action trials again while the absurd jobs are in the cluster."""
    manifests = absurd_manifests(simulated_pod_slots(cluster))
    names = [manifest["metadata"]["name"] for manifest in manifests]
    for manifest in manifests:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    started = time.monotonic()

    def settled() -> bool:
        return all(
            stopped_without_pods(
                custom_object(
                    cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                )
            )
            for name in names
        )

    wait_for(settled, ABSURD_SETTLE, interval=0.5, message="the absurd jobs refused or held")
    to_stopped = time.monotonic() - started
    latencies, timed_out, skipped = event_to_action(cluster, pods, jobs, scale, namespace)
    reasons = {}
    for name in names:
        job = custom_object(
            cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )
        reasons[name] = [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in (job.get("status") or {}).get("conditions") or []
            if c.get("reason") in ("InvalidSpec", "InsufficientCapacity") and c.get("type") != "SpecValid"
        ]
    details = {
        "jobs": {name: manifest["spec"]["replicas"] for name, manifest in zip(names, manifests, strict=True)},
        "seconds_to_refused_or_held": round(to_stopped, 2),
        "pods": pods_of(pods.events(), names),
        "conditions": reasons,
    }
    return latencies, (timed_out, skipped), details


def all_running(cluster: BenchCluster, namespace: str, count: int) -> bool:
    """Whether `count` TrainingJobs in `namespace` have their `Running` condition True."""
    jobs = listed_jobs(cluster, namespace)
    return len(jobs) - len(not_running(jobs)) >= count


def listed_jobs(cluster: BenchCluster, namespace: str) -> list[dict[str, Any]]:
    listing = cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    return list(custom_object(listing)["items"])


def not_running(jobs: list[dict[str, Any]]) -> dict[str, str]:
    """The jobs whose `Running` condition is not True, each with its state and the reason it gives (pure)."""
    found = {}
    for job in jobs:
        status = job.get("status") or {}
        conditions: list[dict[str, Any]] = status.get("conditions") or []
        running: dict[str, Any] = next((c for c in conditions if c.get("type") == "Running"), {})
        if running.get("status") != "True":
            why = f"{running.get('reason')}: {running.get('message')}" if running else "no Running condition"
            found[str(job["metadata"]["name"])] = f"{status.get('state')} ({why})"
    return found


def wait_every_job_running(cluster: BenchCluster, namespace: str, count: int, timeout: float) -> None:
    """Wait until `count` jobs say they run; a BenchError naming a few that do not, and why, after `timeout`."""
    try:
        wait_for(
            lambda: all_running(cluster, namespace, count),
            timeout,
            interval=1.0,
            message="every job's Running condition",
        )
    except BenchError as error:
        late = not_running(listed_jobs(cluster, namespace))
        sample = "; ".join(f"{name}: {why}" for name, why in sorted(late.items())[:5])
        raise BenchError(f"{error}: {len(late)} not Running, e.g. {sample}") from None


def run(context: Any, quick: bool) -> BenchResult:
    scale = QUICK if quick else FULL
    cluster = context.cluster()
    namespace = cluster.create_namespace("bench-ops")
    jobs = [f"job-{index:03d}" for index in range(scale.jobs)]
    log = context.log
    try:
        with (
            pod_watch(cluster.new_api_client, namespace, TRAINER_SELECTOR) as pods,
            ProcessSampler(cluster) as sampler,
        ):
            started = time.monotonic()
            for job in jobs:
                cluster.custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, job_manifest(job, scale.workers)
                )
            log(
                f"{scale.jobs} jobs created in {time.monotonic() - started:.1f} s; waiting for their workers to run"
            )
            # A launcher beats from its pod's start: a worker that ran for a heartbeat timeout before its first
            # beat is rightly judged silent (at 1,000 jobs the last workers run minutes after the first).
            heartbeats = HeartbeatSimulator(
                cluster.new_api_client, namespace, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, scale.workers
            ).start()
            try:
                to_running = wait_all_running(pods, scale, 600 if not quick else 180)
                settle = 2 * HEARTBEAT_INTERVAL + 2 * (
                    cluster.operator.reconcile_interval if cluster.operator else 5
                )
                log(
                    f"heartbeats for {scale.jobs * scale.workers} workers; settling {settle:.0f} s, then a "
                    f"{scale.window} s steady window"
                )
                time.sleep(settle)
                # The window starts once every job says it trains: a late job's `Training` Event is no churn.
                wait_every_job_running(cluster, namespace, len(jobs), 120)
                rss_from = len(sampler.rss)
                steady = steady_window(cluster, scale, namespace)
                rss_steady = sampler.rss[rss_from:]
                log(f"event -> action: {scale.trials} worker pods deleted one at a time")
                latencies, timed_out, skipped = event_to_action(cluster, pods, jobs, scale, namespace)
                log("event -> action again, beside a 100,000-worker job and one over the nodes' capacity")
                beside, beside_missed, absurd = beside_absurd_jobs(cluster, pods, jobs, scale, namespace)
            finally:
                # Jobs go first: heartbeats that stop while their jobs live would be judged as failures.
                cluster.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
                heartbeats.stop()
            log_lines = cluster.operator_log_lines(time.time() - (time.monotonic() - started))
            torch_loaded = maps_torch(sampler.process)
    finally:
        cleanup = cluster.delete_namespace(namespace, timeout=600)
    return result(
        scale,
        cluster,
        to_running,
        steady,
        latencies,
        (timed_out, skipped),
        (beside, beside_missed, absurd),
        sampler,
        rss_steady,
        heartbeats,
        log_lines,
        torch_loaded,
        cleanup,
    )


def result(
    scale: Scale,
    cluster: BenchCluster,
    to_running: float,
    steady: dict[str, Any],
    latencies: list[float],
    missed: tuple[int, int],
    absurd_run: tuple[list[float], tuple[int, int], dict[str, Any]],
    sampler: ProcessSampler,
    rss_steady: list[float],
    heartbeats: HeartbeatSimulator,
    log_lines: list[str],
    torch_loaded: bool,
    cleanup: Cleanup,
) -> BenchResult:
    beside, beside_missed, absurd = absurd_run
    windows = steady["per_window"]
    reconcile_interval = cluster.operator.reconcile_interval if cluster.operator else 5.0
    by_resource = steady["writes_per_second_by_resource"]
    notes = [
        f"{scale.jobs} TrainingJobs x {scale.workers} workers (+ 1 rendezvous pod each) on simulated nodes; "
        f"this process renewed {scale.jobs * scale.workers} heartbeat Leases every {HEARTBEAT_INTERVAL} s "
        f"({heartbeats.writes} renewals, {heartbeats.failures} failed, {heartbeats.late_rounds} late rounds, "
        f"longest a Running pod's Lease went unrenewed {heartbeats.max_gap:.1f} s"
        + (
            "; above the heartbeat timeout, so some pods were rightly declared dead because this process "
            "fell behind)."
            if heartbeats.max_gap > HEARTBEAT_TIMEOUT
            else ")."
        ),
        f"Steady window {steady['seconds']:.0f} s, apiserver scraped every {scale.scrape_every} s. Writes per "
        "second by resource (everyone's): "
        + (", ".join(f"{key} {value}" for key, value in by_resource.items()) or "none")
        + ". Operator writes: trainingjobs, pods, services, serviceaccounts, secrets, roles, rolebindings, plus the "
        "Events the operator posted; leases and nodes are the heartbeats' and the node agent's, endpoints the "
        "endpoints controller's. The operator's reads of single objects (GET) per second by resource: "
        + (
            ", ".join(f"{key} {value}" for key, value in steady["reads_per_second_by_resource"].items())
            or "none"
        )
        + ".",
        f"TrainingJob updates in the window: {steady['job_updates']}; fields they changed: "
        + (", ".join(f"{name} {count}x" for name, count in steady["changed_fields"].items()) or "none")
        + ". Events the operator posted in the window, by reason: "
        + (", ".join(f"{k} {v:.0f}" for k, v in steady["operator_event_reasons"].items()) or "none")
        + "; by other components: "
        + (", ".join(f"{k} {v:.0f}" for k, v in steady["other_event_reasons"].items()) or "none")
        + ".",
        f"The operator process has torch loaded: {'yes' if torch_loaded else 'no'} (libtorch mapped; it "
        "accounts for most of the resident memory when it is).",
        f"Operator reconciles in the window: {steady['reconciles']:.0f} (periodic every {reconcile_interval:g} s per "
        "job, plus events); duration from its histogram p50 "
        f"{fmt_seconds(steady['reconcile_p50'])}, p99 {fmt_seconds(steady['reconcile_p99'])}.",
        f"Event -> action: {len(latencies)} worker pods deleted one at a time across the jobs (0.5 s apart, "
        f"at most {TRIALS_BUDGET} s in all); {missed[0]} replacements did not come within {REPLACE_WAIT:g} s "
        f"and count as {REPLACE_WAIT:g} s; {missed[1]} trials skipped (no running worker, or it was gone "
        "before the delete); latency from the pod's DELETED watch event to the replacement's ADDED event, "
        "both seen by this process.",
        absurd_note(latencies, *absurd_run),
        *heartbeat_false_alarms(steady["operator_event_reasons"], heartbeats.max_gap),
        *(f"Operator log: {line}" for line in warning_summary(log_lines)),
        *([note] if (note := cleanup.note("Cleanup")) else []),
    ]
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[
            event_to_action_metric(
                "event -> action latency",
                latencies,
                "worker pod deleted -> the operator's replacement pod created",
                "event -> action p99 <= 1 s",
            ),
            event_to_action_metric(
                "event -> action latency beside absurd jobs",
                beside,
                "the same trials while a 100,000-worker job and one over the nodes' capacity exist",
                "event -> action p99 <= 1 s beside them",
            ),
            Metric(
                name="pods of the absurd jobs",
                unit="count",
                samples=[float(absurd["pods"])],
                description="pods the refused or held jobs ever had",
                target=Target(op="<=", value=0, stat="max", text="an absurd job never gets a pod"),
            ),
            Metric(
                name="operator RSS",
                unit="MB",
                samples=rss_steady or sampler.rss,
                description="resident memory of the operator process, sampled every second in steady state",
                target=Target(op="<=", value=200, stat="max", text="RSS <= 200 MB"),
                baseline=Baseline(text="kopf operators ~300 MB", value=300),
            ),
            Metric(
                name="operator API writes per second",
                unit="writes/s",
                samples=windows["operator"],
                description=f"writes to the operator's resources in each {scale.scrape_every} s of the steady window",
                target=Target(op="<=", value=20, stat="mean", text="<= 20 API writes/s steady"),
            ),
            Metric(
                name="TrainingJob writes per second",
                unit="writes/s",
                samples=windows["status"],
                description="writes to TrainingJobs (status, kopf annotations): status churn",
            ),
            Metric(
                name="Events posted in steady state",
                unit="count",
                samples=windows["events"],
                description=f"Events created or updated in each {scale.scrape_every} s of the steady window",
                target=Target(op="<=", value=0, stat="max", text="heartbeats never turn into Events"),
            ),
            Metric(
                name="all API writes per second",
                unit="writes/s",
                samples=windows["all"],
                description="every write the apiserver served (heartbeats and node agent included)",
            ),
            Metric(
                name="operator API reads per second",
                unit="reads/s",
                samples=windows["reads"],
                description="the operator's GETs of its jobs and their children in each sub-window (a periodic "
                "reconcile that finds nothing to do reads nothing; children are watched, not re-read)",
            ),
            Metric(
                name="operator CPU",
                unit="%",
                samples=windows["cpu"],
                description="the operator's CPU time over wall time in each sub-window (100% = one core)",
            ),
            Metric(
                name=f"{scale.jobs} jobs created -> workers Running",
                unit="s",
                samples=[to_running],
                description="from the last job created to every worker pod Running",
            ),
        ],
        timeouts=[
            Timeout(
                name="operator periodic reconcile",
                seconds=reconcile_interval,
                source="chart reconcileIntervalSeconds",
            ),
            Timeout(
                name="heartbeat interval", seconds=HEARTBEAT_INTERVAL, source="spec.heartbeat.intervalSeconds"
            ),
            Timeout(
                name="heartbeat timeout", seconds=HEARTBEAT_TIMEOUT, source="spec.heartbeat.timeoutSeconds"
            ),
            Timeout(
                name="no-progress timeout",
                seconds=PROGRESS_TIMEOUT,
                source="spec.heartbeat.progressTimeoutSeconds",
            ),
            Timeout(
                name="gang schedule timeout", seconds=300, source="spec.gang.scheduleTimeoutSeconds (default)"
            ),
        ],
        notes=notes,
        series=[
            Series(
                name="operator RSS",
                x=thin(sampler.times, sampler.rss)[0],
                y=thin(sampler.times, sampler.rss)[1],
                x_label="s since the jobs were created",
                y_label="MB",
            )
        ],
        details={
            "steady": {key: value for key, value in steady.items() if key != "per_window"},
            "missed": sum(missed),
            "timed_out": missed[0],
            "skipped": missed[1],
            "absurd": {**absurd, "timed_out": beside_missed[0], "skipped": beside_missed[1]},
        },
    )


def _quantile(samples: list[float], fraction: float) -> float | None:
    # Nearest rank: the smallest sample with at least `fraction` of them at or below it.
    ordered = sorted(samples)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)] if ordered else None


def absurd_note(
    alone: list[float], beside: list[float], missed: tuple[int, int], absurd: dict[str, Any]
) -> str:
    """Event -> action with and without the absurd jobs, and what became of them."""

    def figures(samples: list[float]) -> str:
        return f"p50 {fmt_seconds(_quantile(samples, 0.5))}, p99 {fmt_seconds(_quantile(samples, 0.99))}"

    jobs = ", ".join(f"{name} ({replicas} workers)" for name, replicas in absurd["jobs"].items())
    conditions = "; ".join(line for lines in absurd["conditions"].values() for line in lines)
    return (
        f"Beside absurd jobs ({jobs}): event -> action {figures(beside)} against {figures(alone)} without them "
        f"({missed[0]} replacements past {REPLACE_WAIT:g} s, {missed[1]} trials skipped). They were refused or "
        f"held {absurd['seconds_to_refused_or_held']:.1f} s after creation and had {absurd['pods']} pods: "
        f"{conditions or 'no condition said why'}."
    )


def heartbeat_false_alarms(reasons: dict[str, float], max_gap: float) -> list[str]:
    """A note when the operator declared heartbeat timeouts although every Lease was renewed in time."""
    timeouts = reasons.get("HeartbeatTimeout", 0)
    if not timeouts or max_gap > HEARTBEAT_TIMEOUT:
        return []
    return [
        f"False alarms: the operator posted {timeouts:.0f} HeartbeatTimeout Events in the steady window although "
        f"no Lease went more than {max_gap:.1f} s without a renewal (timeout {HEARTBEAT_TIMEOUT} s): its view "
        "of the Leases lagged behind."
    ]


def maps_torch(process: Any) -> bool:
    """Whether the process has torch's native library mapped (imported torch)."""
    try:
        return any("libtorch" in mapped.path for mapped in process.memory_maps())
    except Exception:
        return False


def fmt_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"
