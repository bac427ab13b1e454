"""Exit codes of the launcher and of training processes (documented in worker/README.md).

The operator reads the launcher's exit code to tell a user's fault (spend the user's budget or fail the
job) from an infrastructure fault (replace the pod, never charge the user).
"""

from __future__ import annotations

from enum import IntEnum


class LauncherExit(IntEnum):
    SUCCESS = 0
    """Every training process of the group finished."""
    USER_CODE_FAILED = 1
    """The training command failed repeatedly before completing a single step (a bug, not bad luck)."""
    BAD_CONFIG = 2
    """Invalid flags or environment, the command does not exist, torch is outside the supported range, or a
    setting the training processes cannot work with (an in-memory snapshot larger than /dev/shm)."""
    RENDEZVOUS_UNREACHABLE = 3
    """The rendezvous store stayed unreachable, or a round did not form within the join timeout (infra)."""
    RESTART_BUDGET_EXHAUSTED = 4
    """The worker group failed more often than `max_restarts` allows."""
    LOSS_DIVERGED = 5
    """A training process gave up after too many non-finite losses (see guards.NonFiniteLossGuard)."""
    PREFLIGHT_FAILED = 6
    """The preflight failed: the checkpoint location is unusable, the rendezvous store cannot be reached, or a
    restart from a checkpoint does not resume the run it was taken from (worker/preflight.py). The heartbeat
    says which and why."""
    OOM_KILLED = 137
    """The kernel killed a training process for memory (the container's limit): the pod ends so that the
    container is reported `OOMKilled` and the operator's failure policy decides (worker/oomwatch.py)."""
    TERMINATED = 143
    """SIGTERM: training processes were asked to save, then stopped (128 + 15)."""


class TrainerExit(IntEnum):
    """Codes a training process uses to tell the launcher why it stopped."""

    NON_FINITE_LOSS = 86
    """Loss was NaN/Inf more often than the rollback budget allows: restarting cannot help."""
    COLLECTIVE_TIMEOUT = 87
    """The watchdog ended a rank stuck in one collective: restart the group (infrastructure)."""
    ORPHANED = 88
    """The launcher died: the process ends itself rather than train unsupervised."""
    PREFLIGHT_RESTART = 89
    """The preflight recorded its run: restart the group from the checkpoint (no failure, no budget spent)."""
    PREFLIGHT_FAILED = 90
    """The preflight failed: restarting cannot help."""
    NO_SNAPSHOT_SPACE = 91
    """The in-memory snapshot does not fit where snapshots live (/dev/shm): a setting to change
    (`spec.sharedMemory.sizeLimit`), not a fault to retry."""


# Training-process exit codes after which restarting the group is pointless.
FATAL_TRAINER_EXITS: dict[int, LauncherExit] = {
    TrainerExit.NON_FINITE_LOSS: LauncherExit.LOSS_DIVERGED,
    TrainerExit.PREFLIGHT_FAILED: LauncherExit.PREFLIGHT_FAILED,
    TrainerExit.NO_SNAPSHOT_SPACE: LauncherExit.BAD_CONFIG,
}
