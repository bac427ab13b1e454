"""PyTorch Lightning: `Trainer(callbacks=[PhalanxCallback()])` and nothing else.

At train start it restores the model, the optimizers and schedulers and Lightning's own loop state from the
newest snapshot (this pod's memory, a peer's, else the durable checkpoint); after every optimizer step it
snapshots them, saves durably on the operator's interval and publishes the heartbeat; SIGTERM saves and exits.

Resuming the step counter: Lightning's supported resume is `trainer.fit(..., ckpt_path=...)`, which restores the
loops' state (`fit_loop`: epoch, batch and optimizer-step progress, hence `trainer.global_step`) from a `.ckpt`.
That path is chosen before any callback runs, so it would need a second line in the script. The callback instead
carries the same `fit_loop` state dict in its snapshots and loads it with `fit_loop.load_state_dict` in
`on_train_start`, which is how `ckpt_path` restores it (the loops only act on it when the epoch loop starts,
after this hook): `global_step`, `current_epoch` and `max_steps` then count from the restored step.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from phalanx.worker.training_session import Run


class _LoopState:
    """Lightning's fit loop as a `Stateful`: the progress counters a `.ckpt` carries under `loops.fit_loop`."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.fit_loop.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.fit_loop.load_state_dict(state)


class _Several:
    """Several optimizers or schedulers as one `Stateful` (Lightning allows lists of both)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def state_dict(self) -> dict[str, Any]:
        return {str(index): part.state_dict() for index, part in enumerate(self.parts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for index, part in enumerate(self.parts):
            part.load_state_dict(state[str(index)])


class PhalanxCallback(pl.Callback):
    """Keeps a Lightning run resumable and visible to the operator (see the module docstring).

    Keyword arguments go to `phalanx.worker.Run` (checkpoint_dir, interval_steps, keep, ...).
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.settings = settings
        self.run: Run | None = None
        self.start_step = 0
        """The step the run resumed from (0 for a fresh run)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        self.run = Run(
            pl_module,
            _Several(list(trainer.optimizers)),
            lr_scheduler=_Several(schedulers) if schedulers else None,
            extra={"fit_loop": _LoopState(trainer)},
            **self.settings,
        )
        self.run.start()
        self.start_step = self.run.start_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.run is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.run.step(loss if isinstance(loss, torch.Tensor | float) else None, step=trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run is not None:
            self.run.finish()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self.run is not None:
            self.run.close()
