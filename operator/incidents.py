"""Incidents: what failed, what was done, and when training resumed (pure functions).

An incident opens when a failure is handled and closes (`resumedAt`) at the first reconcile where an
active worker's heartbeat step passes the job's step at detection plus the steps one heartbeat interval may
hide (a Lease lags its worker by up to one interval, so a survivor's late report is not a resumption). `resumedFromStep` is the lowest step the
active workers' heartbeats showed in between (the step the group restored), so `stepsLost` = step at
detection - resumed-from step. Goodput is productive time over wall time, the lost time being the union of
the recovery intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from phalanx.operator import api, detection
from phalanx.operator.policy import Decision
from phalanx.operator.timeutil import format_time, parse_time

MAX_INCIDENTS = 20
RECOVERING_ACTIONS = ("ReplaceWorker", "RestartJob")


def unreported_steps(interval_seconds: float, step_seconds: list[float]) -> int:
    """Steps a heartbeat may not have reported yet: one interval's worth at the median step time (>= 1)."""
    known = sorted(seconds for seconds in step_seconds if seconds > 0)
    if not known:
        return 1
    median = known[len(known) // 2]
    return max(math.ceil(interval_seconds / median), 1)


def open_incident(
    failure: detection.Failure,
    decision: Decision,
    now: datetime,
    job_step: int | None,
    unreported: int = 1,
) -> api.Incident:
    """The record of a handled failure. A standby spare's failure disrupts nothing: it is closed at once.

    `unreported`: steps the workers may have done beyond `job_step` before the failure without a heartbeat
    showing them yet; training counts as resumed only past them.
    """
    incident = api.Incident(
        cause=failure.cause,
        worker=failure.pod,
        pod_uid=failure.uid,
        node=failure.node,
        action=decision.action,
        rule=decision.rule,
        message=failure.message,
        detected_at=format_time(now),
        detected_step=job_step,
        resume_step=None if job_step is None else job_step + unreported,
    )
    if failure.spare and decision.action == "ReplaceWorker":
        incident.resumed_at = incident.detected_at
        incident.seconds_to_recover = 0.0
        incident.steps_lost = 0
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
    """One active worker's last heartbeat: its step and when its Lease was renewed (None: unknown)."""

    step: int
    renewed: datetime | None = None


def observe_progress(incidents: list[api.Incident], beats: list[Beat], now: datetime) -> Progress:
    """Update open incidents with the active workers' heartbeats seen now.

    `beats`: heartbeats of the live workers whose phase says they train (or save / restore). Only a
    heartbeat renewed at or after an incident's detection speaks for it: an older one shows a step from
    before the failure, not where training resumed.
    """
    updated: list[api.Incident] = []
    recovered: list[api.Incident] = []
    for incident in incidents:
        if not is_open(incident):
            updated.append(incident)
            continue
        detected_at = parse_time(incident.detected_at)
        fresh = [
            beat.step
            for beat in beats
            if detected_at is None or beat.renewed is None or beat.renewed >= detected_at
        ]
        highest, lowest = max(fresh, default=None), min(fresh, default=None)
        incident = incident.model_copy()
        if lowest is not None and (incident.resumed_from_step is None or lowest < incident.resumed_from_step):
            incident.resumed_from_step = lowest
        baseline = incident.detected_step
        threshold = incident.resume_step if incident.resume_step is not None else baseline
        passed = highest is not None and (threshold is None or highest > threshold)
        if passed:
            detected = parse_time(incident.detected_at) or now
            incident.resumed_at = format_time(now)
            incident.seconds_to_recover = round(max((now - detected).total_seconds(), 0.0), 1)
            if baseline is not None and incident.resumed_from_step is not None:
                incident.steps_lost = max(baseline - min(incident.resumed_from_step, baseline), 0)
            recovered.append(incident)
        updated.append(incident)
    lost = 0.0
    if recovered:
        earliest = min(parse_time(incident.detected_at) or now for incident in recovered)
        lost = max((now - earliest).total_seconds(), 0.0)
    return Progress(updated, recovered, lost)


def append(incidents: list[api.Incident], incident: api.Incident) -> list[api.Incident]:
    """The incident list with `incident` added, keeping the newest `MAX_INCIDENTS`."""
    return [*incidents, incident][-MAX_INCIDENTS:]


def open_seconds(incidents: list[api.Incident], now: datetime) -> float:
    """Seconds lost so far to incidents still open (their union)."""
    starts = [parse_time(incident.detected_at) or now for incident in incidents if is_open(incident)]
    return max((now - min(starts)).total_seconds(), 0.0) if starts else 0.0


def goodput(
    start_time: str | None, end: datetime, recovery_seconds: float, incidents: list[api.Incident]
) -> float | None:
    """Productive time over wall time since the job started (None before it started)."""
    started = parse_time(start_time)
    if started is None:
        return None
    wall = (end - started).total_seconds()
    if wall <= 0:
        return None
    lost = recovery_seconds + open_seconds(incidents, end)
    return round(min(max(1.0 - lost / wall, 0.0), 1.0), 4)


def detected_text(incident: api.Incident) -> str:
    """The Event message of a detection, in the order of the story: what, where, what was done."""
    where = f" on node {incident.node}" if incident.node else ""
    step = f" at step {incident.detected_step}" if incident.detected_step is not None else ""
    return f"{incident.message}{where}{step}: {incident.action} (rule {incident.rule})"


def recovered_text(incident: api.Incident) -> str:
    lost = f"; {incident.steps_lost} step(s) lost" if incident.steps_lost is not None else ""
    resumed = f" from step {incident.resumed_from_step}" if incident.resumed_from_step is not None else ""
    return (
        f"training resumed{resumed} {incident.seconds_to_recover:g}s after {incident.cause} of "
        f"{incident.worker}{lost}"
    )
