"""One system's asynchronous saves of one state size, in a fresh process (`peer-dlrover` runs it).

`python -m phalanx.bench.checkpoint_saves --system phalanx|dlrover --size-mb N --saves K --dir D` builds the
checkpoint-stall benchmark's model of N MB of float32 parameters, warms the system up (its saver started,
its buffers written once), then saves K times on durable steps, waiting each time until the save is on disk.
It prints one line, `RESULT {"stall_s": [...], "persist_s": [...], ...}` (or `ERROR <exception>`):

- stall: the time the training loop is blocked in the save call;
- persist: from the save call until the checkpoint is persisted (Phalanx: `Checkpointer.wait()` returns;
  DLRover: its tracker file names the step, written by its saver after the checkpoint file; DLRover writes
  that file with torch.save and fsyncs only its done and tracker files).

DLRover runs as its flash checkpoint's documentation describes for a process not started by `dlrover-run`:
`DdpCheckpointer(dir)` starts its own saver process, and `save_checkpoint(step, state_dict,
storage_type=StorageType.DISK)` copies into shared memory and hands the rest to that saver. Each system runs
in its own process so that neither's memory, saver or shared memory is there while the other is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "RESULT "
ERROR_PREFIX = "ERROR "
PERSIST_WAIT_S = 600.0
POLL_S = 0.002


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["phalanx", "dlrover"], required=True)
    parser.add_argument("--size-mb", type=int, required=True, help="state size in MB of float32")
    parser.add_argument("--saves", type=int, required=True, help="measured saves (after the warm-up)")
    parser.add_argument("--dir", type=Path, required=True, help="checkpoint folder")
    return parser.parse_args(argv)


def phalanx_saves(model: Any, directory: Path, saves: int) -> dict[str, Any]:
    from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots
    from phalanx.worker.checkpoint import shm_store

    ckpt = Checkpointer(TrainState(model=model), directory, interval_steps=1, keep=2, snapshot_every=1)
    stalls, persists, saver_seconds = [], [], []
    try:
        # As checkpoint-stall warms it up: the saver started and every snapshot slot written once.
        for _ in range(shm_store.SLOT_COUNT + 1):
            ckpt.save(0)
            ckpt.wait()
        for step in range(1, saves + 1):
            started = time.perf_counter()
            ckpt.save(step)
            stalls.append(time.perf_counter() - started)
            ckpt.wait()
            persists.append(time.perf_counter() - started)
            saver_seconds.append(ckpt.stats["last_persist_seconds"])
    finally:
        ckpt.close()
        cleanup_snapshots(namespace=ckpt.namespace)
    return {"stall_s": stalls, "persist_s": persists, "saver_persist_s": saver_seconds}


def dlrover_saves(model: Any, directory: Path, saves: int) -> dict[str, Any]:
    from dlrover.python.common.constants import CheckpointConstant
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

    tracker = directory / CheckpointConstant.TRACER_FILE_NAME

    def persisted(step: int) -> bool:
        try:
            return int(tracker.read_text().strip()) == step
        except (OSError, ValueError):
            return False

    def save(step: int) -> tuple[float, float]:
        started = time.perf_counter()
        checkpointer.save_checkpoint(step, model.state_dict(), storage_type=StorageType.DISK)
        stall = time.perf_counter() - started
        while not persisted(step):
            if time.perf_counter() - started > PERSIST_WAIT_S:
                raise TimeoutError(f"DLRover did not persist step {step} within {PERSIST_WAIT_S:.0f} s")
            time.sleep(POLL_S)
        return stall, time.perf_counter() - started

    directory.mkdir(parents=True, exist_ok=True)
    checkpointer = DdpCheckpointer(str(directory))
    # Warm-up: the first save creates the shared memory buffer and the saver's state; a second one writes
    # into the buffer as every later save does.
    save(1)
    save(2)
    stalls, persists = [], []
    for step in range(3, saves + 3):
        stall, persist = save(step)
        stalls.append(stall)
        persists.append(persist)
    return {"stall_s": stalls, "persist_s": persists}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from phalanx.bench.checkpoint_stall import MB, Blob

    torch.set_num_threads(1)  # the training loop's one core, as in checkpoint-stall
    model = Blob(args.size_mb * MB)
    try:
        if args.system == "phalanx":
            figures = phalanx_saves(model, args.dir, args.saves)
        else:
            figures = dlrover_saves(model, args.dir, args.saves)
    except Exception as error:
        # The cause, on stdout for the benchmark: a failed DLRover engine also prints errors of its own
        # from its destructor, after this one.
        traceback.print_exc()
        print(f"{ERROR_PREFIX}{type(error).__name__}: {error}", flush=True)
        return 1
    figures.update(system=args.system, size_mb=args.size_mb, pid=os.getpid())
    print(RESULT_PREFIX + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
