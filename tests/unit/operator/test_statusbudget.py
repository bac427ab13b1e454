"""A TrainingJob's status under its budget whatever the gang's size (operator/statusbudget.py): each part has
its own bound, and together they would pass 100 KiB at 12,500 pods."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from phalanx.operator import api, reconcile, statusbudget, trackmemory
from phalanx.operator.timeutil import format_micro_time

JOB = "a-job-name-of-forty-characters-for-once"


def incident(index: int, open_: bool = False) -> api.Incident:
    return api.Incident(
        worker=f"{JOB}-worker-{12_000 + index}",
        pod_uid="0c9e4e2a-8d8f-4e8b-9a2c-3f1f1f1f1f1f",
        node=f"node-{'n' * 40}-{index}",
        cause="HeartbeatTimeout",
        action="ReplaceWorker",
        message="m" * api.STATUS_TEXT_LIMIT,
        occurred_at="2026-12-02T14:00:00.123456Z",
        detected_at="2026-12-02T14:00:01Z",
        resumed_at=None if open_ else "2026-12-02T14:00:02.123456Z",
        seconds_to_recover=None if open_ else 1.5,
    )


def crowded_status(now: datetime) -> api.TrainingJobStatus:
    """Every part at its bound with its longest strings: 64 listed workers, 20 incidents (the newest two open)
    and 400 tracks that cannot be rebuilt."""
    workers = [
        api.WorkerStatus(
            name=f"{JOB}-worker-{12_000 + i}", node=f"node-{'n' * 40}-{i}", zone="zone-a", rank=i
        )
        for i in range(64)
    ]
    incidents = [incident(i, open_=i >= 18) for i in range(reconcile.MAX_INCIDENTS)]
    tracks = [
        api.WorkerTrack(
            pod=f"{JOB}-worker-{i}",
            uid=f"uid-{JOB}-worker-{i}",
            node=f"node-{'n' * 40}-{i}",
            step=123_456_789,
            since=format_micro_time(now),
            slow=2,
            restarts=1 if i % 7 == 0 else 0,
        )
        for i in range(400)
    ]
    return api.TrainingJobStatus(workers=workers, incidents=incidents, tracking=tracks)


def test_the_parts_at_their_bounds_would_outgrow_the_budget(now: datetime) -> None:
    status = crowded_status(now)
    status.tracking = status.tracking[: trackmemory.MAX_STORED_TRACKS]
    assert statusbudget.size(status.to_wire()) > 100 * 1024


def test_closed_incidents_go_first_oldest_first_then_the_least_needed_tracks(
    now: datetime, make_pod: Callable[..., dict[str, Any]]
) -> None:
    status = crowded_status(now)
    kept, room = statusbudget.fit(status)
    # Only closed incidents went, the oldest ones, and the open ones stayed.
    assert len(kept) < reconcile.MAX_INCIDENTS
    assert kept == status.incidents[len(status.incidents) - len(kept) :]
    assert [i.worker for i in kept if i.resumed_at is None] == [f"{JOB}-worker-12018", f"{JOB}-worker-12019"]
    status.incidents = kept
    assert room >= statusbudget.TRACKS_RESERVE_BYTES
    bare = status.model_copy(update={"tracking": [], "tracked": None})
    assert room == statusbudget.STATUS_BUDGET_BYTES - statusbudget.size(bare.to_wire())
    pods = [make_pod(track.pod, node=track.node) for track in status.tracking]
    restarted = {track.pod for track in status.tracking if track.restarts}
    status.tracking, status.tracked = trackmemory.compact(
        status.tracking,
        pods,
        lambda pod: None,
        JOB,
        None,
        now,
        budget_bytes=room,
    )
    assert 0 < len(status.tracking) < 256
    assert restarted <= {track.pod for track in status.tracking}  # the most needed stay
    assert statusbudget.size(status.to_wire()) <= statusbudget.STATUS_BUDGET_BYTES


def test_open_incidents_are_never_dropped_even_over_the_budget(now: datetime) -> None:
    status = api.TrainingJobStatus(incidents=[incident(i, open_=True) for i in range(60)])
    assert statusbudget.fit(status)[0] == status.incidents
