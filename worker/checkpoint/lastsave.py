"""The launcher's save on SIGTERM, for a trainer that could not make its own.

A trainer saves its newest in-memory snapshot durably when SIGTERM reaches it. The pods of a job are
stopped together (a Kueue preemption, a suspend, a drain), but their SIGTERMs arrive apart: a rank whose
signal came first saves nothing of its own and exits, the writer's next collective then fails on the lost
peer, and the writer exits before its own signal comes. Its newest snapshot is still whole in the pod's
shared memory. So when SIGTERM ends the launcher, after its trainers are gone, the launcher writes that
snapshot itself when the checkpoint directory has nothing as new.

Only a replicated snapshot taken as rank 0 (the one writer of replicated checkpoints) qualifies: a sharded
checkpoint needs every rank's part, and any other rank's replica is the writer's to save.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from phalanx.worker.checkpoint import (
    durable,
    ownership,
    persister,
    rollback,
    shm_store,
    slots,
    tiers,
)

log = logging.getLogger(__name__)

DIRECTORY_KEY = "directory"
"""In a snapshot's header: the checkpoint directory its checkpointer saves to (absolute)."""


def writers_newest(root: Path | None = None) -> shm_store.SlotInfo | None:
    """The newest replicated snapshot this pod took as rank 0 and knows the directory of (None: none)."""
    candidates = [
        info
        for info in shm_store.held_snapshots(root)
        if info.header.get("rank") == 0
        and not info.header.get("sharded")
        and isinstance(info.header.get(DIRECTORY_KEY), str)
    ]
    return max(candidates, key=lambda info: (info.step, info.seq), default=None)


def save_unsaved(root: Path | None = None) -> int | None:
    """Write the writer's newest snapshot durably when its directory holds no checkpoint as new; returns the
    step written (None: nothing to write, or the write failed, which is logged)."""
    newest = writers_newest(root)
    if newest is None:
        return None
    directory = Path(newest.header[DIRECTORY_KEY])
    saved = durable.complete_steps(directory)
    if saved and saved[0] >= newest.step:
        return None
    extra: dict[str, Any] = {
        "world_size": newest.header.get("world_size"),
        rollback.EPOCH_KEY: newest.header.get(rollback.EPOCH_KEY),
        **ownership.manifest_entry(),
    }
    try:
        result = persister.persist_slot(
            newest.path, newest.seq, directory, newest.step, keep=0, extra=extra, purge=False
        )
    except (OSError, slots.SnapshotChanged, ValueError) as error:
        log.error("the save on SIGTERM of step %d to %s failed: %s", newest.step, directory, error)
        return None
    log.warning(
        "the trainer had not saved step %d before SIGTERM ended it; the launcher wrote it to %s",
        newest.step,
        result["path"],
    )
    tier = tiers.DurableTier.from_env()
    if tier is not None:
        persister.copy_to_durable_tier(tier, Path(result["path"]), newest.step)
    return newest.step
