"""The Phalanx worker: elastic launcher, training library and checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.worker.checkpoint import Checkpointer, RestoreInfo, cleanup_snapshots
    from phalanx.worker.data import ElasticSampler, MicroBatch, micro_batches, rank_share
    from phalanx.worker.exitcodes import LauncherExit, TrainerExit
    from phalanx.worker.guards import (
        CollectiveWatchdog,
        NonFiniteLossError,
        NonFiniteLossGuard,
        exit_on_non_finite,
        global_mean_loss,
        process_group_timeout,
    )
    from phalanx.worker.heartbeat import StatusPublisher
    from phalanx.worker.preflight import Preflight
    from phalanx.worker.safepickle import allow_checkpoint_types
    from phalanx.worker.state import TrainState
    from phalanx.worker.steptime import StepClock, StepTiming
    from phalanx.worker.training_session import Run, session

# Resolved lazily: helper processes (the checkpoint saver, the launcher) import this package and must
# not pay for importing torch.
__all__ = [
    "Checkpointer",
    "CollectiveWatchdog",
    "ElasticSampler",
    "LauncherExit",
    "MicroBatch",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
    "Preflight",
    "RestoreInfo",
    "Run",
    "StatusPublisher",
    "StepClock",
    "StepTiming",
    "TrainState",
    "TrainerExit",
    "allow_checkpoint_types",
    "cleanup_snapshots",
    "exit_on_non_finite",
    "global_mean_loss",
    "micro_batches",
    "process_group_timeout",
    "rank_share",
    "session",
]

_LAZY_EXPORTS = {
    "TrainState": "phalanx.worker.state",
    "Checkpointer": "phalanx.worker.checkpoint",
    "RestoreInfo": "phalanx.worker.checkpoint",
    "cleanup_snapshots": "phalanx.worker.checkpoint",
    # Worker runtime: data order, guards, progress records, exit codes.
    "ElasticSampler": "phalanx.worker.data",
    "MicroBatch": "phalanx.worker.data",
    "micro_batches": "phalanx.worker.data",
    "rank_share": "phalanx.worker.data",
    "NonFiniteLossGuard": "phalanx.worker.guards",
    "NonFiniteLossError": "phalanx.worker.guards",
    "CollectiveWatchdog": "phalanx.worker.guards",
    "exit_on_non_finite": "phalanx.worker.guards",
    "global_mean_loss": "phalanx.worker.guards",
    "process_group_timeout": "phalanx.worker.guards",
    "StatusPublisher": "phalanx.worker.heartbeat",
    "Preflight": "phalanx.worker.preflight",
    "allow_checkpoint_types": "phalanx.worker.safepickle",
    "StepClock": "phalanx.worker.steptime",
    "StepTiming": "phalanx.worker.steptime",
    "LauncherExit": "phalanx.worker.exitcodes",
    "TrainerExit": "phalanx.worker.exitcodes",
    # One call for a plain loop; the framework callbacks (phalanx.worker.integrations) build on it.
    "session": "phalanx.worker.training_session",
    "Run": "phalanx.worker.training_session",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
