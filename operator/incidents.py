"""Incidents: what failed, what was done, and when training resumed (pure functions).

An incident opens when a failure is handled. It closes with exact figures once a worker group that started
after the failure (heartbeat `group-started`) reports that its first step after restoring completed
(`resumed-at`, with `restored-step` and `restore-source`): `resumedAt` is that moment, `stepsLost` = the
highest step any worker had reached (late heartbeats of the failed group included) - the restored step,
and `secondsToRecover` runs from the failure itself (`occurredAt`).

Heartbeats without those fields fall back to an estimate: the incident closes at the first reconcile where
an active worker's step passes the job's step at detection plus the steps one heartbeat interval may hide
(a Lease lags its worker by up to one interval, so a survivor's late report is not a resumption), and
`stepsLost` = step at detection - the lowest step seen in between. Goodput is productive time over wall
time, the lost time being the union of the recovery intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from phalanx.operator import api, detection
from phalanx.operator.policy import Decision
from phalanx.operator.timeutil import format_micro_time, format_time, parse_time

MAX_INCIDENTS = 20
REPLACE_RENDEZVOUS = "ReplaceRendezvous"
# Actions after which the failed worker's group must re-form without it.
WORKER_ACTIONS = ("ReplaceWorker", "RestartJob")
RECOVERING_ACTIONS = (*WORKER_ACTIONS, REPLACE_RENDEZVOUS)


def unreported_steps(interval_seconds: float, step_seconds: list[float]) -> int:
    """Steps a heartbeat may not have reported yet: one interval's worth at the median step time (>= 1)."""
    known = sorted(seconds for seconds in step_seconds if seconds > 0)
    if not known:
        return 1
    median = known[len(known) // 2]
    return max(math.ceil(interval_seconds / median), 1)


def open_incident(
    failure: detection.Failure,
    decision: Decision | None,
    now: datetime,
    job_step: int | None,
    unreported: int = 1,
) -> api.Incident:
    """The record of a handled failure (a standby spare's loss is none: `reconcile._replace_spare`).

    `decision`: the failure policy's; None for the rendezvous pod's loss, which the operator always
    replaces. `unreported`: steps the workers may have done beyond `job_step` before the failure without a
    heartbeat showing them yet; training counts as resumed only past them.
    """
    incident = api.Incident(
        cause=failure.cause,
        worker=failure.pod,
        pod_uid=failure.uid,
        node=failure.node,
        action=decision.action if decision is not None else REPLACE_RENDEZVOUS,
        rule=decision.rule if decision is not None else None,
        message=failure.message,
        occurred_at=format_micro_time(failure.occurred_at) if failure.occurred_at is not None else None,
        detected_at=format_time(now),
        detected_step=job_step,
        resume_step=None if job_step is None else job_step + unreported,
    )
    return incident


def is_open(incident: api.Incident) -> bool:
    return incident.action in RECOVERING_ACTIONS and incident.resumed_at is None


@dataclass(frozen=True)
class Progress:
    incidents: list[api.Incident]
    recovered: list[api.Incident]
    """Incidents closed by this observation."""
    recovery_seconds: float
    """Seconds added to the job's lost time (the union of the closed incidents' intervals)."""


@dataclass(frozen=True)
class Beat:
    """One active worker's last heartbeat: its step, when its Lease was renewed (None: unknown), and what
    it says of its worker group (each None when the worker does not report it)."""

    step: int
    renewed: datetime | None = None
    group_started: datetime | None = None
    """When the worker's current group formed."""
    resumed_at: datetime | None = None
    """When the group's first step after its latest restore completed."""
    restored_step: int | None = None
    """Step the group restored."""
    restored_from: str | None = None
    """Where the group restored its state from."""
    active: bool = True
    """The worker's phase says it is in a group (training, saving, restoring, finished). False between groups
    (re-forming, standing by): its step is then the last one its latest group reached, and the group figures,
    when given, are that group's (it resumed before it ended)."""


def failed_at(incident: api.Incident) -> datetime | None:
    """When the incident's failure happened (its detection when that is all that is known)."""
    return parse_time(incident.occurred_at) or parse_time(incident.detected_at)


def _raise_detected_step(incident: api.Incident, beats: list[Beat], failure: datetime | None) -> None:
    """Heartbeats of the group that failed, arriving late, show steps it reached before it stopped: all
    lost with it. A Lease lags by at most one heartbeat interval, so they raise the detected step up to
    `resumeStep` at most (which stays put: a new group taken for the old one, its clock behind, can never
    hold the incident open). Only for a worker's failure: after a rendezvous loss the group may train on."""
    if failure is None or incident.detected_step is None or incident.action not in WORKER_ACTIONS:
        return
    old = [beat.step for beat in beats if _of_a_group_before(beat, failure)]
    ceiling = incident.resume_step if incident.resume_step is not None else incident.detected_step
    incident.detected_step = max(incident.detected_step, min(max(old, default=0), ceiling))


def _of_a_group_before(beat: Beat, failure: datetime) -> bool:
    """Whether the beat's step was reached by a group formed before the failure: one that runs, or the latest
    group of a worker now between groups (a survivor re-forming shows the step its group stopped at as soon
    as it leaves, often before the failed pod's loss is seen and well before a new group forms); a worker
    between groups whose latest group never resumed does not say when it started, and its step is that
    group's restored one at most."""
    if beat.group_started is not None:
        return beat.group_started <= failure
    return not beat.active


def _resumed_group(beats: list[Beat], failure: datetime | None) -> Beat | None:
    """The heartbeat telling when a group formed after the failure completed its first step (the earliest
    such report), None when no such group resumed yet."""
    if failure is None:
        return None
    resumed = [
        (beat.resumed_at, beat)
        for beat in beats
        if beat.group_started is not None
        and beat.group_started > failure
        and beat.resumed_at is not None
        and beat.resumed_at >= beat.group_started
    ]
    return min(resumed, key=lambda pair: pair[0])[1] if resumed else None


def _close(incident: api.Incident, resumed: str, failure: datetime | None, now: datetime) -> None:
    """Close `incident` at `resumed` (a stamp), timing the recovery from the failure."""
    incident.resumed_at = resumed
    end = parse_time(resumed) or now
    incident.seconds_to_recover = round(max((end - (failure or end)).total_seconds(), 0.0), 1)


def _update_open(incident: api.Incident, beats: list[Beat], now: datetime) -> datetime | None:
    """Follow one open incident; the moment training resumed when it closes now, else None."""
    failure = failed_at(incident)
    _raise_detected_step(incident, beats, failure)
    group = _resumed_group(beats, failure)
    if group is not None and group.resumed_at is not None:
        incident.restored_step, incident.restored_from = group.restored_step, group.restored_from
        _close(incident, format_micro_time(group.resumed_at), failure, now)
        restored = group.restored_step
        if incident.detected_step is not None and restored is not None and incident.action in WORKER_ACTIONS:
            # Whatever a group formed after the failure restored had been reached before it: the step at
            # detection, from Leases that lag, may be short of it.
            incident.detected_step = max(incident.detected_step, restored)
        baseline = incident.detected_step
        if baseline is not None and restored is None:
            restored = incident.resumed_from_step
        if baseline is not None and restored is not None:
            incident.steps_lost = max(baseline - restored, 0)
        return group.resumed_at
    detected_at = parse_time(incident.detected_at)
    # After a worker's failure the group it broke never resumes: a survivor's Lease renewed since, still
    # showing that group's steps (it trained on until a collective failed), says nothing of where training
    # resumed. After a rendezvous loss the group may train on, so its beats count.
    replaced_group = incident.action in WORKER_ACTIONS and failure is not None
    fresh = [
        beat.step
        for beat in beats
        if beat.active
        and (detected_at is None or beat.renewed is None or beat.renewed >= detected_at)
        and not (replaced_group and failure is not None and _of_a_group_before(beat, failure))
    ]
    highest, lowest = max(fresh, default=None), min(fresh, default=None)
    if lowest is not None and (incident.resumed_from_step is None or lowest < incident.resumed_from_step):
        incident.resumed_from_step = lowest
    baseline = incident.detected_step
    threshold = incident.resume_step if incident.resume_step is not None else baseline
    if highest is None or (threshold is not None and highest <= threshold):
        return None
    _close(incident, format_time(now), failure, now)
    if baseline is not None and incident.resumed_from_step is not None:
        incident.steps_lost = max(baseline - min(incident.resumed_from_step, baseline), 0)
    return now


def observe_progress(incidents: list[api.Incident], beats: list[Beat], now: datetime) -> Progress:
    """Update open incidents with the active workers' heartbeats seen now.

    `beats`: heartbeats of the live workers that report a step; those whose phase says they train (or save /
    restore) tell where training resumed, and those between groups only what their previous group reached. For
    the estimate, only a heartbeat renewed at or after an incident's detection speaks for it: an older one
    shows a step from before the failure, not where training resumed.
    """
    updated: list[api.Incident] = []
    recovered: list[api.Incident] = []
    ended: list[datetime] = []
    for incident in incidents:
        if not is_open(incident):
            updated.append(incident)
            continue
        incident = incident.model_copy()
        resumed = _update_open(incident, beats, now)
        if resumed is not None:
            recovered.append(incident)
            ended.append(resumed)
        updated.append(incident)
    lost = 0.0
    if recovered:
        earliest = min(failed_at(incident) or now for incident in recovered)
        lost = max((min(max(ended), now) - earliest).total_seconds(), 0.0)
    return Progress(updated, recovered, lost)


def append(incidents: list[api.Incident], incident: api.Incident) -> list[api.Incident]:
    """The incident list with `incident` added, keeping the newest `MAX_INCIDENTS`."""
    return [*incidents, incident][-MAX_INCIDENTS:]


def open_seconds(incidents: list[api.Incident], now: datetime) -> float:
    """Seconds lost so far to incidents still open (their union)."""
    starts = [failed_at(incident) or now for incident in incidents if is_open(incident)]
    return max((now - min(starts)).total_seconds(), 0.0) if starts else 0.0


def goodput(
    start_time: str | None,
    end: datetime,
    recovery_seconds: float,
    incidents: list[api.Incident],
    digits: int = 4,
) -> float | None:
    """Productive time over wall time since the job started (None before it started), rounded to `digits`.

    A running job's figure moves with the clock: callers storing it round coarsely so that the timer's
    reconciles do not write the status for a change in the fourth decimal."""
    started = parse_time(start_time)
    if started is None:
        return None
    wall = (end - started).total_seconds()
    if wall <= 0:
        return None
    lost = recovery_seconds + open_seconds(incidents, end)
    return round(min(max(1.0 - lost / wall, 0.0), 1.0), digits)


def detected_text(incident: api.Incident) -> str:
    """The Event message of a detection, in the order of the story: what, where, what was done."""
    where = f" on node {incident.node}" if incident.node else ""
    step = f" at step {incident.detected_step}" if incident.detected_step is not None else ""
    rule = f" (rule {incident.rule})" if incident.rule else ""
    return f"{incident.message}{where}{step}: {incident.action}{rule}"


def recovered_text(incident: api.Incident) -> str:
    lost = f"; {incident.steps_lost} step(s) lost" if incident.steps_lost is not None else ""
    resumed_step = (
        incident.restored_step if incident.restored_step is not None else incident.resumed_from_step
    )
    resumed = f" from step {resumed_step}" if resumed_step is not None else ""
    if incident.restored_from:
        resumed += f" ({incident.restored_from})"
    return (
        f"training resumed{resumed} {incident.seconds_to_recover:g}s after {incident.cause} of "
        f"{incident.worker}{lost}"
    )
