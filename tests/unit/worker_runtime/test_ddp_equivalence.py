"""Real DDP over gloo: 2 ranks with the elastic sampler give the same averaged gradient as 1 rank."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from localjob import free_port
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.worker.data import ElasticSampler, micro_batches

GLOBAL_BATCH = 6


def build() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    data = torch.randn(30, 3, dtype=torch.double)
    return model, data, data.sum(1, keepdim=True) ** 2


def gradient(rank: int, world_size: int) -> torch.Tensor:
    model, data, targets = build()
    ddp = DistributedDataParallel(model) if world_size > 1 else model
    sampler = ElasticSampler(len(data), GLOBAL_BATCH, seed=3)
    sampler.next_global_batch()  # a step already taken: the cursor is mid-epoch
    parts = micro_batches(sampler.next_rank_batch(rank, world_size), 2, world_size, GLOBAL_BATCH)
    for part in parts:
        index = torch.tensor(part.indices)
        loss = nn.functional.mse_loss(ddp(data[index]), targets[index]) * part.loss_scale
        if part.sync or world_size == 1:
            loss.backward()
        else:
            with ddp.no_sync():
                loss.backward()
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters()])


def worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    result = gradient(rank, world_size)
    if rank == 0:
        torch.save(result, out)
    # Both ranks leave together: gloo aborts a rank whose peer closed the connection under it.
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_match_one_rank(tmp_path: Path) -> None:
    out = str(tmp_path / "grad.pt")
    mp.spawn(worker, args=(2, free_port(), out), nprocs=2, join=True)
    torch.testing.assert_close(torch.load(out), gradient(0, 1))
