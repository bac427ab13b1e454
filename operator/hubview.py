"""A job's heartbeats as the operator reads them when the job has a heartbeat hub (pure functions).

With the hub (`spec.heartbeat.reporting: hub`), launchers put their beats into the job's rendezvous store and the hub, a
container of the rendezvous pod, publishes one summary Lease named after that pod (phalanx.beatsummary). The
reconcile expands it into the per-pod heartbeats detection has always read, and keeps, pod by pod, the later of
that and the pod's own Lease: a launcher that cannot reach the hub renews its own Lease again.

The hub is one more thing that can fail, and its silence must not read as every worker's. Once its summary is
older than `HUB_LATE_INTERVALS` heartbeat intervals, the hub is out: the reconcile adds a gap in the job's view
from the summary's time on (`viewclock.Gap`), so no pod is judged silent for the hub's silence. Every other
signal (a pod's exit, deletion or node, a launcher's verdict on its own Lease) still counts. After
`outage_grace_seconds` the gap closes: the launchers have been renewing their own Leases since the hub's
silence passed their timeout, and a pod still silent then is silent everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from phalanx import beatsummary
from phalanx.operator import viewclock
from phalanx.operator.timeutil import parse_time

NEVER = datetime.min.replace(tzinfo=UTC)
HUB_LATE_INTERVALS = 2.0
"""Heartbeat intervals after its last summary at which the hub counts as out (it writes one each interval)."""


@dataclass(frozen=True)
class HubSummary:
    """A hub's summary Lease, as the operator's index keeps it."""

    pod: str
    """The rendezvous pod that wrote it (the Lease's name and its owner's)."""
    at: datetime
    """When the hub made the summary."""
    summary: dict[str, Any]
    """The decoded summary (`beatsummary.decode`)."""


def read(body: dict[str, Any]) -> HubSummary | None:
    """The hub summary a Lease carries: named after its owner pod, with a summary that decodes; else None."""
    metadata = body.get("metadata") or {}
    owners = [owner for owner in metadata.get("ownerReferences") or [] if owner.get("kind") == "Pod"]
    name = metadata.get("name")
    if not name or [owner.get("name") for owner in owners] != [name]:
        return None
    summary = beatsummary.decode((metadata.get("annotations") or {}).get(beatsummary.SUMMARY_ANNOTATION))
    if summary is None:
        return None
    at = parse_time(summary["at"])
    return None if at is None else HubSummary(pod=name, at=at, summary=summary)


def outage_grace_seconds(interval_seconds: float, timeout_seconds: float) -> float:
    """How long a silent hub's gap lasts: the launchers' own Leases take over one timeout into the silence
    (worker/beathub.py), then one interval to renew; twice that, for room."""
    return 2.0 * (timeout_seconds + interval_seconds)


def merge(
    own: dict[str, dict[str, Any]],
    hub: HubSummary | None,
    pods: list[str],
    now: datetime,
    interval_seconds: float,
    timeout_seconds: float,
) -> tuple[dict[str, dict[str, Any]], viewclock.Gap | None]:
    """The job's heartbeats by pod name (the later of each pod's own Lease and the hub's word for it), and the
    gap to add to the job's view while the hub is out (None when it is not)."""
    if hub is None:
        return own, None
    expanded = beatsummary.expand(hub.summary)
    merged = dict(own)
    for pod in pods:
        said = expanded.get(pod)
        if said is None:
            continue
        mine = own.get(pod)
        if mine is None or _renewed(said) > _renewed(mine):
            merged[pod] = said
    if gap_closes_in(hub, now, interval_seconds, timeout_seconds) is None:
        return merged, None
    return merged, viewclock.Gap(start=hub.at, end=None)


def gap_closes_in(
    hub: HubSummary | None, now: datetime, interval_seconds: float, timeout_seconds: float
) -> float | None:
    """Seconds until a silent hub's gap closes (the reconcile must judge the silences then), None when no gap is
    open. No wake-up is needed for a gap to open: it counts from the hub's last summary whenever it is read."""
    if hub is None:
        return None
    silent = (now - hub.at).total_seconds()
    grace = outage_grace_seconds(interval_seconds, timeout_seconds)
    if silent <= HUB_LATE_INTERVALS * interval_seconds or silent >= grace:
        return None
    return grace - silent


def _renewed(summary: dict[str, Any]) -> datetime:
    moment = parse_time(summary.get("renewTime"))
    return moment if moment is not None else NEVER


def signals_of(hub: HubSummary) -> dict[str, dict[str, Any]]:
    """Each pod's heartbeat from the hub, as `HeartbeatSignals` compares it: the rank left out, since a
    class carries its slowest member's, which changes as the steps move (a pod's role and phase still count)."""
    return {pod: {**said, "rank": None} for pod, said in beatsummary.expand(hub.summary).items()}
