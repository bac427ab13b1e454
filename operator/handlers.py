"""kopf handlers: they only gather what is observed, call `reconcile.plan`, and carry the plan out.

Order inside one reconcile: read the job (under the job's lock, so a reconcile queued behind another plans
from the status that one stored), create missing children and pods, delete pods, write the status once
(guarded by the job's resourceVersion), then post the Events, so an Event never describes a status that was
not stored. `CreatedPods` names only the pods whose creation the API server accepted; a pod it refused is a
`FailedCreate` Warning with its answer, and the job's creations back off (`throttle.py`).

What wakes a reconcile: the job's own changes, a timer, its pods' changes, and those heartbeat changes that
call for action (`status.heartbeat_signal`: phase, rank, group, resumption), and a heartbeat that turns a
training-health signal on or off (`health.HealthMonitor`), never a mere renewal.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, TypeVar

import kopf
from kubernetes.client.rest import ApiException

from phalanx import beatsummary, contract, kubecredentials
from phalanx.operator import (
    api,
    builders,
    capacity,
    checkpointing,
    conditions,
    gang,
    health,
    hubview,
    names,
    nodeview,
    ownwrites,
    policy,
    queueing,
    quiettick,
    reconcile,
    stepreport,
    throttle,
    validation,
    viewclock,
    watchguard,
)
from phalanx.operator import status as observe
from phalanx.operator.jobqueue import JobQueue
from phalanx.operator.kube import ForeignObject, Kube
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Event, Plan
from phalanx.operator.settings import FINALIZER, STORAGE_PREFIX, OperatorSettings
from phalanx.operator.timeutil import format_time, now, parse_time
from phalanx.operator.wakeups import Wakeups

_Read = TypeVar("_Read")
HEARTBEAT_PHASE_ANNOTATION = "phalanx.dev/phase"
CLUSTER_KEY = "cluster"
"""The one key of the job-history and waiting-gang indexes: every TrainingJob under it."""
GLOBAL_DEFAULT_PRIORITY = ""
"""Key of the PriorityClass index under which the cluster's default class (`globalDefault`) is kept too."""
STATUS_WRITE_ATTEMPTS = 4
"""Status writes per reconcile while only the job's metadata or spec moves under it (409 Conflict)."""
FAILED_CREATE = "FailedCreate"
"""Warning Event reason: the API server refused a pod of the job (`throttle.rejection_message`)."""


LIVE_READ_ATTEMPTS = 50
"""Reads of a live kopf index a reconcile thread makes before the change that keeps coming through is let raise."""


def live_read(read: Callable[[], _Read]) -> _Read:
    """`read()` of kopf's live indexes, from a reconcile thread: kopf changes them on its event loop meanwhile,
    and a loop over one (even the single step from a dict's iterator to its first item) raises once an object
    comes or goes under it (`dictionary changed size during iteration`: the reconcile would fail, and kopf
    retry the handler only a minute later). So a read that ran into a change is simply made again."""
    for _ in range(LIVE_READ_ATTEMPTS - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


def _first(store: Iterable[Any] | None) -> Any:
    return live_read(lambda: next(iter(store or ()), None))


def namespaced(namespace: str | None) -> str:
    """The namespace kopf passes a handler: its types allow None (cluster-scoped resources); every resource
    handled here is namespaced."""
    if namespace is None:
        raise kopf.PermanentError("a namespaced resource arrived without a namespace")
    return namespace


class HeartbeatSignals:
    """The last `heartbeat_signal` seen per Lease: a Lease event wakes its job only when it changed."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[str | None, ...]] = {}
        self._lock = threading.Lock()

    def changed(self, key: tuple[str, str], summary: dict[str, Any]) -> bool:
        signal = observe.heartbeat_signal(summary)
        with self._lock:
            before = self._seen.get(key)
            self._seen[key] = signal
        return before != signal

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._seen.pop(key, None)


class HandlerThreads:
    """Where reconciles run, once the operator has started. Those that watch events ask for go through a queue
    (`events`, operator/jobqueue.py) onto the threads kopf runs sync handlers on, so the bound on the operator's
    threads holds and no handler waits for its reconcile. The periodic reconciles have threads of their own
    (`periodic`): a hundred jobs' ticks come due every few seconds, and on kopf's threads they would queue ahead
    of the reconciles that events call for."""

    def __init__(self, max_workers: int) -> None:
        self.events = JobQueue(max_workers)
        self.periodic = ThreadPoolExecutor(
            max_workers=max(1, max_workers // 4), thread_name_prefix="phalanx-periodic"
        )


class JobReconciler:
    """Carries out plans; one lock per job so periodic and event-driven reconciles never overlap."""

    def __init__(
        self,
        kube: Kube,
        metrics: OperatorMetrics,
        api_concurrency: int = 1,
        clock_margin: timedelta = reconcile.REGROUP_CLOCK_MARGIN,
        max_gang_pods: int | None = None,
        create_batch: int | None = None,
        creations: throttle.CreationThrottle | None = None,
        admission: validation.Admission | None = None,
        network_policy: builders.NetworkPolicySettings | None = None,
        view: viewclock.OperatorView | None = None,
        pacing: policy.ReplacementPacing | None = None,
        worker_lease_role: str | None = None,
        step_report_seconds: float = 0.0,
    ) -> None:
        self.kube = kube
        # The gaps in the operator's own view (paused, restarted, a stalled watch): no heartbeat is late for them.
        self.view = view
        self.metrics = metrics
        self.clock_margin = clock_margin
        self.max_gang_pods = max_gang_pods
        self.admission = admission
        self.network_policy = network_policy
        self.create_batch = create_batch
        self.pacing = pacing
        self.worker_lease_role = worker_lease_role
        # Per job: pauses of its pod creations after the API server refused some.
        self.creations = creations or throttle.CreationThrottle()
        # Training-health histories per job, fed by every heartbeat event (`lease_changed`).
        self.health = health.HealthMonitor()
        # Shared by all jobs: bounds the operator's parallel requests however many jobs reconcile at once.
        self._requests = (
            ThreadPoolExecutor(max_workers=api_concurrency, thread_name_prefix="phalanx-api")
            if api_concurrency > 1
            else None
        )
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._queued: set[tuple[str, str]] = set()
        """Jobs with a reconcile waiting for their lock."""
        self._locks_guard = threading.Lock()
        self.own_writes = ownwrites.OwnWrites()
        self.step_reports = stepreport.StepReports(step_report_seconds)
        self.fresh_reads = quiettick.FreshReads()
        self._kueue_missing: set[tuple[str, str]] = set()
        """Queued jobs told that this cluster serves no Kueue Workload API."""
        self._foreign: dict[tuple[str, str], tuple[str, ...]] = {}
        """(namespace, job) -> the objects it needs that exist and are someone else's, as the last apply found."""
        self.unseen_pods = watchguard.UnseenPods()
        self.watch_stalled = threading.Event()
        """Set when the pod watch has stopped delivering (`watchguard`): the operator then stops, to restart."""
        self.nodes: Mapping[str, Iterable[dict[str, Any]]] = {}
        """Every node's summary by name (`status.summarize_node`): the operator's `nodeview.NodeView`, which
        is complete before any handler runs."""

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str, uid: str) -> None:
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
        self.creations.forget((namespace, name))
        self.health.forget((namespace, name))
        self.unseen_pods.forget((namespace, name))
        self.own_writes.forget(namespace, name)
        self.step_reports.forget((namespace, name))
        self.fresh_reads.forget((namespace, name))
        self.metrics.forget_job_health(namespace, name)
        self.metrics.job_checkpoint_interval(namespace, name, None)
        self.metrics.job_state(uid, None)

    def reconcile(
        self,
        namespace: str,
        name: str,
        pods: Mapping[Any, Iterable[dict[str, Any]]],
        leases: Mapping[Any, Iterable[dict[str, Any]]],
        nodes: Mapping[Any, Iterable[dict[str, Any]]],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        histories: Iterable[checkpointing.JobHistory | None] = (),
        waiting: Iterable[dict[str, Any]] = (),
        priorities: Mapping[Any, Iterable[int]] | None = None,
        hubs: Mapping[Any, Iterable[hubview.HubSummary]] | None = None,
        watched: Mapping[str, Any] | None = None,
    ) -> Plan | None:
        """Reconcile one job; returns its plan (None when another reconcile covers this one, or the job is
        gone). `histories`: every TrainingJob's failure history (the cluster's, for the checkpoint interval);
        `waiting`: the jobs whose gangs wait to be placed (`waiting_gang`), `priorities`: PriorityClass values
        by name, which together say what room the jobs ranked before this one are promised. `hubs`: the
        heartbeat hubs' summaries by (namespace, rendezvous pod). `watched`: kopf's copy of the job, which a
        periodic reconcile may plan from while that plan does nothing (quiettick.py)."""
        key = (namespace, name)
        with self._locks_guard:
            if key in self._queued:
                # A reconcile of this job waits for the lock and reads everything after it gets it: it covers
                # this change too. Without this, a gang of 1,000 pods queues 1,000 reconciles of 1,000 pods.
                self.metrics.reconciles_coalesced.inc()
                return None
            self._queued.add(key)
        started = time.perf_counter()
        views = (pods, leases, nodes, histories, waiting, priorities or {}, hubs or {})
        with self._lock(namespace, name):
            with self._locks_guard:
                self._queued.discard(key)
            planned = None
            if watched is not None and not self.fresh_reads.due(key):
                planned = self._quiet_plan(key, watched, logger, views)
            if planned is None:
                # The stored object, read under the lock: a watch event may lag behind our own last status
                # write, and a job read before a reconcile running now would miss that reconcile's status (its
                # deletions would then look like someone else's).
                job = self.kube.get_job(namespace, name)
                self.fresh_reads.read(key)
                if job is None or not _ours(job):
                    # Gone, going, or another controller's (`spec.managedBy`): nothing of it is ours to touch.
                    return None
                planned = self._plan(job, logger, *views)
                if _deletes_a_late_gang(planned[1]):
                    planned = self._plan_from_listing(job, logger, views)
            job, plan, job_pods = planned
            self._settle_health(key, plan)
            self._apply(job, plan, logger, job_pods)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        return plan

    def _plan_from_listing(
        self,
        job: dict[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        views: tuple[Any, ...],
    ) -> tuple[dict[str, Any], Plan, list[dict[str, Any]]]:
        """The plan again, from the job's pods as the API server lists them now, before a gang is deleted for
        its schedule timeout: that verdict rests on the pods not being bound, and an index that lags shows that
        of a gang already running (with 1,000 jobs started at once, 841 gangs were deleted so). A listing that
        fails raises: nothing is deleted on the index's word alone."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        listed = [observe.summarize_pod(pod) for pod in self.kube.list_job_pods(namespace, name)]
        pods: Mapping[Any, Iterable[dict[str, Any]]] = ChainMap({(namespace, name): listed}, views[0])
        planned = self._plan(job, logger, pods, *views[1:])
        if not _deletes_a_late_gang(planned[1]):
            logger.warning(
                "the pod index showed the gang unscheduled past its timeout, the API server does not: "
                "nothing deleted (the operator's pod watch lags)"
            )
        return planned

    def _quiet_plan(
        self,
        key: tuple[str, str],
        watched: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        views: tuple[Any, ...],
    ) -> tuple[dict[str, Any], Plan, list[dict[str, Any]]] | None:
        """The plan from kopf's copy of the job when carrying it out changes nothing (None: read the job and plan
        again; quiettick.py)."""
        job = copy_of(watched)
        if not _ours(job):
            return None
        planned = self._plan(job, logger, *views)
        stored, plan = job.get("status") or {}, planned[1]
        if quiettick.quiet(plan, stored, lambda: self.step_reports.defer(key, stored, plan.status)):
            self.metrics.quiet_ticks.inc()
            return planned
        return None

    def _plan(
        self,
        job: dict[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        pods: Mapping[Any, Iterable[dict[str, Any]]],
        leases: Mapping[Any, Iterable[dict[str, Any]]],
        nodes: Mapping[Any, Iterable[dict[str, Any]]],
        histories: Iterable[checkpointing.JobHistory | None],
        waiting: Iterable[dict[str, Any]],
        priorities: Mapping[Any, Iterable[int]],
        hubs: Mapping[Any, Iterable[hubview.HubSummary]],
    ) -> tuple[dict[str, Any], Plan, list[dict[str, Any]]]:
        """The job's plan from what is observed now: (the job, its plan, the job's pods it saw)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = (namespace, name)
        uid = job["metadata"].get("uid")
        listed = live_read(lambda: list(pods.get((namespace, name), ())))
        indexed = [dict(pod) for pod in listed if observe.owned_by(pod, uid)]
        self._check_pod_watch(job, [observe.pod_name(pod) for pod in indexed], logger)
        job_pods = self.own_writes.laid_over(namespace, name, indexed)
        pod_names = [observe.pod_name(pod) for pod in job_pods]
        job_leases = {
            pod: lease for pod in pod_names if (lease := _first(leases.get((namespace, pod)))) is not None
        }
        # Every node is indexed: a bound node missing from the index was deleted.
        bound = ((pod.get("spec") or {}).get("nodeName") for pod in job_pods)
        bound_nodes: set[str] = {node for node in bound if node}
        drills_allowed = bool(((job.get("spec") or {}).get("drills") or {}).get("allowed"))
        node_health = {
            node: observe.node_for_job(summary, namespace, name, drills_allowed)
            for node in bound_nodes
            if (summary := _first(nodes.get(node))) is not None
        }
        workload, flavors, priority = self._queue_view(job, priorities)
        moment = now()
        observed = reconcile.Observed(
            pods=job_pods,
            now=moment,
            leases=job_leases,
            node_labels={node: summary["labels"] for node, summary in node_health.items()},
            nodes=node_health,
            health=self.health.snapshot(key),
            cluster=checkpointing.cluster_history(
                live_read(lambda: list(histories)), job["metadata"].get("uid"), moment
            ),
            clock_margin=self.clock_margin,
            capacity=(
                self._capacity_view(key, job, pods, nodes, waiting, priorities)
                if _gang_unplaced(job, job_pods)
                else None
            ),
            max_gang_pods=self.max_gang_pods,
            admission=self.admission,
            network_policy=self.network_policy,
            create_batch=self.create_batch,
            pacing=self.pacing,
            worker_lease_role=self.worker_lease_role,
            view_gaps=self.view.gaps(namespace) if self.view is not None else (),
            foreign=self._foreign.get(key, ()),
            hub=_first(hubs.get((namespace, names.rendezvous_name(name)))),
            create_refused=self.creations.rejection(key),
            workload=workload,
            flavors=flavors,
            priority=priority,
        )
        return job, reconcile.plan(job, observed), job_pods

    def _capacity_view(
        self,
        key: tuple[str, str],
        job: dict[str, Any],
        pods: Mapping[Any, Iterable[dict[str, Any]]],
        nodes: Mapping[Any, Iterable[dict[str, Any]]],
        waiting: Iterable[dict[str, Any]],
        priorities: Mapping[Any, Iterable[int]],
    ) -> capacity.ClusterView:
        """The cluster as the job's unplaced gang is judged against, from copies of the live indexes."""
        every_pod, every_node, gangs = index_copy(pods), index_copy(nodes), live_read(lambda: list(waiting))
        return cluster_view(
            key,
            every_pod,
            every_node,
            earlier_gangs(job, gangs, every_pod, priorities, self.max_gang_pods),
            unseen_gang_pods(job, gangs, every_pod, self.max_gang_pods),
        )

    def _queue_view(
        self, job: dict[str, Any], priorities: Mapping[Any, Iterable[int]]
    ) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]], queueing.Priority]:
        """A queued job's Workload, its admitted flavors and, while it has no Workload, the priority a new one
        gets; nothing for a job Kueue does not manage (no request either)."""
        if queueing.queue_name(job) is None:
            return None, {}, queueing.Priority(0)
        workload = self.kube.get_workload(job["metadata"]["namespace"], queueing.workload_name(job))
        flavors = {
            name: flavor
            for name in queueing.admitted_flavors(workload)
            if (flavor := self.kube.get_flavor(name)) is not None
        }
        priority = queueing.Priority(0) if workload is not None else self._workload_priority(job, priorities)
        return workload, flavors, priority

    def _workload_priority(
        self, job: dict[str, Any], priorities: Mapping[Any, Iterable[int]]
    ) -> queueing.Priority:
        """As Kueue's `ExtractPriority`: the job's WorkloadPriorityClass label, else its pods' PriorityClass,
        else the cluster's default class, else 0."""
        named = ((job.get("metadata") or {}).get("labels") or {}).get(queueing.PRIORITY_LABEL)
        if named:
            value = self.kube.get_workload_priority(named)
            if value is not None:
                return queueing.Priority(value, "WorkloadPriorityClass", named)
        pod_class = ((((job.get("spec") or {}).get("template") or {}).get("spec")) or {}).get(
            "priorityClassName"
        )
        if pod_class and (value := _first(priorities.get(pod_class))) is not None:
            return queueing.Priority(int(value), "PriorityClass", pod_class)
        return queueing.Priority(job_priority(job, priorities))

    def _write_workload(self, job: dict[str, Any], op: queueing.WorkloadOp) -> None:
        if op.kind != "create":
            self.kube.write_workload(op)
            return
        try:
            self.kube.create(op.body)
        except ApiException as error:
            if error.status != 404:
                raise
            # Kueue's API is not served here: say so on the job (once per operator run).
            key = (job["metadata"]["namespace"], job["metadata"]["name"])
            if key not in self._kueue_missing:
                self._kueue_missing.add(key)
                message = (
                    f"the job is labelled {queueing.QUEUE_LABEL}, but this cluster serves no Kueue Workload API "
                    f"({queueing.WORKLOAD_API_VERSION}): install Kueue, or remove the label"
                )
                self._guarded("event", self.kube.post_event, job, Event("Warning", "KueueMissing", message))
            raise

    def release_workload(self, workload: dict[str, Any]) -> None:
        """Drop Kueue's finalizer from the Workload of a job that is gone."""
        op = queueing.WorkloadOp("drop_finalizer", target=workload["metadata"])
        self._guarded("workload", self.kube.write_workload, op)

    def _settle_health(self, key: tuple[str, str], plan: Plan) -> None:
        """Tell the health monitor what this reconcile judged with, so heartbeats wake the job only when a
        signal changes state from here."""
        if plan.health_reset:
            self.health.reset(key)
        elif plan.health is not None:
            spec, assessment = plan.health
            self.health.settle(key, spec, assessment, since=plan.health_since)

    def _apply(
        self, job: dict[str, Any], plan: Plan, logger: Any, observed_pods: Iterable[dict[str, Any]] = ()
    ) -> None:
        if plan.delete_job:
            logger.info("the job finished longer than spec.ttlSecondsAfterFinished ago: deleting it")
            self._guarded("delete", self.kube.delete_job, job)
            return
        if plan.suspend and not self._suspend(job, logger):
            # A training-health Pause: without the suspension the status must not say it happened; the next
            # reconcile plans it again.
            return
        namespace = job["metadata"]["namespace"]
        key = (namespace, job["metadata"]["name"])
        foreign: list[str] = []
        for child in plan.ensure:
            try:
                self._guarded("ensure", self.kube.ensure, child)
            except ForeignObject as error:
                foreign.append(str(error))
        newly_foreign = sorted(set(foreign) - set(self._foreign.get(key, ())))
        if foreign:
            self._foreign[key] = tuple(foreign)
            # None of the job's pods runs beside an object under its name that is not its own (a squatted
            # rendezvous Service would take its workers' connections). The next reconcile says so in a condition.
            plan.create_pods = []
        elif plan.ensure:
            self._foreign.pop(key, None)
        for op in plan.workload_ops:
            self._guarded("workload", self._write_workload, job, op)
        generation = job["metadata"].get("generation")
        outcomes = self._each(
            "create", self._create_pod, [(key, pod, generation, logger) for pod in plan.create_pods]
        )
        paused = self.creations.paused_for(key, generation)
        if paused:
            # Wake the job when its creations may go on, rather than at the next periodic reconcile.
            plan.wake_after = paused if plan.wake_after is None else min(plan.wake_after, paused)
        elif plan.create_pods:
            self.creations.succeeded(key)
        created: set[str] = set()
        existing = [
            pod["metadata"]["name"]
            for pod, outcome in zip(plan.create_pods, outcomes, strict=True)
            if outcome is False
        ]
        made_at = format_time(now())
        for pod, outcome in zip(plan.create_pods, outcomes, strict=True):
            if outcome is True:
                created.add(pod["metadata"]["name"])
                self.metrics.pods_created.labels(role=pod["metadata"]["labels"][names.LABEL_ROLE]).inc()
                summary = observe.summarize_pod(
                    {**pod, "metadata": {**pod["metadata"], "creationTimestamp": made_at}}
                )
                self.own_writes.wrote(
                    namespace, key[1], pod["metadata"]["name"], None, ownwrites.Created(summary)
                )
        # Created or found existing, the pod index must show each of them soon (else its watch has stopped).
        self.unseen_pods.found_existing(key, [*existing, *created])
        if created:
            # New pods need the children no watch covers (the store Secret, the PodGroup): the next reconcile
            # (their own events bring it) checks those again. Not before creating them: a replacement waits for
            # no read, and a pod waits for a missing Secret until it is made.
            self.kube.forget(namespace, key[1], keep=WATCHED_CHILDREN.keys())
        rejections = [outcome for outcome in outcomes if isinstance(outcome, throttle.Rejection)]
        if rejections:
            # The next reconcile (when the pause ends) puts it in the job's conditions.
            self.creations.rejected(key, rejections[0])
        # Grace 0 first: the survivors' connections to a frozen or lost worker close at once.
        self._each("delete", self.kube.delete_pod, [(namespace, pod, 0) for pod in plan.force_delete_pods])
        self._each("delete", self.kube.delete_pod, [(namespace, pod) for pod in plan.delete_pods])
        self.metrics.pods_deleted.inc(len(plan.force_delete_pods) + len(plan.delete_pods))
        # After this reconcile's creations: the gates open once the whole gang exists.
        uids = {observe.pod_name(pod): pod["metadata"].get("uid") for pod in observed_pods}
        job_name = job["metadata"]["name"]
        # Only the pods the index shows (a uid): a gate lifted from a pod created a moment ago could not be
        # remembered against its watch events, which come with the gate still on and would have it lifted again;
        # those events wake the job, whose next reconcile lifts it.
        lifts: list[tuple[str, ownwrites.PodChange]] = [
            (pod, ownwrites.GateLifted()) for pod in plan.ungate_pods if uids.get(pod)
        ]
        labels: list[tuple[str, ownwrites.PodChange]] = [
            (pod, ownwrites.RoleLabel(role)) for pod, role in plan.relabel_pods.items()
        ]
        for operation, changes in (("ungate", lifts), ("label", labels)):
            done = self._each(
                operation, self._change_pod, [(namespace, pod, change) for pod, change in changes]
            )
            for (pod_name, change), written in zip(changes, done, strict=True):
                if written:
                    self.own_writes.wrote(namespace, job_name, pod_name, uids.get(pod_name), change)
        self.metrics.job_state(job["metadata"]["uid"], plan.status.get("state"))
        # A status that moved only its step waits (stepreport.py); the metrics below carry the live step.
        deferred = not plan.events and self.step_reports.defer(key, job.get("status") or {}, plan.status)
        if deferred or self._write_status(job, plan.status, logger):
            self.metrics.record_recovery(plan.detected, plan.recovered, plan.spare_swaps, plan.spares_lost)
            self.metrics.record_job(namespace, job["metadata"]["name"], plan.status)
            self.metrics.record_health(
                namespace, job["metadata"]["name"], plan.status, plan.health_started, plan.health_rollbacks
            )
            if plan.health_restart is not None:
                # A rollback is stored: the run that goes on is judged on its own heartbeats only.
                self.health.reset((namespace, job["metadata"]["name"]), since=plan.health_restart)
            self.metrics.job_checkpoint_interval(
                namespace, job["metadata"]["name"], plan.status.get("checkpoint")
            )
            for event in plan.events:
                # `CreatedPods` names only the pods the API server accepted just now.
                if (posted := event.for_created(created)) is not None:
                    self._guarded("event", self.kube.post_event, job, posted)
        for message in newly_foreign:
            self._guarded(
                "event",
                self.kube.post_event,
                job,
                Event("Warning", conditions.REASON_FOREIGN_OBJECT, message),
            )
        if rejections:
            # What the API server answered, whether or not the status was stored: it is not in the status, and
            # these pods are not sent again before the pause ends, so this is the one Event of this refusal.
            failed = Event("Warning", FAILED_CREATE, throttle.rejection_message(rejections))
            self._guarded("event", self.kube.post_event, job, failed)

    def _change_pod(self, namespace: str, pod: str, change: ownwrites.PodChange) -> bool:
        if isinstance(change, ownwrites.GateLifted):
            self.kube.ungate_pod(namespace, pod, gang.SCHEDULING_GATE)
        elif isinstance(change, ownwrites.RoleLabel):
            self.kube.label_pod(namespace, pod, {names.LABEL_ROLE: change.role})
        return True

    def _check_pod_watch(self, job: dict[str, Any], indexed: list[str], logger: Any) -> None:
        """Set `watch_stalled` when a pod of the job's own that a creation found existing is still missing from
        the pod index after `unseen_pods.limit_seconds` (the watch stopped). A pod of that name that is not
        the job's (someone else's, or gone) says nothing about the watch and is dropped."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        self.unseen_pods.seen(key, indexed)
        for name in self.unseen_pods.overdue(key):
            pod = self.kube.get_pod(meta["namespace"], name)
            if observe.controller_uid((pod or {}).get("metadata") or {}) == meta["uid"]:
                logger.error(
                    f"pod {name} exists but the operator's pod watch has not shown it for "
                    f"{self.unseen_pods.limit_seconds:g} s: the watch has stopped; stopping to restart"
                )
                self.watch_stalled.set()
                return
            self.unseen_pods.forget(key, [name])

    def _create_pod(
        self, key: tuple[str, str], pod: dict[str, Any], generation: int | None, logger: Any
    ) -> bool | throttle.Rejection | None:
        """Create one of the job's pods unless its creations pause: True when created, False when it existed,
        a `Rejection` when the API server refused the pod itself, None when not sent or not now. Any refusal
        starts (or continues) the pause, so the rest of the batch is not sent."""
        if self.creations.paused_for(key, generation):
            return None
        try:
            return self.kube.create(pod)
        except ApiException as error:
            self.metrics.api_errors.labels(operation="create").inc()
            name = pod["metadata"]["name"]
            if throttle.is_rejection(error.status):
                # Sending it again would get the same answer: back off as for throttling, and say why.
                pause = self.creations.refused(key, generation=generation)
                answer = throttle.describe_answer(error.status, error.reason, error.body)
                logger.warning(f"pod {name} refused: {answer}; pausing creations {pause:.1f}s")
                return throttle.Rejection(name, answer, pause)
            if not throttle.is_refusal(error.status):
                logger.warning(f"create of {name} failed: {error.status} {error.reason}")
                return None
            pause = self.creations.refused(key, throttle.retry_after_seconds(error.headers))
            logger.info(f"pod creations refused ({error.status} {error.reason}); pausing them {pause:.1f}s")
            return None

    def _suspend(self, job: dict[str, Any], logger: Any) -> bool:
        """Set `spec.suspend` (a training-health Pause); False when the API refused it."""
        try:
            self.kube.suspend_job(job)
            return True
        except ApiException as error:
            self.metrics.api_errors.labels(operation="suspend").inc()
            logger.info(f"job not suspended ({error.status}: {error.reason}); will retry")
            return False

    def _write_status(self, job: dict[str, Any], status: dict[str, Any], logger: Any) -> bool:
        """Write the status once; True when the stored status is now `status`."""
        if status == (job.get("status") or {}):
            return True
        target = job
        for _ in range(STATUS_WRITE_ATTEMPTS):
            try:
                self.kube.replace_status(target, status)
                self.step_reports.wrote((job["metadata"]["namespace"], job["metadata"]["name"]))
                return True
            except ApiException as error:
                failure = error
                if error.status != 409:
                    break
            # Often only metadata or spec moved (kopf's annotations, our own suspension, which kopf answers with
            # an annotation of its own): the status we planned from is still the stored one, so the plan holds;
            # retry on the new version. A status someone else wrote means planning again.
            fresh = self.kube.get_job(job["metadata"]["namespace"], job["metadata"]["name"])
            if fresh is None or fresh.get("status") != job.get("status"):
                break
            target = fresh
        # The next reconcile plans again from the newer job.
        self.metrics.api_errors.labels(operation="status").inc()
        logger.info(f"status not written ({failure.status}: {failure.reason}); will retry")
        return False

    def _each(self, operation: str, call: Any, calls: list[tuple[Any, ...]]) -> list[Any]:
        """`call(*args)` for every args tuple, up to `api_concurrency` at once; results in order. One phase
        ends before the next begins (all creations, then deletions), as when they ran one by one."""
        if self._requests is None or len(calls) < 2:
            return [self._guarded(operation, call, *args) for args in calls]
        return list(self._requests.map(lambda args: self._guarded(operation, call, *args), calls))

    def _guarded(self, operation: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except ApiException as error:
            self.metrics.api_errors.labels(operation=operation).inc()
            logging.getLogger(__name__).warning(f"{operation} failed: {error.status} {error.reason}")
            return None


def _ours(job: Mapping[str, Any]) -> bool:
    """Whether the job is this operator's to act on: not going away, and not another controller's."""
    return not job["metadata"].get("deletionTimestamp") and api.managed_here(job.get("spec"))


def copy_of(watched: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of kopf's live body (kopf changes it in place as watch events arrive)."""
    return copy.deepcopy(dict(watched))


def _gang_unplaced(job: dict[str, Any], job_pods: list[dict[str, Any]]) -> bool:
    """Whether the job's gang was never placed and no attempt at it is under way: only then does the plan
    judge it against the cluster's capacity (observing every node is not free)."""
    if ((job.get("status") or {}).get("gang") or {}).get("scheduledTime") or (job.get("spec") or {}).get(
        "suspend"
    ):
        return False
    return not any(observe.is_trainer(pod) and not observe.is_terminating(pod) for pod in job_pods)


def _deletes_a_late_gang(plan: Plan) -> bool:
    """Whether `plan` deletes a gang that was not scheduled within its timeout (`gang.decide`)."""
    return bool(plan.delete_pods) and any(
        event.reason == conditions.REASON_SCHEDULE_TIMEOUT for event in plan.events
    )


def jobs_on_node(pods: Mapping[Any, Iterable[dict[str, Any]]], node: str) -> list[tuple[str, str]]:
    """The jobs (namespace, name) with a pod bound to `node`, from a copy of the pod index."""
    return [
        key
        for key, job_pods in pods.items()
        if any((pod.get("spec") or {}).get("nodeName") == node for pod in job_pods)
    ]


def index_copy(index: Mapping[Any, Iterable[Any]]) -> dict[Any, list[Any]]:
    """A copy of a whole kopf index, for a reconcile thread to loop over (`live_read`)."""

    def copy() -> dict[Any, list[Any]]:
        return {key: list(store) for key in list(index) if (store := index.get(key)) is not None}

    return live_read(copy)


def cluster_view(
    key: tuple[str, str],
    pods: Mapping[Any, Iterable[dict[str, Any]]],
    nodes: Mapping[Any, Iterable[dict[str, Any]]],
    earlier: Iterable[capacity.Gang] = (),
    unseen: Iterable[dict[str, str]] = (),
) -> capacity.ClusterView:
    """Every node, what the live pods of the other TrainingJobs request on the nodes they are bound to, what
    those not bound yet request (with the `unseen` pods of gangs being created), and the `earlier` gangs (the
    job's own pods are the gang itself, never counted against it)."""
    every_node = {name: summary for name, store in nodes.items() if (summary := _first(store)) is not None}
    bound: dict[str, list[dict[str, str]]] = {}
    pending: list[dict[str, str]] = [dict(requests) for requests in unseen]
    for job_key, store in pods.items():
        if job_key == key:
            continue
        for pod in store:
            if observe.phase(pod) in observe.FINISHED_PHASES or observe.is_terminating(pod):
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            requests = (pod.get("spec") or {}).get("requests") or {}
            if node:
                bound.setdefault(node, []).append({capacity.PODS: "1", **requests})
            else:
                pending.append(dict(requests))
    return capacity.ClusterView(every_node, bound, pending, tuple(earlier))


def waiting_gang(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A job whose gang waits to be placed, as the waiting-gangs index keeps it (None: placed, suspended,
    finished, or being deleted)."""
    metadata, spec, status = (dict(body.get(key) or {}) for key in ("metadata", "spec", "status"))
    if metadata.get("deletionTimestamp") or spec.get("suspend") or not api.managed_here(spec):
        return None
    if (status.get("gang") or {}).get("scheduledTime") or status.get("state") in ("Succeeded", "Failed"):
        return None
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": metadata,
        "spec": spec,
    }


def job_priority(job: Mapping[str, Any], priorities: Mapping[Any, Iterable[int]]) -> int:
    """The priority its pods get: the template's `priority`, else its PriorityClass's value, else the
    cluster's default class (`globalDefault`), else 0."""
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    if isinstance(pod_spec.get("priority"), int):
        return int(pod_spec["priority"])
    named = _first(priorities.get(pod_spec.get("priorityClassName") or GLOBAL_DEFAULT_PRIORITY))
    return int(named) if named is not None else 0


def _runnable_gang(waiting: Mapping[str, Any], max_gang_pods: int | None) -> capacity.Gang | None:
    """A waiting job's gang as a capacity check counts it (None: a spec its own reconcile refuses)."""
    meta = waiting.get("metadata") or {}
    # Only a job that could run holds room; an invalid one is its own reconcile's to report.
    spec, _ = validation.check(waiting.get("spec"), str(meta.get("name") or ""), max_gang_pods)
    if spec is None:
        return None
    pod_spec = builders.build_worker_pod(dict(waiting), spec, 0, names.ROLE_WORKER)["spec"]
    return capacity.Gang(f"{meta.get('namespace')}/{meta.get('name')}", pod_spec, spec.replicas + spec.spares)


def _live_trainers(waiting: Mapping[str, Any], pods: Mapping[Any, Iterable[dict[str, Any]]]) -> int:
    meta = waiting.get("metadata") or {}
    return sum(
        1
        for pod in pods.get((meta.get("namespace"), meta.get("name")), ())
        if observe.is_trainer(pod)
        and not observe.is_terminating(pod)
        and observe.owned_by(pod, meta.get("uid"))
    )


def _others(job: Mapping[str, Any], waiting: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    mine = (job["metadata"]["namespace"], job["metadata"]["name"])
    return (
        other
        for other in waiting
        if ((other.get("metadata") or {}).get("namespace"), (other.get("metadata") or {}).get("name")) != mine
    )


def earlier_gangs(
    job: Mapping[str, Any],
    waiting: Iterable[dict[str, Any]],
    pods: Mapping[Any, Iterable[dict[str, Any]]],
    priorities: Mapping[Any, Iterable[int]],
    max_gang_pods: int | None = None,
) -> list[capacity.Gang]:
    """The gangs of the jobs ranked before `job` that wait to be placed and have no pod yet (those with pods
    count through their pods and `unseen_gang_pods`), in rank order."""

    def rank_of(other: Mapping[str, Any]) -> tuple[int, str, str, str]:
        meta = other.get("metadata") or {}
        return capacity.rank(
            job_priority(other, priorities), meta.get("creationTimestamp"), meta["namespace"], meta["name"]
        )

    mine = rank_of(job)
    gangs: list[tuple[tuple[int, str, str, str], capacity.Gang]] = []
    for other in _others(job, waiting):
        if rank_of(other) >= mine or _live_trainers(other, pods):
            continue
        gang = _runnable_gang(other, max_gang_pods)
        if gang is not None:
            gangs.append((rank_of(other), gang))
    return [gang for _, gang in sorted(gangs, key=lambda item: item[0])]


def unseen_gang_pods(
    job: Mapping[str, Any],
    waiting: Iterable[dict[str, Any]],
    pods: Mapping[Any, Iterable[dict[str, Any]]],
    max_gang_pods: int | None = None,
) -> list[dict[str, str]]:
    """The requests of the pods that other jobs' gangs, being created, still miss in the pod index: whatever
    their rank, their room is promised. The index shows a gang's pods one by one as their creations land, and
    a gang judged by the few it shows so far would leave room for a later job that is not there."""
    unseen: list[dict[str, str]] = []
    for other in _others(job, waiting):
        live = _live_trainers(other, pods)
        if not live:
            continue
        gang = _runnable_gang(other, max_gang_pods)
        if gang is None or live >= gang.count:
            continue
        requests = {
            name: str(amount)
            for name, amount in capacity.pod_requests(gang.pod_spec).items()
            if name != capacity.PODS
        }
        unseen.extend(dict(requests) for _ in range(gang.count - live))
    return unseen


WATCHED_CHILDREN: dict[str, tuple[str, str, str]] = {
    "Service": ("", "v1", "services"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
}
"""Kinds of a job's children whose deletion the operator watches, by kind: (group, version, plural). The job is
reconciled at once and makes the child again, where a re-check by GET of every child of every job would cost
a read per child per period (117 a second at 1,000 jobs every 60 s). Not the store Secret (the operator may
not list or watch Secrets) nor the gang schedulers' PodGroups (their API may be absent): those are checked
again at the reconcile after the job created pods, and after the re-check period."""

WATCH_SELECTORS: dict[tuple[str, str], str] = {
    ("coordination.k8s.io", "leases"): contract.LEASE_SELECTOR,
    ("v1", "pods"): names.LABEL_JOB_NAME,
    **{
        (group or version, plural): names.LABEL_JOB_NAME
        for group, version, plural in WATCHED_CHILDREN.values()
    },
}
"""Label selectors of the operator's watches, by (group or version, plural): the only Leases, pods and children
its handlers take (every Lease handler filters on annotations or labels that these Leases carry; every pod and
child handler on the job's label)."""


def configure_kopf(kopf_settings: kopf.OperatorSettings, max_workers: int) -> None:
    """Our finalizer and storage prefix under phalanx.dev, quiet kopf Events, the thread count."""
    kopf_settings.persistence.finalizer = FINALIZER
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration"
    )
    # Our own Events tell the story; kopf's per-handler log Events would only add noise and writes.
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.execution.max_workers = max_workers
    # Asked of the API server, not filtered here: the handlers' own filters drop what they do not want only after
    # it arrived, and every node's heartbeat Lease (one every 10 s a node: 500/s at 5,000 nodes) and every pod of
    # the cluster would reach the operator for nothing.
    for resource, selector in WATCH_SELECTORS.items():
        kopf_settings.watching.label_selectors[resource] = selector


def register(
    registry: kopf.OperatorRegistry, settings: OperatorSettings, reconciler: JobReconciler
) -> JobQueue:
    """Register every handler of the operator on `registry`; returns the queue of the reconciles that watch events
    ask for."""

    max_workers = settings.max_workers
    handler_threads = HandlerThreads(max_workers)
    reconciler.metrics.reconcile_queue_depth.set_function(handler_threads.events.depth)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, max_workers)
        handler_threads.events.executor = settings.execution.executor

    @kopf.on.cleanup(registry=registry)
    def stop_periodic(**_: Any) -> None:
        handler_threads.periodic.shutdown(wait=False, cancel_futures=True)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same identity as the operator's own client (kubecredentials): a kubeconfig named by KUBECONFIG
        # wins over the pod's service account, which kopf alone would try first.
        if kubecredentials.source(os.environ) == "kubeconfig":
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_via_client(**kwargs)

    # Every index is async: each is a small summary of one object, computed on kopf's event loop. A sync one
    # costs each event a hop to a handler thread and back, queued behind whatever reconciles hold those threads,
    # so that a deleted pod would reach its job's index only after them.
    @kopf.index("pods", id="phalanx_pods", labels={names.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry)
    async def phalanx_pods(
        body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> dict[Any, Any]:
        return {(namespace, labels[names.LABEL_JOB_NAME]): observe.summarize_pod(dict(body))}

    @kopf.index(
        "coordination.k8s.io",
        "v1",
        "leases",
        id="phalanx_leases",
        annotations={HEARTBEAT_PHASE_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )
    async def phalanx_leases(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, Any]:
        # Async, as `lease_changed`: every worker's renewal comes through here, see there.
        return {(namespace, name): observe.summarize_lease(dict(body))}

    @kopf.index(
        "coordination.k8s.io",
        "v1",
        "leases",
        id="phalanx_hubs",
        annotations={beatsummary.SUMMARY_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )
    async def phalanx_hubs(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, Any]:
        # A job's heartbeat hub: one summary Lease for all its workers (operator/hubview.py).
        hub = hubview.read(dict(body))
        return {(namespace, name): hub} if hub is not None else {}

    @kopf.index("pods", id="phalanx_pod_jobs", labels={names.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry)
    async def phalanx_pod_jobs(
        namespace: str | None, name: str, labels: kopf.Labels, **_: Any
    ) -> dict[Any, Any]:
        # A heartbeat Lease is named after its pod: this finds the job a Lease event belongs to.
        return {(namespace, name): labels[names.LABEL_JOB_NAME]}

    @kopf.index(api.GROUP, api.VERSION, api.PLURAL, id="phalanx_job_histories", registry=registry)
    async def phalanx_job_histories(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        # Every job under one key: the automatic checkpoint interval weighs the cluster's failure history.
        return {CLUSTER_KEY: checkpointing.job_history(dict(body))}

    @kopf.index(api.GROUP, api.VERSION, api.PLURAL, id="phalanx_waiting_gangs", registry=registry)
    async def phalanx_waiting_gangs(body: kopf.Body, **_: Any) -> dict[Any, Any]:
        # The jobs whose gangs wait to be placed: each capacity check keeps room for those ranked before it.
        waiting = waiting_gang(dict(body))
        return {CLUSTER_KEY: waiting} if waiting is not None else {}

    @kopf.index("scheduling.k8s.io", "v1", "priorityclasses", id="phalanx_priorities", registry=registry)
    async def phalanx_priorities(body: kopf.Body, name: str, **_: Any) -> dict[Any, Any]:
        value = int(body.get("value") or 0)
        entries = {name: value}
        if body.get("globalDefault"):
            entries[GLOBAL_DEFAULT_PRIORITY] = value
        return entries

    wakeups = Wakeups(settings.reconcile_interval_seconds)
    # kopf's indexes (live objects, the same for every handler), for the reconciles a node's change asks for
    # from outside any handler. Empty until a handler has run: kopf runs none before every index has taken in its
    # first listing, and a reconcile from a half-filled pod index would make pods that exist again.
    indexes: dict[str, Any] = {}

    def run(
        name: str, namespace: str, logger: Any, watched: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not indexes:
            indexes.update({key: value for key, value in kwargs.items() if key.startswith("phalanx_")})
        plan = reconciler.reconcile(
            namespace,
            name,
            kwargs["phalanx_pods"],
            kwargs["phalanx_leases"],
            reconciler.nodes,  # not kopf's: operator/nodeview.py says why
            logger,
            histories=kwargs["phalanx_job_histories"].get(CLUSTER_KEY, ()),
            waiting=kwargs["phalanx_waiting_gangs"].get(CLUSTER_KEY, ()),
            priorities=kwargs["phalanx_priorities"],
            hubs=kwargs["phalanx_hubs"],
            watched=watched,
        )
        if plan is not None:
            # The indexes in kwargs are live: the wake-up reconciles with what is observed then. It goes through
            # the queue, so it holds no thread beyond the handler threads and joins a reconcile already waiting.
            wakeups.schedule(
                (namespace, name), plan.wake_after, lambda: queue_reconcile(name, namespace, logger, kwargs)
            )

    def ours(spec: kopf.Spec, **_: Any) -> bool:
        # A job another controller runs (`spec.managedBy`) gets no handler, so no finalizer or annotation either.
        return api.managed_here(dict(spec))

    @kopf.on.create(api.GROUP, api.VERSION, api.PLURAL, id="created", when=ours, registry=registry)
    @kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, id="updated", when=ours, registry=registry)
    @kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL, id="resumed", when=ours, registry=registry)
    def trainingjob_changed(name: str, namespace: str | None, logger: Any, **kwargs: Any) -> None:
        fence()  # kopf writes its own annotations after this handler: only the leader's may be written
        # Queued, as a child's event is: kopf takes the job's next event (and its entries in the job indexes)
        # only after this handler returns. A reconcile that fails is logged; the job's tick tries again.
        queue_reconcile(name, namespaced(namespace), logger, kwargs)

    def fence() -> None:
        check = getattr(reconciler.kube, "fence", None)  # (a test's stand-in for Kube may have none)
        if check is not None:
            check()

    @kopf.timer(
        api.GROUP,
        api.VERSION,
        api.PLURAL,
        interval=settings.reconcile_interval_seconds,
        id="tick",
        when=ours,
        registry=registry,
    )
    async def trainingjob_tick(name: str, namespace: str | None, logger: Any, **kwargs: Any) -> None:
        # Planned from kopf's copy of the job while that plan does nothing (quiettick.py).
        tick = functools.partial(run, name, namespaced(namespace), logger, watched=kwargs["body"], **kwargs)
        await asyncio.get_running_loop().run_in_executor(handler_threads.periodic, tick)

    @kopf.on.event("pods", id="pod_changed", labels={names.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry)
    async def pod_changed(
        namespace: str | None, labels: kopf.Labels, type: str | None, logger: Any, **kwargs: Any
    ) -> None:
        # A child changed (scheduled, running, finished): reconcile its job now rather than at the next tick.
        if type in ("MODIFIED", "DELETED"):
            kwargs.pop("name", None)  # the pod's name; the job's is its label
            queue_reconcile(labels[names.LABEL_JOB_NAME], namespaced(namespace), logger, kwargs)

    def watch_child(kind: str, group: str, version: str, plural: str) -> None:
        resource = (group, version, plural) if group else (version, plural)

        @kopf.on.event(
            *resource, id=f"{plural}_changed", labels={names.LABEL_JOB_NAME: kopf.PRESENT}, registry=registry
        )
        async def child_changed(
            namespace: str | None,
            name: str,
            labels: kopf.Labels,
            type: str | None,
            logger: Any,
            **kwargs: Any,
        ) -> None:
            # A child was deleted: its job makes it again now (the cascade after the job's own deletion finds
            # the job forgotten, and wakes nothing).
            namespace = namespaced(namespace)
            job_name = labels[names.LABEL_JOB_NAME]
            if type == "DELETED" and reconciler.kube.unverify(kind, namespace, name, job_name):
                logger.info(f"{kind} {name} of job {job_name} was deleted; making it again")
                queue_reconcile(job_name, namespace, logger, kwargs)

    for kind, (group, version, plural) in WATCHED_CHILDREN.items():
        watch_child(kind, group, version, plural)

    signals = HeartbeatSignals()

    @kopf.on.event(
        "coordination.k8s.io",
        "v1",
        "leases",
        id="lease_changed",
        annotations={HEARTBEAT_PHASE_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )
    async def lease_changed(
        namespace: str | None, name: str, body: kopf.Body, type: str | None, logger: Any, **kwargs: Any
    ) -> None:
        # Async, so a renewal is handled on kopf's event loop: a sync handler costs each event a hop to a
        # thread and back, and while a big gang's reconcile holds the interpreter each hop waits its turn
        # (about 0.1 ms idle, near 1 ms beside a busy thread), at one event per worker per interval.
        # A heartbeat that changes what the operator acts on (a promoted spare, a group that re-formed or
        # resumed, a finished worker): reconcile its job now. A mere renewal (step, timings) waits for the
        # timer, so heartbeats never multiply reconciles or status writes.
        namespace = namespaced(namespace)
        key = (namespace, name)
        if type == "DELETED":
            signals.forget(key)
            return
        summary = observe.summarize_lease(dict(body))
        changed = signals.changed(key, summary)
        job_name = _first(kwargs["phalanx_pod_jobs"].get(key))
        # Every heartbeat feeds the job's training-health history; only a signal changing state wakes it.
        if job_name is not None and reconciler.health.observe((namespace, job_name), name, summary):
            changed = True
        # The first sight of a Lease (the operator's start-up listing) is left to the resume handlers.
        if changed and type is not None and job_name is not None:
            queue_reconcile(job_name, namespace, logger, kwargs)

    def queue_reconcile(job_name: str, namespace: str, logger: Any, kwargs: dict[str, Any]) -> None:
        """Queue a reconcile of the job from a watch handler, to run on kopf's handler threads; never waited for,
        so the watched object's next event reaches its index at once (operator/jobqueue.py says why)."""
        if not handler_threads.events.wake(
            (namespace, job_name), functools.partial(run, job_name, namespace, logger, **kwargs)
        ):
            reconciler.metrics.reconciles_coalesced.inc()

    def node_changed(node: str) -> None:
        """A node turned NotReady, unreachable or tainted NoExecute, came back, or was deleted: reconcile the jobs
        with pods on it now (on the node view's thread; the reconciles go through the queue)."""
        if not indexes:
            return  # before kopf's first handler: the start-up (resume) reconciles look at every node
        logger_settings = kopf.OperatorSettings()
        for namespace, name in jobs_on_node(index_copy(indexes["phalanx_pods"]), node):
            logger = kopf.LocalObjectLogger(
                body=kopf.Body(
                    {
                        "apiVersion": api.API_VERSION,
                        "kind": api.KIND,
                        "metadata": {"namespace": namespace, "name": name},
                    }
                ),
                settings=logger_settings,
            )
            queue_reconcile(name, namespace, logger, indexes)

    if isinstance(reconciler.nodes, nodeview.NodeView):
        reconciler.nodes.on_change = node_changed

    hub_signals = HeartbeatSignals()
    # The settled hang verdict of each hub's last summary (touched on the event loop only).
    hub_verdicts: dict[tuple[str, str], datetime | None] = {}

    @kopf.on.event(
        "coordination.k8s.io",
        "v1",
        "leases",
        id="hub_changed",
        annotations={beatsummary.SUMMARY_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )
    async def hub_changed(
        namespace: str | None, name: str, body: kopf.Body, type: str | None, logger: Any, **kwargs: Any
    ) -> None:
        # A job's heartbeat hub published its summary (each interval): what `lease_changed` does for one Lease,
        # for every worker the summary stands for.
        namespace = namespaced(namespace)
        hub = hubview.read(dict(body))
        job_name = _first(kwargs["phalanx_pod_jobs"].get((namespace, name)))
        if type == "DELETED":
            hub_verdicts.pop((namespace, name), None)
        if type == "DELETED" or hub is None or job_name is None:
            return
        changed = False
        for pod, said in hubview.signals_of(hub).items():
            changed = hub_signals.changed((namespace, pod), said) or changed
        # A hang verdict waits until every peer renewed after it, which no signal change says: the summary that
        # shows it (the hub publishes one at once) wakes the job, once per verdict.
        settled = beatsummary.settled_verdict(hub.summary)
        if settled is not None and hub_verdicts.get((namespace, name)) != settled:
            changed = True
        hub_verdicts[(namespace, name)] = settled
        for pod, said in beatsummary.real_beats(hub.summary).items():
            changed = reconciler.health.observe((namespace, job_name), pod, said) or changed
        if changed and type is not None:
            queue_reconcile(job_name, namespace, logger, kwargs)

    @kopf.on.event(
        "coordination.k8s.io",
        "v1",
        "leases",
        id="view_canary",
        labels={viewclock.CANARY_LABEL: kopf.PRESENT},
        registry=registry,
    )
    async def view_canary(namespace: str | None, body: kopf.Body, type: str | None, **_: Any) -> None:
        # The operator's own canary came through the Lease watch: its view is current up to that renewal.
        renewed = parse_time((body.get("spec") or {}).get("renewTime"))
        if reconciler.view is not None and renewed is not None and type != "DELETED":
            reconciler.view.saw(namespaced(namespace), renewed)

    @kopf.on.event(
        queueing.GROUP,
        queueing.WORKLOAD_VERSION,
        "workloads",
        id="workload_changed",
        labels={queueing.JOB_UID_LABEL: kopf.PRESENT},
        registry=registry,
    )
    def workload_changed(
        namespace: str | None, body: kopf.Body, type: str | None, logger: Any, **kwargs: Any
    ) -> None:
        # Kueue admitted, evicted or finished a queued job's Workload: reconcile the job now. (Where Kueue is
        # not installed this watch waits, unserved, for its CRD.)
        workload = dict(body)
        job_name = queueing.owner_job(workload)
        if job_name is None or type is None:
            return  # another controller's, or the start-up listing (the resume handlers cover that)
        namespace = namespaced(namespace)
        if (
            workload["metadata"].get("deletionTimestamp")
            and reconciler.kube.get_job(namespace, job_name) is None
        ):
            # The job is gone and its pods with it: nothing holds the quota any more.
            reconciler.release_workload(workload)
            return
        kwargs.pop("name", None)  # the Workload's name; the job's is its owner's
        queue_reconcile(job_name, namespace, logger, kwargs)

    @kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, id="deleted", when=ours, registry=registry)
    def trainingjob_deleted(name: str, namespace: str | None, uid: str, **_: Any) -> None:
        # Children go with the job through their ownerReferences; only our own bookkeeping is left (and kopf's
        # removal of the finalizer, after the fence).
        fence()
        namespace = namespaced(namespace)
        reconciler.forget(namespace, name, uid)
        wakeups.cancel((namespace, name))
        reconciler.metrics.forget_job(namespace, name)
        reconciler.kube.forget(namespace, name)

    return handler_threads.events
