"""The heartbeat hub's summary: every worker's beat of a job as one small object, and back.

At a few hundred pods and more, launchers do not renew a Lease each: they put their beat into the job's
rendezvous store, and the hub beside it (worker/beathub.py) reads them all and publishes one summary Lease,
which the operator expands back into the per-pod heartbeats its detection reads (operator/hubview.py). A beat
is exactly what the operator keeps of a pod's own Lease (`status.summarize_lease`): the heartbeat fields without
their annotation prefix, `renewTime` and `ownerUid`.

A summary stays small whatever the gang's size because pods that say the same thing are one class: the fields
the operator acts on (phase, step, fault, exit code, group, restore, ...) are the class's key, and its members
are index ranges. What varies from pod to pod without changing any decision (its rank, loss, step time, ...)
is the class's first member's. A class's `renewTime` is its members' oldest, so an expanded heartbeat is never
fresher than the pod's own beat; beats older than the hub's freshness window are classed by their renew time as
well, to the second unless listed whole. Pods with a fault or an exit code are listed whole (up to
`MAX_LISTED`): the operator reads their details. Steady training is two or three classes, whatever N.

Both sides import this module (it lives beside `contract`): the summary is a promise between images.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from phalanx import contract

VERSION = 1
SUMMARY_ANNOTATION = "phalanx.dev/hub-summary"
"""The summary Lease's annotation that holds the summary (JSON)."""
PER_POD_NOISE = frozenset(
    {
        "rank",
        "loss",
        "grad-norm",
        "step-seconds",
        "step-at",
        "samples-per-second",
        "compute-seconds",
        "checkpoint-save-seconds",
        "hang-threshold",
        "hang-basis",
    }
)
"""Beat fields that differ between pods saying the same thing, and that no decision of the operator reads per
pod: a class carries its first member's. Whether a rank is set at all is part of the key (a spare released
unpromoted finishes without one)."""
LATEST_OF_CLASS = frozenset({"phase-since", "group-started", "resumed-at"})
"""Times a class carries as its latest member's: each pod enters a phase, starts its group and resumes a
moment apart, and the latest never makes a timeout fire early nor a recovery look faster than it was."""
LOWEST_OF_CLASS = ("step", "checkpoint-step")
"""Counters a class carries as its slowest member's (its fields are that member's): pods renew a moment apart,
so at any instant some report the next step or the new checkpoint and some not yet. Keyed by them, a gang would
split into classes of scattered indices; carried as the lowest, a progress clock moves only once the slowest
pod moved, as it does in synchronous training, and no checkpoint is taken as made before every pod made it."""
NOT_IN_KEY = PER_POD_NOISE | LATEST_OF_CLASS | frozenset({"renewTime", "ownerUid", *LOWEST_OF_CLASS})
LISTED_WHOLE = ("fault", "exit-code", "preflight")
"""A beat with any of these set is listed whole: the operator reads its details (the fault's rank, since and
message; the exit code; the preflight's reason)."""
MAX_LISTED = 256
"""Pods listed whole at most; beyond, they are classed like the others."""
MAX_CLASSES = 128
"""Classes at most (each carries a whole beat, about 1 kB): beyond, they merge (`summarise`)."""
MAX_MERGE_WIDTH = 4096
"""The coarsest renew-time bucket, in seconds, of merged stale classes."""
MAX_SUMMARY_BYTES = 200_000
"""The most a summary may take: under the 256 KiB Kubernetes allows a Lease's annotations."""
MAX_BEAT_BYTES = 16_384
"""A beat longer than this is not a launcher's (its fields are cut to `status.MAX_LEASE_SUMMARY`)."""
MAX_INDEX = 1_000_000


def parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------------------------------- beats

MAX_LEASE_VALUE = 4096
"""Characters kept of one heartbeat annotation (the longest a worker writes, `checkpoint-skipped`, is ~2 KB)."""
MAX_LEASE_SUMMARY = 16384
"""Characters kept of one Lease's heartbeat annotations in all (a worker's come to ~5 KB at most): anyone who
can write Leases could otherwise fill the operator's memory with 256 KiB of annotations per Lease."""


def lease_summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """Heartbeat fields of a worker's Lease (annotations without their prefix, plus the renew time and the
    owning pod's uid), each value cut to `MAX_LEASE_VALUE` and the whole to `MAX_LEASE_SUMMARY` characters: what
    the operator keeps of a Lease, and what a launcher puts into the store as its beat."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    summary: dict[str, Any] = {}
    budget = MAX_LEASE_SUMMARY
    for key, value in annotations.items():
        if not key.startswith(contract.LEASE_ANNOTATION_PREFIX) or budget <= 0:
            continue
        field, text = key.removeprefix(contract.LEASE_ANNOTATION_PREFIX)[:64], str(value)[:MAX_LEASE_VALUE]
        budget -= len(field) + len(text)
        if budget >= 0:
            summary[field] = text
    summary["renewTime"] = (body.get("spec") or {}).get("renewTime")
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    summary["ownerUid"] = next((owner.get("uid") for owner in owners if owner.get("kind") == "Pod"), None)
    return summary


def encode_beat(beat: Mapping[str, str | None]) -> bytes:
    """A beat as the launcher writes it into the store (JSON of strings)."""
    return json.dumps(
        {key: value for key, value in beat.items() if value is not None}, separators=(",", ":")
    ).encode()


def decode_beat(raw: bytes) -> dict[str, str] | None:
    """A beat read back from the store: a JSON object of strings, else None (never trusted further)."""
    if len(raw) > MAX_BEAT_BYTES:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or not all(
        isinstance(key, str) and isinstance(item, str) for key, item in value.items()
    ):
        return None
    return value


# --------------------------------------------------------------------------------------- verdicts


def verdict_time(beat: Mapping[str, Any] | None) -> datetime | None:
    """When a launcher judged its rank hung: the wait's start plus the threshold it was judged by (None: its beat
    or Lease carries no hang verdict)."""
    if not beat or beat.get("fault") != contract.FAULT_HUNG:
        return None
    since = parse_time(beat.get("fault-since"))
    try:
        threshold = float(beat.get("hang-threshold") or 0.0)
    except (TypeError, ValueError):
        threshold = 0.0
    if since is None or not math.isfinite(threshold):
        return None
    return since + timedelta(seconds=threshold)


def earliest_verdict(beats: Iterable[Mapping[str, Any]]) -> datetime | None:
    """The earliest hang verdict among `beats` (None: none carries one)."""
    return min((moment for beat in beats if (moment := verdict_time(beat)) is not None), default=None)


def awaited_verdict(beats: Iterable[Mapping[str, Any]], live_seconds: float = math.inf) -> datetime | None:
    """The earliest hang verdict among `beats` while a live peer in the group (not itself judged hung) last
    renewed before it; None when there is none or every live peer renewed since. A peer whose last renewal came
    more than `live_seconds` before the verdict is not waited for: it fell silent (or its pod is gone and its
    beat lingers), and no renewal of it will come.

    The operator acts on a hang verdict only once every peer renewed after it: a healthy peer renews every
    interval while the others wait, so one that did not is the likelier culprit (operator/detection.py). The
    hub publishes as soon as the wait is over rather than at its next interval, and says so in the summary
    (`settled`); the operator still decides from its own view of the job's pods."""
    beats = list(beats)
    judged = earliest_verdict(beats)
    if judged is None:
        return None
    for beat in beats:
        if verdict_time(beat) is not None or beat.get("phase") not in contract.IN_GROUP_PHASES:
            continue
        renewed = parse_time(beat.get("renewTime"))
        if renewed is not None and renewed < judged and (judged - renewed).total_seconds() <= live_seconds:
            return judged
    return None


def settled_verdict(summary: Mapping[str, Any]) -> datetime | None:
    """The hang verdict a summary (`decode` accepted) says every live peer renewed after (`settled`): the
    operator can act on it now. None when the summary says none (or comes from a hub that does not say)."""
    return parse_time(summary.get("settled"))


# ------------------------------------------------------------------------------------------ ranges


def format_ranges(indices: Iterable[int]) -> str:
    """`0-3,7,9-10` from any iterable of indices."""
    spans: list[str] = []
    ordered = sorted(set(indices))
    start = previous = None
    for index in [*ordered, None]:
        if index is not None and previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ",".join(spans)


RANGE = re.compile(r"^(\d{1,7})(?:-(\d{1,7}))?$")


def parse_ranges(text: str) -> Iterator[int]:
    """The indices of `format_ranges`' text; a malformed part or one beyond `MAX_INDEX` is skipped."""
    for part in text.split(","):
        match = RANGE.match(part)
        if match is None:
            continue
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if first <= last <= MAX_INDEX:
            yield from range(first, last + 1)


# ---------------------------------------------------------------------------------------- summarise


def _listed_whole(beat: Mapping[str, str]) -> bool:
    return any(beat.get(field) for field in LISTED_WHOLE)


def _renew_second(beat: Mapping[str, str]) -> int | None:
    moment = parse_time(beat.get("renewTime"))
    return None if moment is None else math.floor(moment.timestamp())


def summarise(
    prefix: str,
    beats: Mapping[int, Mapping[str, str]],
    now: datetime,
    fresh_seconds: float,
    settled: datetime | None = None,
) -> dict[str, Any]:
    """One summary of `beats` (pod index -> beat) for pods named `prefix` + index.

    A beat renewed within `fresh_seconds` of `now` is classed by what it says; an older one by its renew second
    as well, so that a class's oldest renewal is within a second of each member's: a silent pod is never hidden
    in a fresh class, nor does it make fresh pods look silent. When the classes are too many or too big (a mass
    re-form, a partition), the listed pods join them first, then classes merge by phase and by ever coarser
    renew seconds, fresh beats never with stale ones. `settled`: a hang verdict every live peer renewed after
    (`awaited_verdict`), said as `settled` for the operator to act on at once."""
    listed: dict[str, dict[str, str]] = {}
    keyed: dict[tuple[Any, ...], list[int]] = {}
    for index in sorted(beats):
        beat = beats[index]
        if _listed_whole(beat) and len(listed) < MAX_LISTED:
            listed[str(index)] = dict(beat)
            continue
        keyed.setdefault(_key(beat, now, fresh_seconds), []).append(index)
    width = 0
    while True:
        classes = keyed if width == 0 else _merged(keyed, beats, width)
        summary = {
            "v": VERSION,
            "at": micro_time(now),
            "prefix": prefix,
            "members": len(beats),
            "classes": [_class(beats, members) for members in classes.values()],
            "listed": listed,
        }
        if settled is not None:
            summary["settled"] = micro_time(settled)
        if (
            len(classes) <= MAX_CLASSES and len(encode(summary)) <= MAX_SUMMARY_BYTES
        ) or width > MAX_MERGE_WIDTH:
            return summary
        if listed:
            for name in listed:
                keyed.setdefault(_key(beats[int(name)], now, fresh_seconds), []).append(int(name))
            listed = {}
            continue
        width = max(1, width * 2)


def _key(beat: Mapping[str, str], now: datetime, fresh_seconds: float) -> tuple[Any, ...]:
    """(what the beat says that the operator acts on, its renew second if it is stale else None)."""
    renewed = parse_time(beat.get("renewTime"))
    stale = renewed is None or (now - renewed).total_seconds() > fresh_seconds
    said = (bool(beat.get("rank")), *sorted((f, v) for f, v in beat.items() if f not in NOT_IN_KEY))
    return said, _renew_second(beat) if stale else None


def _merged(
    keyed: dict[tuple[Any, ...], list[int]], beats: Mapping[int, Mapping[str, str]], width: int
) -> dict[tuple[Any, ...], list[int]]:
    """Classes merged by phase and renew time in buckets of `width` seconds (fresh beats stay apart)."""
    merged: dict[tuple[Any, ...], list[int]] = {}
    for (_, second), members in keyed.items():
        bucket = None if second is None else second // width
        merged.setdefault((beats[members[0]].get("phase"), bucket), []).extend(members)
    return merged


def _class(beats: Mapping[int, Mapping[str, str]], members: list[int]) -> dict[str, Any]:
    """A class of `members`: its fields from the member at the lowest step (then index), its times the latest
    of its members', its renewal the oldest."""
    template = beats[min(members, key=lambda index: (_number(beats[index], "step"), index))]
    # (Its figures are that member's own; `real_beats` hands them on under its name.)
    fields = {field: value for field, value in template.items() if field not in ("renewTime", "ownerUid")}
    for field in LOWEST_OF_CLASS:
        lowest = min(members, key=lambda index: (_number(beats[index], field), index))
        if beats[lowest].get(field):
            fields[field] = beats[lowest][field]
    for field in LATEST_OF_CLASS:
        latest = max((beats[index].get(field) or "" for index in members), key=_time_order)
        if latest:
            fields[field] = latest
    renewals = [parse_time(beats[index].get("renewTime")) for index in members]
    known = [moment for moment in renewals if moment is not None]
    return {
        "pods": format_ranges(members),
        "of": min(members, key=lambda index: (_number(beats[index], "step"), index)),
        "renewTime": micro_time(min(known)) if known else None,
        "fields": fields,
    }


def _number(beat: Mapping[str, str], field: str) -> float:
    """The field as a number; unknown sorts last."""
    try:
        value = float(beat.get(field) or "")
    except ValueError:
        return math.inf
    return value if math.isfinite(value) else math.inf


def _time_order(text: str) -> float:
    moment = parse_time(text)
    return -math.inf if moment is None else moment.timestamp()


def encode(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, separators=(",", ":"), sort_keys=True)


# ------------------------------------------------------------------------------------------- expand


def decode(text: object) -> dict[str, Any] | None:
    """A summary read from the Lease: the shape `summarise` writes, else None."""
    if not isinstance(text, str) or len(text) > MAX_SUMMARY_BYTES:
        return None
    try:
        summary = json.loads(text)
    except ValueError:
        return None
    if not isinstance(summary, dict) or summary.get("v") != VERSION:
        return None
    if not isinstance(summary.get("prefix"), str) or parse_time(summary.get("at")) is None:
        return None
    if not isinstance(summary.get("classes"), list) or not isinstance(summary.get("listed"), dict):
        return None
    return summary


def _strings(value: object) -> dict[str, str] | None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None
    return value


def expand(summary: Mapping[str, Any]) -> dict[str, dict[str, str | None]]:
    """Pod name -> its heartbeat as the operator keeps a Lease's (`status.summarize_lease`), from a summary
    `decode` accepted. A class member's carries the class's fields and oldest renewal and no `ownerUid` (taken
    as the pod's; a recreated pod is told apart by its creation after that renewal); a listed pod's is its beat.
    """
    prefix = summary["prefix"]
    beats: dict[str, dict[str, str | None]] = {}
    for entry in summary["classes"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("pods"), str):
            continue
        fields = _strings(entry.get("fields"))
        renewed = entry.get("renewTime")
        if fields is None or not (renewed is None or isinstance(renewed, str)):
            continue
        for index in parse_ranges(entry["pods"]):
            beats[f"{prefix}{index}"] = {**fields, "renewTime": renewed}
    for index, beat in summary["listed"].items():
        fields = _strings(beat)
        if fields is not None and isinstance(index, str) and index.isdigit() and int(index) <= MAX_INDEX:
            beats[f"{prefix}{int(index)}"] = {**fields, "renewTime": fields.get("renewTime")}
    return beats


def real_beats(summary: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The beats a summary carries whole, by pod name: each class's template (`of`, its member whose figures it
    carries: loss, step time) and the listed pods. What a pod's training-health history may take as its own."""
    prefix = summary["prefix"]
    found: dict[str, dict[str, str]] = {}
    for entry in summary["classes"]:
        fields = _strings(entry.get("fields")) if isinstance(entry, dict) else None
        index = entry.get("of") if isinstance(entry, dict) else None
        if fields is not None and isinstance(index, int) and 0 <= index <= MAX_INDEX:
            found[f"{prefix}{index}"] = {**fields, "renewTime": entry.get("renewTime") or ""}
    for index, beat in summary["listed"].items():
        fields = _strings(beat)
        if fields is not None and isinstance(index, str) and index.isdigit() and int(index) <= MAX_INDEX:
            found[f"{prefix}{int(index)}"] = fields
    return found
