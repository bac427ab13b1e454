"""A plain torchrun DDP script with no Phalanx imports: what runs under a TrainingJob unmodified.

    torchrun --nproc-per-node 2 -m phalanx.worker.examples.plain_ddp --steps 100

Written the way PyTorch's DDP-with-torchrun tutorial writes it: the process group from torchrun's environment,
a DistributedSampler, DDP, and an optional snapshot of its own (`--snapshot-path`) loaded at start. It publishes
no steps, so the operator shows its progress as unknown and judges it by heartbeats and exits alone.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def random_dataset(samples: int, features: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    targets = inputs @ torch.randn(features, 1, generator=generator) + 0.1 * torch.randn(samples, 1)
    return TensorDataset(inputs, targets)


class Trainer:
    def __init__(
        self, model: nn.Module, data: DataLoader, optimizer: torch.optim.Optimizer, args: argparse.Namespace
    ) -> None:
        self.rank = int(os.environ["RANK"])
        self.model: nn.Module = model
        self.data = data
        self.optimizer = optimizer
        self.args = args
        self.steps_run = 0
        if args.snapshot_path and os.path.exists(args.snapshot_path):
            self._load_snapshot(args.snapshot_path)
        self.module = self.model
        self.model = DDP(self.model)

    def _load_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]
        print(f"Resuming training from snapshot at step {self.steps_run}", flush=True)

    def _save_snapshot(self) -> None:
        snapshot = {
            "MODEL_STATE": self.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "STEPS_RUN": self.steps_run,
        }
        torch.save(snapshot, self.args.snapshot_path)

    def _run_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def train(self) -> None:
        epoch = 0
        while self.steps_run < self.args.steps:
            sampler = self.data.sampler
            if isinstance(sampler, DistributedSampler):
                sampler.set_epoch(epoch)
            for inputs, targets in self.data:
                loss = self._run_batch(inputs, targets)
                self.steps_run += 1
                if self.args.step_delay:
                    time.sleep(self.args.step_delay)
                if self.rank == 0 and self.steps_run % self.args.print_every == 0:
                    print(f"step {self.steps_run} loss {loss:.4f}", flush=True)
                if self.rank == 0 and self.args.snapshot_path and self.steps_run % self.args.save_every == 0:
                    self._save_snapshot()
                if self.steps_run >= self.args.steps:
                    break
            epoch += 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.examples.plain_ddp", description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    parser.add_argument("--snapshot-path", default="", help="save and resume from this file (off when empty)")
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--print-every", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = random_dataset(1024, 16, seed=0)
    data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    Trainer(model, data, optimizer, args).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
