"""The operator's per-worker memory kept small: `status.tracking` holds only what the pods and their heartbeats
cannot tell again, so a job's status stays a few KiB whether its gang has 3 pods or 12,500.

Between reconciles the operator remembers, for each trainer pod, that it saw it, when its no-progress clock
started, its straggler streak, its restarts and whether its failure was handled (`api.WorkerTrack`). For nearly
every pod of a healthy gang all of that follows from the pod and its heartbeat: the clock started when the
heartbeat says the step was reached (`step-at`, never before the job's clocks last started over), the streak and
the restarts are zero. Such a pod's memory is not written: its index goes into `status.tracked.known`, and the
next reconcile rebuilds its track (`expand`). Pods the operator is done with are index ranges too (a gang
deleted at once is one range). Only the exceptions are written out in full (`compact`), at most
`MAX_STORED_TRACKS` of them.

What a rebuilt track cannot tell is the step its straggler streak was last measured at: a worker whose streak is
zero is measured again at every reconcile that sees its heartbeat's step time, so one step may count twice
toward a streak's start (a streak needs `stragglerSteps` in a row, and the second measurement stores the track).
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from phalanx.operator import api, detection, names, statusbudget
from phalanx.operator import status as observe
from phalanx.operator.timeutil import parse_time

MAX_STORED_TRACKS = 256
"""Tracks written out in full at most. Beyond it the least needed
are rebuilt from their pods at the next reconcile like any other: a straggler streak starts over, a no-progress
clock restarts at the heartbeat's step."""

Heartbeat = Callable[[dict[str, Any]], dict[str, Any] | None]
"""A pod's own heartbeat Lease summary, or None (`detection.heartbeat_of`, judged once per pod by the reconcile)."""

FIELD_NAMES_BYTES = 32
"""What `"tracking":[],"tracked":` add to a status besides their contents."""
MAX_TRACKED_INDEX = 1_000_000
"""Pod indices beyond this are never read from `status.tracked` (a gang is bounded far below it, and a status
edited by hand must not make the operator walk billions of indices)."""


def format_ranges(indices: Iterable[int]) -> list[str]:
    """Indices as sorted ranges, e.g. `["0-511", "514", "600-601"]`."""
    parts: list[str] = []
    start = end = None
    for index in sorted(set(indices)):
        if end is not None and index == end + 1:
            end = index
            continue
        if start is not None:
            parts.append(_range_text(start, end))
        start = end = index
    if start is not None:
        parts.append(_range_text(start, end))
    return parts


def _range_text(start: int, end: int | None) -> str:
    return str(start) if end is None or end == start else f"{start}-{end}"


class IndexRanges:
    """A parsed range list: membership by bisection, so a wide range costs nothing until walked."""

    def __init__(self, parts: Iterable[str]) -> None:
        spans: list[tuple[int, int]] = []
        for part in parts:
            span = _parse_span(part)
            if span is not None:
                spans.append(span)
        spans.sort()
        self.spans = spans
        self._starts = [start for start, _ in spans]

    def __contains__(self, index: object) -> bool:
        if not self.spans or not isinstance(index, int):
            return False
        at = bisect.bisect_right(self._starts, index) - 1
        return at >= 0 and self.spans[at][0] <= index <= self.spans[at][1]

    def __iter__(self) -> Iterator[int]:
        seen = -1
        for start, end in self.spans:
            for index in range(max(start, seen + 1), end + 1):
                seen = index
                yield index


def _parse_span(part: str) -> tuple[int, int] | None:
    """One `a` or `a-b`; None for anything else or anything outside [0, MAX_TRACKED_INDEX]."""
    first, _, last = part.strip().partition("-")
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    start, end = int(first), int(last or first)
    if start > end or end > MAX_TRACKED_INDEX:
        return None
    return start, end


def expand(
    status: api.TrainingJobStatus,
    pods: list[dict[str, Any]],
    heartbeat: Heartbeat,
    job_name: str,
    now: datetime,
) -> list[api.WorkerTrack]:
    """Every track the operator remembers: the stored ones, then one rebuilt for each other pod of
    `status.tracked.known`, from the pod when it is observed, else as a pod that vanished."""
    stored = list(status.tracking)
    summary = status.tracked
    if summary is None:
        return stored
    known, done, kept = IndexRanges(summary.known), IndexRanges(summary.done), IndexRanges(summary.kept)
    named = {track.pod for track in stored}
    # By name: the pod of an index is the trainer named for it (a name that is not the job's own is never one).
    trainers = {observe.pod_name(pod): pod for pod in pods if observe.is_trainer(pod)}
    rebuilt: list[api.WorkerTrack] = []
    for index in known:
        name = names.worker_pod_name(job_name, index)
        if name in named:
            continue
        pod = trainers.get(name)
        if pod is None:
            rebuilt.append(api.WorkerTrack(pod=name, done=index in done, kept=index in kept))
            continue
        lease = heartbeat(pod)
        rebuilt.append(
            api.WorkerTrack(
                pod=name,
                uid=pod["metadata"].get("uid"),
                node=(pod.get("spec") or {}).get("nodeName"),
                since=_clock_start(lease, summary.clocks_since, now),
                done=index in done,
                kept=index in kept,
            )
        )
    return stored + rebuilt


def compact(
    tracks: list[api.WorkerTrack],
    pods: list[dict[str, Any]],
    heartbeat: Heartbeat,
    job_name: str,
    clocks_since: str | None,
    now: datetime,
    budget_bytes: int = sys.maxsize,
) -> tuple[list[api.WorkerTrack], api.TrackedPods | None]:
    """What to write: the tracks `expand` could not rebuild as they are (at most `MAX_STORED_TRACKS`, the most
    needed first, and no more than fit in `budget_bytes` as JSON beside the ranges), and the index ranges of all
    the others."""
    if not tracks:
        return [], None
    observed = {
        (observe.pod_name(pod), pod["metadata"].get("uid")): pod for pod in pods if observe.is_trainer(pod)
    }
    known: list[int] = []
    done: list[int] = []
    kept: list[int] = []
    stored: list[tuple[int, int | None, api.WorkerTrack]] = []
    for track in tracks:
        index = _own_index(track.pod, job_name)
        pod = observed.get((track.pod, track.uid))
        if pod is None and track.done:
            continue  # handled and gone: `detection.update_tracks` forgets it as well
        if index is None or not _rebuilds(track, pod, heartbeat, clocks_since, now):
            stored.append((_need(track, pod is not None), index, track))
            continue
        known.append(index)
        if track.done:
            done.append(index)
        if track.kept:
            kept.append(index)
    stored.sort(key=lambda entry: entry[0])
    fitting = _fitting(stored, known, done, kept, clocks_since, budget_bytes)
    # No room for the rest: rebuilt from their pods like the others (a streak or a restart count starts over).
    known.extend(index for _, index, _ in stored[fitting:] if index is not None)
    written = [
        track
        for _, index, track in sorted(
            stored[:fitting], key=lambda entry: (-1 if entry[1] is None else entry[1], entry[2].pod)
        )
    ]
    summary = api.TrackedPods(
        known=format_ranges(known),
        done=format_ranges(done),
        kept=format_ranges(kept),
        clocks_since=clocks_since,
    )
    return written, summary


def _fitting(
    stored: list[tuple[int, int | None, api.WorkerTrack]],
    known: list[int],
    done: list[int],
    kept: list[int],
    clocks_since: str | None,
    budget_bytes: int,
) -> int:
    """How many of the `stored` tracks (most needed first) are written out: at most `MAX_STORED_TRACKS`, and as
    many as fit in `budget_bytes` beside the ranges of the others."""
    count = min(len(stored), MAX_STORED_TRACKS)
    if budget_bytes == sys.maxsize or count == 0:
        return count
    sizes = [statusbudget.size(track.to_wire()) + 1 for _, _, track in stored[:count]]

    def ranges_bytes(written: int) -> int:
        others = [*known, *(index for _, index, _ in stored[written:] if index is not None)]
        ranges = api.TrackedPods(
            known=format_ranges(others),
            done=format_ranges(done),
            kept=format_ranges(kept),
            clocks_since=clocks_since,
        )
        return statusbudget.size(ranges.to_wire())

    # First as if the ranges stayed as they are with every stored track left out; then exactly (a track written
    # out can split a range, so the ranges may grow a little as tracks are written).
    room = budget_bytes - FIELD_NAMES_BYTES - ranges_bytes(0)
    fits = 0
    while fits < count and room - sizes[fits] >= 0:
        room -= sizes[fits]
        fits += 1
    while fits > 0 and sum(sizes[:fits]) + ranges_bytes(fits) + FIELD_NAMES_BYTES > budget_bytes:
        fits -= 1
    return fits


def _rebuilds(
    track: api.WorkerTrack,
    pod: dict[str, Any] | None,
    heartbeat: Heartbeat,
    clocks_since: str | None,
    now: datetime,
) -> bool:
    """Whether `expand` rebuilds `track` as it is from its observed pod. Nothing but `done` and `kept`
    matters of a pod the operator is done with; a vanished pod still to be judged keeps its uid and node."""
    if pod is None:
        return False
    if track.done:
        return True
    if track.slow or track.restarts or track.node != (pod.get("spec") or {}).get("nodeName"):
        return False
    lease = heartbeat(pod)
    if track.step is not None and track.step != detection.lease_step(lease):
        return False
    rebuilt = _clock_start(lease, clocks_since, now)
    if track.since is None or rebuilt is None:
        return track.since == rebuilt
    reached = parse_time((lease or {}).get("step-at"))
    # A heartbeat stamped ahead of the operator's clock was cut to `now`: only the operator remembers that.
    return reached is not None and reached <= now and parse_time(track.since) == parse_time(rebuilt)


def _clock_start(lease: dict[str, Any] | None, clocks_since: str | None, now: datetime) -> str | None:
    """The no-progress clock's start as `detection.update_tracks` sets it for a worker training at its
    heartbeat's step since `step-at` (never before the job's clocks last started over); None when off."""
    if (lease or {}).get("phase") != detection.TRAINING_PHASE or detection.lease_step(lease) is None:
        return None
    return detection.step_reached(lease, clocks_since, now)


def _own_index(pod_name: str, job_name: str) -> int | None:
    """The index in `pod_name` when it is the job's own trainer pod name for that index."""
    suffix = pod_name.rpartition("-")[2]
    if not suffix.isdigit() or int(suffix) > MAX_TRACKED_INDEX:
        return None
    index = int(suffix)
    return index if names.worker_pod_name(job_name, index) == pod_name else None


def _need(track: api.WorkerTrack, observed: bool) -> int:
    """Which stored tracks matter most when not all fit: a vanished pod still to be judged (its uid and node
    are nowhere else), then restarts seen, then the rest (straggler streaks, clocks the heartbeats cannot tell)."""
    if not observed:
        return 0
    return 1 if track.restarts else 2
