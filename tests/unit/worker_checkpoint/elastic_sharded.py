"""A sharded data-parallel training loop whose world size changes between runs (4 -> 3 -> 5).

Parameters and Adam moments are DTensors sharded over a CPU mesh (gloo), as FSDP keeps them. Each step
gathers the full parameters for compute; every rank runs its share of the constant global batch in
micro-batches (`rank_share`, `micro_batches`); the full gradient is averaged over ranks (what DDP's and
FSDP's reductions compute) and each rank keeps its own shard for the optimizer step. State goes through
the sharded `Checkpointer` (DCP), so a run at another world size reshards it on load.

`reference_losses` trains the same model on one process with plain tensors: since the global batch and
the sample order do not depend on the world size, every step's loss must match it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from phalanx.worker import Checkpointer, TrainState
from phalanx.worker.data import ElasticSampler, micro_batches, rank_share
from phalanx.worker.guards import global_mean_loss

DATASET_LEN = 150
GLOBAL_BATCH = 12
MICRO_BATCH = 2
"""Smaller than every rank's share, so each rank accumulates gradients over several micro-batches."""
FEATURES = 6
WIDTH = 10
"""Rows of every sharded tensor: uneven shards at 3 and 4 ranks, none empty at 5."""
LR = 0.05
SEED = 3


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(DATASET_LEN, FEATURES, generator=generator, dtype=torch.float64)
    mixing = torch.randn(FEATURES, WIDTH, generator=generator, dtype=torch.float64)
    return inputs, torch.sin(inputs @ mixing)


def build_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH)).double()


def forward(parameters: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(inputs @ parameters["0.weight"].T + parameters["0.bias"])
    return hidden @ parameters["2.weight"].T + parameters["2.bias"]


def make_optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=LR, foreach=False)


def reference_losses(steps: int) -> list[float]:
    """Losses of an uninterrupted single-process run with full-batch gradients."""
    inputs, targets = dataset()
    model = build_model()
    optimizer = make_optimizer(model.parameters())
    sampler = ElasticSampler(DATASET_LEN, GLOBAL_BATCH, seed=SEED)
    losses = []
    for _ in range(steps):
        index = torch.tensor(sampler.next_global_batch())
        loss = nn.functional.mse_loss(model(inputs[index]), targets[index])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def train(rank: int, workdir: Any, stop_at: int, final_save: str) -> dict[str, Any]:
    """Resume from whatever the checkpoints hold and train until ``stop_at``.

    ``final_save`` is how that step reaches the disk: ``async`` (the periodic path: a forced durable
    save written in the background), ``emergency`` (the SIGTERM path: a synchronous DCP save) or
    ``none`` (snapshots in memory only).
    """
    world_size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    model = build_model()
    for module in model:
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(distribute_tensor(module.weight.detach(), mesh, [Shard(0)]))
            module.bias = nn.Parameter(distribute_tensor(module.bias.detach(), mesh, [Shard(0)]))
    optimizer = make_optimizer(model.parameters())
    sampler = ElasticSampler(DATASET_LEN, GLOBAL_BATCH, seed=SEED)
    state = TrainState(model=model, optimizer=optimizer, data_cursor=sampler)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0, keep=3, snapshot_every=1, sharded=True)
    step = start_step = ckpt.load()
    assert ckpt.last_restore is not None
    source = ckpt.last_restore.source
    inputs, targets = dataset()
    records = []
    while step < stop_at:
        global_batch = sampler.next_global_batch()
        mine = rank_share(global_batch, rank, world_size)
        full = {
            name: parameter.detach().full_tensor().requires_grad_()
            for name, parameter in model.named_parameters()
            if isinstance(parameter, DTensor)
        }
        local_loss = torch.zeros((), dtype=torch.float64)
        for micro in micro_batches(mine, MICRO_BATCH, world_size, GLOBAL_BATCH):
            index = torch.tensor(micro.indices)
            loss = nn.functional.mse_loss(forward(full, inputs[index]), targets[index]) * micro.loss_scale
            loss.backward()
            local_loss = local_loss + loss.detach()
        mean_loss = global_mean_loss(local_loss)
        for name, parameter in model.named_parameters():
            gradient = full[name].grad
            assert gradient is not None
            dist.all_reduce(gradient)
            gradient /= world_size
            parameter.grad = distribute_tensor(gradient, mesh, [Shard(0)])
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        records.append({"step": step, "indices": mine, "loss": mean_loss})
        ckpt.save(step, force_durable=final_save == "async" and step == stop_at)
    if final_save == "emergency":
        ckpt.emergency_save()
    ckpt.close()
    return {
        "start_step": start_step,
        "source": source,
        "final_step": step,
        "world_size": world_size,
        "records": records,
    }
