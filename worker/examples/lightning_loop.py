"""PyTorch Lightning under a TrainingJob, made resumable with one line: `callbacks=[PhalanxCallback()]`.

    python -m phalanx.worker.launch --nnodes 2 -- python -m phalanx.worker.examples.lightning_loop --steps 100

Written the way Lightning's docs write a model: a LightningModule with `training_step` and
`configure_optimizers`, a DataLoader of random tensors, `Trainer(max_steps=...)` with the DDP strategy on CPU
(under torchrun one process per node: `num_nodes` is the world size). Needs the `lightning` extra.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.worker.integrations.lightning import PhalanxCallback


class LitRegressor(L.LightningModule):
    def __init__(self, step_delay: float = 0.0) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_delay = step_delay

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = F.mse_loss(self.model(inputs), targets)
        self.log("train_loss", loss)
        if self.step_delay:
            time.sleep(self.step_delay)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.worker.examples.lightning_loop", description=__doc__
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    L.seed_everything(0)
    inputs = torch.randn(1024, 16)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        callbacks=[PhalanxCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(LitRegressor(args.step_delay), DataLoader(dataset, batch_size=args.batch_size))


if __name__ == "__main__":
    main()
