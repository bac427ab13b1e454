"""One call for a plain training loop: `with session(model, optimizer) as run: ... run.step(loss)`.

    with phalanx.worker.session(model, optimizer) as run:
        for step in range(run.start_step, total_steps):
            loss = ...; loss.backward(); optimizer.step(); optimizer.zero_grad()
            run.step(loss)

It wires together what worker/README.md's full contract asks of a script: a :class:`TrainState` and a
:class:`Checkpointer` (resume from this pod's memory, a peer's or the disk; a snapshot every step; durable saves
on the interval the operator sets and on SIGTERM), a :class:`StatusPublisher` (heartbeats with step and loss),
the non-finite-loss guard (roll back to the last snapshot, give up with exit 86 past `max_rollbacks`) and the
:class:`CollectiveWatchdog` (a step stuck longer than `PHALANX_COLLECTIVE_TIMEOUT` ends the process with 87).
Settings come from the environment the operator and the launcher provide (`PHALANX_CHECKPOINT_DIR`,
`PHALANX_CHECKPOINT_INTERVAL`, `PHALANX_CHECKPOINT_KEEP`, `PHALANX_STATUS_DIR`, ...); outside the launcher it
checkpoints into ./phalanx-checkpoints and publishes nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from phalanx.worker.autointerval import parse_interval
from phalanx.worker.checkpoint import Checkpointer
from phalanx.worker.exitcodes import LauncherExit, TrainerExit
from phalanx.worker.guards import CollectiveWatchdog, NonFiniteLossError, all_ranks_finite
from phalanx.worker.heartbeat import StatusPublisher
from phalanx.worker.state import Stateful, TrainState

DEFAULT_CHECKPOINT_DIR = "phalanx-checkpoints"
DEFAULT_INTERVAL = 50
DEFAULT_KEEP = 3


class Terminated(SystemExit):
    """SIGTERM arrived: the newest snapshot was saved durably; the process ends with 143."""

    def __init__(self) -> None:
        super().__init__(int(LauncherExit.TERMINATED))


class Progress:
    """The loop position a session carries in its checkpoints besides the step: the epoch (for a
    `DistributedSampler.set_epoch`) and the batches done in it (to skip on resume)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.batch_in_epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DistributedDataParallel (or any wrapper with `.module`): checkpoints then hold the
    same keys whether or not the model was wrapped, at any world size."""
    while isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
        model = model.module
    return model


def _env_interval(env: Mapping[str, str]) -> int | str:
    return parse_interval(env.get("PHALANX_CHECKPOINT_INTERVAL") or DEFAULT_INTERVAL)


class Run:
    """What the loop holds inside `session(...)`: where to start, `step(loss)` after each optimizer step,
    `should_stop` once the run is asked to end."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Stateful | None = None,
        *,
        lr_scheduler: Stateful | None = None,
        data_cursor: Stateful | None = None,
        extra: Mapping[str, Stateful] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        interval_steps: int | str | None = None,
        keep: int | None = None,
        max_rollbacks: int = 3,
        loss_guard: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.progress = Progress()
        self.state = TrainState(
            model=unwrap(model),
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            data_cursor=data_cursor,
            extra={**(extra or {}), "session": self.progress},
        )
        self.checkpointer = Checkpointer(
            self.state,
            directory=checkpoint_dir or env.get("PHALANX_CHECKPOINT_DIR") or DEFAULT_CHECKPOINT_DIR,
            interval_steps=_env_interval(env) if interval_steps is None else interval_steps,
            keep=int(env.get("PHALANX_CHECKPOINT_KEEP") or DEFAULT_KEEP) if keep is None else keep,
            snapshot_every=1,
        )
        self.publisher = StatusPublisher.from_env(dict(env))
        self.watchdog = CollectiveWatchdog()
        self.max_rollbacks = max_rollbacks
        self.loss_guard = loss_guard
        """Roll back on a non-finite loss (off where the loss given lags the step it belongs to)."""
        self.rollbacks = 0
        self.start_step = 0
        """The step training resumes after (0 for a fresh run): the next step is `start_step + 1`."""
        self.global_step = 0
        """The last finished step."""
        self.loss: float | None = None
        """The loss of the last finished step, as given to `step`."""
        self.should_stop = False
        """True once SIGTERM arrived (the newest snapshot is then saved and the process is ending)."""
        self._last_step_at: float | None = None
        self._previous_handler: Any = None
        self._terminating = False
        self._closed = False

    # -- the loop's side --------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the loop is in (saved with every step; set it when an epoch starts)."""
        return self.progress.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        if value != self.progress.epoch:
            self.progress.epoch = value
            self.progress.batch_in_epoch = 0

    @property
    def batch_in_epoch(self) -> int:
        """Steps finished in the current epoch: the batches a resumed epoch skips."""
        return self.progress.batch_in_epoch

    def step(self, loss: torch.Tensor | float | None = None, *, step: int | None = None) -> int:
        """Call after each optimizer step, on every rank: snapshots the state, saves durably when due and
        publishes the heartbeat. `step`: the loop's own step counter, when it keeps one (a framework);
        by default the session counts. A loss that is not finite on some rank rolls every rank back to the
        last snapshot (the loop goes on with the next batch). Returns the last finished step."""
        value = self._loss_value(loss)
        if self.loss_guard and value is not None and not self._finite_everywhere(value):
            return self._roll_back()
        new_step = self.global_step + 1 if step is None else step
        if new_step == self.global_step:
            return self.global_step  # gradient accumulation: no optimizer step since the last call
        self.global_step = new_step
        self.state.step = new_step
        self.progress.batch_in_epoch += 1
        self.loss = value
        self.publisher.publish(phase="saving")
        self.checkpointer.save(new_step)
        now = time.monotonic()
        step_seconds = now - self._last_step_at if self._last_step_at is not None else None
        self._last_step_at = now
        ckpt = self.checkpointer
        self.publisher.publish(
            phase="training",
            step=new_step,
            loss=value,
            step_seconds=step_seconds,
            checkpoint_step=int(ckpt.stats["last_durable_step"]),
            checkpoint_stall_seconds=float(ckpt.stats["last_stall_seconds"]),
            checkpoint_save_seconds=ckpt.save_seconds,
            checkpoint_interval=ckpt.interval_steps,
        )
        self._watch_next()
        return new_step

    # -- life cycle ---------------------------------------------------------------------------------------
    def start(self) -> Run:
        """Restore the newest state (memory, peers, disk), start the watchdog and the SIGTERM save."""
        self.publisher.publish(phase="restoring")
        self.start_step = self.checkpointer.load()
        self.global_step = self.start_step
        info = self.checkpointer.last_restore
        self.publisher.restored(
            self.start_step, info.source if info else "none", skipped_checkpoints=info.skipped if info else ()
        )
        self.watchdog.start()
        self._watch_next()
        self._last_step_at = time.monotonic()
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def finish(self) -> None:
        """The run ended normally: a durable save of the last step, then everything released."""
        if self._closed:
            return
        # A collective on every rank, so every rank must take the same decision: by the last durable save
        # started (every rank's own count), not the last one known written (only the writing rank learns it).
        if self.global_step > 0 and self.global_step != self.checkpointer.stats["last_durable_save_step"]:
            # Said as a save: it may wait for the save in flight (a copy to object storage, say), and the
            # launcher's hang watch, which counts only time in `training`, would take that for a hung step.
            self.publisher.publish(phase="saving")
            self.checkpointer.save(self.global_step, force_durable=True)
        # `finished` once the last save is written (close waits for it): the launcher ends a process that
        # said `finished` and lingers, so nothing may still be saving then.
        self.close()
        self.publisher.publish(phase="finished", step=self.global_step)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watchdog.disarm()
        self.watchdog.stop()
        if self._previous_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler)
        self.checkpointer.close()

    def emergency_save(self) -> int | None:
        """Write the newest snapshot durably now (SIGTERM); returns its step."""
        self.publisher.publish(phase="saving")
        return self.checkpointer.emergency_save()

    # -- internals ----------------------------------------------------------------------------------------
    def _watch_next(self) -> None:
        # One watched region from each step's end to the next one's: a rank stuck anywhere in a step (the
        # gradient all-reduce, a loader waiting on a lost peer) longer than the collective timeout exits 87.
        self.watchdog.arm(f"step {self.global_step + 1}")

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        if self._terminating:
            return
        self._terminating = True
        self.should_stop = True
        signal.signal(signum, signal.SIG_IGN)
        # Snapshots are taken every step, so the newest complete one is the last finished step, whatever
        # the loop was doing when the signal came: saving it here needs nothing from the other ranks.
        saved = self.emergency_save()
        print(
            f"phalanx: SIGTERM: saved step {saved}" if saved is not None else "", file=sys.stderr, flush=True
        )
        raise Terminated

    def _loss_value(self, loss: torch.Tensor | float | None) -> float | None:
        if loss is None:
            return None
        if isinstance(loss, torch.Tensor):
            return float(loss.detach().float().mean().item())
        return float(loss)

    def _finite_everywhere(self, value: float) -> bool:
        # One tiny all-reduce: every rank takes the same decision.
        return all_ranks_finite(torch.tensor(value if math.isfinite(value) else float("nan")))

    def _roll_back(self) -> int:
        self.rollbacks += 1
        if self.rollbacks > self.max_rollbacks:
            raise NonFiniteLossError(
                f"loss was not finite {self.rollbacks} times (limit {self.max_rollbacks}); giving up"
            )
        self.global_step = self.checkpointer.load()
        self.state.step = self.global_step
        info = self.checkpointer.last_restore
        self.publisher.restored(
            self.global_step,
            info.source if info else "none",
            skipped_checkpoints=info.skipped if info else (),
        )
        self._watch_next()
        return self.global_step


@contextlib.contextmanager
def session(
    model: nn.Module,
    optimizer: Stateful | None = None,
    *,
    lr_scheduler: Stateful | None = None,
    data_cursor: Stateful | None = None,
    extra: Mapping[str, Stateful] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    interval_steps: int | str | None = None,
    keep: int | None = None,
    max_rollbacks: int = 3,
) -> Iterator[Run]:
    """Resume `model` and `optimizer` (DDP-wrapped or not) from the newest state and keep them saved.

    Create it after `init_process_group` (under torchrun) and after the model and optimizer. `lr_scheduler`,
    `data_cursor` (e.g. an `ElasticSampler`) and `extra` (anything else with `state_dict`/`load_state_dict`)
    are saved and restored with them. The directory, interval and keep default to the operator's
    `PHALANX_CHECKPOINT_DIR`, `PHALANX_CHECKPOINT_INTERVAL` and `PHALANX_CHECKPOINT_KEEP`. A loss that stays
    non-finite past `max_rollbacks` rollbacks exits 86 (not retried); SIGTERM saves and exits 143.
    """
    run = Run(
        model,
        optimizer,
        lr_scheduler=lr_scheduler,
        data_cursor=data_cursor,
        extra=extra,
        checkpoint_dir=checkpoint_dir,
        interval_steps=interval_steps,
        keep=keep,
        max_rollbacks=max_rollbacks,
    )
    run.start()
    try:
        yield run
    except NonFiniteLossError as error:
        run.close()
        print(f"phalanx: {error}", file=sys.stderr, flush=True)
        raise SystemExit(int(TrainerExit.NON_FINITE_LOSS)) from error
    except BaseException:
        run.close()
        raise
    run.finish()
