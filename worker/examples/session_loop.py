"""A plain DDP loop made resumable with one call: `with phalanx.worker.session(model, optimizer) as run:`.

    python -m phalanx.worker.launch --nnodes 2 -- python -m phalanx.worker.examples.session_loop --steps 100

The loop is an ordinary torchrun DDP loop (CPU, gloo, random data); the session resumes it from the newest
snapshot (memory, a peer's, the disk), snapshots every step, saves on the operator's interval and on SIGTERM,
and publishes step and loss in the heartbeat. The batches come from the step number, so a resumed run trains on
the same data as an undisturbed one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import phalanx.worker


def batch_of(step: int, rank: int, batch_size: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(batch_size, features, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.worker.examples.session_loop", description=__doc__
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    parser.add_argument("--log-file", default="", help="append one JSON line per step (rank 0) and per start")
    parser.add_argument(
        "--hang-at-exit",
        type=int,
        default=-1,
        metavar="RANK",
        help="this rank hangs once its run finished, as a teardown that never ends (tests)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group(backend="gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DDP(model) if distributed else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    with phalanx.worker.session(ddp, optimizer) as run:
        _log(args.log_file, {"event": "start", "rank": rank, "start_step": run.start_step})
        for step in range(run.start_step + 1, args.steps + 1):
            inputs, targets = batch_of(step, rank, args.batch_size, 16)
            loss = F.mse_loss(ddp(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_delay:
                time.sleep(args.step_delay)
            run.step(loss)
            if rank == 0:
                _log(args.log_file, {"step": step, "loss": loss.item()})
    if distributed:
        dist.destroy_process_group()
    if rank == args.hang_at_exit:
        print(f"rank {rank}: hanging after the run finished (--hang-at-exit)", file=sys.stderr, flush=True)
        threading.Event().wait()


def _log(path: str, record: dict[str, object]) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
