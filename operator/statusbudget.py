"""A TrainingJob's status kept under a fixed size whatever its gang's size (pure functions).

Each part of the status has its own bound (64 listed workers, 20 incidents, 256 stored tracks, every string cut
to `api.STATUS_TEXT_LIMIT`), but together those bounds come to well over 100 KiB: at 12,500 pods the stored
tracks alone could fill 69 KiB. Every status write sends the whole status, and every client watching the
TrainingJob receives it, so the operator keeps the whole under `STATUS_BUDGET_BYTES` as well. When the parts
do not fit it gives up, in order, what it can best do without:
1. closed incidents, oldest first (their Events and metrics keep the history; an open incident is never dropped:
   its recovery is still being timed);
2. stored tracks, least needed first (`trackmemory.compact`: rebuilt from their pods at the next reconcile, so
   a straggler streak or a no-progress clock starts over);
and the tracks always have `TRACKS_RESERVE_BYTES` of room unless the rest alone leaves less.
"""

from __future__ import annotations

import json
from typing import Any

from phalanx.operator import api, incidents

STATUS_BUDGET_BYTES = 60 * 1024
"""The most a TrainingJob's status takes as JSON: under 64 KiB, with room for kopf's own annotations."""
TRACKS_RESERVE_BYTES = 24 * 1024
"""Room kept for the stored tracks (about 90 of them at their longest) before incidents are dropped for it."""


def size(wire: Any) -> int:
    """Bytes of a status (or part of one) as JSON, as the API server stores it."""
    return len(json.dumps(wire, separators=(",", ":")))


def without_tracks(status: api.TrainingJobStatus) -> api.TrainingJobStatus:
    return status.model_copy(update={"tracking": [], "tracked": None})


def fit(status: api.TrainingJobStatus) -> tuple[list[api.Incident], int]:
    """The incidents to keep so that the status without its tracks leaves `TRACKS_RESERVE_BYTES` of the budget
    (the closed ones dropped oldest first, the open ones always kept), and the bytes the stored tracks and the
    tracked ranges may then take."""
    bare = size(without_tracks(status).to_wire())
    kept = list(status.incidents)
    excess = bare - (STATUS_BUDGET_BYTES - TRACKS_RESERVE_BYTES)
    at = 0
    while excess > 0 and at < len(kept):
        if incidents.is_open(kept[at]):
            at += 1
            continue
        excess -= size(kept[at].to_wire()) + 1  # and its comma
        del kept[at]
    if len(kept) < len(status.incidents):  # rare: measured again rather than trust the arithmetic
        bare = size(without_tracks(status.model_copy(update={"incidents": kept})).to_wire())
    return kept, max(0, STATUS_BUDGET_BYTES - bare)
