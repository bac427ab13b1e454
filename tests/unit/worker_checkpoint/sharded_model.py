"""A tiny model whose parameters are DTensors sharded by rows over a CPU mesh (gloo), for DCP tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from helpers import Cursor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from phalanx.worker import TrainState

ROWS = 10
"""Not divisible by 3, 4 or 5 ranks: the shards are uneven at every world size the tests use."""


def build_sharded_state() -> tuple[TrainState, Any]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, ROWS), torch.nn.Linear(ROWS, ROWS))
    for module in model:
        assert isinstance(module, torch.nn.Linear)
        module.weight = torch.nn.Parameter(distribute_tensor(module.weight.detach(), mesh, [Shard(0)]))
        module.bias = torch.nn.Parameter(distribute_tensor(module.bias.detach(), mesh, [Shard(0)]))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    return TrainState(model=model, optimizer=optimizer, data_cursor=Cursor()), mesh


def train_steps(state: TrainState, steps: int) -> None:
    for step in range(1, steps + 1):
        # A loss of DTensors only (a CPU gloo mesh has no sharded matmul worth testing here).
        loss = sum((parameter * parameter * step).sum() for parameter in state.model.parameters())
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.data_cursor.position = step * 4
        state.step = step


def full_state(state: TrainState) -> dict[str, Any]:
    """Full (unsharded) values of every parameter and Adam moment, as lists."""

    def full(tensor: torch.Tensor) -> list[Any]:
        return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).tolist()

    result: dict[str, Any] = {f"param/{name}": full(p.detach()) for name, p in state.model.named_parameters()}
    for name, parameter in state.model.named_parameters():
        moments = state.optimizer.state.get(parameter, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                result[f"{key}/{name}"] = full(moments[key])
    result["cursor"] = state.data_cursor.position
    return result
