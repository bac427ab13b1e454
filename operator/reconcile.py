"""One reconcile of a TrainingJob as a pure function: (job, observed cluster state) -> Plan.

Level-based: the plan depends only on what is observed now (pods from the index, heartbeat Leases, nodes)
and on the job's last status, never on which event woke the operator. Running it twice, or after an
operator restart, asks for the same deterministic names, so nothing is ever duplicated.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from phalanx import contract
from phalanx.operator import (
    api,
    builders,
    capacity,
    checkpointing,
    conditions,
    detection,
    gang,
    health,
    hubview,
    incidents,
    names,
    policy,
    preflight,
    queueing,
    statusbudget,
    topology,
    trackmemory,
    trainerfacts,
    validation,
    viewclock,
)
from phalanx.operator import status as observe
from phalanx.operator.timeutil import format_micro_time, format_time, parse_time, parse_time_end

MAX_INCIDENTS = incidents.MAX_INCIDENTS
# Heartbeat phases of a worker that holds a slot in the training group.
ACTIVE_PHASES = observe.ACTIVE_PHASES
# Heartbeat phases of a worker inside a running group: its loss leaves that group broken.
GROUP_PHASES = contract.IN_GROUP_PHASES
MAX_REGROUP_REASON = 256
# Failure causes after which the failed pod's node is suspect: it went silent, and may be dead.
SILENT_CAUSES = (detection.NODE_LOST, detection.HEARTBEAT_TIMEOUT, detection.RENDEZVOUS_LOST)
# How long such a node stays suspect once it is no longer observed: the node controller has marked a dead node
# (and the scheduler skips it) long before this.
SUSPECT_NODE_SECONDS = 120
# A running pod whose heartbeat missed this many renewals (and at least this many seconds) marks its node quiet.
QUIET_RENEWALS = 2
MIN_QUIET_SECONDS = 2.0
# Seconds until the next reconcile of a job whose missing pods did not all fit in one batch.
NEXT_BATCH_SECONDS = 0.5
# Added to a regroup request's `before` unless the operator is configured otherwise (`Observed.clock_margin`).
REGROUP_CLOCK_MARGIN = timedelta(milliseconds=250)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the job, posted only after the status write succeeded."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    pods: tuple[str, ...] = ()
    """The pods a `CreatedPods` Event reports: it is posted after their creations, naming only those the
    API server accepted (`for_created`), and not at all when it accepted none."""

    def for_created(self, created: Collection[str]) -> Event | None:
        """The Event as posted once `created` are the pods whose creation succeeded."""
        if not self.pods:
            return self
        kept = tuple(pod for pod in self.pods if pod in created)
        return created_pods_event(kept) if kept else None


def created_pods_event(pods: Sequence[str]) -> Event:
    return Event("Normal", "CreatedPods", "created " + ", ".join(pods), tuple(pods))


@dataclass(frozen=True)
class Observed:
    """What the operator sees of one job's world."""

    pods: list[dict[str, Any]]
    """Summaries of every pod labelled with the job's name."""
    now: datetime
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Heartbeat summaries by pod name."""
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Labels of the nodes, by node name."""
    nodes: dict[str, dict[str, Any]] | None = None
    """Health of the nodes the job's pods are bound to (`status.summarize_node`), by node name; a bound
    node missing here was deleted. None: nodes are not observed (no node checks)."""
    health: health.History | None = None
    """The job's training-health history from its heartbeats (`health.HealthMonitor`). None: not observed
    (no health judgement; `status.health` and the `Healthy` condition stay as they are)."""
    cluster: checkpointing.ClusterHistory | None = None
    """The failure history of the cluster's other TrainingJobs (for `intervalSteps: auto`). None: not observed."""
    clock_margin: timedelta = REGROUP_CLOCK_MARGIN
    """Added to a regroup request's `before`: the failure time and a group's start come from different
    machines' clocks, so this is the skew tolerated between nodes. A group that re-formed by itself starts
    seconds after the failure, well beyond it."""
    capacity: capacity.ClusterView | None = None
    """Every node and what other TrainingJobs' pods hold on them, observed while the job's gang has no live
    pod (`capacity.gang_fit`). None: not observed (no capacity check)."""
    max_gang_pods: int | None = None
    """The operator's limit on pods per job (`maxGangPods`); None: no limit."""
    network_policy: builders.NetworkPolicySettings | None = None
    """The NetworkPolicy the operator gives each job; None: none (the chart's `networkPolicy.enabled` false)."""
    worker_lease_role: str | None = None
    """The ClusterRole bound to each job's workers for their heartbeat Leases (the chart's); None: the job's own
    Role grants them."""
    admission: validation.Admission | None = None
    """What the operator lets a template have (host paths, service accounts); None: not judged."""
    create_batch: int | None = None
    """Most pods of the job created by one reconcile (`createBatch`); None: all that are missing."""
    pacing: policy.ReplacementPacing | None = None
    """How fast pods replace failures that do not spend `maxRestarts` (the chart's back-off and hourly cap);
    None: at once, always."""
    workload: dict[str, Any] | None = None
    """The job's Kueue Workload (a job labelled `kueue.x-k8s.io/queue-name`); None: it has none."""
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The specs of the ResourceFlavors its admission names, by name."""
    priority: queueing.Priority = field(default_factory=lambda: queueing.Priority(0))
    """The priority a new Workload of the job gets (its WorkloadPriorityClass or PriorityClass)."""
    view_gaps: tuple[viewclock.Gap, ...] = ()
    """Stretches of time during which the operator's own view was stale (paused, restarted, a watch that
    stalled; `viewclock.ViewClock`), the one going on last: no heartbeat or progress clock counts them."""
    foreign: tuple[str, ...] = ()
    """What the last apply found of the objects the job needs existing under their names and owned by someone
    else (each a sentence); while any is, the condition `ChildrenOwned` is False and no pod is created."""
    hub: hubview.HubSummary | None = None
    """The job's heartbeat hub's latest summary (operator/hubview.py); None: the job has none, or it has not
    written one yet."""
    create_refused: str | None = None
    """The API server's answer to the job's latest refused pod creation (quota, LimitRange, admission: `pod X
    refused: 403 Forbidden: ...`), until a creation of the job succeeds; while its gang forms, the condition
    `GangScheduled` is False with reason `CreateRefused` and says it."""


@dataclass(frozen=True)
class Regroup:
    """One pod that leaves a running worker group (`_Builder.regroup`)."""

    before: datetime
    """When it failed (or was removed)."""
    reason: str
    pod: str
    uid: str | None


@dataclass
class Plan:
    """Everything one reconcile wants done, in the order the handler applies it."""

    ensure: list[dict[str, Any]] = field(default_factory=list)
    """Per-job objects created when missing (RBAC, Services, PodGroup)."""
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    force_delete_pods: list[str] = field(default_factory=list)
    """Pods deleted with grace 0 (node gone, frozen or hung: nothing left to save, peers must see it now)."""
    relabel_pods: dict[str, str] = field(default_factory=dict)
    """Pod name -> role label: labels follow the role torch gave the pod (a promoted spare is a worker)."""
    ungate_pods: list[str] = field(default_factory=list)
    """Pods released from the gang's scheduling gate (the whole gang exists now)."""
    workload_ops: list[queueing.WorkloadOp] = field(default_factory=list)
    """Writes to the job's Kueue Workload, before the pods' creations."""
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    detected: list[api.Incident] = field(default_factory=list)
    """Incidents opened by this reconcile (for metrics, counted once the status is stored)."""
    recovered: list[api.Incident] = field(default_factory=list)
    """Incidents closed by this reconcile."""
    spare_swaps: int = 0
    """Spares promoted into a worker's slot in this reconcile."""
    spares_lost: list[str] = field(default_factory=list)
    """Causes of the standby spares lost in this reconcile (failures, but no incident: for metrics)."""
    health: tuple[api.HealthSpec, health.Assessment] | None = None
    """The training-health judgement of this reconcile and the spec it used (the Lease handler judges
    heartbeats with them until the next reconcile)."""
    health_started: list[str] = field(default_factory=list)
    """Training-health signals that started in this reconcile (for metrics)."""
    health_reset: bool = False
    """Start the job's training-health history afresh (the job is suspended or over)."""
    suspend: bool = False
    """Set `spec.suspend` to true before the status write (a training-health signal's `Pause`)."""
    health_rollbacks: list[str] = field(default_factory=list)
    """Training-health signals whose `Rollback` this reconcile asked for (for metrics)."""
    health_restart: datetime | None = None
    """A rollback was asked for: once the status is stored, start the job's training-health history afresh
    and ignore heartbeats of worker groups started before this moment (the abandoned run)."""
    health_since: datetime | None = None
    """Heartbeats of worker groups started before this moment (the latest rollback's request) describe an
    abandoned run: the health monitor ignores them."""
    wake_after: float | None = None
    """Seconds until a worker's heartbeat or progress timeout may expire: reconcile the job again then, not
    at the next periodic reconcile (a heartbeat that only renews wakes nothing)."""
    delete_job: bool = False
    """Delete the TrainingJob itself (its `ttlSecondsAfterFinished` has passed): its pods and other objects go
    with it (owner references). Nothing else of the plan is applied."""


class _Builder:
    """Accumulates one reconcile's status changes and events."""

    def __init__(self, job: dict[str, Any], observed: Observed) -> None:
        self.job = job
        self.observed = observed
        self.now = observed.now
        self.generation = job["metadata"].get("generation")
        self.status = api.TrainingJobStatus.model_validate(job.get("status") or {})
        self.previous_workers = {worker.name: worker for worker in self.status.workers}
        self.plan = Plan()
        # The names in `plan.delete_pods` and `plan.force_delete_pods`, which only `delete` fills.
        self._deleting: set[str] = set()
        self._force_deleting: set[str] = set()
        self.trainers = [pod for pod in observed.pods if observe.is_trainer(pod)]
        """The job's trainer pods among those observed (workers and spares), in the observed order."""
        self.facts = trainerfacts.read_all(
            self.trainers, lambda pod: detection.heartbeat_of(pod, observed.leases)
        )
        """What this reconcile reads of each trainer (its own Lease judged once), in the same order."""
        # By the pod object's identity: `self.trainers` keeps every one of these pods alive for the whole
        # reconcile, so no other object can have one of their ids meanwhile.
        self._facts_of: dict[int, trainerfacts.Trainer] = {id(facts.pod): facts for facts in self.facts}
        self.regroups: list[Regroup] = []
        self.clocks_since = self.status.tracked.clocks_since if self.status.tracked is not None else None
        # `_tracks_of`'s index and the list it was built from (held, so its identity cannot be reused).
        self._track_index: dict[tuple[str, str | None], list[api.WorkerTrack]] = {}
        self._indexed: list[api.WorkerTrack] | None = None
        self._indexed_length = 0
        self.status.tracking = trackmemory.expand(
            self.status, self.trainers, self.heartbeat, job["metadata"]["name"], self.now
        )

    def condition(
        self,
        condition_type: str,
        value: bool,
        reason: str,
        message: str,
        event: Literal["Normal", "Warning"] | None = None,
    ) -> bool:
        self.status.conditions, changed = conditions.set_condition(
            self.status.conditions,
            condition_type,
            value,
            reason,
            message,
            now=self.now,
            generation=self.generation,
        )
        if changed and event is not None:
            self.event(event, reason, message)
        return changed

    def event(self, event_type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.plan.events.append(Event(event_type, reason, message))

    def delete(self, pods: list[dict[str, Any]], force: bool = False) -> None:
        """Delete pods (with grace 0 when `force`, even if already terminating); the operator is then done
        with them, so their going is never taken for a failure."""
        for pod in pods:
            name = observe.pod_name(pod)
            self.mark_done(name, pod["metadata"].get("uid"))
            if force:
                if name not in self._force_deleting:
                    self._force_deleting.add(name)
                    self.plan.force_delete_pods.append(name)
                if name in self._deleting:
                    self._deleting.discard(name)
                    self.plan.delete_pods.remove(name)
            elif not observe.is_terminating(pod) and not self.deleting(name):
                self._deleting.add(name)
                self.plan.delete_pods.append(name)

    def heartbeat(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod's own Lease (`detection.heartbeat_of`), judged once per trainer and reconcile."""
        facts = self._facts_of.get(id(pod))
        return facts.lease if facts is not None else detection.heartbeat_of(pod, self.observed.leases)

    def role(self, pod: dict[str, Any]) -> str:
        """The role the pod really plays by its own Lease (`status.observed_role`), read once per trainer."""
        facts = self._facts_of.get(id(pod))
        return facts.role if facts is not None else observe.observed_role(pod, self.heartbeat(pod))

    def deleting(self, pod_name: str) -> bool:
        """Whether this reconcile deletes the pod."""
        return pod_name in self._deleting or pod_name in self._force_deleting

    def wake_within(self, seconds: float) -> None:
        """Reconcile again at the latest `seconds` from now (an earlier wake-up already planned stands)."""
        wake = self.plan.wake_after
        self.plan.wake_after = seconds if wake is None else min(wake, seconds)

    def mark_done(self, pod_name: str, uid: str | None, kept: bool = False) -> None:
        for track in self._tracks_of(pod_name, uid):
            track.done = True
            track.kept = track.kept or kept

    def _tracks_of(self, pod_name: str, uid: str | None) -> list[api.WorkerTrack]:
        """The tracks of one pod, by an index of `status.tracking` rebuilt whenever the list is replaced or
        grows (deleting a whole 12,500-pod gang marks every pod done: one scan each would be quadratic)."""
        tracks = self.status.tracking
        if self._indexed is not tracks or self._indexed_length != len(tracks):
            index: dict[tuple[str, str | None], list[api.WorkerTrack]] = {}
            for track in tracks:
                index.setdefault((track.pod, track.uid), []).append(track)
            self._track_index, self._indexed, self._indexed_length = index, tracks, len(tracks)
        return self._track_index.get((pod_name, uid), [])

    def regroup(self, before: datetime, reason: str, departed: str, uid: str | None) -> None:
        """Ask the launchers to re-form groups started before `before` without the pod `departed` (of UID
        `uid`; one request per reconcile)."""
        self.regroups.append(Regroup(before, reason, departed, uid))

    def _write_regroup(self) -> None:
        if not self.regroups:
            return
        previous = self.status.regroup.epoch if self.status.regroup is not None else 0
        reason = "; ".join(dict.fromkeys(regroup.reason for regroup in self.regroups))
        if len(reason) > MAX_REGROUP_REASON:
            reason = reason[: MAX_REGROUP_REASON - 3] + "..."
        self.status.regroup = api.RegroupRequest(
            before=format_micro_time(
                max(regroup.before for regroup in self.regroups) + self.observed.clock_margin
            ),
            epoch=previous + 1,
            reason=reason,
            departed=sorted({regroup.pod for regroup in self.regroups}),
            departed_uids=sorted({regroup.uid for regroup in self.regroups if regroup.uid}),
        )

    def restart_clocks(self) -> None:
        """After an incident every survivor waits on the group: every no-progress clock starts over."""
        detection.restart_clocks(self.status.tracking, self.now)
        self.clocks_since = format_time(self.now)

    def finish(self) -> Plan:
        self._write_regroup()
        # The whole status stays under its budget, whatever the gang's size (operator/statusbudget.py).
        self.status.incidents, room_for_tracks = statusbudget.fit(self.status)
        self.status.tracking, self.status.tracked = trackmemory.compact(
            self.status.tracking,
            self.trainers,
            self.heartbeat,
            self.job["metadata"]["name"],
            self.clocks_since,
            self.now,
            budget_bytes=room_for_tracks,
        )
        if queueing.queue_name(self.job) is not None and _terminal(self):
            # Kueue frees the quota of a finished Workload; the finalizer goes with the last running pod.
            succeeded = conditions.is_true(self.status.conditions, conditions.SUCCEEDED)
            outcome = conditions.find(
                self.status.conditions, conditions.SUCCEEDED if succeeded else conditions.FAILED
            )
            message = outcome.message if outcome is not None else "the job is over"
            self.plan.workload_ops = queueing.finish(
                self.job, self.observed.workload, succeeded, message, _pods_left(self), format_time(self.now)
            )
        self.status.observed_generation = self.generation
        finished = parse_time(self.status.completion_time)
        # Percent while running (no status write per timer tick), full precision once finished.
        self.status.goodput = incidents.goodput(
            self.status.start_time,
            finished or self.now,
            self.status.recovery_seconds,
            self.status.incidents,
            digits=4 if finished is not None else 2,
        )
        self.plan.status = self.status.to_wire()
        return self.plan


def _trainer_name(spec: api.TrainingJobSpec | None, job: dict[str, Any]) -> str:
    if spec is not None:
        return spec.trainer_container
    chosen = (job.get("spec") or {}).get("trainerContainer")
    return chosen if isinstance(chosen, str) and chosen else names.TRAINER_CONTAINER


def _observe_into_status(b: _Builder, spec: api.TrainingJobSpec | None, trainer: str, desired: int) -> None:
    trainers = b.trainers
    visible = [pod for pod in trainers if not observe.is_terminating(pod)]
    b.status.replicas = observe.replica_counts(desired, trainers, trainer)
    b.status.ready_workers = f"{b.status.replicas.ready}/{desired}"
    b.status.selector = names.active_worker_selector(b.job["metadata"]["name"])
    topology_spec = spec.topology if spec is not None else None
    b.status.workers, b.status.unlisted_workers = observe.worker_statuses(
        visible, b.observed.leases, b.observed.node_labels, topology_spec
    )
    step = observe.latest_step(trainers, b.observed.leases)
    if step is not None:
        # The heartbeats' word, even if lower: a job resumed without a durable checkpoint starts again.
        b.status.step = step
    heartbeat = spec.heartbeat if spec is not None else api.HeartbeatSpec()
    progress = observe.progress_kind(
        trainers,
        b.observed.leases,
        b.status.step,
        b.status.progress,
        b.now,
        heartbeat.progress_timeout_seconds,
    )
    if progress == observe.PROGRESS_UNKNOWN and b.status.progress != progress:
        b.event(
            "Normal",
            conditions.REASON_PROGRESS_UNKNOWN,
            f"the workers have trained for {heartbeat.progress_timeout_seconds}s (the progress timeout) and "
            "published no step: progress is unknown, so no stall is ever called a hang; heartbeats and exits "
            "still are judged (phalanx.worker.session publishes steps)",
        )
    b.status.progress = progress  # type: ignore[assignment]


def _terminal(b: _Builder) -> bool:
    if conditions.is_true(b.status.conditions, conditions.SUCCEEDED):
        return True
    failed = conditions.find(b.status.conditions, conditions.FAILED)
    return failed is not None and failed.status == "True" and failed.reason != conditions.REASON_INVALID_SPEC


def _finish_job(b: _Builder, succeeded: bool, reason: str, message: str) -> None:
    """Mark the job done and remove what it no longer needs (spares, rendezvous; every live pod on failure)."""
    if succeeded:
        b.condition(conditions.SUCCEEDED, True, reason, message, "Normal")
        b.condition(conditions.FAILED, False, conditions.REASON_NOT_FAILED, "the job has not failed")
        b.status.state = "Succeeded"
    else:
        b.condition(conditions.FAILED, True, reason, message, "Warning")
        b.status.state = "Failed"
    b.condition(conditions.RUNNING, False, reason, message)
    _not_degraded_once_finished(b)
    b.status.completion_time = b.status.completion_time or format_time(b.now)
    if conditions.is_true(b.status.conditions, conditions.RECOVERING):
        b.condition(conditions.RECOVERING, False, reason, message)
    _clean_up_finished(b, succeeded)
    b.status.tracking = []
    b.status.rendezvous = None
    # The job is over: nothing is left to re-form.
    b.regroups.clear()


def _not_degraded_once_finished(b: _Builder) -> None:
    """A finished job is never Degraded: its spares leave (and its workers end) because it is over."""
    if conditions.find(b.status.conditions, conditions.DEGRADED) is None:
        return
    finished = conditions.find(b.status.conditions, conditions.SUCCEEDED)
    if finished is None or finished.status != "True":
        finished = conditions.find(b.status.conditions, conditions.FAILED)
    reason = finished.reason if finished is not None else conditions.REASON_FINISHED
    b.condition(conditions.DEGRADED, False, reason, "the job is over")


def _clean_up_finished(b: _Builder, succeeded: bool) -> None:
    # Finished workers stay for their logs; what still runs goes.
    for pod in b.observed.pods:
        spare = observe.role(pod) == names.ROLE_SPARE
        running_worker = observe.is_trainer(pod) and not succeeded and observe.is_live(pod)
        if observe.is_rendezvous(pod) or spare or running_worker:
            b.delete([pod])


def _force_delete_on_lost_nodes(b: _Builder) -> None:
    """Pods on a lost node never finish terminating (no kubelet): remove them now (rendezvous too)."""
    for pod in b.observed.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if detection.node_problem(node, b.observed.nodes) is not None and (
            observe.is_terminating(pod) or observe.is_rendezvous(pod)
        ):
            b.delete([pod], force=True)


def _in_group(pod: dict[str, Any] | None, failure_spare: bool, b: _Builder) -> bool:
    """Whether the pod held a place in a running worker group (its loss breaks that group), or was joining
    one (a promoted spare, a worker re-forming: the round must not wait for its keep-alive to lapse): its last
    heartbeat says so; without one (heartbeats off, pod gone), an active worker is assumed to. A spare whose
    loss overlaps a recovery (`_overlapping_spares`) may be joining whatever its heartbeat says."""
    if failure_spare:
        return False
    lease = b.heartbeat(pod) if pod is not None else None
    if lease is None or not lease.get("phase"):
        return True
    if pod is not None and observe.role(pod) == names.ROLE_SPARE:
        return True
    return lease.get("phase") in (*GROUP_PHASES, observe.JOINING_PHASE)


def _decisions(
    failures: list[detection.Failure], spec: api.TrainingJobSpec
) -> list[tuple[detection.Failure, policy.Decision]]:
    """Each failure with its decision. A permanent failure ends the job: when one is among them, it alone
    is handled, since the other workers' failures seen with it (a peer that exited the same way, a pod the
    operator already removed) cannot change that and must not spend restarts or open incidents."""
    decided = [(failure, policy.decide(failure, spec.failure_policy)) for failure in failures]
    fatal = [(failure, decision) for failure, decision in decided if decision.action == "FailJob"]
    return fatal[:1] or decided


def _follow_preflight(b: _Builder, spec: api.TrainingJobSpec) -> bool:
    """The preflight's progress into `status.preflight` and `PreflightPassed`; True when it failed, which
    fails the job (its pods are removed before they spend more of the allocation)."""
    if not spec.preflight.enabled:
        return False
    current = b.status.preflight
    if current is not None and current.state == "Passed":
        return False
    trainers = b.trainers
    told = preflight.outcome(trainers, b.observed.leases)
    if told is None:
        running = current or api.PreflightStatus(
            state="Running",
            reason=preflight.REASON_RUNNING,
            message=preflight.running_message(spec.preflight),
        )
        b.status.preflight = running
        if _preflight_restarted(b) or any(
            preflight.planned_restart(b.heartbeat(pod)) for pod in trainers if observe.is_live(pod)
        ):
            # Its own Event, once: the group re-forms on purpose, no failure's story.
            message = preflight.restart_message(spec.preflight)
            if not _preflight_restarted(b):
                b.event("Normal", preflight.REASON_RESTART, message)
            b.condition(conditions.PREFLIGHT_PASSED, False, preflight.REASON_RESTART, message)
        else:
            b.condition(conditions.PREFLIGHT_PASSED, False, preflight.REASON_RUNNING, running.message)
        return False
    if told.state == "Passed":
        _record_preflight(b, told)
        return False
    _preflight_failed(b, told)
    return True


def _preflight_restarted(b: _Builder) -> bool:
    """Whether the preflight's planned restart began and its verdict is still to come."""
    condition = conditions.find(b.status.conditions, conditions.PREFLIGHT_PASSED)
    return (
        condition is not None and condition.status == "False" and condition.reason == preflight.REASON_RESTART
    )


def _planned_regroup(b: _Builder) -> bool:
    """The group re-forms for the preflight's planned restart, and no failure is being recovered: workers not
    yet back in the group are not missing."""
    return _preflight_restarted(b) and not any(incidents.is_open(incident) for incident in b.status.incidents)


def _preflight_swap(b: _Builder, lease: dict[str, Any]) -> bool:
    """Whether a spare that now trains took its place in the group the preflight's planned restart formed
    (torch's reshuffle, not a promotion): no failure is being recovered, and the preflight restarted and has
    no verdict yet, or passed after the spare's group formed (the verdict may come before its relabel)."""
    if any(incidents.is_open(incident) for incident in b.status.incidents):
        return False
    if _preflight_restarted(b):
        return True
    done = b.status.preflight
    passed = parse_time_end(done.finished_at) if done is not None and done.state == "Passed" else None
    started = parse_time(lease.get("group-started"))
    return passed is not None and started is not None and started <= passed


def _record_preflight(b: _Builder, told: preflight.Outcome) -> str:
    """The outcome into `status.preflight` and `PreflightPassed` (an Event); returns the message."""
    b.status.preflight = api.PreflightStatus(
        state=told.state,
        reason=told.reason,
        message=told.message,
        pod=told.pod,
        finished_at=format_time(b.now),
    )
    text = f"{told.message} (pod {told.pod})"
    passed = told.state == "Passed"
    b.condition(conditions.PREFLIGHT_PASSED, passed, told.reason, text)
    # Once per job (the outcome is final): False -> False with another reason would post no Event.
    b.event("Normal" if passed else "Warning", told.reason, text)
    return text


def _preflight_failed(b: _Builder, told: preflight.Outcome) -> None:
    """Record the preflight's failure and fail the job."""
    text = _record_preflight(b, told)
    _finish_job(b, False, preflight.REASON_FAILED, f"the preflight failed ({told.reason}): {text}")


def _training_finished(b: _Builder, trainer: str) -> bool:
    """Whether some active worker finished training (exited 0, or its heartbeat says `finished`)."""
    return _completed(b, trainer)[0] or _a_heartbeat_says_finished(b)


def _a_heartbeat_says_finished(b: _Builder) -> bool:
    return any(trainer.lease_phase == contract.PHASE_FINISHED for trainer in b.facts)


def _handle_failures(b: _Builder, spec: api.TrainingJobSpec, trainer: str) -> bool:
    """Detect failures, apply the failure policy, start recoveries; True when the job failed.

    Each pod's failure is handled once (its track is marked done), so a slow deletion never spends the
    restart budget twice; a pod the operator is done with but that still exists is deleted again. A handled
    failure of a worker inside a running group asks the launchers to re-form (`status.regroup`).
    """
    trainers = b.trainers
    known = {(track.pod, track.uid) for track in b.status.tracking}
    # The tracks were read from the job's status and rebuilt by this reconcile: its own to update.
    b.status.tracking = detection.update_tracks(
        b.status.tracking,
        trainers,
        b.observed.leases,
        spec.heartbeat,
        trainer,
        b.now,
        in_place=True,
        facts=b.facts,
    )
    _force_delete_on_lost_nodes(b)
    failures = detection.detect(
        trainers,
        b.observed.leases,
        b.observed.nodes,
        b.status.tracking,
        known,
        spec.heartbeat,
        trainer,
        b.now,
        b.observed.view_gaps,
        facts=b.facts,
    )
    detection.sync_restarts(b.status.tracking, trainers, trainer)
    heartbeat_deadline = detection.next_heartbeat_deadline(
        trainers,
        b.observed.leases,
        b.status.tracking,
        spec.heartbeat,
        b.now,
        b.observed.view_gaps,
        facts=b.facts,
    )
    if heartbeat_deadline is not None:
        b.wake_within(heartbeat_deadline)
    hub_gap_closes = hubview.gap_closes_in(
        b.observed.hub, b.now, spec.heartbeat.interval_seconds, spec.heartbeat.timeout_seconds
    )
    if hub_gap_closes is not None:
        b.wake_within(hub_gap_closes)
    _delete_again(b, trainers, spec.heartbeat)
    disrupted = False
    pods = {observe.pod_name(pod): pod for pod in trainers}
    step_seconds = [
        seconds
        for facts in b.facts
        if (seconds := detection.lease_number(facts.lease, "step-seconds")) is not None
    ]
    unreported = incidents.unreported_steps(spec.heartbeat.interval_seconds, step_seconds)
    if _training_finished(b, trainer):
        # Training has finished: a standby spare ending now (its rendezvous closed) is no failure.
        for failure in [failure for failure in failures if failure.spare]:
            b.mark_done(failure.pod, failure.uid, kept=True)
        failures = [failure for failure in failures if not failure.spare]
    failures = _overlapping_spares(b, failures)
    for failure, decision in _decisions(failures, spec):
        pod = pods.get(failure.pod)
        if decision.action in incidents.WORKER_ACTIONS and failure.spare:
            if _standby_spare(pod, b):
                _replace_spare(b, failure, decision, pod)
                continue
            failure = replace(failure, spare=False)
        step = _step_at_failure(b, trainers, failure.occurred_at)
        incident = incidents.open_incident(failure, decision, b.now, step, unreported)
        b.status.incidents = incidents.append(b.status.incidents, incident)
        b.plan.detected.append(incident)
        b.event("Warning", failure.cause, incidents.detected_text(incident))
        message = f"{failure.message} (rule {decision.rule})"
        if decision.action == "FailJob":
            b.mark_done(failure.pod, failure.uid)
            if spec.preflight.enabled and failure.exit_code == preflight.LAUNCHER_EXIT_FAILED:
                # The heartbeat that says why was lost: the exit code still says it was the preflight.
                _preflight_failed(
                    b, preflight.Outcome("Failed", preflight.REASON_FAILED, message, failure.pod)
                )
                return True
            _finish_job(b, False, conditions.REASON_PERMANENT_FAILURE, message)
            return True
        if decision.action == "Ignore":
            if failure.alive and failure.cause != detection.CONTAINER_RESTART:
                # A heartbeat class: judged afresh later, not forgotten for good.
                detection.restart_clocks(
                    [t for t in b.status.tracking if t.pod == failure.pod and t.uid == failure.uid], b.now
                )
            elif not failure.alive:
                b.mark_done(failure.pod, failure.uid, kept=True)
            continue
        budget = policy.spend(b.status.restarts, decision, failure.cause, spec.failure_policy.max_restarts)
        b.status.restarts = budget.restarts
        if not budget.allowed:
            b.mark_done(failure.pod, failure.uid)
            _finish_job(b, False, conditions.REASON_RESTARTS_EXCEEDED, f"{message}; {budget.message}")
            return True
        if not decision.counts:
            _record_uncounted(b)
        disrupted = disrupted or not failure.spare
        if _in_group(pod, failure.spare, b):
            b.regroup(
                failure.occurred_at or b.now, f"{failure.cause} of {failure.pod}", failure.pod, failure.uid
            )
        b.mark_done(failure.pod, failure.uid)
        if decision.action == "RestartJob":
            b.delete(trainers, force=failure.force)
        elif pod is not None:
            b.delete(
                [pod],
                force=failure.force or detection.node_problem(failure.node, b.observed.nodes) is not None,
            )
    disrupted = _follow_rendezvous(b, unreported) or disrupted
    if disrupted:
        b.restart_clocks()
    return False


def _overlapping_spares(b: _Builder, failures: list[detection.Failure]) -> list[detection.Failure]:
    """A spare lost while a worker's failure is being recovered from may be the one torch is promoting into
    the failed worker's place, though its Lease (renewed a moment after each change, and read later still)
    says it stood by: failures that overlap are recovered from together, so it counts as a worker's (an
    incident open until training resumed after it, its node dropped from the rendezvous)."""
    recovering = any(
        incidents.is_open(incident) and incident.action in incidents.WORKER_ACTIONS
        for incident in b.status.incidents
    ) or any(not failure.spare for failure in failures)
    if not recovering:
        return failures
    return [replace(failure, spare=False) if failure.spare else failure for failure in failures]


def _standby_spare(pod: dict[str, Any] | None, b: _Builder) -> bool:
    """Whether a failed spare stood by, outside every worker group. A spare whose heartbeat says
    `rendezvous` is being taken into a group (torch promotes it): its loss breaks the group forming."""
    lease = b.heartbeat(pod) if pod is not None else None
    return (lease or {}).get("phase") != contract.PHASE_RENDEZVOUS


def _replace_spare(
    b: _Builder, failure: detection.Failure, decision: policy.Decision, pod: dict[str, Any] | None
) -> None:
    """A standby spare lost: delete it (the pool is refilled by `_plan_pods`). Training was not disrupted,
    so it is no restart, no incident and no regroup; a Warning when the cause is one the policy charges to
    the job (it may come back with every spare), else Normal."""
    b.mark_done(failure.pod, failure.uid)
    if pod is not None:
        b.delete(
            [pod], force=failure.force or detection.node_problem(failure.node, b.observed.nodes) is not None
        )
    if not decision.counts:
        _record_uncounted(b)
    b.plan.spares_lost.append(failure.cause)
    where = f" on node {failure.node}" if failure.node else ""
    b.event(
        "Warning" if decision.counts else "Normal",
        conditions.REASON_SPARE_REPLACED,
        f"standby spare {failure.pod} lost{where} ({failure.cause}: {failure.message}); a new spare refills "
        "the pool; training was not disrupted, no restart is counted",
    )


def _record_uncounted(b: _Builder) -> None:
    """Remember a replacement that spends no `maxRestarts`: the operator's pacing counts them."""
    if b.observed.pacing is not None:
        b.status.restarts.uncounted_times = policy.record_uncounted(
            b.status.restarts.uncounted_times, b.now, b.observed.pacing
        )


def _replacements_held(b: _Builder, missing: int) -> str | None:
    """Why the pods replacing failed ones wait (the pacing of uncounted replacements), or None: created now.
    Only replacements wait: the gang's first pods, and those of a gang created again, never do."""
    pacing = b.observed.pacing
    if pacing is None or not missing or b.status.gang.scheduled_time is None:
        return None
    times = b.status.restarts.uncounted_times
    due = policy.next_replacement_at(times, b.now, pacing)
    if due is None:
        return None
    b.wake_within((due - b.now).total_seconds())
    return (
        f"{len(policy.recent_times(times, b.now))} replacements in the last hour did not spend maxRestarts (exits 3, 137 or 143, lost nodes, "
        f"evictions; {pacing.free_per_hour} an hour are replaced at once, at most {pacing.cap_per_hour}): "
        f"the next {missing} pods are created at {format_time(due)}"
    )


def _follow_rendezvous(b: _Builder, unreported: int) -> bool:
    """The loss of the rendezvous pod while the job runs is an incident (never charged to the user's
    restart budget); the pod is recreated by `_plan_pods`. True when one was lost."""
    container = names.RENDEZVOUS_CONTAINER
    failure = detection.rendezvous_failure(
        b.observed.pods, b.status.rendezvous, b.observed.nodes, container, b.now
    )
    if failure is not None and failure.node_conditions:
        failure = _dated_by_later_signs_of_life(b, failure)
    if failure is not None:
        incident = incidents.open_incident(failure, None, b.now, b.status.step, unreported)
        b.status.incidents = incidents.append(b.status.incidents, incident)
        b.plan.detected.append(incident)
        b.event("Warning", failure.cause, incidents.detected_text(incident))
        restarts = b.status.restarts.model_copy(deep=True)
        restarts.total += 1
        restarts.by_cause[failure.cause] = restarts.by_cause.get(failure.cause, 0) + 1
        b.status.restarts = restarts
        # Watched again once a new one runs (`_remember_rendezvous`).
        b.status.rendezvous = None
        return True
    return False


def _dated_by_later_signs_of_life(b: _Builder, failure: detection.Failure) -> detection.Failure:
    """A rendezvous pod lost with its node has no heartbeat of its own, and the node's last Ready heartbeat may
    be minutes old (a node reports its status on a change or every few minutes; its Lease is what renews).
    Dated from it, the job's first group looked like one formed after the loss and closed the incident as
    "resumed from step 0 (none)" with every step lost. Two later signs of life bound the loss from below: every
    group the workers report formed through a rendezvous alive then (none can form through a new one before
    this loss is seen), and a heartbeat from a pod on the same node says the node was up when it was renewed."""
    signs = []
    for pod in b.trainers:
        if (lease := b.heartbeat(pod)) is None:
            continue
        signs.append(parse_time(lease.get("group-started")))
        if failure.node is not None and (pod.get("spec") or {}).get("nodeName") == failure.node:
            signs.append(parse_time_end(lease.get("renewTime")))
    latest = max((sign for sign in signs if sign is not None and sign <= b.now), default=None)
    if latest is None or (failure.occurred_at is not None and failure.occurred_at >= latest):
        return failure
    return replace(failure, occurred_at=latest)


def _remember_rendezvous(b: _Builder) -> None:
    """Once the gang runs, remember the running rendezvous pod, so its loss is noticed later."""
    running = b.status.gang.scheduled_time is not None
    found = detection.rendezvous_memory(b.observed.pods, b.observed.nodes, names.RENDEZVOUS_CONTAINER)
    b.status.rendezvous = found if running else None


def _step_at_failure(b: _Builder, trainers: list[dict[str, Any]], failed_at: datetime | None) -> int | None:
    """The job's step when a failure happened. torch may have re-formed the group before the operator saw
    the failure (the failed member's rendezvous keep-alive lapsed first): the new group's steps then count
    in the job's step, and taking them as the step the failure stopped training at would count as lost the
    steps trained since. Then it is the highest step heard from a group formed no later than the failure."""
    if failed_at is None:
        return b.status.step
    before: list[int] = []
    re_formed = False
    for pod in trainers:
        lease = b.heartbeat(pod)
        started = parse_time((lease or {}).get("group-started"))
        step = detection.lease_step(lease)
        if started is None or step is None:
            continue
        if started > failed_at:
            re_formed = True
        else:
            before.append(step)
    return max(before) if re_formed and before else b.status.step


def _delete_again(b: _Builder, trainers: list[dict[str, Any]], heartbeat: api.HeartbeatSpec) -> None:
    """A pod whose failure was handled but which is still there (a deletion that failed): delete it again,
    with grace 0 when it cannot save anyway (node lost, heartbeat silent)."""
    done = {(track.pod, track.uid) for track in b.status.tracking if track.done and not track.kept}
    if not done:
        return
    for pod in trainers:
        if (observe.pod_name(pod), pod["metadata"].get("uid")) not in done or observe.is_terminating(pod):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        silence = detection.heartbeat_age(b.heartbeat(pod), b.now, b.observed.view_gaps)
        silent = silence is not None and silence > heartbeat.timeout_seconds
        b.delete([pod], force=silent or detection.node_problem(node, b.observed.nodes) is not None)


def _beat(step: int, lease: dict[str, Any]) -> incidents.Beat:
    """A worker's heartbeat as the incidents read it (empty annotations mean unknown)."""
    restored = detection.lease_number(lease, "restored-step")
    return incidents.Beat(
        step=step,
        renewed=parse_time(lease.get("renewTime")),
        group_started=parse_time(lease.get("group-started")),
        resumed_at=parse_time(lease.get("resumed-at")),
        restored_step=None if restored is None else int(restored),
        restored_from=lease.get("restore-source") or None,
        active=lease.get("phase") in ACTIVE_PHASES,
    )


def _follow_progress(b: _Builder, spec: api.TrainingJobSpec) -> None:
    """Close incidents once training passed the step they stopped it at; set the Recovering condition."""
    doing = set(b.plan.delete_pods) | set(b.plan.force_delete_pods)
    # Only an open incident reads the heartbeats: a healthy big gang's reconcile builds none.
    any_open = any(incidents.is_open(incident) for incident in b.status.incidents)
    beats = [
        _beat(step, lease)
        for facts in (b.facts if any_open else ())
        if facts.exists_unfinished
        and facts.name not in doing
        and (lease := facts.lease) is not None
        and facts.lease_phase in (*ACTIVE_PHASES, observe.JOINING_PHASE, contract.PHASE_STANDBY)
        and (step := detection.lease_step(lease)) is not None
    ]
    progress = incidents.observe_progress(b.status.incidents, beats, b.now)
    b.status.incidents = progress.incidents
    b.status.recovery_seconds = round(b.status.recovery_seconds + progress.recovery_seconds, 1)
    for incident in progress.recovered:
        b.plan.recovered.append(incident)
        b.event("Normal", conditions.REASON_RECOVERED, incidents.recovered_text(incident))
    still_open = [incident for incident in b.status.incidents if incidents.is_open(incident)]
    if still_open:
        newest = still_open[-1]
        past_step = f" past step {newest.detected_step}" if newest.detected_step is not None else ""
        message = (
            f"{newest.action} after {newest.cause} of {newest.worker} (detected {newest.detected_at}); "
            f"waiting for training to advance{past_step}"
        )
        b.condition(conditions.RECOVERING, True, newest.cause, message)
    elif progress.recovered:
        b.condition(
            conditions.RECOVERING,
            False,
            conditions.REASON_RECOVERED,
            incidents.recovered_text(progress.recovered[-1]),
        )
    elif conditions.find(b.status.conditions, conditions.RECOVERING) is None:
        b.condition(
            conditions.RECOVERING, False, conditions.REASON_NO_INCIDENT, "no failure is being recovered"
        )


def _follow_checkpoint_interval(b: _Builder, spec: api.TrainingJobSpec) -> None:
    """The durable-checkpoint interval in force (`checkpointing.choose`) into `status.checkpoint`, with an
    Event when it changes. The launchers pass an `auto` interval on to their trainers."""
    leases = [
        facts.lease
        for facts in b.facts
        if facts.exists_unfinished and facts.lease is not None and facts.lease_phase in GROUP_PHASES
    ]
    recent = b.observed.health.samples[-checkpointing.RECENT_STEPS :] if b.observed.health is not None else []
    started = parse_time(b.status.start_time)
    measured = checkpointing.Measurements(
        save_seconds=checkpointing.save_seconds_from(
            [detection.lease_number(lease, "checkpoint-save-seconds") for lease in leases]
        ),
        step_seconds=checkpointing.step_seconds_from(
            [sample.step_seconds for sample in recent],
            [detection.lease_number(lease, "step-seconds") for lease in leases],
        ),
        failures=b.status.restarts.total,
        running_seconds=(b.now - started).total_seconds() if started is not None else 0.0,
        workers=b.status.replicas.desired or spec.replicas,
        cluster=b.observed.cluster,
    )
    previous = b.status.checkpoint
    passed_over = previous.skipped if previous is not None else None
    if previous is not None:
        # The interval is chosen on its own figures: the checkpoints passed over are followed below.
        previous = previous.model_copy(update={"skipped": None})
    decision = checkpointing.choose(spec.checkpoint, previous, measured)
    b.status.checkpoint = decision.status
    if decision.event is not None:
        b.event("Normal", checkpointing.REASON_CHECKPOINT_INTERVAL, decision.event)
    _follow_skipped_checkpoints(b, decision.status, passed_over)


def _follow_skipped_checkpoints(
    b: _Builder, checkpoint: api.CheckpointStatus, previous: list[api.SkippedCheckpoint] | None
) -> None:
    """The checkpoints the workers' restores passed over (their heartbeats' `checkpoint-skipped`) into
    `status.checkpoint.skipped`, with one Warning Event naming those it did not name yet."""
    reported = [
        api.SkippedCheckpoint(**entry, pod=observe.pod_name(pod), seen_at=format_time(b.now))
        for pod in sorted(b.trainers, key=observe.pod_name)
        for entry in observe.skipped_checkpoints(b.heartbeat(pod))
    ]
    followed = checkpointing.follow_skipped(previous, reported)
    checkpoint.skipped = followed.entries
    if followed.event is not None:
        b.event("Warning", checkpointing.REASON_CHECKPOINT_SKIPPED, followed.event)


def _follow_health(b: _Builder, spec: api.HealthSpec, resumed: bool) -> None:
    """Training-health verdicts (`health.evaluate`) into `status.health`, the `Healthy` condition, one
    Event per signal that starts, and the signal's action.

    A signal's message keeps the numbers it started with, so an active signal causes no status write per
    reconcile. A signal whose windows lack data (`unknown`) keeps its last state. A resumed job is judged
    afresh on its own heartbeats (its history restarts while it is suspended)."""
    if resumed and b.status.health is not None:
        b.status.health = api.HealthStatus(
            baseline_step_seconds=b.status.health.baseline_step_seconds,
            baseline_steps=b.status.health.baseline_steps,
            rollbacks=b.status.health.rollbacks,
            last_rollback=b.status.health.last_rollback,
        )
        b.status.conditions = [c for c in b.status.conditions if c.type != conditions.HEALTHY]
    if b.observed.health is None:
        return
    previous = b.status.health or api.HealthStatus()
    assessment = health.evaluate(b.observed.health, spec, health.baseline_from_status(previous))
    b.plan.health = (spec, assessment)
    before = {signal.reason: signal for signal in previous.signals}
    signals: list[api.HealthSignal] = []
    started: list[api.HealthSignal] = []
    for verdict in assessment.verdicts:
        old = before.get(verdict.signal)
        if verdict.state == "active" and old is None:
            new = api.HealthSignal(
                reason=verdict.signal,
                message=verdict.message,
                since=format_time(b.now),
                since_step=verdict.since_step,
            )
            started.append(new)
            signals.append(new)
        elif old is not None and verdict.state != "clear":
            signals.append(old)
    status = previous.model_copy(update={"signals": signals})
    if assessment.baseline is not None:
        status.baseline_step_seconds = round(assessment.baseline.seconds, 6)
        status.baseline_steps = assessment.baseline.steps
    actions = {signal.reason: health.action_of(spec, signal.reason) for signal in started}
    for signal in started:
        b.plan.health_started.append(signal.reason)
        b.event("Warning", signal.reason, signal.message)
    pausing = [signal for signal in started if actions[signal.reason] == "Pause"]
    rolling = [signal for signal in started if actions[signal.reason] == "Rollback"]
    rolled_back = None
    if rolling and not pausing:
        # One rollback for every signal that starts at once, to before the earliest anomaly.
        first = min(rolling, key=lambda signal: (signal.since_step is None, signal.since_step or 0))
        seen = [sample.step for sample in b.observed.health.samples]
        decision = health.decide_rollback(spec, status, b.status.rollback, first, b.status.step, b.now, seen)
        if decision.action == "Rollback" and decision.request is not None:
            for signal in rolling:
                signal.action = "Rollback"
            rolled_back = _roll_back(b, status, decision, rolling, spec.rollback.max_rollbacks)
        else:
            _pause(b, status, first, decision.event)
    for signal in pausing[:1]:
        _pause(
            b,
            status,
            signal,
            f"suspending the job after {signal.reason} (action Pause): the workers save a checkpoint and "
            "stop; set spec.suspend to false to resume",
        )
    if status.last_rollback is not None:
        b.plan.health_since = parse_time(status.last_rollback.requested_at)
        _follow_rollback(b, status)
    if b.status.health is not None or status != api.HealthStatus():
        b.status.health = status
    if rolled_back is not None:
        b.condition(conditions.HEALTHY, False, rolled_back[0], rolled_back[1])
    elif signals:
        message = "; ".join(f"{signal.reason}: {signal.message}" for signal in signals)
        b.condition(conditions.HEALTHY, False, signals[0].reason, message)
    elif assessment.judged:
        was_unhealthy = conditions.find(b.status.conditions, conditions.HEALTHY)
        event: Literal["Normal"] | None = (
            "Normal" if was_unhealthy is not None and was_unhealthy.status == "False" else None
        )
        b.condition(
            conditions.HEALTHY, True, conditions.REASON_HEALTHY, "no training-health signal is on", event
        )


def _pause(b: _Builder, status: api.HealthStatus, signal: api.HealthSignal, event: str) -> None:
    """A signal's `Pause` (or a `Rollback` past its budget): suspend the job before the status write."""
    signal.action = "Pause"
    status.paused = f"{signal.reason}: {signal.message}"
    b.plan.suspend = True
    b.event("Warning", conditions.REASON_HEALTH_PAUSE, event)


def _roll_back(
    b: _Builder,
    status: api.HealthStatus,
    decision: health.RollbackDecision,
    signals: list[api.HealthSignal],
    budget: int,
) -> tuple[str, str]:
    """Ask the launchers for the rollback (`status.rollback`) and record it; returns the `Healthy`
    condition's reason and message.

    The signals are cleared: the history starts afresh once the status is stored, heartbeats of the abandoned
    run are ignored from then on, and a signal that comes back in the resumed run starts again (and spends
    another rollback)."""
    assert decision.request is not None and decision.record is not None
    b.status.rollback = decision.request
    status.rollbacks = (status.rollbacks or 0) + 1
    status.last_rollback = decision.record
    status.signals = [signal for signal in status.signals if signal not in signals]
    since = parse_time(decision.request.requested_at)
    b.plan.health_restart = since
    b.plan.health_rollbacks.extend(signal.reason for signal in signals)
    b.event("Warning", conditions.REASON_HEALTH_ROLLBACK, decision.event)
    first = signals[0]
    what = "; ".join(f"{signal.reason}: {signal.message}" for signal in signals)
    message = (
        f"{what}; rolling back to the newest checkpoint at or before step {decision.record.at_or_before_step} "
        f"(rollback {status.rollbacks} of {budget}); "
        "the resumed run is judged afresh"
    )
    return first.reason, message


def _follow_rollback(b: _Builder, status: api.HealthStatus) -> None:
    """Record where the worker group restarted by the latest rollback restored from, once it says so, with
    an Event (a Warning when nothing at or before the bound existed and training started from scratch)."""
    record = status.last_rollback
    if record is None or record.restored_step is not None:
        return
    reports = [
        health.RestoreReport(
            group_started=parse_time(lease.get("group-started")),
            restored_step=int(restored),
            restored_from=lease.get("restore-source") or None,
        )
        for pod in b.trainers
        if (lease := b.heartbeat(pod)) is not None
        and lease.get("phase") in GROUP_PHASES
        and (restored := detection.lease_number(lease, "restored-step")) is not None
    ]
    outcome = health.rollback_outcome(record, reports, b.now)
    if outcome is None:
        return
    status.last_rollback, message, warning = outcome
    b.event("Warning" if warning else "Normal", conditions.REASON_ROLLED_BACK, message)


def _free_indices(pods: list[dict[str, Any]], job_name: str, count: int) -> list[int]:
    """The `count` lowest indices whose pod name no existing pod (even a terminating one) holds."""
    if count <= 0:
        return []
    taken = {observe.pod_name(pod) for pod in pods}
    result: list[int] = []
    index = 0
    while len(result) < count:
        if names.worker_pod_name(job_name, index) not in taken:
            result.append(index)
        index += 1
    return result


def _scale_down(b: _Builder, live: list[dict[str, Any]], wanted: int, workers: bool = False) -> None:
    """Delete the surplus: unscheduled pods first, then the highest indices. Removing a worker from a
    running group asks the launchers to re-form it without that worker."""
    if len(live) <= wanted:
        return
    order = sorted(live, key=lambda pod: (gang.is_scheduled(pod), -observe.index(pod)))
    surplus = order[: len(live) - wanted]
    for pod in surplus:
        if workers and observe.is_running(pod) and _in_group(pod, False, b):
            name = observe.pod_name(pod)
            b.regroup(b.now, f"scale-down removed {name}", name, pod["metadata"].get("uid"))
    b.delete(surplus)


def _held_for_capacity(b: _Builder, spec: api.TrainingJobSpec) -> bool:
    """Hold a gang that the cluster's schedulable capacity cannot hold (before any of its pods exists): no pod
    is created, `GangScheduled` says what is short, and every reconcile looks again."""
    view = b.observed.capacity
    if view is None or b.status.gang.scheduled_time is not None:
        return False
    if any(not observe.is_terminating(pod) for pod in b.trainers):
        # An attempt is under way: its pods are the gang's, and the gang timeout judges it.
        return False
    expected = spec.replicas + spec.spares
    pod_spec = builders.build_worker_pod(b.job, spec, 0, names.ROLE_WORKER)["spec"]
    fit = capacity.gang_fit(view, pod_spec, expected)
    if fit.fits:
        return False
    previous = conditions.find(b.status.conditions, conditions.GANG_SCHEDULED)
    if previous is None or previous.reason != conditions.REASON_INSUFFICIENT_CAPACITY:
        b.event("Warning", conditions.REASON_INSUFFICIENT_CAPACITY, f"{fit.message}; holding the job")
    b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_INSUFFICIENT_CAPACITY, fit.message)
    b.status.state = "Unschedulable"
    return True


def _plan_pods(b: _Builder, spec: api.TrainingJobSpec, trainer: str) -> None:
    """Rendezvous pod, worker and spare pods, under the gang's all-or-nothing rule."""
    job, job_name = b.job, b.job["metadata"]["name"]
    rendezvous = [pod for pod in b.observed.pods if observe.is_rendezvous(pod)]
    if _held_for_capacity(b, spec):
        b.delete(rendezvous)
        return
    lost_nodes = _lost_nodes(b, spec)
    _release_unschedulable(b, lost_nodes)
    gang_state = b.status.gang
    forming = spec.gang.pod_group == "None" and gang_state.scheduled_time is None

    def held(pod: dict[str, Any]) -> dict[str, Any]:
        return gang.gated(pod) if forming else pod

    # A rendezvous pod released above is created again once it is gone (the name is the same).
    if not rendezvous:
        b.plan.create_pods.append(held(builders.build_rendezvous_pod(job, spec, avoid=lost_nodes)))
    b.delete([pod for pod in rendezvous if observe.phase(pod) in observe.FINISHED_PHASES])

    trainers = b.trainers
    live = [
        pod for pod in trainers if observe.is_live(pod, trainer) and not b.deleting(observe.pod_name(pod))
    ]
    _relabel(b, live)
    # Each live pod's role by its heartbeat, read once: the passes below each ask it of every pod.
    effective = {id(pod): b.role(pod) for pod in live}
    workers = [pod for pod in live if effective[id(pod)] == names.ROLE_WORKER]
    spares = [pod for pod in live if effective[id(pod)] == names.ROLE_SPARE]
    expected = spec.replicas + spec.spares

    retry_after = parse_time(gang_state.retry_after)
    if not live and retry_after is not None and b.now < retry_after:
        # The reason stays the timeout (the why); the message and the state say a retry is pending.
        previous = conditions.find(b.status.conditions, conditions.GANG_SCHEDULED)
        why = previous.message if previous is not None else "the gang was not scheduled in time"
        if "; next attempt" not in why:
            why = f"{why}; next attempt ({gang_state.attempts + 1}) at {gang_state.retry_after}"
        b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_SCHEDULE_TIMEOUT, why)
        b.status.state = "Backoff"
        return

    if gang_state.scheduled_time is None and spec.gang.pod_group == "None" and live:
        decision = gang.decide(live, expected, spec.gang, gang_state.attempts, b.now)
        if decision.action == "DeleteAll":
            b.delete(live)
            gang_state.attempts += 1
            gang_state.retry_after = format_time(decision.retry_after or b.now)
            b.condition(conditions.GANG_SCHEDULED, False, decision.reason, decision.message)
            b.event("Warning", decision.reason, decision.message)
            b.status.state = "Backoff"
            return

    # Workers over `replicas` go only where the gang as a whole is over its size (a scale-down). Within the
    # gang's size they are torch swapping roles: it promoted a spare over a member whose keep-alive lapsed,
    # and that member, still labelled a worker, has yet to rejoin as the standby. Deleting the highest index
    # there would kill the spare that just took the slot and break the group a second time.
    gang_surplus = len(workers) + len(spares) - expected
    removed_workers = min(max(len(workers) - spec.replicas, 0), max(gang_surplus, 0))
    _scale_down(b, workers, len(workers) - removed_workers, workers=True)
    kept_workers = len(workers) - removed_workers
    # Only a surplus over the whole gang removes spares: a spare about to take a failed worker's slot
    # and the new spare refilling the pool both stay.
    surplus = kept_workers + len(spares) - expected
    if surplus > 0:
        _scale_down(b, spares, len(spares) - surplus)
    kept_spares = len(spares) - max(surplus, 0)
    missing = max(expected - kept_workers - kept_spares, 0)
    # A slot a failed worker left is the spares' to take (torch promotes a standby): refill the pool with
    # a new spare. Other missing workers (scale up, no spare left) are new workers.
    vacated = sum(1 for incident in b.status.incidents if incidents.is_open(incident))
    taken_by_spares = min(kept_spares, vacated)
    missing_workers = min(max(spec.replicas - kept_workers - taken_by_spares, 0), missing)
    missing_spares = missing - missing_workers
    held_back = _replacements_held(b, missing_workers + missing_spares)
    if held_back is not None:
        missing_workers = missing_spares = 0
    batch = b.observed.create_batch
    if batch is not None and missing_workers + missing_spares > batch:
        # The rest in the next reconciles: one job's creations never hold the API server for long. The new
        # pods' events wake the job; this wake-up only covers a quiet watch.
        missing_workers = min(missing_workers, batch)
        missing_spares = batch - missing_workers
        b.wake_within(NEXT_BATCH_SECONDS)
    indices = _free_indices(b.observed.pods, job_name, missing_workers + missing_spares)
    roles: list[names.Role] = [names.ROLE_WORKER] * missing_workers + [names.ROLE_SPARE] * missing_spares
    # A spare refilling the pool goes where the failed worker was (its domain), so the group stays close.
    no_domain: list[tuple[str, str] | None] = [None] * missing_workers
    domains = no_domain + _vacated_domains(b, spec, missing_spares)
    new_pods = [
        held(builders.build_worker_pod(job, spec, index, role, near=domain, avoid=lost_nodes))
        for index, role, domain in zip(indices, roles, domains, strict=True)
    ]
    b.plan.create_pods.extend(new_pods)
    if b.status.start_time is None and (new_pods or trainers):
        # From the pods when they exist: a status write lost after their creation must not lose it.
        created = [
            moment for pod in trainers if (moment := parse_time(pod["metadata"].get("creationTimestamp")))
        ]
        b.status.start_time = format_time(min(created, default=b.now))
    if new_pods:
        b.plan.events.append(created_pods_event([pod["metadata"]["name"] for pod in new_pods]))

    leaving = set(b.plan.delete_pods) | set(b.plan.force_delete_pods)
    remaining = [pod for pod in live if observe.pod_name(pod) not in leaving]
    scheduled = sum(1 for pod in remaining if gang.is_scheduled(pod))
    standing = [pod for pod in rendezvous if observe.pod_name(pod) not in leaving]
    if forming and not new_pods:
        b.plan.ungate_pods = gang.to_ungate(remaining, expected, standing)
    # Some pod of the forming gang (a trainer or the rendezvous) is still missing: the others wait at the gate.
    incomplete = forming and not gang.is_whole(remaining, expected, standing)
    if gang_state.scheduled_time is None:
        if not new_pods and len(remaining) >= expected and scheduled == len(remaining):
            gang_state.scheduled_time = format_time(b.now)
            gang_state.retry_after = None
            message = f"all {len(remaining)} pods of the gang are scheduled"
            b.condition(conditions.GANG_SCHEDULED, True, conditions.REASON_ALL_SCHEDULED, message, "Normal")
        else:
            message = f"{scheduled} of {expected} pods of the gang scheduled"
            if incomplete:
                exist = len(remaining) + len(standing)
                message += (
                    f"; {exist} of its {expected + 1} pods (the rendezvous included) exist, held at the "
                    "scheduling gate until all do"
                )
            if b.observed.create_refused:
                # Waiting will not help: the server said no (quota, LimitRange, admission), and says why.
                refused = f"{b.observed.create_refused} ({message})"
                b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_CREATE_REFUSED, refused)
            else:
                b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_SCHEDULING, message)
            b.status.state = "Scheduling"
            return

    running_roles = [effective[id(pod)] for pod in remaining if observe.is_running(pod)]
    ready = running_roles.count(names.ROLE_WORKER)
    spares_running = running_roles.count(names.ROLE_SPARE)
    if _planned_regroup(b) and ready + spares_running >= expected:
        # Every pod of the gang runs: whoever is not in the group yet is on its way back into it.
        message = preflight.restart_message(spec.preflight)
        b.condition(conditions.DEGRADED, False, preflight.REASON_RESTART, message)
        ready = max(ready, spec.replicas)
    elif _starting(b) and (ready < spec.replicas or spares_running < spec.spares):
        # Nothing was lost: the pods of a new (or resumed) gang come up one by one.
        message = "the gang is starting: not every worker and spare runs yet"
        b.condition(conditions.DEGRADED, False, conditions.REASON_STARTING, message)
    else:
        _set_degraded(b, spec, ready, spares_running, min(spares_running, vacated), held_back)
    if ready >= spec.effective_min_replicas:
        b.condition(
            conditions.RUNNING, True, conditions.REASON_TRAINING, f"{ready} workers running", "Normal"
        )
        b.status.state = "Running"
    else:
        message = f"{ready} of at least {spec.effective_min_replicas} workers running"
        b.condition(conditions.RUNNING, False, conditions.REASON_WAITING, message)
        b.status.state = "Pending"


def _lost_nodes(b: _Builder, spec: api.TrainingJobSpec) -> frozenset[str]:
    """Nodes new pods must stay off: the job's nodes with a problem now; the nodes of its running pods whose
    heartbeat went quiet (missed two renewals: the first sign of a dead node, seconds before anyone else can
    tell); and for `SUSPECT_NODE_SECONDS` the nodes of losses being recovered from that went silent (the node
    lost, a heartbeat stopped, the rendezvous lost), no longer observed once their pods are gone. The
    scheduler counts such a node healthy until the node controller marks it, tens of seconds after its last
    word (8 s on the local cluster); torch promotes a spare in the meantime, and the spare refilling the pool
    would otherwise land on the dead node and be lost with it."""
    nodes = b.observed.nodes or {}
    troubled = {node for node in nodes if detection.node_problem(node, nodes) is not None}
    quiet_after = max(QUIET_RENEWALS * spec.heartbeat.interval_seconds, MIN_QUIET_SECONDS)
    quiet = {
        node
        for facts in b.facts
        if facts.running
        and (node := facts.node)
        and facts.lease is not None
        and facts.lease_phase not in (contract.PHASE_FINISHED, detection.EXITING_PHASE)
        and (detection.heartbeat_age(facts.lease, b.now, b.observed.view_gaps) or 0.0) > quiet_after
    }
    horizon = b.now - timedelta(seconds=SUSPECT_NODE_SECONDS)
    suspect = {
        incident.node
        for incident in b.status.incidents
        if incident.cause in SILENT_CAUSES
        and incidents.is_open(incident)
        and incident.node
        and (parse_time(incident.detected_at) or b.now) > horizon
    }
    return frozenset(troubled | quiet | suspect)


def _release_unschedulable(b: _Builder, lost_nodes: frozenset[str]) -> None:
    """Delete pods the scheduler cannot place that were kept off a node no longer judged lost (it came back,
    or its suspicion ran out): they are created again without that exclusion. Without this, a job whose only
    fitting node recovered would wait forever."""
    for pod in b.observed.pods:
        avoided = set((pod.get("spec") or {}).get("avoidNodes") or ())
        if avoided - lost_nodes and gang.is_unschedulable(pod) and not observe.is_terminating(pod):
            b.delete([pod])


def _vacated_domains(b: _Builder, spec: api.TrainingJobSpec, count: int) -> list[tuple[str, str] | None]:
    """(topology key, domain) of the nodes of the workers whose slots are being refilled, newest failure
    first, padded with None to `count`: the node's label when the node is still observed, else the domain
    the previous status recorded for the worker."""
    key = topology.domain_key(spec.topology)
    found: list[tuple[str, str] | None] = []
    for incident in reversed(b.status.incidents):
        if not incidents.is_open(incident) or incident.action not in incidents.WORKER_ACTIONS:
            continue
        labels = b.observed.node_labels.get(incident.node or "")
        previous = b.previous_workers.get(incident.worker or "")
        domain = topology.zone_of(labels, spec.topology) if labels is not None else None
        domain = domain or (previous.zone if previous is not None else None)
        if domain:
            found.append((key, domain))
    return (found + [None] * count)[:count]


def _promoted(lease: dict[str, Any]) -> bool:
    """Whether a spare's heartbeat shows it took a worker's place in a running group: it trains (or saves,
    restores), or it finished training with a rank. A spare released when the job ended finishes too, with
    no rank: it never trained."""
    phase = lease.get("phase")
    return phase in GROUP_PHASES or (phase == contract.PHASE_FINISHED and bool(lease.get("rank")))


def _slot_freed_for(b: _Builder, lease: dict[str, Any]) -> str | None:
    """The failed worker whose slot a spare now training took: the newest worker failure still being
    recovered from, or one its group resumed from (that group formed after the failure and resumed after it
    formed: the heartbeat that closes the incident may be seen before the spare's own)."""
    started = parse_time(lease.get("group-started"))
    for incident in reversed(b.status.incidents):
        if incident.action not in incidents.WORKER_ACTIONS or incident.worker is None:
            continue
        if incidents.is_open(incident):
            return incident.worker
        failed, resumed = incidents.failed_at(incident), parse_time(incident.resumed_at)
        if started is not None and failed is not None and resumed is not None and failed < started <= resumed:
            return incident.worker
    return None


def _relabel(b: _Builder, live: list[dict[str, Any]]) -> None:
    """Labels follow the heartbeats: torch promotes a standby spare on its own; the operator records it."""
    for pod in live:
        lease = b.heartbeat(pod)
        if lease is None or lease.get("phase") not in (*ACTIVE_PHASES, contract.PHASE_STANDBY):
            continue
        wanted = observe.observed_role(pod, lease)
        if observe.role(pod) == wanted:
            continue
        if wanted == names.ROLE_WORKER and not _promoted(lease):
            continue
        name = observe.pod_name(pod)
        b.plan.relabel_pods[name] = wanted
        if wanted != names.ROLE_WORKER:
            continue
        failed = _slot_freed_for(b, lease)
        if failed is None and _preflight_swap(b, lease):
            continue
        b.plan.spare_swaps += 1
        node = (pod.get("spec") or {}).get("nodeName")
        rank = lease.get("rank")
        at = f" as rank {rank}" if rank else ""
        slot = f"the slot of failed worker {failed}" if failed else "a worker's place in the group"
        b.event(
            "Normal",
            conditions.REASON_SPARE_PROMOTED,
            f"spare {name} on node {node} took {slot}{at}; now a worker",
        )


def _starting(b: _Builder) -> bool:
    """Whether the gang has not been at full strength since it was created (or resumed), and no failure is
    being recovered: a shortfall now is pods still coming up, not pods lost."""
    degraded = conditions.find(b.status.conditions, conditions.DEGRADED)
    if degraded is not None and degraded.reason not in (
        conditions.REASON_STARTING,
        conditions.REASON_SUSPENDED,
    ):
        return False
    return not any(incidents.is_open(incident) for incident in b.status.incidents)


def _set_degraded(
    b: _Builder,
    spec: api.TrainingJobSpec,
    ready: int,
    spares_running: int,
    promoting: int,
    held_back: str | None = None,
) -> None:
    """Degraded: fewer workers or spares than asked for (once the gang first ran).

    `promoting`: running spares about to take failed workers' slots (torch promotes them on its own).
    `held_back`: why the pods replacing failed ones wait (`_replacements_held`).
    """
    minimum = spec.effective_min_replicas
    event: Literal["Warning"] | None = None
    if held_back is not None:
        previous = conditions.find(b.status.conditions, conditions.DEGRADED)
        if previous is None or previous.reason != conditions.REASON_REPLACEMENT_BACKOFF:
            b.event("Warning", conditions.REASON_REPLACEMENT_BACKOFF, held_back)
        b.condition(conditions.DEGRADED, True, conditions.REASON_REPLACEMENT_BACKOFF, held_back)
        return
    if promoting and ready < spec.replicas and ready + promoting >= minimum:
        reason = conditions.REASON_PROMOTING_SPARE
        message = f"{ready} of {spec.replicas} workers running; a spare is taking the failed worker's slot"
    elif ready < minimum:
        reason = conditions.REASON_BELOW_MIN_REPLICAS
        message = f"{ready} of at least {minimum} workers running: training waits for replacements"
        event = "Warning"
    elif ready < spec.replicas:
        reason = conditions.REASON_SHRUNK
        message = f"training with {ready} of {spec.replicas} workers; grows back when replacements join"
    elif spares_running < spec.spares:
        reason = conditions.REASON_SPARES_MISSING
        message = f"{spares_running} of {spec.spares} spares running; refilling the pool"
    else:
        message = "every worker and spare is running"
        b.condition(conditions.DEGRADED, False, conditions.REASON_FULL_STRENGTH, message)
        return
    b.condition(conditions.DEGRADED, True, reason, message, event)


def _completed(b: _Builder, trainer: str) -> tuple[bool, bool]:
    """(some worker finished training, every worker is done)."""
    doing = set(b.plan.delete_pods) | set(b.plan.force_delete_pods)
    some, every = False, True
    for facts in b.facts:
        if facts.terminating or facts.name in doing or facts.role != names.ROLE_WORKER:
            continue
        code = observe.trainer_exit_code(facts.pod, trainer)
        some = some or code == 0
        every = every and code is not None
    return some, some and every


def _with_hub(spec: api.TrainingJobSpec | None, observed: Observed) -> Observed:
    """The heartbeats with the hub's word merged in, and the hub's silence as a gap in the job's view. A job
    whose spec was refused judges no heartbeat; a summary Lease beside a job that reports through Leases is no
    word of its workers."""
    if observed.hub is None or spec is None or spec.heartbeat_reporting != "hub":
        return observed
    heartbeat = spec.heartbeat
    trainers = [observe.pod_name(pod) for pod in observed.pods if observe.is_trainer(pod)]
    leases, gap = hubview.merge(
        observed.leases,
        observed.hub,
        trainers,
        observed.now,
        heartbeat.interval_seconds,
        heartbeat.timeout_seconds,
    )
    gaps = observed.view_gaps if gap is None else viewclock.joined(observed.view_gaps, gap)
    return replace(observed, leases=leases, view_gaps=gaps)


def plan(job: dict[str, Any], observed: Observed) -> Plan:
    """Decide one reconcile of `job`."""
    job_name = job["metadata"]["name"]
    spec, issues = validation.check(
        job.get("spec"),
        job_name,
        observed.max_gang_pods,
        admission=observed.admission,
        namespace=job["metadata"].get("namespace", ""),
    )
    if spec is not None and queueing.queue_name(job) is not None and spec.gang.pod_group == "Kueue":
        # Both would hand the job to Kueue: its pods would be queued again, each group on its own.
        why = (
            f"the label {queueing.QUEUE_LABEL} hands the whole job to Kueue (one Workload); gang.podGroup Kueue "
            "would queue its pods again: leave gang.podGroup unset"
        )
        spec, issues = None, [validation.SpecIssue("spec.gang.podGroup", why)]
    observed = _with_hub(spec, observed)
    # A node problem the control plane may have made up during an outage is not acted on until confirmed.
    observed = replace(
        observed,
        nodes=detection.confirmed_nodes(
            observed.nodes, observed.pods, observed.leases, observed.now, observed.view_gaps
        ),
    )
    b = _Builder(job, observed)
    trainer = _trainer_name(spec, job)
    accepted_replicas = spec.replicas if spec is not None else b.status.replicas.desired
    _observe_into_status(b, spec, trainer, accepted_replicas)

    if _terminal(b):
        succeeded = conditions.is_true(b.status.conditions, conditions.SUCCEEDED)
        _clean_up_finished(b, succeeded)
        _not_degraded_once_finished(b)
        b.plan.health_reset = True
        _follow_ttl(b, spec.ttl_seconds_after_finished if spec is not None else _raw_ttl(job))
        return b.finish()

    if spec is None:
        message = "; ".join(str(issue) for issue in issues)
        if b.condition(conditions.SPEC_VALID, False, conditions.REASON_INVALID_SPEC, message):
            for issue in issues:
                b.event("Warning", conditions.REASON_INVALID_SPEC, str(issue))
        started = b.status.start_time is not None or bool(b.trainers)
        if not started:
            b.condition(conditions.FAILED, True, conditions.REASON_INVALID_SPEC, message)
            b.status.state = "Invalid"
        return b.finish()

    b.condition(conditions.SPEC_VALID, True, conditions.REASON_VALID_SPEC, "the spec is valid")
    failed = conditions.find(b.status.conditions, conditions.FAILED)
    if failed is None or failed.status == "True":
        b.condition(conditions.FAILED, False, conditions.REASON_NOT_FAILED, "the job has not failed")
    b.plan.ensure = builders.build_fixed_children(
        job, spec, observed.network_policy, observed.worker_lease_role
    )
    _follow_ownership(b)

    queue = _follow_queue(b, spec)
    if spec.suspend:
        paused = b.status.health.paused if b.status.health is not None else None
        why = (
            f"the job is suspended (paused by the operator after {paused})"
            if paused
            else "the job is suspended"
        )
        _stop_gang(b, conditions.REASON_SUSPENDED, "the job is suspended", "Suspended", why)
        return b.finish()
    if queue is not None and not queue.run:
        _stop_gang(b, queue.reason, queue.message, "Queued")
        return b.finish()
    if queue is not None and queue.workers is not None and queue.workers < spec.replicas:
        # Kueue admitted fewer workers than asked for now (a scale-up after the admission): run those.
        spec = spec.model_copy(update={"replicas": queue.workers})
    suspended = conditions.find(b.status.conditions, conditions.SUSPENDED)
    if (
        suspended is not None
        and suspended.status == "False"
        and suspended.reason == conditions.REASON_SUSPENDING
    ):
        # Resumed before its pods were all gone: suspended all the same, so the condition turns False now (the
        # active deadline counts from the resume).
        b.condition(conditions.SUSPENDED, True, conditions.REASON_SUSPENDED, suspended.message)
    was_suspended = conditions.is_true(b.status.conditions, conditions.SUSPENDED)
    reason = conditions.REASON_RESUMED if was_suspended else conditions.REASON_NOT_SUSPENDED
    message = "the job was resumed" if was_suspended else "the job is not suspended"
    b.condition(conditions.SUSPENDED, False, reason, message, "Normal" if was_suspended else None)
    if _deadline_exceeded(b, spec.active_deadline_seconds):
        return b.finish()
    _follow_health(b, spec.health, was_suspended)
    if _follow_preflight(b, spec):
        return b.finish()

    if _handle_failures(b, spec, trainer):
        return b.finish()
    _follow_progress(b, spec)
    _follow_checkpoint_interval(b, spec)

    some_done, all_done = _completed(b, trainer)
    if all_done:
        _finish_job(b, True, conditions.REASON_FINISHED, "every active worker finished training")
        return b.finish()
    if some_done or _a_heartbeat_says_finished(b):
        # Training has finished somewhere: replacing or adding pods now would start it again, and the
        # spares leave (their rendezvous closed), which is neither a promotion nor a missing spare.
        b.status.state = "Finishing"
        return b.finish()

    _plan_pods(b, spec, trainer)
    if queue is not None:
        b.plan.create_pods = [_on_admitted_flavor(pod, queue) for pod in b.plan.create_pods]
    _remember_rendezvous(b)
    return b.finish()


def _active_since(b: _Builder) -> datetime | None:
    """Since when the job has been active: its start, or its last resume after a suspension or a wait in
    Kueue's queue (`Suspended` turned False), whichever is later. None: it has not started."""
    started = parse_time(b.status.start_time)
    if started is None:
        return None
    # `Suspended` last turned False at the resume (or, never suspended, at the job's first reconcile).
    suspended = conditions.find(b.status.conditions, conditions.SUSPENDED)
    resumed = None
    if suspended is not None and suspended.status == "False":
        resumed = parse_time(suspended.last_transition_time)
    return max(started, resumed) if resumed is not None else started


def _deadline_exceeded(b: _Builder, deadline: int | None) -> bool:
    """`spec.activeDeadlineSeconds`: past it, the job fails (`DeadlineExceeded`) and its pods go; before it, a
    reconcile is planned for the moment it passes. True when it has passed."""
    since = _active_since(b) if deadline is not None else None
    if deadline is None or since is None:
        return False
    left = (since + timedelta(seconds=deadline) - b.now).total_seconds()
    if left > 0:
        b.wake_within(left)
        return False
    message = f"the job was active for longer than spec.activeDeadlineSeconds ({deadline} s) since {format_time(since)}"
    _finish_job(b, False, conditions.REASON_DEADLINE_EXCEEDED, message)
    return True


def _raw_ttl(job: dict[str, Any]) -> int | None:
    """`spec.ttlSecondsAfterFinished` of a finished job whose spec no longer validates (edited since)."""
    value = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _follow_ttl(b: _Builder, ttl: int | None) -> None:
    """`spec.ttlSecondsAfterFinished` of a finished job: delete it once that long has passed since its
    completion, else plan a reconcile for that moment."""
    finished = parse_time(b.status.completion_time)
    if ttl is None or finished is None:
        return
    left = (finished + timedelta(seconds=ttl) - b.now).total_seconds()
    if left <= 0:
        b.plan.delete_job = True
    else:
        b.wake_within(left)


def _stop_gang(
    b: _Builder, reason: str, message: str, state: api.JobState, detail: str | None = None
) -> None:
    """No pod runs: every live pod is deleted gracefully (a worker saves a checkpoint on SIGTERM), and a
    resumed job schedules a fresh gang. `detail`: the `Suspended` condition's message, when not `message`."""
    b.plan.health_reset = True
    b.delete([pod for pod in b.observed.pods if not observe.is_terminating(pod)])
    for track in b.status.tracking:
        track.done = True
    b.status.rendezvous = None
    stopping = _unfinished_pods(b)
    if stopping:
        # Not suspended while a pod still runs: a worker stopping saves its checkpoint on SIGTERM, and who
        # waits for `Suspended` reads that checkpoint next. Their going wakes the job.
        b.condition(
            conditions.SUSPENDED,
            False,
            conditions.REASON_SUSPENDING,
            f"{detail or message}: {stopping} of its pods still stopping (a worker saves a checkpoint on SIGTERM)",
        )
    else:
        b.condition(conditions.SUSPENDED, True, reason, detail or message, "Normal")
    b.condition(conditions.RUNNING, False, reason, message)
    b.condition(conditions.GANG_SCHEDULED, False, reason, message)
    if conditions.find(b.status.conditions, conditions.DEGRADED) is not None:
        # No pod runs on purpose; a resumed gang starts afresh.
        b.condition(conditions.DEGRADED, False, reason, message)
    # A resumed job schedules a fresh gang, with a fresh timeout.
    b.status.gang = api.GangStatus(attempts=b.status.gang.attempts)
    b.status.state = state


def _follow_ownership(b: _Builder) -> None:
    """`ChildrenOwned`: False while objects the job needs are someone else's (the apply creates no pod then),
    True again once they are the job's; never set on a job that never met such an object."""
    if b.observed.foreign:
        b.condition(
            conditions.CHILDREN_OWNED, False, conditions.REASON_FOREIGN_OBJECT, "; ".join(b.observed.foreign)
        )
    elif conditions.find(b.status.conditions, conditions.CHILDREN_OWNED) is not None:
        b.condition(
            conditions.CHILDREN_OWNED,
            True,
            conditions.REASON_ALL_OWNED,
            "every object the job needs is its own",
        )


def _unfinished_pods(b: _Builder) -> int:
    """The job's pods that have not finished (still running, or stopping)."""
    return sum(1 for pod in b.observed.pods if observe.phase(pod) not in observe.FINISHED_PHASES)


def _pods_left(b: _Builder) -> bool:
    """Whether a pod of the job may still hold what Kueue admitted (one that has not finished)."""
    return _unfinished_pods(b) > 0


def _follow_queue(b: _Builder, spec: api.TrainingJobSpec) -> queueing.Decision | None:
    """Kueue's side of a queued job (`queueing.decide`): the Workload writes it calls for, the `Admitted`
    condition and `status.queue`. None: Kueue does not manage the job."""
    if queueing.queue_name(b.job) is None:
        # Not (or no longer) Kueue's: nothing of its queueing stays in the status.
        b.status.queue = None
        b.status.conditions = [c for c in b.status.conditions if c.type != queueing.ADMITTED]
        return None
    decision = queueing.decide(
        b.job,
        spec,
        b.observed.workload,
        b.observed.flavors,
        b.observed.priority,
        _pods_left(b),
        format_time(b.now),
    )
    b.plan.workload_ops = decision.ops
    previous = conditions.find(b.status.conditions, queueing.ADMITTED)
    b.condition(queueing.ADMITTED, decision.admitted, decision.reason, decision.message)
    if previous is None or previous.reason != decision.reason:
        if decision.reason in (queueing.REASON_EVICTED, queueing.REASON_SCALE_NOT_ADMITTED):
            b.event("Warning", decision.reason, decision.message)
        elif decision.admitted:
            b.event("Normal", decision.reason, decision.message)
    b.status.queue = api.QueueStatus(
        workload=queueing.workload_name(b.job),
        cluster_queue=decision.cluster_queue if decision.admitted else None,
        admitted_workers=decision.workers,
    )
    return decision


def _on_admitted_flavor(pod: dict[str, Any], queue: queueing.Decision) -> dict[str, Any]:
    pod_set = queueing.RENDEZVOUS if observe.is_rendezvous(pod) else queueing.WORKERS
    return queueing.place(pod, pod_set, queue.placement.get(pod_set))
