"""The checkpointer a training loop uses: snapshots in memory, async durable saves, fast restore.

Restore order: the newest complete state anywhere, preferring this pod's in-memory snapshot, then a
peer's snapshot sent over the process group, then the newest verified checkpoint on disk (the fast tier,
then the durable tier when one is configured: worker/checkpoint/tiers.py). All ranks agree on one step
(the newest any rank holds) and meet at a barrier before training on.
Under a rollback request (`PHALANX_ROLLBACK`, worker/checkpoint/rollback.py) the newest state at or
before the request's step is restored instead, once; the abandoned run's states are never restored again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from phalanx.worker import autointerval, fatal, heartbeat
from phalanx.worker.checkpoint import (
    durable,
    lastsave,
    layout,
    ownership,
    payload,
    persister,
    rollback,
    shm_store,
    skipped,
    tiers,
)
from phalanx.worker.checkpoint.collectives import Group
from phalanx.worker.checkpoint.skipped import SkippedCheckpoint
from phalanx.worker.exitcodes import TrainerExit
from phalanx.worker.state import TrainState, capture_rng, restore_rng

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1
# Durable saves whose median blocking time is the save cost published to the operator: one slow save on a
# busy machine must not move the automatic interval.
SAVE_COST_WINDOW = 5


class PeerSnapshotMismatch(RuntimeError):
    """A peer's snapshot did not match the digest its donor sent with it: it is never loaded."""


@dataclass(frozen=True)
class RestoreInfo:
    """Where :meth:`Checkpointer.load` found the state: ``source`` is memory, peer, disk or none."""

    step: int
    source: str
    seconds: float
    rolled_back: RollbackInfo | None = None
    """Set when this restore carried out a rollback request."""
    skipped: tuple[SkippedCheckpoint, ...] = ()
    """The checkpoints newer than the one restored that this rank looked at and passed over (torn, corrupt, of
    another format), newest first; empty on ranks that did not read a checkpoint location."""


@dataclass(frozen=True)
class RollbackInfo:
    """What a restore that carried out a rollback request did."""

    epoch: int
    at_or_before_step: int
    skipped_batches: int
    """Global batches the data cursor skipped after the restored step."""
    set_aside: tuple[int, ...] = ()
    """Durable checkpoints of the abandoned run moved to `rolled-back/` (rank 0)."""
    dropped: tuple[int, ...] = ()
    """This rank's in-memory snapshots of the abandoned run."""


def _nonnegative(name: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class Checkpointer:
    """Saves and restores a :class:`TrainState` (see the module docstring for the restore order).

    ``interval_steps``: a durable save every that many steps (0: only forced ones), at every step that is
    a multiple of it; or ``"auto"``: the interval the operator chooses (worker/autointerval.py), read by
    rank 0 from ``interval_source`` (default: the launcher's file, ``PHALANX_CHECKPOINT_INTERVAL_FILE``) at
    each durable save and restore and broadcast, the next durable save being that step plus the interval
    (``autointerval.BOOTSTRAP_STEPS`` until the operator has chosen). ``keep``: durable
    checkpoints kept (0: all). ``snapshot_every``: an in-memory snapshot every that many steps (0:
    only with durable saves). ``sharded``: model and optimizer hold per-rank shards (DTensors or
    per-rank tensors), saved with torch.distributed.checkpoint and resharded on load.
    ``process_group``: None means the default group when one is initialised, else a single process.
    ``rollback_request``: restore at or before a step (see worker/checkpoint/rollback.py); default: the
    launcher's ``PHALANX_ROLLBACK``. ``durable_tier``: where every ``durable_tier.every``-th checkpoint
    (and every forced one) is copied after its commit to ``directory`` (worker/checkpoint/tiers.py);
    default: ``PHALANX_CHECKPOINT_DURABLE_URL``. ``node_local``: ``directory`` is on this node's disk, not
    shared (default: ``PHALANX_CHECKPOINT_LOCAL_TIER``); every rank then looks in its own at restore.
    """

    def __init__(
        self,
        state: TrainState,
        directory: str | os.PathLike[str],
        interval_steps: int | str = 50,
        keep: int = 3,
        snapshot_every: int = 1,
        sharded: bool = False,
        process_group: dist.ProcessGroup | None = None,
        namespace: str | None = None,
        local_rank: int | None = None,
        interval_source: Callable[[], int | None] | None = None,
        rollback_request: rollback.RollbackRequest | None = None,
        durable_tier: tiers.DurableTier | Literal["env"] | None = "env",
        node_local: bool | None = None,
    ) -> None:
        self.state = state
        self.durable_tier = tiers.DurableTier.from_env() if durable_tier == "env" else durable_tier
        """The tier checkpoints are copied to after their commit to `directory` (None: no second tier)."""
        self.node_local = os.environ.get(tiers.LOCAL_ENV) == "1" if node_local is None else node_local
        """`directory` is this node's own (a local tier): every rank looks in its own at restore."""
        if sharded and self.node_local:
            raise ValueError(
                "sharded checkpoints need a directory every pod shares: a node-local tier holds replicated "
                "checkpoints only (turn the local tier off, or save replicated state)"
            )
        self._saves_since_copy = 0
        self._copy_pending = False
        self.rollback_request = rollback_request or rollback.from_env()
        """The operator's rollback request this process was started with (default: `PHALANX_ROLLBACK`);
        :meth:`load` carries it out unless the state found is already of its run."""
        self.rollback_epoch = 0
        """The newest rollback this run went through: recorded in every snapshot and durable checkpoint."""
        self.directory = Path(directory)
        interval = autointerval.parse_interval(interval_steps)
        self.auto = interval == autointerval.AUTO
        """The interval follows the operator's choice (`interval_steps="auto"`)."""
        self.interval_steps = interval if isinstance(interval, int) else autointerval.BOOTSTRAP_STEPS
        """Steps between durable saves in force (under `auto`: the one agreed at the last durable save)."""
        self.next_durable_step = self.interval_steps
        """Under `auto`: the step of the next durable save, the same on every rank."""
        self._interval_source = interval_source or autointerval.file_source()
        self._save_costs: deque[float] = deque(maxlen=SAVE_COST_WINDOW)
        self.keep = _nonnegative("keep", keep)
        self.snapshot_every = _nonnegative("snapshot_every", snapshot_every)
        self.sharded = sharded
        self.group = Group.resolve(process_group)
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        self.namespace = namespace or shm_store.job_namespace(self.directory)
        self.store = shm_store.SnapshotStore(shm_store.store_dir(self.namespace, self.local_rank))
        self.last_restore: RestoreInfo | None = None
        self._skip_log = skipped.SkipLog()
        self.stats: dict[str, float] = {
            "last_stall_seconds": 0.0,
            "last_snapshot_step": -1,
            "last_snapshot_bytes": 0,
            "snapshots_total": 0,
            "snapshots_skipped_total": 0,
            "last_persist_seconds": 0.0,
            "last_persist_bytes": 0,
            "last_durable_step": -1,
            "persists_total": 0,
            "persist_failures_total": 0,
            "saver_restarts_total": 0,
            "last_restore_seconds": 0.0,
            "last_restore_step": -1,
            "durable_saves_total": 0,
            "last_durable_save_step": -1,
            "last_save_seconds": 0.0,
            "save_seconds": 0.0,
            "durable_copies_total": 0,
            "durable_copy_failures_total": 0,
            "last_durable_copy_step": -1,
            "last_durable_copy_seconds": 0.0,
        }
        """Counters and last figures. `durable_saves_total` / `last_durable_save_step`: durable saves this
        rank took part in (every rank; rank 0 writes replicated ones). `last_save_seconds`: what the last
        durable save blocked training for (snapshot, RNG gather, hand-over to the saver); `save_seconds`: the
        median of the last `SAVE_COST_WINDOW` of them (0 before the first), the cost published to the
        operator. `durable_copies_total` / `last_durable_copy_step`: copies to the durable tier (rank 0)."""
        self._persister = persister.PersisterClient()
        # A snapshot's copies of the parameters and the optimizer's state overlap the next forward and backward;
        # the optimizer's step, which changes them next, waits for the copies on the device. Without a hook (an
        # optimizer torch's hooks do not reach) every copy stays on the training's stream.
        self._optimizer = innermost_optimizer(state.optimizer)
        self._optimizer_hook: torch.utils.hooks.RemovableHandle | None = None
        if self._optimizer is not None:
            self._optimizer_hook = self._optimizer.register_step_pre_hook(self._before_optimizer_step)
        self._pinned: set[Path] = set()
        self._durable_pending = False
        self._closed = False
        if sharded:
            from phalanx.worker.checkpoint.sharded import ShardedWriter

            self._sharded: ShardedWriter | None = ShardedWriter(self)
        else:
            self._sharded = None

    # ------------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def is_writer(self) -> bool:
        """The one rank that writes replicated checkpoints and purges old ones."""
        return self.group.rank == 0

    @property
    def save_seconds(self) -> float | None:
        """Median blocking time of the recent durable saves; None before the first."""
        return self.stats["save_seconds"] if self._save_costs else None

    def manifest_extra(self) -> dict[str, Any]:
        """What every durable checkpoint's manifest records besides its files."""
        return {
            "world_size": self.world_size,
            rollback.EPOCH_KEY: self.rollback_epoch,
            **ownership.manifest_entry(),
        }

    @property
    def saver_pid(self) -> int | None:
        """PID of the saver process (None until the first durable save)."""
        return self._persister.pid

    # ------------------------------------------------------------------ saving
    def save(self, step: int, force_durable: bool = False) -> None:
        """Call after finishing ``step`` on every rank (with the same ``force_durable`` everywhere)."""
        started = time.perf_counter()
        self._collect_persist_result(timeout=0.0)
        if self._sharded is not None:
            self._sharded.poll()
        durable_due = force_durable or self.durable_due(step)
        if force_durable:
            self._copy_pending = True
        if durable_due:
            self.stats["durable_saves_total"] += 1
            self.stats["last_durable_save_step"] = step
            if self.auto:
                # Ranks meet here anyway: the one place all of them can take a new interval at the same step.
                self._agree_interval(step)
        snapshot_due = durable_due or (self.snapshot_every > 0 and step % self.snapshot_every == 0)
        self.state.step = step
        if durable_due and self.is_writer and self._sharded is None:
            # Starting the saver process is paid once, not by every save: it stays out of the save cost.
            self._persister.ensure_started()
            self.stats["saver_restarts_total"] = self._persister.restarts
        info: shm_store.SlotInfo | None = None
        if snapshot_due:
            started = time.perf_counter()
            rank_rngs = self._gather_rank_rngs() if durable_due else None
            info = self._snapshot(step, rank_rngs)
            if info is None:
                self.stats["snapshots_skipped_total"] += 1
            else:
                self.stats["last_stall_seconds"] = time.perf_counter() - started
                self.stats["last_snapshot_step"] = step
                self.stats["last_snapshot_bytes"] = int(info.header["payload_bytes"])
                self.stats["snapshots_total"] += 1
                self._prepare_slots(int(info.header["payload_bytes"]))
        if durable_due:
            if self._sharded is not None:
                self._sharded.save(step)
                self._record_save_cost(time.perf_counter() - started)
                return
            self._durable_pending = True
        if self._durable_pending and self.is_writer:
            self._submit_newest(info)
        if durable_due:
            self._record_save_cost(time.perf_counter() - started)

    def durable_due(self, step: int) -> bool:
        """Whether `save(step)` writes a durable checkpoint (besides a forced one)."""
        if self.auto:
            return step >= self.next_durable_step
        return self.interval_steps > 0 and step % self.interval_steps == 0

    def _agree_interval(self, step: int) -> None:
        """Rank 0's interval (the operator's, else the one in force) for every rank; the next durable save
        is `step` plus it. A collective: every rank calls it at the same step."""
        offered = (self._interval_source() or 0) if self.rank == 0 else 0
        (agreed,) = self.group.broadcast_ints([offered], src=0)
        if agreed >= 1 and agreed != self.interval_steps:
            log.info("checkpoint interval %d -> %d steps from step %d", self.interval_steps, agreed, step)
            self.interval_steps = agreed
        self.next_durable_step = step + self.interval_steps

    def _record_save_cost(self, seconds: float) -> None:
        self._save_costs.append(seconds)
        self.stats["last_save_seconds"] = seconds
        self.stats["save_seconds"] = float(statistics.median(self._save_costs))

    def _gather_rank_rngs(self) -> dict[int, Any] | None:
        if not self.group.distributed or self.sharded:
            return None
        gathered = self.group.gather_objects(capture_rng(), dst=0)
        return dict(enumerate(gathered)) if gathered is not None else None

    def _prepare_slots(self, payload_bytes: int) -> None:
        """Have every slot ready for a payload of `payload_bytes` (the helper thread maps what is missing)."""
        if payload_bytes > self.store.prepared_bytes():
            self.store.prepare(payload_bytes, pin=bool(payload.accelerators_of(self.state.state_dict())))

    def _snapshot_content(self, step: int, rank_rngs: dict[int, Any] | None) -> dict[str, Any]:
        return {
            "format": SNAPSHOT_FORMAT,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "state": self._sharded.snapshot_state() if self._sharded is not None else self.state.state_dict(),
            "rng": capture_rng(),
            "rank_rngs": rank_rngs,
        }

    def _snapshot(self, step: int, rank_rngs: dict[int, Any] | None) -> shm_store.SlotInfo | None:
        """The snapshot of `step` in a free slot; None when there is none (2 slots, a save being written)."""
        content = self._snapshot_content(step, rank_rngs)
        meta = {
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "namespace": self.namespace,
            "sharded": self.sharded,
            # The launcher saves the writer's newest snapshot itself when the trainer could not (lastsave).
            lastsave.DIRECTORY_KEY: os.path.abspath(self.directory),
            "pid": os.getpid(),
            "created_unix": time.time(),
            rollback.EPOCH_KEY: self.rollback_epoch,
        }
        try:
            return self.store.write(
                payload.plan(content), meta, pinned=self._pinned, deferrable=self._changed_by_optimizer_only()
            )
        except shm_store.NoFreeSlot:
            if not self.stats["snapshots_skipped_total"]:
                log.info(
                    "step %d: no in-memory snapshot while the saver writes step %s (2 slots kept; a third "
                    "would keep snapshots going meanwhile)",
                    step,
                    self._persister.in_flight,
                )
            return None
        except shm_store.SnapshotSpaceError as error:
            if not os.environ.get(heartbeat.STATUS_DIR_ENV):
                raise  # not under the launcher: the script decides
            # Under the launcher: every retry would fail alike, so the job stops here with the reason.
            fatal.stop(TrainerExit.NO_SNAPSHOT_SPACE, error.strerror or str(error), cleanups=[self.close])

    def _before_optimizer_step(self, *_: Any) -> None:
        self.store.copier.hold_until_copied()

    def _changed_by_optimizer_only(self) -> Callable[[torch.Tensor], bool]:
        """Which tensors of a snapshot nothing but the optimizer's step changes (the model's parameters and the
        optimizer's state): their copies may overlap the next step's forward and backward. None without the
        optimizer's pre-hook."""
        optimizer = self._optimizer
        if self._optimizer_hook is None or optimizer is None:
            return lambda _: False

        # Asked only for device tensors: a snapshot of host tensors never walks the optimizer's state.
        @functools.cache
        def addresses() -> frozenset[int]:
            return frozenset(
                tensor.data_ptr()
                for group in optimizer.param_groups
                for parameter in group["params"]
                for tensor in (parameter, *optimizer.state.get(parameter, {}).values())
                if isinstance(tensor, torch.Tensor)
            )

        return lambda tensor: tensor.data_ptr() in addresses()

    def _snapshot_now(self, step: int) -> shm_store.SlotInfo:
        """The snapshot of `step`, after the save in flight when that holds the only free slot."""
        info = self._snapshot(step, None)
        if info is None:
            self._collect_persist_result(timeout=None)
            info = self._snapshot(step, None)
        assert info is not None, "a slot is free once the saver has finished"
        return info

    def _submit_newest(self, newest: shm_store.SlotInfo | None = None) -> None:
        if self._persister.in_flight is not None:
            return
        self.store.settle()  # the saver reads only a committed slot
        newest = newest or self.store.newest()
        if newest is None:
            return
        self._persister.submit(
            newest, self.directory, self.keep, self.manifest_extra(), durable=self.durable_copy_job()
        )
        self.stats["saver_restarts_total"] = self._persister.restarts
        self._pinned = {newest.path}
        self._durable_pending = False

    def durable_copy_job(self) -> dict[str, Any] | None:
        """For the next commit: the durable tier to copy it to when a copy is due (every `every`-th commit,
        a forced save, or after a failed copy), else None. Counts the commit."""
        tier = self.durable_tier
        if tier is None:
            return None
        self._saves_since_copy += 1
        if not self._copy_pending and self._saves_since_copy < tier.every:
            return None
        self._saves_since_copy = 0
        self._copy_pending = False
        return tier.as_job()

    def _record_copy(self, reply: dict[str, Any]) -> None:
        if "durable_error" in reply:
            self.stats["durable_copy_failures_total"] += 1
            self._copy_pending = True
        elif "durable_step" in reply:
            self.stats["durable_copies_total"] += 1
            self.stats["last_durable_copy_step"] = int(reply["durable_step"])
            self.stats["last_durable_copy_seconds"] = float(reply["durable_seconds"])

    def _collect_persist_result(self, timeout: float | None) -> None:
        reply = self._persister.poll(timeout=timeout)
        if reply is None:
            return
        self._pinned = set()
        self._record_copy(reply)
        if reply.get("ok"):
            self.stats["last_persist_seconds"] = float(reply["seconds"])
            self.stats["last_persist_bytes"] = int(reply["bytes"])
            self.stats["last_durable_step"] = int(reply["step"])
            self.stats["persists_total"] += 1
        else:
            self.stats["persist_failures_total"] += 1
            self._durable_pending = True
            log.warning(
                "durable save of step %s failed: %s; retrying with the next snapshot",
                reply.get("step"),
                reply.get("error"),
            )

    def emergency_save(self) -> int | None:
        """Write the newest snapshot durably, now and in this process (for SIGTERM). Returns its step."""
        if self._sharded is not None:
            return self._sharded.emergency_save()
        if not self.is_writer:
            return None
        newest = self.store.newest()
        if newest is None or newest.step < self.state.step:
            newest = self._snapshot_now(self.state.step)
        started = time.perf_counter()
        result = persister.persist_slot(
            newest.path,
            newest.seq,
            self.directory,
            newest.step,
            self.keep,
            self.manifest_extra(),
            purge=False,
        )
        self.stats["last_persist_seconds"] = time.perf_counter() - started
        self.stats["last_durable_step"] = newest.step
        log.info("emergency save of step %d written to %s", newest.step, result["path"])
        if self.durable_tier is not None:
            # The pod is going away: with a node-local fast tier, only the durable copy outlives it.
            self._record_copy(
                persister.copy_to_durable_tier(self.durable_tier, Path(result["path"]), newest.step)
            )
        return newest.step

    def wait(self, timeout: float | None = None) -> None:
        """Block until the pending durable save (if any) is on disk."""
        if self._sharded is not None:
            self._sharded.wait()
            return
        self._collect_persist_result(timeout=timeout)
        if self._durable_pending and self.is_writer:
            self._submit_newest()
            self._collect_persist_result(timeout=timeout)

    def rejoin(self, process_group: dist.ProcessGroup | None = None) -> None:
        """This process joined a new process group (worker/livegroup.py): ranks and world size are read
        again. A replicated save in flight finishes first (it is local: the saver process writes it); a
        sharded one in flight is abandoned, since its collectives ran in the old group (its folder never
        commits). The operator's rollback request is read again from the environment, which the launcher
        updates with each group it hands over."""
        if self._sharded is not None:
            with contextlib.suppress(Exception):
                self._sharded.poll(block=True)
        else:
            self._collect_persist_result(timeout=None)
        self.group = Group.resolve(process_group)
        self.rollback_request = rollback.from_env()

    def close(self) -> None:
        """Wait for pending persistence and release the saver process and mappings."""
        if self._closed:
            return
        self.wait()
        self._persister.close()
        if self._sharded is not None:
            self._sharded.close()
        if self._optimizer_hook is not None:
            self._optimizer_hook.remove()
        self.store.close()
        self._closed = True

    # ------------------------------------------------------------------ loading
    def load(self) -> int:
        """Restore the newest complete state any rank or the disk holds (under a rollback request not yet
        carried out: the newest at or before its step); returns the step to resume from."""
        started = time.perf_counter()
        self._skip_log = skipped.SkipLog()
        offer = self.rollback_request.as_ints() if self.rollback_request else rollback.NO_REQUEST_INTS
        # A launcher whose view of the TrainingJob lags passes an older request: the newest one wins.
        request = rollback.agree(self.group.all_gather_ints(offer))
        dropped_first: list[int] = []
        if self._sharded is not None:
            step, source, restored_epoch = self._sharded.load(request)
        else:
            if request is not None:
                # Never restorable under the request, and the first slots a state received from a peer takes.
                dropped_first = self._drop_abandoned(request)
            step, source, restored_epoch = self._load_replicated(request)
        self.rollback_epoch = rollback.lineage_epoch(request, restored_epoch)
        rolled_back = None
        if request is not None:
            # Also after the rollback: a saver of the abandoned run may have committed a checkpoint since.
            dropped, set_aside = self._put_away(request)
            dropped = sorted({*dropped_first, *dropped})
            if rollback.applies(request, restored_epoch):
                rolled_back = self._carry_out(request, step, dropped, set_aside)
        if self.auto:
            # Every rank resumes from the same step: the next durable save is that step plus the interval.
            self._agree_interval(step)
        if self._sharded is None:
            # The slots are made ready while the first steps run, so the first saves cost what later ones do.
            self._prepare_slots(payload.plan(self._snapshot_content(step, None)).total_bytes)
        seconds = time.perf_counter() - started
        # Each checkpoint passed over was logged with its reason where it was looked at.
        self.last_restore = RestoreInfo(step, source, seconds, rolled_back, self._skip_log.entries)
        self.stats["last_restore_seconds"] = seconds
        self.stats["last_restore_step"] = step
        log.info("restored step %d from %s in %.3f s", step, source, seconds)
        return step

    def _put_away(self, request: rollback.RollbackRequest) -> tuple[list[int], list[int]]:
        """Uncommit this rank's snapshots of the run `request` abandoned and (rank 0) move its durable
        checkpoints to `rolled-back/`, out of the restore's, the saver's and the purge's sight; returns their
        steps."""

        dropped = self._drop_abandoned(request)
        set_aside: list[int] = []
        if self.is_writer:
            set_aside = self.set_aside(_abandoned_under(request), f"epoch-{request.epoch}")
        return dropped, set_aside

    def _drop_abandoned(self, request: rollback.RollbackRequest) -> list[int]:
        """Uncommit this rank's snapshots of the run `request` abandoned; returns their steps."""
        abandoned = _abandoned_under(request)
        return self.store.drop(lambda info: abandoned(info.step, info.header))

    def set_aside(self, condemned: Callable[[int, dict[str, Any]], bool], label: str) -> list[int]:
        """Rank 0: move the checkpoints `condemned(step, manifest)` picks, on every tier, to `rolled-back/<label>/`
        where no restore or purge looks; returns their steps."""
        moved = set(durable.set_aside(self.directory, condemned, label))
        if self.durable_tier is not None:
            try:
                moved |= set(tiers.set_aside(self.durable_tier, condemned, label))
            except Exception as error:
                # Restores under the same rollback request still refuse them (their manifests' epoch).
                log.warning("durable tier %s: checkpoints not set aside: %s", self.durable_tier.url, error)
        return sorted(moved)

    def _carry_out(
        self, request: rollback.RollbackRequest, step: int, dropped: list[int], set_aside: list[int]
    ) -> RollbackInfo:
        """After restoring `step` for `request` (the abandoned run put away): skip the batches asked for and
        snapshot the restored state as the new run's, so a later restart neither restores the abandoned run
        nor rolls back (or skips) again."""
        skip = rollback.batches_to_skip(request, step)
        cursor = self.state.data_cursor
        skipper = getattr(cursor, "skip_batches", None)
        if skip and callable(skipper):
            skipper(skip)
        elif skip:
            log.warning("rollback: the data cursor cannot skip batches; %d batches are trained again", skip)
            skip = 0
        self.state.step = step
        self._snapshot_now(step)
        log.warning(
            "rollback %d: restored step %d (at or before %d); skipped %d batches; set aside checkpoints %s, "
            "dropped snapshots %s of the abandoned run",
            request.epoch,
            step,
            request.at_or_before_step,
            skip,
            set_aside or "none",
            dropped or "none",
        )
        return RollbackInfo(request.epoch, request.at_or_before_step, skip, tuple(set_aside), tuple(dropped))

    def local_snapshot(
        self, accept: Callable[[shm_store.SlotInfo], bool] | None = None
    ) -> shm_store.SlotInfo | None:
        """This process's newest snapshot of this job (of those `accept` takes, when given)."""

        def mine(info: shm_store.SlotInfo) -> bool:
            if info.header.get("namespace") != self.namespace:
                return False
            return bool(info.header.get("sharded")) == self.sharded and (accept is None or accept(info))

        return self.store.newest(mine)

    @property
    def directory_tier(self) -> str:
        """How skipped checkpoints name `directory`: `local` (node-local), `fast` (a durable tier is behind
        it) or `durable` (the only tier)."""
        if self.node_local:
            return skipped.TIER_LOCAL
        return skipped.TIER_FAST if self.durable_tier is not None else skipped.TIER_DURABLE

    def newest_on_disk(
        self, newer_than: int, request: rollback.RollbackRequest | None
    ) -> durable.LoadableCheckpoint | None:
        """The newest verified checkpoint after `newer_than` in `directory`, or on the durable tier when that
        holds a newer one (fetched into `directory` first); restorable under `request` and of this
        checkpointer's kind (replicated or sharded). The newer ones passed over are kept for `RestoreInfo`.

        The durable tier is asked only when no rank holds a snapshot in memory (`newer_than` < 0): copies are
        made of snapshots, so a snapshot is at least as new as any copy, and a recovery with survivors must
        not wait on the network."""

        def accept(step: int, manifest: dict[str, Any]) -> bool:
            return rollback.restorable(step, rollback.epoch_of(manifest), request)

        kind = "sharded" if self.sharded else "replicated"
        near = self._skip_log.reporter(self.directory_tier)
        found = durable.newest_loadable(
            self.directory, newer_than=newer_than, accept=accept, kind=kind, report=near
        )
        if self.durable_tier is None or newer_than >= 0 or (self.node_local and not self.is_writer):
            return found
        floor = max(newer_than, found.step if found else -1)
        try:
            fetched = tiers.fetch_newest(
                self.durable_tier,
                self.directory,
                newer_than=floor,
                accept=accept,
                kind=kind,
                report=self._skip_log.reporter(skipped.TIER_DURABLE),
            )
        except Exception as error:  # an unreachable store must not stop a restore the fast tier can do
            log.warning("durable tier %s not readable: %s", self.durable_tier.url, error)
            return found
        if fetched is None:
            return found
        log.info("step %d fetched from the durable tier %s", fetched, self.durable_tier.url)
        again = durable.newest_loadable(
            self.directory, newer_than=floor, accept=accept, kind=kind, report=near
        )
        return again or found

    def _load_replicated(self, request: rollback.RollbackRequest | None) -> tuple[int, str, int]:
        """Restore (see `load`); returns the step, where it came from and its rollback epoch."""
        group = self.group
        mine = self.local_snapshot(
            lambda info: rollback.restorable(info.step, rollback.epoch_of(info.header), request)
        )
        my_step = mine.step if mine else -1
        my_bytes = int(mine.header["payload_bytes"]) if mine else 0
        held = group.all_gather_ints([my_step, my_bytes, rollback.epoch_of(mine.header) if mine else 0])
        newest_memory, memory_epoch, memory_holders = rollback.newest_held(
            [(step, epoch) for step, _, epoch in held]
        )

        live = {"state": self.state.state_dict()}
        on_device = bool(payload.accelerators_of(live))
        # An in-memory state, this process's own or a peer's, is read where it lies in a slot of this process's
        # store (pinned beside an accelerator) straight into the training state's own tensors: one copy, and
        # no buffer of its own. A checkpoint read from disk, rare and slower anyway, gets a buffer.
        buffer: torch.Tensor | None = None
        disk = [-1, 0, 0]
        if group.rank == 0 or self.node_local:
            found = self.newest_on_disk(newest_memory, request)
            if found is not None:
                buffer = _read_file(found.path / layout.STATE_FILE)
                disk = [found.step, buffer.numel(), rollback.epoch_of(found.manifest)]
        on_disk = group.all_gather_ints(disk)
        disk_step = max(step for step, _, _ in on_disk)

        if disk_step > newest_memory:
            holders = {rank for rank, (step, _, _) in enumerate(on_disk) if step == disk_step}
            donor = min(holders)
            _, size, epoch = on_disk[donor]
            step, source_for_holders = disk_step, "disk"
        elif newest_memory >= 0:
            holders = set(memory_holders)
            donor = min(holders)
            step, size, source_for_holders, epoch = newest_memory, held[donor][1], "memory", memory_epoch
            if group.rank in holders:
                assert mine is not None
                buffer = self.store.view(mine, on_device)
        else:
            group.barrier()
            return 0, "none", 0
        if source_for_holders == "disk" and group.rank not in holders:
            buffer = None

        needy = [rank for rank in range(group.world_size) if rank not in holders]
        if group.rank == donor and needy:
            assert buffer is not None
            sent = torch.frombuffer(bytearray(payload.digest(buffer)), dtype=torch.uint8)
            for rank in needy:
                group.send(sent, dst=rank)
                group.send(buffer, dst=rank)
        elif group.rank in needy:
            expected = torch.empty(payload.DIGEST_BYTES, dtype=torch.uint8)
            group.recv(expected, src=donor)
            buffer = self.store.scratch(size, on_device, {mine.path} if mine else set())
            group.recv(buffer, src=donor)
            if payload.digest(buffer) != bytes(expected.numpy()):
                raise PeerSnapshotMismatch(
                    f"the state of step {step} received from rank {donor} does not match the digest it sent: "
                    "refused (a damaged transfer, or bytes from something other than the job's own rank)"
                )
        assert buffer is not None
        if source_for_holders == "disk":
            source = "disk"
        elif group.rank in holders:
            source = "memory"
        else:
            source = "peer"
        content = payload.read_live(buffer, live, self._placement)
        payload.finish_device_copies(content)
        if source == "memory":
            assert mine is not None
            self.store.check_unchanged(mine)
        self._apply(content, source)
        group.barrier()
        return step, source, epoch

    def _placement(self, path: payload.StatePath, ref: payload.TensorRef) -> torch.Tensor | None:
        """Where a restored tensor the training state has no counterpart for yet will live (`read_live`)."""
        if len(path) < 2 or path[0] != "state":
            return None
        return self.state.placement(path[1:], ref.shape, payload.dtype_from_name(ref.dtype))

    def _apply(self, content: dict[str, Any], source: str) -> None:
        self.state.load_state_dict(content["state"])
        self.state.step = int(content["step"])
        same_layout = content["rank"] == self.rank and content["world_size"] == self.world_size
        rank_rngs = content.get("rank_rngs")
        if source == "disk" and rank_rngs and len(rank_rngs) == self.world_size:
            restore_rng(rank_rngs[self.rank])
        elif source in ("memory", "disk") and same_layout:
            restore_rng(content["rng"])
        else:
            log.info(
                "RNG state not restored (saved by rank %s of %s)", content["rank"], content["world_size"]
            )


def _abandoned_under(request: rollback.RollbackRequest) -> Callable[[int, dict[str, Any] | None], bool]:
    """Whether a state of `step` with this header or manifest is of the run `request` abandoned."""
    return lambda step, meta: rollback.abandoned(step, rollback.epoch_of(meta), request)


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer whose `step` changes the state, under the wrappers a framework puts around it
    (Accelerate's `AcceleratedOptimizer`, which Hugging Face's Trainer uses, proxies `step` to `.optimizer`
    without torch's hooks of its own); None when there is none."""
    seen: set[int] = set()
    while (
        isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and id(optimizer) not in seen
    ):
        seen.add(id(optimizer))
        optimizer = optimizer.optimizer
    if isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "_optimizer_step_pre_hooks"):
        return optimizer
    return None


def _read_file(path: Path) -> torch.Tensor:
    size = path.stat().st_size
    buffer = torch.empty(size, dtype=torch.uint8)
    view = buffer.numpy().data
    with open(path, "rb", buffering=0) as handle:
        position = 0
        while position < size:
            count = handle.readinto(view[position:])
            if not count:
                raise OSError(f"{path} ended early")
            position += count
    return buffer
