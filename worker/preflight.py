"""Preflight: before the real run, prove that this job can restart from its checkpoints.

With `spec.preflight.enabled` the operator sets `PHALANX_PREFLIGHT_STEPS` (and `..._TOLERANCE`) on every
trainer pod. Each launcher first checks that the checkpoint location (and the durable tier, when there is one)
can be written, synced, read back and removed (`durable.probe_directory`, `tiers.probe`), then that it reaches
the job's rendezvous store within the join timeout; a pod that cannot fails the preflight before any training
(`CheckpointStorageUnusable`, `RendezvousUnreachable`). The training loop then drives :class:`Preflight` (three
calls, see worker/examples/tinygpt.py):

1. record: train `steps` steps from wherever the job starts; half-way (step `k`) a durable checkpoint is
   forced and awaited; the losses of the steps after it and, at the end, a digest of every rank's model
   are written to `<checkpoint dir>/preflight/`. Then every training process exits with
   `TrainerExit.PREFLIGHT_RESTART` and the launchers restart the group, as after a failure but without
   spending its restart budget: fresh processes, a fresh rendezvous.
   With a node-local checkpoint tier (worker/checkpoint/tiers.py) the records, verdicts and this check live on
   the durable tier instead, and the restart first empties every node's local tier.
2. verify: every rank must see the checkpoint of step `k` in its checkpoint location (whoever is rank 0
   after a restart reads it: a location the pods do not share fails here). The restarted processes throw
   away every in-memory snapshot and set aside durable checkpoints newer than `k`, so the restore has to
   read step `k` from the durable storage, exactly as after losing every node. They train to the same end
   step and compare each loss and the final model with the record:
   bitwise with tolerance 0 (deterministic on CPU at a fixed world size), else within the relative
   tolerance (losses and the parameters' norm). The ranks agree on one verdict.
3. done: a passed preflight writes its verdict and training goes on from there (the steps trained count);
   a failed one exits with `TrainerExit.PREFLIGHT_FAILED`, which the launcher does not retry
   (`LauncherExit.PREFLIGHT_FAILED`), so the job stops before it spends its allocation.

Every rank publishes the outcome in its heartbeat (`preflight`, `preflight-reason`, `preflight-message`),
where the operator reads it into the `PreflightPassed` condition. A verdict on disk makes later starts of
the job (restarts, resumes) skip the preflight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from phalanx.worker import fatal
from phalanx.worker.checkpoint import durable, layout, tiers
from phalanx.worker.exitcodes import TrainerExit

if TYPE_CHECKING:
    from phalanx.worker.checkpoint.checkpointer import Checkpointer
    from phalanx.worker.heartbeat import StatusPublisher

STEPS_ENV = "PHALANX_PREFLIGHT_STEPS"
"""Steps the preflight trains before its restart (unset or 0: no preflight)."""
TOLERANCE_ENV = "PHALANX_PREFLIGHT_TOLERANCE"
"""Relative tolerance of the comparison (0: bitwise)."""
RECORD_DIR = "preflight"
SET_ASIDE_LABEL = "preflight"

RUNNING = "running"
PASSED = "passed"
FAILED = "failed"

REASON_STORAGE = "CheckpointStorageUnusable"
"""The checkpoint location cannot be written, synced, read back or cleaned up."""
REASON_RENDEZVOUS = "RendezvousUnreachable"
"""A pod cannot reach the job's rendezvous store (its name does not resolve, or nothing answers there)."""
REASON_RESTORE = "RestoreFailed"
"""The restart did not restore the preflight's checkpoint from the durable storage."""
REASON_MISMATCH = "ResumeMismatch"
"""The resumed run's losses or model differ from the uninterrupted run's."""
REASON_PASSED = "Passed"


def pending(env: dict[str, str], job: dict[str, Any] | None) -> bool:
    """Whether this pod starts as part of the job's preflight: it was given preflight steps and the job (when
    known) does not say the preflight passed. Pods created after a pass get no steps; a pod given them
    before the pass that starts again after it (a container restart) is no longer in the preflight."""
    steps = env.get(STEPS_ENV, "")
    if not steps.isdigit() or int(steps) <= 0:
        return False
    state = (((job or {}).get("status") or {}).get("preflight") or {}).get("state")
    return state != "Passed"


LOOSE_TOLERANCE = 1e-3
"""The least tolerance when the world size changed between the two runs (a failure during the preflight):
the reduction order differs, so results differ in their last bits."""


class RecordStore:
    """The preflight's small JSON files where every pod can read them: a directory (replaced atomically) or,
    with a node-local checkpoint tier, the durable tier (a directory or an fsspec URL: one PUT each)."""

    def __init__(self, location: str, options: dict[str, Any] | None = None) -> None:
        self.location = location.rstrip("/")
        self.options = options or {}

    @property
    def is_directory(self) -> bool:
        return "://" not in self.location or self.location.startswith("file://")

    def __str__(self) -> str:
        return self.location

    def _filesystem(self) -> tuple[Any, str]:
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.location, **self.options)
        return fs, root.rstrip("/")

    def write(self, name: str, content: dict[str, Any]) -> None:
        data = json.dumps(content).encode()
        if self.is_directory:
            directory = Path(self.location.removeprefix("file://"))
            directory.mkdir(parents=True, exist_ok=True)
            durable.write_file_atomic(directory / name, data)
            return
        fs, root = self._filesystem()
        fs.pipe_file(f"{root}/{name}", data)

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            if self.is_directory:
                raw = (Path(self.location.removeprefix("file://")) / name).read_bytes()
            else:
                fs, root = self._filesystem()
                raw = fs.cat_file(f"{root}/{name}")
            content = json.loads(raw)
        except (OSError, ValueError):
            return None
        return content if isinstance(content, dict) else None

    def exists(self, name: str) -> bool:
        if self.is_directory:
            return (Path(self.location.removeprefix("file://")) / name).exists()
        fs, root = self._filesystem()
        return bool(fs.exists(f"{root}/{name}"))


@dataclass
class Record:
    """What the uninterrupted run saw after the preflight's checkpoint (one file per rank)."""

    start_step: int
    checkpoint_step: int
    end_step: int
    world_size: int
    losses: dict[str, float] = field(default_factory=dict)
    """Loss of each step after the checkpoint, by step (JSON keys are strings)."""
    digest: str = ""
    """SHA-256 of this rank's model state at the end step."""
    norm: float = 0.0
    """L2 norm of this rank's floating-point model state at the end step."""


def model_fingerprint(model: Any) -> tuple[str, float]:
    """(SHA-256 of the model's state, L2 norm of its floating-point tensors)."""
    digest = hashlib.sha256()
    squares = 0.0
    for name, value in model.state_dict().items():
        tensor = value.to_local() if hasattr(value, "to_local") else value
        tensor = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        if tensor.is_floating_point():
            squares += float(tensor.double().pow(2).sum())
    return digest.hexdigest(), math.sqrt(squares)


def _close(expected: float, actual: float, tolerance: float) -> bool:
    if tolerance == 0:
        return expected == actual or (math.isnan(expected) and math.isnan(actual))
    return abs(expected - actual) <= tolerance * max(1.0, abs(expected))


class Preflight:
    """The training loop's side of the preflight (see the module docstring). Disabled (`steps` 0), every
    call does exactly what the loop would do without it."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        steps: int,
        tolerance: float = 0.0,
        publisher: StatusPublisher | None = None,
        model: Any = None,
    ) -> None:
        self.checkpointer = checkpointer
        self.steps = steps
        self.tolerance = tolerance
        self.publisher = publisher
        self.model = model if model is not None else checkpointer.state.model
        self.shared_tier = checkpointer.durable_tier if checkpointer.node_local else None
        """With a node-local fast tier: the durable tier, the one location every pod shares."""
        if self.shared_tier is not None:
            self.records = RecordStore(
                f"{self.shared_tier.url.rstrip('/')}/{RECORD_DIR}", dict(self.shared_tier.options)
            )
        else:
            self.records = RecordStore(str(Path(checkpointer.directory) / RECORD_DIR))
        self.mode = "off" if steps <= 0 else "pending"
        """off, pending (before `load`), record, verify or done."""
        self.record: Record | None = None
        self.failure: tuple[str, str] | None = None
        self.verdict: dict[str, Any] | None = None

    @classmethod
    def from_env(
        cls,
        checkpointer: Checkpointer,
        publisher: StatusPublisher | None = None,
        model: Any = None,
        env: dict[str, str] | None = None,
    ) -> Preflight:
        env = dict(os.environ) if env is None else env
        steps = int(env.get(STEPS_ENV) or 0)
        tolerance = float(env.get(TOLERANCE_ENV) or 0.0)
        return cls(checkpointer, steps, tolerance, publisher, model)

    # -- files ------------------------------------------------------------------------------------

    @staticmethod
    def _record_name(rank: int) -> str:
        return f"record-rank-{rank}.json"

    @property
    def _verdict_name(self) -> str:
        # One per rank: with node-local storage each node sees only its own.
        return f"passed-rank-{self.checkpointer.rank}.json"

    def _read_record(self) -> Record | None:
        content = self.records.read(self._record_name(self.checkpointer.rank))
        with contextlib.suppress(TypeError):
            return Record(**content) if content is not None else None
        return None

    def _shared_steps(self) -> list[int]:
        """Complete checkpoints in the location a restart with another rank 0 would read."""
        if self.shared_tier is not None:
            return tiers.complete_steps(self.shared_tier)
        return durable.complete_steps(self.checkpointer.directory)

    # -- the three calls ----------------------------------------------------------------------------

    def load(self) -> int:
        """Restore as `Checkpointer.load` does; in the verify phase, from the preflight's durable checkpoint."""
        ckpt = self.checkpointer
        if self.mode == "off":
            return ckpt.load()
        group = ckpt.group
        record = self._read_record()
        # Every rank takes the same path. A verdict anywhere: the preflight is over (a node that joined since
        # has none). Rank 0 writes its record last, once every rank wrote its own: without it (a failure during
        # the recording) or in a group of another size, the recording starts again.
        recorded_world = record.world_size if record is not None else 0
        rows = group.all_gather_ints(
            [int(self.records.exists(self._verdict_name)), int(record is not None), recorded_world]
        )
        if any(row[0] for row in rows):
            self.mode = "done"
            return ckpt.load()
        complete = rows[0][1] == 1 and rows[0][2] == ckpt.world_size
        missing = [rank for rank, row in enumerate(rows) if not row[1]]
        if complete and missing:
            self._fail(
                REASON_RESTORE,
                f"after the restart, rank(s) {missing} found no record of the preflight's run in "
                f"{self.records}: the checkpoint location is not shared by the pods, or not durable",
            )
        if not complete:
            step = ckpt.load()
            self.mode = "record"
            middle = max(1, self.steps // 2)
            self.record = Record(step, step + middle, step + self.steps, ckpt.world_size)
            self._publish(RUNNING, "", f"training steps {step + 1}-{step + self.steps}, then a restart")
            return step
        assert record is not None
        self.mode, self.record = "verify", record
        # Whoever is rank 0 after a restart reads the durable checkpoint: every pod must see it.
        visible = record.checkpoint_step in self._shared_steps()
        blind = [rank for rank, row in enumerate(group.all_gather_ints([int(visible)])) if not row[0]]
        if blind:
            self._fail(
                REASON_RESTORE,
                f"the durable checkpoint of step {record.checkpoint_step} is missing from the checkpoint location "
                f"{self.shared_tier.url if self.shared_tier else ckpt.directory} of rank(s) {blind}: the location is "
                "not shared by the pods, so a restart with "
                "another rank 0 would find no checkpoint (use a ReadWriteMany claim, spec.checkpoint.claimName)",
            )
        # Only the durable copy of the checkpoint may serve the restore: no snapshot in any rank's memory,
        # nothing newer on disk, and with a node-local tier nothing on it either (as on a new node).
        ckpt.store.drop(lambda info: True)
        if self.shared_tier is not None:
            forget_local_tier(ckpt.directory)
        if ckpt.is_writer:
            ckpt.set_aside(lambda step, _manifest: step > record.checkpoint_step, SET_ASIDE_LABEL)
        group.barrier()
        step = ckpt.load()
        source = ckpt.last_restore.source if ckpt.last_restore else "none"
        if step != record.checkpoint_step or source != "disk":
            self._fail(
                REASON_RESTORE,
                f"the restart restored step {step} from {source}, not step {record.checkpoint_step} from the "
                "durable checkpoint the preflight wrote",
            )
        self._publish(RUNNING, "", f"restarted from the durable checkpoint of step {step}; comparing")
        return step

    def save_due(self, step: int) -> bool:
        """Whether `step` must be saved durably (pass it as `Checkpointer.save(step, force_durable=...)`)."""
        return self.mode == "record" and self.record is not None and step == self.record.checkpoint_step

    def check(self, step: int, loss: float) -> None:
        """After `Checkpointer.save(step)`: record or compare the step; at the end of the recording, exit
        for the restart; at the end of the comparison, pass (and return) or fail (and exit)."""
        record = self.record
        if self.mode not in ("record", "verify") or record is None:
            return
        if self.mode == "record":
            if step == record.checkpoint_step:
                self.checkpointer.wait()  # the checkpoint is durable before anything depends on it
            elif step > record.checkpoint_step:
                record.losses[str(step)] = loss
            if step >= record.end_step:
                record.digest, record.norm = model_fingerprint(self.model)
                rank = self.checkpointer.rank
                if rank != 0:
                    self.records.write(self._record_name(rank), asdict(record))
                self.checkpointer.group.barrier()
                if rank == 0:  # last: its record says every rank's is written
                    self.records.write(self._record_name(rank), asdict(record))
                self._publish(
                    RUNNING, "", f"recorded steps to {step}; restarting from step {record.checkpoint_step}"
                )
                self._exit(TrainerExit.PREFLIGHT_RESTART)
            return
        problem = self._compare(step, loss, record)
        if problem is None and step < record.end_step:
            return
        self._decide(problem)

    # -- verify ---------------------------------------------------------------------------------------

    def _tolerance(self, record: Record) -> float:
        changed = record.world_size != self.checkpointer.world_size
        return max(self.tolerance, LOOSE_TOLERANCE) if changed else self.tolerance

    def _compare(self, step: int, loss: float, record: Record) -> str | None:
        tolerance = self._tolerance(record)
        expected = record.losses.get(str(step))
        if expected is not None and not _close(expected, loss, tolerance):
            return (
                f"loss at step {step} after the restart is {loss!r}, the uninterrupted run had {expected!r} "
                f"(tolerance {tolerance:g})"
            )
        if step < record.end_step:
            return None
        digest, norm = model_fingerprint(self.model)
        if tolerance == 0 and digest != record.digest:
            return f"the model at step {step} differs from the uninterrupted run's (rank {self.checkpointer.rank})"
        if not _close(record.norm, norm, tolerance):
            return (
                f"the model's norm at step {step} is {norm!r} after the restart, {record.norm!r} without it "
                f"(rank {self.checkpointer.rank}, tolerance {tolerance:g})"
            )
        return None

    def _decide(self, problem: str | None) -> None:
        """All ranks agree: the preflight fails if it failed anywhere (the first rank's reason is told)."""
        group = self.checkpointer.group
        failing = [row[0] for row in group.all_gather_ints([int(problem is not None)])]
        record = self.record
        assert record is not None
        if not any(failing):
            self.mode = "done"
            message = (
                f"resumed from the durable checkpoint of step {record.checkpoint_step} and matched the "
                f"uninterrupted run to step {record.end_step}"
                + (" bitwise" if self._tolerance(record) == 0 else f" within {self._tolerance(record):g}")
            )
            self.verdict = {"passed": True, "reason": REASON_PASSED, "message": message}
            self.records.write(self._verdict_name, self.verdict)
            self._publish(PASSED, REASON_PASSED, message)
            return
        first = failing.index(1)
        message = problem if problem is not None else f"rank {first} saw the resumed run differ"
        self._fail(REASON_MISMATCH, message)

    def _fail(self, reason: str, message: str) -> None:
        self.failure = (reason, message)
        self.verdict = {"passed": False, "reason": reason, "message": message}
        if self.checkpointer.is_writer:
            with contextlib.suppress(Exception):
                self.records.write("failed.json", self.verdict)
        self._publish(FAILED, reason, message)
        self._exit(TrainerExit.PREFLIGHT_FAILED)

    # -- plumbing ---------------------------------------------------------------------------------------

    def _publish(self, outcome: str, reason: str, message: str) -> None:
        if self.publisher is not None:
            self.publisher.publish(preflight=outcome, preflight_reason=reason, preflight_message=message)

    def _exit(self, code: int) -> None:
        """Close the checkpointer, leave the process group and end the process with `code` at once."""
        fatal.exit_now(code, cleanups=[self.checkpointer.close, _leave_process_group])


def forget_local_tier(directory: Path) -> list[int]:
    """Remove this node's local-tier checkpoints (the restore must come from the durable tier); their steps."""
    steps = durable.complete_steps(directory)
    for step in steps:
        shutil.rmtree(directory / layout.step_dir_name(step), ignore_errors=True)
    return steps


def _leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
