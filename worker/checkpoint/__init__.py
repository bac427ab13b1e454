"""Checkpoints of training processes: in-memory snapshots, async durable saves, peer and disk restore.

Exports are resolved lazily so that the saver process (``persister``) starts without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.worker.checkpoint.checkpointer import Checkpointer, RestoreInfo
    from phalanx.worker.checkpoint.shm_store import cleanup_snapshots

__all__ = ["Checkpointer", "RestoreInfo", "cleanup_snapshots"]

_EXPORTS = {
    "Checkpointer": "phalanx.worker.checkpoint.checkpointer",
    "RestoreInfo": "phalanx.worker.checkpoint.checkpointer",
    "cleanup_snapshots": "phalanx.worker.checkpoint.shm_store",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
