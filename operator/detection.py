"""Failure detection from observed pods, heartbeat Leases and nodes (pure functions).

Each reconcile first refreshes the per-worker memory kept in status (`update_tracks`: last step, when it
last moved, straggler streak), then judges every trainer pod once (`detect`), in order of certainty: a lost
node, an eviction or disruption, an exit code, a deletion by someone else, a container restart, then the
heartbeat classes (timeout, no progress, straggler). A pod yields at most one failure per reconcile, and a
pod the operator is done with (`WorkerTrack.done`) yields none, so a slow deletion is never counted twice.

Each failure carries when it happened (`occurred_at`), as closely as the observations tell: the launchers
re-form only worker groups started before it (`status.regroup`), and recovery is measured from it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from phalanx import beatsummary, contract
from phalanx.operator import api, trainerfacts
from phalanx.operator import status as observe
from phalanx.operator.timeutil import format_micro_time, format_time, parse_time, parse_time_end
from phalanx.operator.trainerfacts import Trainer
from phalanx.operator.viewclock import Gap, seen_age, unseen_seconds

# Failure causes (the keys of status.restarts.byCause).
EXIT_CODE = "ExitCode"
KILLED = "Killed"
POD_DELETED = "PodDeleted"
EVICTED = "Evicted"
DISRUPTION_TARGET = "DisruptionTarget"
CONTAINER_RESTART = "ContainerRestart"
NODE_LOST = "NodeLost"
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
EXITING_PHASE = contract.PHASE_EXITING
EXITING_GRACE_SECONDS = 30
"""How much longer than the heartbeat timeout a pod whose launcher announced its exit may stay silent: the
exit shows in the pod's status once the node reports it, normally within seconds."""
NO_PROGRESS = "NoProgress"
TRAINER_STOPPED = "TrainerStopped"
# The launcher's verdicts on its training processes (the Lease's `fault`, worker/trainerwatch.py).
FAULT_STOPPED = contract.FAULT_STOPPED
FAULT_HUNG = contract.FAULT_HUNG
STRAGGLER = "Straggler"
RENDEZVOUS_LOST = "RendezvousLost"

# Node problems, as `failurePolicy.rules[].match.nodeConditions` names them.
NODE_NOT_READY = "NotReady"
NODE_UNREACHABLE = "Unreachable"
NODE_DELETED = "Deleted"
NODE_NO_EXECUTE = "NoExecuteTaint"
NODE_DRILL_CRASH = "DrillCrash"

# Exit codes of processes stopped by a signal from outside (SIGKILL, SIGTERM): not the user's code.
KILL_EXIT_CODES = (137, 143)
OOM_REASON = "OOMKilled"
# Heartbeat phases in which a step that does not move is expected, never a hang.
TRAINING_PHASE = contract.PHASE_TRAINING


@dataclass(frozen=True)
class Failure:
    """One detected failure of one trainer pod."""

    cause: str
    pod: str
    uid: str | None
    node: str | None
    message: str
    exit_code: int | None = None
    pod_conditions: frozenset[str] = field(default_factory=frozenset)
    """Pod condition types or reasons this failure shows (matched by `match.podConditions`)."""
    node_conditions: frozenset[str] = field(default_factory=frozenset)
    """Node problems this failure shows (matched by `match.nodeConditions`)."""
    force: bool = False
    """Delete the pod with grace 0: its node is gone, or it is frozen or hung (nothing left to save)."""
    spare: bool = False
    """The pod was a spare standing by (`status.standing_by`): training was not disrupted."""
    alive: bool = False
    """The pod still runs (the operator deletes it); False when it already ended or is going."""
    occurred_at: datetime | None = None
    """When the failure happened, as closely as known (never after its detection): the end of the second
    of the container's finish time, the last heartbeat, the node's or the pod's last sign of life, or the
    detection time (deletions, stragglers, hangs). None only for failures built by hand."""


def node_problem(node: str | None, nodes: dict[str, dict[str, Any]] | None) -> str | None:
    """The node problem of `node` (None when healthy or when nodes are not observed)."""
    if node is None or nodes is None:
        return None
    health = nodes.get(node)
    if health is None:
        return NODE_DELETED
    ready = health.get("ready")
    if ready == "False":
        return NODE_NOT_READY
    if ready == "Unknown":
        return NODE_UNREACHABLE
    if health.get("noExecute"):
        return NODE_NO_EXECUTE
    if health.get("drill"):
        return NODE_DRILL_CRASH
    return None


# Node problems the node controller infers from silence: after a gap in everyone's view (the API server or
# etcd away) it reports them for nodes that never stopped.
INFERRED_NODE_PROBLEMS = (NODE_NOT_READY, NODE_UNREACHABLE, NODE_NO_EXECUTE)

LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
"""The NoExecute taints the node controller puts on a node it stopped hearing from, and lifts once the node
says Ready again (at its next look, seconds later)."""


def lifting(health: dict[str, Any]) -> bool:
    """Whether a node's only NoExecute taints are the node controller's silence taints while the node says
    Ready: it spoke after the controller gave up on it, and the taints are on their way off. Seen after every
    outage of the control plane, when the controller had called every node lost."""
    keys = set(health.get("noExecute") or ())
    return health.get("ready") == "True" and bool(keys) and keys <= LIFECYCLE_TAINTS


def confirmed_nodes(
    nodes: dict[str, dict[str, Any]] | None,
    pods: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    now: datetime,
    gaps: Sequence[Gap] = (),
) -> dict[str, dict[str, Any]] | None:
    """The nodes' health with the problems not (yet) to be believed shown as healthy.

    The node controller calls a node NotReady or unreachable (and taints it NoExecute) when it has not heard
    from it for its grace period. After the control plane itself was away (the API server or etcd hung, a
    watch that stalled) it does so for every node at once, although none stopped. So a node's problem counts
    only when (1) no pod of the job on it renewed its heartbeat after the problem began (a pod that still talks
    vouches for its node) and the node itself has not said Ready since (`lifting`), and (2) the problem has
    lasted at least as long as the stale stretches of the operator's own view since the node was last heard
    from (`gaps`): a real crash is judged at once, a silence that fell inside an outage only once it outlasts
    it (by then the node has long reported Ready again).
    Deleted nodes and drills are always believed."""
    if nodes is None:
        return None
    confirmed = dict(nodes)
    suspects = [
        (name, health, problem)
        for name, health in nodes.items()
        if (problem := node_problem(name, nodes)) in INFERRED_NODE_PROBLEMS
    ]
    if not suspects:
        return confirmed  # nothing to vouch for: no pass over a big gang's heartbeats
    renewed_on: dict[str, list[datetime]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        renewed = parse_time((heartbeat_of(pod, leases) or {}).get("renewTime"))
        if node and renewed is not None:
            renewed_on.setdefault(node, []).append(renewed)
    for name, health, problem in suspects:
        since = parse_time(health.get("noExecuteSince" if problem == NODE_NO_EXECUTE else "readySince"))
        if since is None:
            continue
        heard = parse_time(health.get("readyHeartbeat")) or since
        vouched = lifting(health) or any(renewed > since for renewed in renewed_on.get(name, ()))
        outlasted = (now - since).total_seconds() >= unseen_seconds(min(heard, since), now, gaps)
        if vouched or not outlasted:
            confirmed[name] = {**health, "ready": "True", "noExecute": [], "unconfirmed": problem}
    return confirmed


def _at_most(moment: datetime | None, now: datetime) -> datetime:
    """`moment` when known and not later than `now` (a stamp rounded up to its second may be), else `now`."""
    return now if moment is None else min(moment, now)


def node_lost_at(
    problem: str, health: dict[str, Any] | None, lease: dict[str, Any] | None, now: datetime
) -> datetime:
    """When a lost node failed: the later of the node's last word (its last Ready heartbeat when it went
    silent, when it turned NotReady, when the NoExecute taint came) and the pod's last heartbeat. Both are
    signs of life before the loss, so the later one is the closer; a deleted node: now."""
    if problem in (NODE_DELETED, NODE_DRILL_CRASH):
        return now
    health = health or {}
    node_time = {
        NODE_UNREACHABLE: health.get("readyHeartbeat"),
        NODE_NOT_READY: health.get("readySince"),
        NODE_NO_EXECUTE: health.get("noExecuteSince"),
    }.get(problem)
    known = [
        moment
        for moment in (parse_time_end(node_time), parse_time_end((lease or {}).get("renewTime")))
        if moment is not None
    ]
    return _at_most(max(known) if known else None, now)


def _seconds_since(moment: str | None, now: datetime, gaps: Sequence[Gap] = ()) -> float | None:
    """Seconds from the stamp `moment` to `now`, leaving out the gaps in the operator's view."""
    return seen_age(parse_time(moment), now, gaps)


def heartbeat_age(lease: dict[str, Any] | None, now: datetime, gaps: Sequence[Gap] = ()) -> float | None:
    """Seconds since the Lease was last renewed, the gaps in the operator's view left out (None: no Lease, or
    no renewal known): a heartbeat is late only by time the operator was watching."""
    return None if lease is None else _seconds_since(lease.get("renewTime"), now, gaps)


def heartbeat_of(pod: dict[str, Any], leases: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The pod's own Lease: the one its launcher wrote, owned by this pod (`ownerUid`, from the Lease's owner
    reference). A Lease that names another owner (an earlier pod of the same name, not yet collected) or none (not
    written by the pod's launcher, which always sets it) is not the pod's heartbeat: its annotations could stop or
    fail a job. A summary without the key at all (`status.summarize_lease` always sets it) is taken as the pod's."""
    lease = leases.get(observe.pod_name(pod))
    if lease is None:
        return None
    if "ownerUid" in lease and lease["ownerUid"] != pod["metadata"].get("uid"):
        return None
    created, renewed = (
        parse_time(pod["metadata"].get("creationTimestamp")),
        parse_time(lease.get("renewTime")),
    )
    if created is not None and renewed is not None and renewed < created:
        return None
    return lease


def _facts(
    trainers: list[dict[str, Any]], leases: dict[str, dict[str, Any]], facts: Sequence[Trainer] | None
) -> Sequence[Trainer]:
    """The trainers' facts as the reconcile read them, else read here (each beside its own Lease)."""
    if facts is not None:
        return facts
    return trainerfacts.read_all(trainers, lambda pod: heartbeat_of(pod, leases))


def lease_number(lease: dict[str, Any] | None, key: str) -> float | None:
    try:
        return float((lease or {})[key])
    except (KeyError, TypeError, ValueError):
        return None


def lease_step(lease: dict[str, Any] | None) -> int | None:
    value = lease_number(lease, "step")
    return None if value is None else int(value)


def _trainer_restarts(pod: dict[str, Any], trainer: str) -> tuple[int, int | None]:
    return _restarts(observe.container_status(pod, trainer))


def _restarts(container: dict[str, Any]) -> tuple[int, int | None]:
    """A container status's restart count and the exit code its last run ended with."""
    return int(container.get("restartCount") or 0), container.get("lastExitCode")


def _terminated(pod: dict[str, Any], container_name: str) -> dict[str, Any]:
    return observe.container_status(pod, container_name).get("terminated") or {}


def _last_finished(pod: dict[str, Any], container_name: str) -> str | None:
    return observe.container_status(pod, container_name).get("lastFinishedAt")


def _condition_since(pod: dict[str, Any], condition_type: str) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == condition_type:
            return condition.get("lastTransitionTime")
    return None


def _has_condition(pod: dict[str, Any], condition_type: str) -> bool:
    return any(
        condition.get("type") == condition_type and condition.get("status") == "True"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )


COMPUTE_SECONDS = "compute-seconds"
STEP_SECONDS = "step-seconds"


def straggler_measure(timed: list[dict[str, Any]]) -> str:
    """Which step time the training workers are compared on: their own compute time when every one
    reports it (under synchronous data parallelism every rank's full step time includes waiting for the
    slowest, so only the compute time shows which one is slow), else the full step time."""
    reported = [lease_number(lease, COMPUTE_SECONDS) for lease in timed]
    if timed and all(seconds is not None and seconds > 0 for seconds in reported):
        return COMPUTE_SECONDS
    return STEP_SECONDS


def update_tracks(
    tracks: list[api.WorkerTrack],
    trainers: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    heartbeat: api.HeartbeatSpec,
    trainer: str,
    now: datetime,
    in_place: bool = False,
    facts: Sequence[Trainer] | None = None,
) -> list[api.WorkerTrack]:
    """Per-worker memory after this reconcile's observations (pods no longer observed are forgotten,
    except those whose disappearance is still to be judged). `in_place`: the caller owns `tracks` and lets
    them be updated rather than copied (a reconcile's own, at 12,500 pods a copy each costs tens of ms).

    Nothing here follows the Lease's renew time: a heartbeat that only renews changes no track, so it
    never makes the operator write the status.
    """
    pods = _facts(trainers, leases, facts)
    previous = {(track.pod, track.uid): track for track in tracks}
    training = {
        pod.name: pod.lease for pod in pods if pod.lease is not None and pod.lease_phase == TRAINING_PHASE
    }
    measure = straggler_measure(list(training.values()))
    times = {
        name: seconds
        for name, lease in training.items()
        if (seconds := lease_number(lease, measure)) is not None and seconds > 0
    }
    median = statistics.median(times.values()) if len(times) >= 2 else None
    stamp = format_time(now)
    result: list[api.WorkerTrack] = []
    seen: set[tuple[str, str | None]] = set()
    for pod in pods:
        key = pod.key
        seen.add(key)
        # A pod seen for the first time starts from its current restart count (only new restarts count).
        old = previous.get(key) or api.WorkerTrack(
            pod=key[0], uid=key[1], restarts=_trainer_restarts(pod.pod, trainer)[0]
        )
        track = old if in_place else old.model_copy()
        track.node = pod.node or old.node
        lease = pod.lease
        step = lease_step(lease)
        is_training = key[0] in training
        new_step = step is not None and step != old.step
        # The no-progress clock runs only while training at an unchanged step; in any other phase it is
        # off (unset, so a standby spare's track stays the same from one reconcile to the next), and so it is
        # for a worker that publishes no step at all: its progress is unknown, never a stall.
        if not is_training or step is None:
            track.since = None
        elif new_step or old.since is None:
            track.since = step_reached(lease, old.since, now) or stamp
        track.step = step if step is not None else old.step
        if is_training and new_step and heartbeat.straggler_factor > 0:
            # Each new step is one new measurement of the worker's step time.
            seconds = times.get(key[0])
            slow = (
                median is not None and seconds is not None and seconds > heartbeat.straggler_factor * median
            )
            track.slow = old.slow + 1 if slow else 0
        elif not is_training:
            track.slow = 0
        result.append(track)
    # A pod that vanished without the operator's doing is kept until judged (PodDeleted).
    result.extend(track for key, track in previous.items() if key not in seen and not track.done)
    return result


def step_reached(lease: dict[str, Any] | None, floor: str | None, now: datetime) -> str | None:
    """When the worker reached its current step, by its heartbeat's `step-at` (kept between `floor`, the
    clock's previous start, and now); None when the heartbeat does not say."""
    step_at = (lease or {}).get("step-at")
    return _step_reached(step_at, floor, now) if isinstance(step_at, str) else None


@lru_cache(maxsize=1 << 16)
def _step_reached(step_at: str, floor: str | None, now: datetime) -> str | None:
    """`step_reached` of one stamp (kept: one reconcile asks it of each worker's heartbeat three times, and
    formatting a stamp costs more than the rest of that question)."""
    reached = parse_time(step_at)
    if reached is None:
        return None
    lower = parse_time(floor)
    if lower is not None:
        reached = max(reached, lower)
    return format_micro_time(min(reached, now))


VERDICT_RENEWAL_MARGIN_SECONDS = 0.25
"""Past a healthy peer's next renewal: the time its Lease takes to reach the operator's watch."""


def next_heartbeat_deadline(
    trainers: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    tracks: list[api.WorkerTrack],
    heartbeat: api.HeartbeatSpec,
    now: datetime,
    gaps: Sequence[Gap] = (),
    facts: Sequence[Trainer] | None = None,
) -> float | None:
    """Seconds until the first heartbeat timeout or progress timeout of a running worker could expire, by
    what this reconcile saw (None when no clock runs): a reconcile then judges it on time, not at the
    next periodic one. `gaps`: the stale stretches of the operator's view, which no clock counts."""
    judged = {(track.pod, track.uid): track for track in tracks}
    deadlines: list[float] = []
    for pod in _facts(trainers, leases, facts):
        lease = pod.lease
        if lease is None or pod.lease_phase == contract.PHASE_FINISHED or not pod.running:
            continue
        track = judged.get(pod.key)
        if track is None or track.done:
            continue  # already being handled: nothing to wake for
        allowed = heartbeat.timeout_seconds + (
            EXITING_GRACE_SECONDS if pod.lease_phase == EXITING_PHASE else 0
        )
        silent = _seconds_since(lease.get("renewTime"), now, gaps)
        if silent is not None:
            deadlines.append(allowed - silent)
        stalled = _seconds_since(track.since, now, gaps)
        if pod.lease_phase == TRAINING_PHASE and stalled is not None:
            deadlines.append(heartbeat.progress_timeout_seconds - stalled)
        verdict = beatsummary.verdict_time(lease)
        if verdict is not None and pod.lease_phase == TRAINING_PHASE:
            # A hang verdict waits until every peer renewed after it (`_a_peer_fell_silent`), which their
            # renewals do not announce: look again once each healthy peer's next renewal is due, and each half
            # interval after that while the verdict stands (through the heartbeat hub a renewal shows in its
            # next summary, up to an interval later).
            due = (
                (verdict - now).total_seconds() + heartbeat.interval_seconds + VERDICT_RENEWAL_MARGIN_SECONDS
            )
            deadlines.append(due if due > 0 else heartbeat.interval_seconds / 2)
    # A deadline already past was judged by this reconcile: only the ones ahead call for a wake-up.
    ahead = [seconds for seconds in deadlines if seconds > 0]
    return min(ahead) if ahead else None


def sync_restarts(tracks: list[api.WorkerTrack], trainers: list[dict[str, Any]], trainer: str) -> None:
    """Remember each pod's current restart count once its restarts have been judged."""
    counts = {
        (observe.pod_name(pod), pod["metadata"].get("uid")): _trainer_restarts(pod, trainer)[0]
        for pod in trainers
    }
    for track in tracks:
        track.restarts = counts.get((track.pod, track.uid), track.restarts)


def restart_clocks(tracks: list[api.WorkerTrack], now: datetime) -> None:
    """After an incident every survivor waits on the group: no-progress clocks and streaks start over."""
    for track in tracks:
        track.since = format_time(now) if track.since is not None else None
        track.slow = 0


def _pod_failure(
    facts: Trainer,
    track: api.WorkerTrack | None,
    trainer: str,
    nodes: dict[str, dict[str, Any]] | None,
    spare: bool,
    now: datetime,
) -> Failure | None:
    """Failures seen on the pod object itself (node, eviction, exit code, deletion, restart)."""
    pod, name, node, lease = facts.pod, facts.name, facts.node, facts.lease
    base: dict[str, Any] = {"pod": name, "uid": facts.uid, "node": node, "spare": spare}
    problem = node_problem(node, nodes)
    if problem is not None:
        what = {
            NODE_DELETED: "was deleted",
            NODE_NOT_READY: "is NotReady",
            NODE_UNREACHABLE: "is unreachable (Ready Unknown)",
            NODE_NO_EXECUTE: "has a NoExecute taint",
            NODE_DRILL_CRASH: "is lost to this job in a drill (phalanx.dev/drill-crash)",
        }[problem]
        message = f"{name}: its node {node} {what}"
        return Failure(
            NODE_LOST,
            message=message,
            node_conditions=frozenset({problem}),
            force=True,
            occurred_at=node_lost_at(problem, (nodes or {}).get(node or ""), lease, now),
            **base,
        )
    status = pod.get("status") or {}
    container = observe.container_status(pod, trainer)
    terminated = container.get("terminated") or {}
    if status.get("reason") == EVICTED:
        return Failure(
            EVICTED,
            message=f"{name} was evicted",
            pod_conditions=frozenset({EVICTED}),
            occurred_at=_at_most(parse_time_end(terminated.get("finishedAt")), now),
            **base,
        )
    if _has_condition(pod, DISRUPTION_TARGET):
        message = f"{name} is a disruption target"
        return Failure(
            DISRUPTION_TARGET,
            message=message,
            pod_conditions=frozenset({DISRUPTION_TARGET}),
            occurred_at=_at_most(parse_time_end(_condition_since(pod, DISRUPTION_TARGET)), now),
            **base,
        )
    code = observe.exit_code_of(container, facts.phase)
    if code is not None and code != 0:
        reason = terminated.get("reason")
        conditions = frozenset({reason}) if reason else frozenset()
        killed = code in KILL_EXIT_CODES and reason != OOM_REASON
        cause = KILLED if killed else EXIT_CODE
        message = f"{name} exited with code {code}" + (f" ({reason})" if reason else "")
        said = terminated.get("message")
        if said:
            message += f": {said}"
        finished = _at_most(parse_time_end(terminated.get("finishedAt")), now)
        return Failure(
            cause, message=message, exit_code=code, pod_conditions=conditions, occurred_at=finished, **base
        )
    if facts.terminating:
        if track is not None and not track.done:
            message = f"{name} was deleted by someone other than the operator"
            return Failure(
                POD_DELETED,
                message=message,
                pod_conditions=frozenset({POD_DELETED}),
                occurred_at=now,
                **base,
            )
        return None
    restarts, last_code = _restarts(container)
    if track is not None and restarts > track.restarts:
        message = f"{name}: trainer container restarted (exit code {last_code})"
        return Failure(
            CONTAINER_RESTART,
            message=message,
            exit_code=last_code,
            pod_conditions=frozenset({CONTAINER_RESTART}),
            alive=True,
            occurred_at=_at_most(parse_time_end(container.get("lastFinishedAt")), now),
            **base,
        )
    return None


def _heartbeat_failure(
    pod: Trainer,
    track: api.WorkerTrack,
    heartbeat: api.HeartbeatSpec,
    now: datetime,
    spare: bool,
    gaps: Sequence[Gap] = (),
) -> Failure | None:
    """Failures seen in the worker's heartbeat: silence, a step that does not move, a slow step time. Silence
    and stalls count only time outside `gaps`, when the operator's view was current."""
    lease = pod.lease
    if lease is None or pod.lease_phase == contract.PHASE_FINISHED or not pod.running:
        return None
    name = pod.name
    base: dict[str, Any] = {"pod": name, "uid": pod.uid, "node": track.node, "spare": spare, "alive": True}
    silent = _seconds_since(lease.get("renewTime"), now, gaps)
    allowed = heartbeat.timeout_seconds
    if lease.get("phase") == EXITING_PHASE:
        # The launcher ended on its own and said so; its exit code, in the pod's status, decides.
        allowed += EXITING_GRACE_SECONDS
    if silent is not None and silent > allowed:
        message = f"{name}: no heartbeat for {silent:.0f}s (timeout {allowed}s)"
        # Frozen since its last renewal, at the latest.
        last = _at_most(parse_time_end(lease.get("renewTime")), now)
        return Failure(HEARTBEAT_TIMEOUT, message=message, force=True, occurred_at=last, **base)
    fault = _launcher_fault(lease, track, now)
    if fault is not None:
        return replace(fault, message=f"{name}: {fault.message}", **base)
    stalled = _seconds_since(track.since, now, gaps)
    if (
        lease.get("phase") == TRAINING_PHASE
        and stalled is not None
        and stalled > heartbeat.progress_timeout_seconds
    ):
        message = (
            f"{name}: step {track.step} has not advanced for {stalled:.0f}s while training "
            f"(progress timeout {heartbeat.progress_timeout_seconds}s)"
        )
        return Failure(NO_PROGRESS, message=message, force=True, occurred_at=now, **base)
    if heartbeat.straggler_factor > 0 and track.slow >= heartbeat.straggler_heartbeats:
        what = "compute time" if lease_number(lease, COMPUTE_SECONDS) else "step time"
        message = (
            f"{name}: {what} above {heartbeat.straggler_factor:g}x the job's median for "
            f"{track.slow} steps seen in a row"
        )
        # Still alive and healthy enough to save: deleted with its grace period (emergency save).
        return Failure(STRAGGLER, message=message, occurred_at=now, **base)
    return None


def _launcher_fault(lease: dict[str, Any], track: api.WorkerTrack, now: datetime) -> Failure | None:
    """The launcher's verdict on one of its training processes (Lease `fault`), as a failure of its pod
    (pod fields left to the caller): a stopped process at once; a hang (NoProgress, blamed like one) only
    when the wait it reports began no earlier than the worker's no-progress clock, so that a survivor still
    waiting on a rank already replaced is not judged for that wait."""
    fault = lease.get("fault")
    if fault not in (FAULT_STOPPED, FAULT_HUNG):
        return None
    message = lease.get("fault-message") or f"the launcher reports a training process {fault}"
    since = parse_time(lease.get("fault-since"))
    occurred = _at_most(since, now)
    if fault == FAULT_STOPPED:
        return Failure(
            TRAINER_STOPPED, pod="", uid=None, node=None, message=message, force=True, occurred_at=occurred
        )
    if fault != FAULT_HUNG or lease.get("phase") != TRAINING_PHASE:
        return None
    clock = parse_time(track.since)
    if clock is None or since is None or since < clock:
        return None
    return Failure(NO_PROGRESS, pod="", uid=None, node=None, message=message, force=True, occurred_at=now)


def detect(
    trainers: list[dict[str, Any]],
    leases: dict[str, dict[str, Any]],
    nodes: dict[str, dict[str, Any]] | None,
    tracks: list[api.WorkerTrack],
    known: set[tuple[str, str | None]],
    heartbeat: api.HeartbeatSpec,
    trainer: str,
    now: datetime,
    gaps: Sequence[Gap] = (),
    facts: Sequence[Trainer] | None = None,
) -> list[Failure]:
    """Every failure of the job's trainer pods now, in pod index order (vanished pods last).

    `tracks` is this reconcile's memory (after `update_tracks`); `known` the (pod, uid) pairs the operator
    knew before it, since only a pod it knew can be deleted or restarted behind its back. `gaps`: the stale
    stretches of the operator's view (`viewclock`), left out of every heartbeat's and progress clock's age.
    """
    pods = _facts(trainers, leases, facts)
    by_key = {(track.pod, track.uid): track for track in tracks}
    failures: list[Failure] = []
    stalled: list[Failure] = []
    observed: set[tuple[str, str | None]] = set()
    for pod in sorted(pods, key=lambda pod: pod.index):
        key = pod.key
        observed.add(key)
        track = by_key.get(key)
        if track is not None and track.done:
            continue
        judged = track if key in known else None
        spare = pod.standing_by
        failure = _pod_failure(pod, judged, trainer, nodes, spare, now)
        if failure is None and track is not None:
            failure = _heartbeat_failure(pod, track, heartbeat, now, spare, gaps)
        if failure is not None and failure.cause == NO_PROGRESS:
            stalled.append(failure)
        elif failure is not None:
            failures.append(failure)
    if stalled and not failures and _a_peer_fell_silent(stalled, pods):
        # A rank waits in a collective on a peer that stopped renewing its heartbeat before the wait was
        # judged a hang (a frozen pod, a crashed node): the silent peer is the culprit, and its heartbeat
        # timeout (or its node's loss) replaces it shortly; replacing the waiting survivor would lose it too.
        stalled = []
    if stalled and not failures:
        # A hung rank stalls every rank in the next collective: all look hung. Replacing one makes the
        # group re-form; the lowest step (then the lowest index) is the likeliest culprit.
        steps = {track.pod: track.step for track in tracks}

        def step_of(failure: Failure) -> int:
            step = steps.get(failure.pod)
            return step if step is not None else -1

        failures.append(min(stalled, key=step_of))
    for key, track in by_key.items():
        if key not in observed and key in known and not track.done:
            message = f"{track.pod} disappeared (deleted by someone other than the operator)"
            failures.append(
                Failure(
                    POD_DELETED,
                    pod=track.pod,
                    uid=track.uid,
                    node=track.node,
                    message=message,
                    pod_conditions=frozenset({POD_DELETED}),
                    occurred_at=now,
                )
            )
    return failures


def _a_peer_fell_silent(stalled: list[Failure], trainers: Sequence[Trainer]) -> bool:
    """Whether a worker of the group, not itself judged stalled, last renewed its heartbeat before the
    earliest launcher's hang verdict among `stalled`: a healthy peer renews every interval while the others
    wait, so one that did not is frozen or gone."""
    names = {failure.pod for failure in stalled}
    verdicts = [
        moment
        for pod in trainers
        if pod.name in names and (moment := beatsummary.verdict_time(pod.lease)) is not None
    ]
    if not verdicts:
        return False
    judged = min(verdicts)
    for pod in trainers:
        lease = pod.lease
        if pod.name in names or lease is None or pod.lease_phase not in observe.IN_GROUP_PHASES:
            continue
        renewed = parse_time(lease.get("renewTime"))
        if renewed is not None and renewed < judged:
            return True
    return False


def _container_restarts(pod: dict[str, Any], container_name: str) -> int:
    return _trainer_restarts(pod, container_name)[0]


def rendezvous_failure(
    pods: list[dict[str, Any]],
    memory: api.RendezvousTrack | None,
    nodes: dict[str, dict[str, Any]] | None,
    container: str,
    now: datetime,
) -> Failure | None:
    """The loss of the rendezvous pod last seen running (`memory`): gone, deleted, ended, its node lost,
    or its store restarted in place (a restart empties the store as surely as a new pod)."""
    if memory is None:
        return None
    pod = next((p for p in pods if observe.is_rendezvous(p) and p["metadata"].get("uid") == memory.uid), None)
    base = Failure(RENDEZVOUS_LOST, pod=memory.pod, uid=memory.uid, node=memory.node, message="")
    if pod is None:
        message = f"rendezvous pod {memory.pod} disappeared"
        return replace(base, message=message, occurred_at=now)
    problem = node_problem(memory.node, nodes)
    if problem is not None:
        message = f"rendezvous pod {memory.pod}: its node {memory.node} is lost ({problem})"
        health = (nodes or {}).get(memory.node or "")
        return replace(
            base,
            message=message,
            node_conditions=frozenset({problem}),
            force=True,
            occurred_at=node_lost_at(problem, health, None, now),
        )
    terminated = _terminated(pod, container)
    if observe.phase(pod) in observe.FINISHED_PHASES or terminated:
        code = terminated.get("exitCode")
        message = f"rendezvous pod {memory.pod} ended" + (f" (exit code {code})" if code is not None else "")
        finished = _at_most(parse_time_end(terminated.get("finishedAt")), now)
        return replace(base, message=message, exit_code=code, occurred_at=finished)
    if observe.is_terminating(pod):
        message = f"rendezvous pod {memory.pod} was deleted by someone other than the operator"
        return replace(base, message=message, occurred_at=now)
    restarts, last_code = _trainer_restarts(pod, container)
    if restarts > memory.restarts:
        message = f"rendezvous store of {memory.pod} restarted (exit code {last_code}): its state is gone"
        occurred = _at_most(parse_time_end(_last_finished(pod, container)), now)
        return replace(base, message=message, exit_code=last_code, occurred_at=occurred)
    return None


def rendezvous_memory(
    pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]] | None, container: str
) -> api.RendezvousTrack | None:
    """The rendezvous pod to watch from now on: the one running on a healthy node (None: none is)."""
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if (
            observe.is_rendezvous(pod)
            and observe.is_running(pod)
            and not _terminated(pod, container)
            and node_problem(node, nodes) is None
        ):
            return api.RendezvousTrack(
                pod=observe.pod_name(pod),
                uid=pod["metadata"].get("uid"),
                node=node,
                restarts=_container_restarts(pod, container),
            )
    return None
