"""Hugging Face Trainer: `Trainer(..., callbacks=[PhalanxCallback()])` and nothing else.

At train start it restores the model, the optimizer and the learning-rate scheduler from the newest snapshot
(this pod's memory, a peer's, else the durable checkpoint) and sets `state.global_step`; after every optimizer
step it snapshots them, saves durably on the operator's interval and publishes the heartbeat with the last
logged loss; SIGTERM saves and exits.

Resuming the step counter: the Trainer's supported resume is `trainer.train(resume_from_checkpoint=...)`, a
folder in its own format, chosen before any callback runs (a second line in the script). `TrainerState` is the
object the Trainer hands callbacks to read and steer the run, and its loop reads `state.global_step` after
`on_train_begin` on every step: the default flow callback stops at `max_steps` by it, logging and the scheduler
counts go on from it. So the callback sets it to the restored step there, and the run continues from it.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from phalanx.worker.training_session import Run


class PhalanxCallback(TrainerCallback):
    """Keeps a Trainer run resumable and visible to the operator (see the module docstring).

    Keyword arguments go to `phalanx.worker.Run` (checkpoint_dir, interval_steps, keep, ...).
    """

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.run: Run | None = None
        self.start_step = 0
        """The step the run resumed from (0 for a fresh run)."""
        self._loss: float | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # The loss reaches callbacks only through `on_log`, after the step it belongs to has been snapshotted:
        # a rollback on it would restore the step that went wrong, so the guard stays off here.
        self.run = Run(
            kwargs["model"],
            kwargs.get("optimizer"),
            lr_scheduler=kwargs.get("lr_scheduler"),
            **{"loss_guard": False, **self.settings},
        )
        self.run.start()
        self.start_step = self.run.start_step
        if self.start_step > 0:
            state.global_step = self.start_step

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.run is not None:
            self.run.step(self._loss, step=state.global_step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.run is not None:
            self.run.finish()
