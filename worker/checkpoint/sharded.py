"""Sharded checkpoints with torch.distributed.checkpoint (DCP), resharded on load.

Model and optimizer state come from ``torch.distributed.checkpoint.state_dict.get_state_dict``, so
FSDP/DTensor models and plain modules alike give FQN-keyed dicts of DTensors/tensors. Durable saves
run through ``dcp.async_save`` with torch's process executor (a background process per rank with its
own gloo group writes the shards), into a temporary folder; once rank 0 sees the save finished, the
torch-free saver process hashes and fsyncs the folder, renames it to ``step-<N>`` and writes the
manifest. Each rank adds ``rng-rank-<r>.bin`` (its RNG states: a payload as in payload.py, so it is read
through the allow-list). Loading uses ``dcp.load`` into the live, current-world-size state, so shards are re-cut when the world size changed. In-memory
snapshots hold each rank's local shards; they restore only when every rank has one of the same step
at an unchanged world size (peer recovery of lost shards is not possible without replicas).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.tensor import DTensor

from phalanx.worker.checkpoint import durable, layout, payload, rollback
from phalanx.worker.state import TrainState, capture_rng, restore_rng

if TYPE_CHECKING:
    from phalanx.worker.checkpoint.checkpointer import Checkpointer

log = logging.getLogger(__name__)

_LOCAL_SHARD = "__phalanx_local_shard__"
_DCP_PAIR = ("model", "optimizer")
"""The parts DCP's state-dict helpers handle together (sharded model and optimizer); the rest are plain."""


def dcp_state(state: TrainState) -> dict[str, Any]:
    """The state as DCP saves and loads it (optimizer state initialised so a load can fill it)."""
    result: dict[str, Any] = {"step": state.step}
    if isinstance(state.model, torch.nn.Module) and isinstance(state.optimizer, torch.optim.Optimizer):
        result["model"], result["optimizer"] = get_state_dict(state.model, state.optimizer)
    else:
        for name in _DCP_PAIR:
            if (part := getattr(state, name)) is not None:
                result[name] = part.state_dict()
    for name, part in state.parts().items():
        if name not in _DCP_PAIR:
            result[name] = part.state_dict()
    return result


def apply_dcp_state(state: TrainState, loaded: dict[str, Any]) -> None:
    if isinstance(state.model, torch.nn.Module) and isinstance(state.optimizer, torch.optim.Optimizer):
        set_state_dict(
            state.model,
            state.optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optimizer"],
        )
    else:
        for name in _DCP_PAIR:
            if (part := getattr(state, name)) is not None:
                part.load_state_dict(loaded[name])
    for name, part in state.parts().items():
        if name not in _DCP_PAIR:
            part.load_state_dict(loaded[name])
    state.step = int(loaded["step"])


def localize(node: Any) -> Any:
    """Replace DTensors by their local shard (what a snapshot of this rank holds)."""
    if isinstance(node, DTensor):
        return {_LOCAL_SHARD: node.to_local()}
    if isinstance(node, dict):
        return type(node)((key, localize(value)) for key, value in node.items())
    if isinstance(node, list):
        return [localize(item) for item in node]
    return node


def fill_from_local(target: Any, saved: Any) -> Any:
    """Copy a localized snapshot into ``target`` (same layout: same world size and rank)."""
    if isinstance(target, DTensor):
        target.to_local().copy_(saved[_LOCAL_SHARD])
        return target
    if isinstance(target, torch.Tensor):
        target.copy_(saved)
        return target
    if isinstance(target, dict):
        if set(target) != set(saved):
            return saved
        for key in target:
            target[key] = fill_from_local(target[key], saved[key])
        return target
    return saved


def rng_file(rank: int) -> str:
    return f"rng-rank-{rank}.bin"


def stop_background_saver(timeout: float = 10.0) -> None:
    """End torch's checkpoint background process (`dcp.async_save` with the process executor) now.

    torch keeps that process, with its own gloo group, for the life of the training process and leaves it
    to interpreter teardown. Call only once no save is pending (`ShardedWriter.wait`): the process is idle,
    and SIGTERM ends it at once, without the C++ teardown of its gloo group (its own orderly exit takes
    seconds). A later `async_save` starts a new one (collectively, like the first).
    """
    try:
        from torch.distributed.checkpoint import _async_process_executor as executor
    except ImportError:  # a torch without the process executor never started one
        return
    process = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if process is None:
        return
    executor._CHECKPOINT_PROCESS = None
    child = getattr(process, "_save_process", None)
    if child is not None and child.is_alive():
        child.terminate()
        child.join(timeout=timeout)
        if child.is_alive():
            log.warning("checkpoint background process %s ignored SIGTERM; killing it", child.pid)
            child.kill()
            child.join(timeout=timeout)
    with contextlib.suppress(Exception):
        process._process_pipe.close()


class ShardedWriter:
    """The sharded save/load path of a :class:`Checkpointer`."""

    def __init__(self, owner: Checkpointer) -> None:
        self.owner = owner
        self._future: Any = None
        self._saving: tuple[int, Path] | None = None
        self.skipped_busy = 0

    def snapshot_state(self) -> dict[str, Any]:
        return localize(dcp_state(self.owner.state))

    def _tmp_dir(self, step: int) -> Path:
        # Every rank must name the same folder without talking: the step is the agreement.
        return self.owner.directory / layout.tmp_dir_name(step, "dcp")

    def _write_rng(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        data = payload.to_bytes({"rng": capture_rng(), "world_size": self.owner.world_size})
        durable.write_file_from_chunks(folder / rng_file(self.owner.rank), [data])

    def poll(self, block: bool = False) -> None:
        """Notice a finished background save; rank 0 then has the saver process commit it."""
        if self._future is None or self._saving is None:
            return
        if not block and not self._future.done():
            return
        future, (step, tmp) = self._future, self._saving
        self._future, self._saving = None, None
        try:
            future.result()
        except Exception as error:
            self.owner.stats["persist_failures_total"] += 1
            log.warning("sharded save of step %d failed: %s", step, error)
            return
        if self.owner.is_writer:
            self.owner._collect_persist_result(timeout=None)  # one commit at a time
            self.owner._persister.submit_commit(
                tmp,
                step,
                self.owner.directory,
                self.owner.keep,
                self.owner.manifest_extra(),
                durable=self.owner.durable_copy_job(),
            )

    def save(self, step: int) -> None:
        self.poll()
        if self._future is not None:
            self.skipped_busy += 1
            log.warning("sharded save of step %d skipped: the previous one is still being written", step)
            return
        tmp = self._tmp_dir(step)
        self._write_rng(tmp)
        response = dcp.async_save(
            dcp_state(self.owner.state),
            checkpoint_id=str(tmp),
            process_group=self.owner.group.group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
        )
        self._future = getattr(response, "upload_completion", response)
        self._saving = (step, tmp)

    def wait(self) -> None:
        self.poll(block=True)
        self.owner._collect_persist_result(timeout=None)

    def emergency_save(self) -> int:
        """Collective: every rank calls it. Saves the current state synchronously with DCP."""
        self.wait()
        step = self.owner.state.step
        tmp = self.owner.directory / layout.tmp_dir_name(step, "dcp-emergency")
        if self.owner.is_writer and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        self.owner.group.barrier()
        self._write_rng(tmp)
        dcp.save(dcp_state(self.owner.state), checkpoint_id=str(tmp), process_group=self.owner.group.group)
        if self.owner.is_writer:
            durable.commit(tmp, step, "sharded", None, self.owner.manifest_extra())
        self.owner.group.barrier()
        return step

    def close(self) -> None:
        self.wait()
        stop_background_saver()

    def load(self, request: rollback.RollbackRequest | None = None) -> tuple[int, str, int]:
        """Restore (see `Checkpointer.load`); returns the step, where it came from and its rollback epoch."""
        owner, group = self.owner, self.owner.group
        mine = owner.local_snapshot(
            lambda info: rollback.restorable(info.step, rollback.epoch_of(info.header), request)
        )
        held = group.all_gather_ints(
            [
                mine.step if mine else -1,
                int(mine.header["world_size"]) if mine else -1,
                int(mine.header["rank"]) if mine else -1,
                rollback.epoch_of(mine.header) if mine else 0,
            ]
        )
        same_layout = all(
            step == held[0][0] and world == group.world_size and rank == index
            for index, (step, world, rank, _) in enumerate(held)
        )
        memory_step = held[0][0] if same_layout else -1
        disk = [-1, 0]
        if group.rank == 0:
            # Only sharded checkpoints: a replicated one is passed over, and named (`RestoreInfo.skipped`).
            found = owner.newest_on_disk(memory_step, request)
            if found is not None:
                disk = [found.step, rollback.epoch_of(found.manifest)]
        disk_step, disk_epoch = group.broadcast_ints(disk, src=0)
        epoch = 0
        if disk_step > memory_step:
            self._load_disk(owner.directory / layout.step_dir_name(disk_step))
            step, source, epoch = disk_step, "disk", disk_epoch
        elif memory_step >= 0:
            assert mine is not None
            content = payload.read_from(owner.store.read(mine))
            target = dcp_state(owner.state)
            apply_dcp_state(owner.state, fill_from_local(target, content["state"]))
            restore_rng(content["rng"])
            step, source, epoch = memory_step, "memory", max(held_epoch for *_, held_epoch in held)
        else:
            step, source = 0, "none"
        group.barrier()
        return step, source, epoch

    def _load_disk(self, path: Path) -> None:
        owner = self.owner
        target = dcp_state(owner.state)
        dcp.load(target, checkpoint_id=str(path), process_group=owner.group.group)
        apply_dcp_state(owner.state, target)
        rng_path = path / rng_file(owner.rank)
        try:
            saved = payload.from_bytes(rng_path.read_bytes())
        except FileNotFoundError:
            saved = None
        except ValueError as error:  # not a payload, or one naming a type the allow-list refuses
            log.warning("RNG state not restored: %s is unreadable (%s)", rng_path.name, error)
            return
        if saved is not None and saved["world_size"] == owner.world_size:
            restore_rng(saved["rng"])
            return
        log.info("RNG state not restored: %s saved at another world size or missing", rng_path.name)
