"""One training process of a checkpoint test scenario: ``worker_main.py SCENARIO RANK WORLD PORT DIR EXTRA``.

Runs as a real process (own PID, own gloo connection); writes its findings to
``DIR/result-SCENARIO-RANK.json`` for the test to check.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from helpers import advance_to, build_state, fingerprint

from phalanx.worker import Checkpointer


def init_group(rank: int, world: int, port: int) -> None:
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def draws() -> list[float]:
    return [random.random(), float(np.random.rand()), *torch.rand(3).tolist()]


def peer_phase1(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)
    for step in range(1, int(extra["last_step"][rank]) + 1):
        advance_to(state, step)
        ckpt.save(step)
    ckpt.close()
    return {}


def peer_phase2(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)
    step = ckpt.load()
    assert ckpt.last_restore is not None
    result = {"step": step, "source": ckpt.last_restore.source, "state": fingerprint(state)}
    ckpt.close()
    return result


def peer_forged(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Like peer_phase2, but rank 0's state is changed on its way to the others (a forged or damaged
    transfer); a receiver's refusal is its result."""
    from phalanx.worker.checkpoint.checkpointer import PeerSnapshotMismatch
    from phalanx.worker.checkpoint.collectives import Group

    if rank == 0:
        send = Group.send

        def tampered(self: Group, tensor: torch.Tensor, dst: int) -> None:
            if tensor.numel() > 64:
                tensor = tensor.clone()
                tensor[-1] ^= 0xFF
            send(self, tensor, dst)

        Group.send = tampered  # type: ignore[method-assign]
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)
    try:
        step = ckpt.load()
    except PeerSnapshotMismatch as error:
        ckpt.group.barrier()  # the others wait there for the end of the restore
        return {"refused": str(error), "state": fingerprint(state)}
    assert ckpt.last_restore is not None
    result = {"step": step, "source": ckpt.last_restore.source}
    ckpt.close()
    return result


def durable_then_resume(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Replicated durable save in a group; then resume from disk only (snapshots wiped by the test)."""
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=int(extra["interval"]), keep=2)
    if extra["phase"] == "save":
        for step in range(1, int(extra["steps"]) + 1):
            advance_to(state, step)
            ckpt.save(step)
        ckpt.close()
        return {"draws": draws()}
    step = ckpt.load()
    assert ckpt.last_restore is not None
    result = {"step": step, "source": ckpt.last_restore.source, "state": fingerprint(state), "draws": draws()}
    ckpt.close()
    return result


def tiered(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Replicated saves to each rank's own node-local tier (`extra["fast"][rank]`), every `every`-th copied to
    the durable tier; then a resume with the snapshots wiped by the test."""
    from phalanx.worker.checkpoint.tiers import DurableTier

    state = build_state()
    tier = DurableTier(str(workdir / "durable"), every=int(extra["every"]), keep=3)
    fast = workdir / extra["fast"][rank]
    ckpt = Checkpointer(
        state, fast, interval_steps=int(extra["interval"]), keep=2, durable_tier=tier, node_local=True
    )
    if extra["phase"] == "save":
        for step in range(1, int(extra["steps"]) + 1):
            advance_to(state, step)
            ckpt.save(step)
            ckpt.wait()
        ckpt.close()
        return {}
    step = ckpt.load()
    assert ckpt.last_restore is not None
    result = {"step": step, "source": ckpt.last_restore.source, "state": fingerprint(state)}
    ckpt.close()
    return result


def sigterm_save(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Train with snapshots only; SIGTERM makes it write the newest snapshot durably and exit."""
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)

    def on_sigterm(signum: int, frame: object) -> None:
        saved = ckpt.emergency_save()
        (workdir / "emergency.json").write_text(json.dumps({"step": saved}))
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    for step in range(1, int(extra["steps"]) + 1):
        advance_to(state, step)
        ckpt.save(step)
    (workdir / "ready").write_text("ready")
    time.sleep(120)
    return {}


def snapshot_writer(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Write snapshots; with ``crash_at`` SIGKILL itself in the middle of copying that step."""
    from phalanx.worker.checkpoint import payload

    state = build_state(width=int(extra.get("width", 16)))
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)
    crash_at = extra.get("crash_at")
    original = payload.write_into

    def write_then_die(target: torch.Tensor, packed: payload.PackPlan, **copying: Any) -> None:
        # Copy only the first half of the tensors, as a process killed mid-copy would have.
        half = payload.PackPlan(
            packed.skeleton,
            packed.tensors[: len(packed.tensors) // 2],
            packed.refs[: len(packed.refs) // 2],
            packed.data_start,
            packed.total_bytes,
        )
        original(target, half, **copying)
        os.kill(os.getpid(), signal.SIGKILL)

    for step in range(1, int(extra["steps"]) + 1):
        advance_to(state, step)
        if step == crash_at:
            payload.write_into = write_then_die  # type: ignore[assignment]
        ckpt.save(step)
    return {"pid": os.getpid()}


def snapshot_reader(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    state = build_state(width=int(extra.get("width", 16)))
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, snapshot_every=1)
    step = ckpt.load()
    assert ckpt.last_restore is not None
    result = {
        "step": step,
        "source": ckpt.last_restore.source,
        "state": fingerprint(state),
        "pid": os.getpid(),
    }
    ckpt.close()
    return result


def sharded(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Phase `save`: train and save sharded; phase `load`: restore. With `extra["tier"]`, checkpoints are also
    copied to a durable tier in that folder and `extra["fast"]` names the shared fast tier."""
    from sharded_model import build_sharded_state, full_state, train_steps

    from phalanx.worker.checkpoint.tiers import DurableTier

    state, _mesh = build_sharded_state()
    tier = DurableTier(str(workdir / extra["tier"])) if extra.get("tier") else None
    fast = workdir / extra.get("fast", "ckpt")
    ckpt = Checkpointer(state, fast, interval_steps=0, keep=2, sharded=True, durable_tier=tier)
    if extra["phase"] == "save":
        train_steps(state, int(extra["steps"]))
        ckpt.save(int(extra["steps"]), force_durable=True)
        ckpt.close()
        return {"full": full_state(state)}
    step = ckpt.load()
    assert ckpt.last_restore is not None
    result = {"step": step, "source": ckpt.last_restore.source, "full": full_state(state)}
    ckpt.close()
    return result


def sharded_rollback(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Phase `save`: 3 steps and a durable save, 3 more and another. Phase `load`: under `PHALANX_ROLLBACK`."""
    from sharded_model import build_sharded_state, full_state, train_steps

    state, _mesh = build_sharded_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, keep=5, sharded=True)
    if extra["phase"] == "save":
        train_steps(state, 3)
        ckpt.save(3, force_durable=True)
        ckpt.wait()
        at_three = full_state(state)
        train_steps(state, 6)
        ckpt.save(6, force_durable=True)
        ckpt.close()
        return {"full": at_three}
    step = ckpt.load()
    assert ckpt.last_restore is not None and ckpt.last_restore.rolled_back is not None
    result = {
        "step": step,
        "source": ckpt.last_restore.source,
        "full": full_state(state),
        "set_aside": list(ckpt.last_restore.rolled_back.set_aside),
    }
    ckpt.close()
    return result


def elastic_sharded(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    from elastic_sharded import train

    return train(rank, workdir, int(extra["stop_at"]), str(extra["final_save"]))


def auto_interval(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """`interval_steps="auto"`: every rank reads its own interval file (as each pod's launcher writes its own),
    and the files disagree; rank 0's changes at ``change_at``. The durable steps every rank took, then the
    next durable step after a restore."""
    from phalanx.worker.autointerval import read_interval, write_interval

    mine = workdir / f"interval-{rank}"
    state = build_state()
    ckpt = Checkpointer(
        state,
        workdir / "ckpt",
        interval_steps="auto",
        snapshot_every=1,
        interval_source=lambda: read_interval(mine),
    )
    start = ckpt.load()
    durable: list[int] = []
    intervals: list[int] = []
    for step in range(start + 1, int(extra["steps"]) + 1):
        advance_to(state, step)
        before = ckpt.stats["durable_saves_total"]
        ckpt.save(step)
        if ckpt.stats["durable_saves_total"] > before:
            durable.append(step)
            intervals.append(ckpt.interval_steps)
        if rank == 0 and step == int(extra["change_at"]):
            write_interval(mine, int(extra["new_interval"]))
    ckpt.wait()
    ckpt.close()
    # A new group of the same ranks: restored from the snapshots, next durable save at restored step + interval.
    again = Checkpointer(
        build_state(), workdir / "ckpt", interval_steps="auto", interval_source=lambda: read_interval(mine)
    )
    restored = again.load()
    result = {
        "durable": durable,
        "intervals": intervals,
        "restored": restored,
        "next_after_restore": again.next_durable_step,
        "save_seconds": ckpt.save_seconds,
    }
    again.close()
    return result


def rollback_group(rank: int, workdir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Phase `train`: steps up to `last_step`, durable every `interval`. Phase `load`: one load under the
    rollback request this rank's launcher passed (`PHALANX_ROLLBACK`, maybe none), then `then` more steps."""
    state = build_state()
    ckpt = Checkpointer(
        state, workdir / "ckpt", interval_steps=int(extra.get("interval", 10)), snapshot_every=1
    )
    result: dict[str, Any] = {}
    if extra["phase"] == "load":
        step = ckpt.load()
        assert ckpt.last_restore is not None
        rolled = ckpt.last_restore.rolled_back
        result = {
            "step": step,
            "source": ckpt.last_restore.source,
            "cursor": state.data_cursor.position,
            "rolled_back": None
            if rolled is None
            else [rolled.epoch, list(rolled.set_aside), list(rolled.dropped)],
            "epoch": ckpt.rollback_epoch,
        }
        first = step + 1
    else:
        first = 1
    for step in range(first, int(extra.get("last_step", first - 1)) + 1):
        advance_to(state, step)
        ckpt.save(step)
        if step % 10 == 0:
            ckpt.wait()  # every durable save lands under its own step
    ckpt.close()
    return result


SCENARIOS = {
    "rollback_group": rollback_group,
    "peer_phase1": peer_phase1,
    "peer_phase2": peer_phase2,
    "peer_forged": peer_forged,
    "durable_then_resume": durable_then_resume,
    "tiered": tiered,
    "sigterm_save": sigterm_save,
    "snapshot_writer": snapshot_writer,
    "snapshot_reader": snapshot_reader,
    "sharded": sharded,
    "sharded_rollback": sharded_rollback,
    "elastic_sharded": elastic_sharded,
    "auto_interval": auto_interval,
}


def main() -> None:
    scenario, rank, world, port, workdir, extra = sys.argv[1:7]
    init_group(int(rank), int(world), int(port))
    torch.manual_seed(1234 + int(rank))
    random.seed(99 + int(rank))
    np.random.seed(7 + int(rank))
    result = SCENARIOS[scenario](int(rank), Path(workdir), json.loads(extra))
    Path(workdir, f"result-{scenario}-{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # Once DTensors existed in a process, torch keeps its gloo group (and the threads under it) alive past
    # destroy_process_group; left to interpreter teardown they can abort the exit ("terminate called
    # without an active exception"). The result is written: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
