"""Checkpoints a restore passed over, and why (pure, torch-free: the saver process imports durable.py).

A restore takes the newest usable checkpoint and passes over the newer ones it cannot use. Each of those is
kept as a :class:`SkippedCheckpoint`: its step, the tier it was on (`fast`, `local` or `durable`), a reason
word (`Torn`, `Corrupt`, `OtherFormat`) and the detail. The restore hands them on in
`RestoreInfo.skipped`; the worker publishes them in its heartbeat (`phalanx.dev/checkpoint-skipped`, a JSON
list of at most `MAX_ENTRIES` entries with messages of at most `MAX_MESSAGE` characters), and the operator
names them in the job's status and in a Warning Event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

TORN = "Torn"
"""A step folder (or durable copy) without its manifest: a save or copy cut short."""
CORRUPT = "Corrupt"
"""A manifest that cannot be read or makes no sense, or files that disagree with it (size, sha256, missing)."""
OTHER_FORMAT = "OtherFormat"
"""A checkpoint this restore cannot use as such: another manifest format, or sharded where replicated state is
restored (or the reverse)."""
OTHER_JOB = "OtherJob"
"""A checkpoint another job wrote (its manifest names another namespace or name), passed over unless the job
sets `spec.checkpoint.acceptOtherJobs` (worker/checkpoint/ownership.py)."""
REASONS = (TORN, CORRUPT, OTHER_FORMAT, OTHER_JOB)

TIER_FAST = "fast"
"""The checkpoint directory (`PHALANX_CHECKPOINT_DIR`) when a durable tier is configured behind it."""
TIER_LOCAL = "local"
"""The checkpoint directory when it is the node's own disk (a node-local fast tier)."""
TIER_DURABLE = "durable"
"""The durable tier, or the checkpoint directory when it is the only tier."""

MAX_ENTRIES = 8
"""Skipped checkpoints one heartbeat names at most (the newest steps)."""
MAX_MESSAGE = 160
"""The longest detail one entry carries."""


@dataclass(frozen=True)
class Problem:
    """Why one checkpoint cannot be restored: a reason word (`TORN`, `CORRUPT`, `OTHER_FORMAT`) and the detail."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint a restore passed over."""

    step: int
    tier: str
    reason: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "tier": self.tier, "reason": self.reason, "message": self.message}


Reporter = Callable[[int, Problem], None]
"""What a checkpoint lookup calls for each checkpoint it passes over: `report(step, problem)`."""


class SkipLog:
    """The checkpoints one restore passed over, each once (a lookup may be repeated after a fetch)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str], SkippedCheckpoint] = {}

    def reporter(self, tier: str) -> Reporter:
        """A `Reporter` that records what it is told as passed over on `tier`."""

        def report(step: int, problem: Problem) -> None:
            self._entries.setdefault(
                (step, tier), SkippedCheckpoint(step, tier, problem.reason, problem.message[:MAX_MESSAGE])
            )

        return report

    @property
    def entries(self) -> tuple[SkippedCheckpoint, ...]:
        """Newest step first."""
        return tuple(sorted(self._entries.values(), key=lambda entry: (-entry.step, entry.tier)))


def encode(entries: Iterable[SkippedCheckpoint]) -> str:
    """The heartbeat annotation's text: a compact JSON list of the newest `MAX_ENTRIES` (empty: none)."""
    chosen = sorted(set(entries), key=lambda entry: (-entry.step, entry.tier, entry.reason, entry.message))
    if not chosen:
        return ""
    items = [{**entry.as_json(), "message": entry.message[:MAX_MESSAGE]} for entry in chosen[:MAX_ENTRIES]]
    return json.dumps(items, separators=(",", ":"))


def decode(text: str | None) -> list[SkippedCheckpoint]:
    """The entries of an annotation's text (what is not an entry is left out)."""
    if not text:
        return []
    try:
        raw = json.loads(text)
    except ValueError:
        return []
    found = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        step, tier, reason, message = (item.get(key) for key in ("step", "tier", "reason", "message"))
        if isinstance(step, int) and all(isinstance(value, str) for value in (tier, reason, message)):
            found.append(SkippedCheckpoint(step, str(tier), str(reason), str(message)[:MAX_MESSAGE]))
    return found


def merge(texts: Iterable[str | None]) -> str | None:
    """One annotation text for several records' (a pod's ranks'); None when none names any."""
    return encode(entry for text in texts for entry in decode(text)) or None
