"""A tiny GPT-style character model trained with DDP under the Phalanx launcher.

    python -m phalanx.worker.launch --nnodes 1:2 -- python -m phalanx.worker.examples.tinygpt --steps 300

Trains on a synthetic corpus (worker/examples/corpus.py) with gloo on CPU, or NCCL on CUDA when present.
It uses everything a Phalanx training script should: TrainState + Checkpointer (resume from memory, peers
or disk), ElasticSampler (constant global batch whatever the world size), the non-finite-loss guard,
the collective watchdog, progress records for heartbeats, an emergency save on SIGTERM, and (for tests of
hang detection) a hang on SIGUSR1.
Run alone (`python -m phalanx.worker.examples.tinygpt`) it trains in a single process.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.worker import livegroup
from phalanx.worker.autointerval import parse_interval
from phalanx.worker.data import ElasticSampler, micro_batches, rank_share
from phalanx.worker.examples.corpus import generate
from phalanx.worker.exitcodes import LauncherExit, TrainerExit
from phalanx.worker.guards import (
    CollectiveWatchdog,
    NonFiniteLossError,
    NonFiniteLossGuard,
    global_mean_loss,
    process_group_timeout,
)
from phalanx.worker.heartbeat import StatusPublisher
from phalanx.worker.preflight import Preflight
from phalanx.worker.steptime import StepClock

NO_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)
"""No sync of buffers at each forward: torch 2.14 renamed DDP's `broadcast_buffers` (deprecated, with a warning in
every training process) to `forward_sync_buffers`; its sync at start-up is harmless for a constant mask."""


class Terminated(Exception):
    """SIGTERM arrived: save durably and stop."""


# -- model ------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    mask: torch.Tensor

    def __init__(self, vocab: int, block: int, width: int = 96, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer(
            "mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.token(tokens) + self.position(torch.arange(length, device=tokens.device))
        mask = self.mask[:length, :length]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


# -- data -------------------------------------------------------------------------------------------


class CharDataset:
    """Windows of `block + 1` characters; sample i starts at i * block."""

    def __init__(self, text: str, block: int) -> None:
        self.vocab = sorted(set(text))
        lookup = {character: index for index, character in enumerate(self.vocab)}
        self.data = torch.tensor([lookup[character] for character in text], dtype=torch.long)
        self.block = block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        windows = torch.stack([self.data[i * self.block : i * self.block + self.block + 1] for i in indices])
        return windows[:, :-1], windows[:, 1:]


class GrownState:
    """Checkpointed bytes that training never reads (the --grow-state-at-step knob): empty until `at_step`,
    then `megabytes` of float32, as when a run unfreezes layers or an optimizer creates its state late. Every
    save has that much more to copy from then on, so a durable save blocks training longer."""

    def __init__(self, megabytes: int, at_step: int) -> None:
        self.megabytes = megabytes
        self.at_step = at_step
        self.tensor = torch.zeros(0)

    def follow(self, step: int) -> None:
        if step >= self.at_step and self.tensor.numel() == 0:
            self.tensor = torch.ones(self.megabytes * (1 << 20) // 4)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"values": self.tensor}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.tensor = state["values"].clone()


# -- helpers ----------------------------------------------------------------------------------------


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def append_json(path: str | None, record: dict[str, Any]) -> None:
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def choose_device() -> torch.device:
    """CUDA (this process's local rank's device) when present, else the CPU: chosen at run time."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.examples.tinygpt", description=__doc__)
    add = parser.add_argument
    add("--steps", type=int, default=300, help="train until this step")
    add("--global-batch", type=int, default=32, help="samples per step, the same at every world size")
    add("--micro-batch", type=int, default=16, help="most samples per forward/backward on one rank")
    add("--block", type=int, default=32, help="characters of context")
    add("--width", type=int, default=96, help="model width")
    add("--layers", type=int, default=2, help="transformer blocks")
    add("--lr", type=float, default=3e-3, help="peak learning rate")
    add("--seed", type=int, default=0, help="model init and data order")
    add("--corpus-chars", type=int, default=60_000, help="size of the synthetic corpus")
    add("--checkpoint-dir", default=os.environ.get("PHALANX_CHECKPOINT_DIR") or "phalanx-checkpoints")
    add(
        "--checkpoint-interval",
        type=parse_interval,
        default=os.environ.get("PHALANX_CHECKPOINT_INTERVAL") or 50,
        help="steps between durable saves, or auto: the operator's choice (env PHALANX_CHECKPOINT_INTERVAL)",
    )
    add("--checkpoint-keep", type=int, default=int(os.environ.get("PHALANX_CHECKPOINT_KEEP") or 3))
    add("--max-rollbacks", type=int, default=3, help="non-finite losses tolerated before giving up")
    add("--threads", type=int, default=1, help="torch CPU threads per process")
    add("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    add(
        "--slow-pod",
        default=os.environ.get("PHALANX_EXAMPLE_SLOW_POD", ""),
        help="the pod ($POD_NAME) that works --slow-seconds longer per step (tests; env PHALANX_EXAMPLE_SLOW_POD)",
    )
    add(
        "--slow-seconds",
        type=float,
        default=float(os.environ.get("PHALANX_EXAMPLE_SLOW_SECONDS") or 0.0),
        help="extra seconds of work per step on --slow-pod (env PHALANX_EXAMPLE_SLOW_SECONDS)",
    )
    add("--slow-from-step", type=int, default=0, help="--slow-pod is slow only from this step on (tests)")
    add(
        "--grow-state-at-step",
        type=int,
        default=0,
        help="from this step on the checkpointed state carries --grow-state-mb more, so every save copies "
        "more and a durable save blocks training longer: a save that got costlier (tests)",
    )
    add("--grow-state-mb", type=int, default=128, help="see --grow-state-at-step (tests)")
    add(
        "--lr-spike-at-step", type=int, default=0, help="multiply the learning rate from this step on (tests)"
    )
    add("--lr-spike-factor", type=float, default=100.0, help="the factor of --lr-spike-at-step (tests)")
    add(
        "--grad-spike-at-step",
        type=int,
        default=0,
        help="multiply the gradients by --grad-spike-factor for --grad-spike-steps steps from this step: a "
        "burst of exploding gradients that the clipping keeps from the weights (tests)",
    )
    add("--grad-spike-factor", type=float, default=1000.0, help="see --grad-spike-at-step (tests)")
    add("--grad-spike-steps", type=int, default=10, help="see --grad-spike-at-step (tests)")
    add(
        "--no-loss-guard",
        action="store_true",
        help="train on through non-finite losses and publish them, as a script without the guard would (tests)",
    )
    add("--fail-at-step", type=int, default=0, help="crash the last rank once at this step (tests)")
    add("--nan-at-step", type=int, default=0, help="make rank 0's loss NaN at this step (tests)")
    add("--nan-repeat", type=int, default=1, help="attempts at --nan-at-step that get a NaN (tests)")
    add(
        "--nan-batch-of-step",
        type=int,
        default=0,
        help="the global batch step N trains on in an undisturbed run gives rank 0 a NaN loss whenever it is "
        "trained, in any process: a bad batch that only skipping it helps against (tests)",
    )
    add(
        "--nondeterministic-resume",
        action="store_true",
        help="skip a batch after every restore: a resume that does not continue the run (tests)",
    )
    add("--log-file", help="append one JSON line per step (rank 0) and per restore (every rank)")
    add("--summary-file", help="write the final JSON summary here (rank 0)")
    add("--print-every", type=int, default=0, help="print the loss every N steps (0: only the summary)")
    return parser.parse_args(argv)


# -- training ---------------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Set up what outlives a worker group (model, optimizer, data, checkpointer), then train in one group
    after another (worker/livegroup.py): under the launcher, a lost peer costs this process a new group and
    a restore from its own memory, not a restart."""
    from phalanx.worker import TrainState

    torch.set_num_threads(args.threads)
    device = choose_device()
    clock = StepClock(device=device if device.type == "cuda" else None)
    slow_seconds = args.slow_seconds if args.slow_pod and os.environ.get("POD_NAME") == args.slow_pod else 0.0

    dataset = CharDataset(generate(args.corpus_chars), args.block)
    torch.manual_seed(args.seed)
    model = TinyGPT(len(dataset.vocab), args.block, width=args.width, layers=args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = 20
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * _lr_spike(args, step + 1)
    )
    sampler = ElasticSampler(len(dataset), args.global_batch, seed=args.seed)
    bad_batch = _batch_of_step(ElasticSampler(len(dataset), args.global_batch, seed=args.seed), args)
    grown = GrownState(args.grow_state_mb, args.grow_state_at_step) if args.grow_state_at_step else None
    state = TrainState(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        data_cursor=sampler,
        extra={"grown": grown} if grown is not None else None,
    )
    training = Training(
        args,
        device,
        dataset,
        model,
        optimizer,
        scheduler,
        sampler,
        grown,
        bad_batch,
        state,
        clock,
        slow_seconds,
    )

    def on_sigterm(signum: int, _frame: Any) -> None:
        signal.signal(signum, signal.SIG_IGN)
        raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGUSR1, _hang_here)
    return livegroup.run_groups(training.in_group, timeout=process_group_timeout())


@dataclass
class Training:
    """What outlives a worker group in this process; `in_group` trains in the group it is in now."""

    args: argparse.Namespace
    device: torch.device
    dataset: CharDataset
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: ElasticSampler
    grown: GrownState | None
    bad_batch: list[int] | None
    state: Any
    clock: StepClock
    slow_seconds: float
    ckpt: Any = None
    restores: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def in_group(self) -> dict[str, Any]:
        from phalanx.worker import Checkpointer

        rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        publisher = StatusPublisher.from_env()
        publisher.publish(phase="starting", rank=rank, world_size=world_size)
        if self.ckpt is None:
            args = self.args
            self.ckpt = Checkpointer(
                self.state,
                directory=args.checkpoint_dir,
                interval_steps=args.checkpoint_interval,
                keep=args.checkpoint_keep,
                snapshot_every=1,
            )
        else:
            self.ckpt.rejoin()
        # Gradients of a step the last group did not finish must not reach this one's optimizer.
        self.optimizer.zero_grad(set_to_none=True)
        # The only buffer is the constant causal mask: no broadcast of it at every forward, which would also
        # make the ranks wait for each other before the StepClock's sync point could see it.
        model = self.model
        ddp: nn.Module = DistributedDataParallel(model, **NO_BUFFER_SYNC) if world_size > 1 else model
        watchdog = CollectiveWatchdog().start()
        try:
            return train_in_group(self, rank, world_size, ddp, publisher, watchdog)
        finally:
            watchdog.stop()


def train_in_group(
    training: Training,
    rank: int,
    world_size: int,
    ddp: nn.Module,
    publisher: StatusPublisher,
    watchdog: CollectiveWatchdog,
) -> dict[str, Any]:
    """Restore, then train until the last step, in the group this process is in now."""
    args, device, dataset, model, ckpt = (
        training.args,
        training.device,
        training.dataset,
        training.model,
        training.ckpt,
    )
    optimizer, scheduler, sampler, grown = (
        training.optimizer,
        training.scheduler,
        training.sampler,
        training.grown,
    )
    bad_batch, clock, slow_seconds = training.bad_batch, training.clock, training.slow_seconds
    restores, started = training.restores, training.started
    guard = NonFiniteLossGuard(ckpt, sampler, max_rollbacks=args.max_rollbacks)
    preflight = Preflight.from_env(ckpt, publisher)

    def restore(reason: str, do_load: Any) -> int:
        publisher.publish(phase="restoring")
        step = do_load()
        info = ckpt.last_restore
        event = {
            "event": "restore",
            "reason": reason,
            "rank": rank,
            "world_size": world_size,
            "step": step,
            "source": info.source if info else "none",
            "seconds": round(info.seconds, 4) if info else 0.0,
            "time": time.time(),
        }
        restores.append(event)
        append_json(args.log_file, event)
        publisher.restored(step, event["source"], skipped_checkpoints=info.skipped if info else ())
        return step

    def load_at_start() -> int:
        loaded = preflight.load()
        if args.nondeterministic_resume and loaded > 0:
            sampler.skip_batches(1)  # a resume that does not continue the run: the preflight must see it
        return loaded

    step = restore("start", load_at_start)
    loss_value = float("nan")
    nans_injected = 0
    try:
        while step < args.steps:
            clock.start()
            if slow_seconds and step + 1 >= args.slow_from_step:
                time.sleep(slow_seconds)  # this pod's own work takes longer: a straggler
            global_batch = sampler.next_global_batch()
            batch = rank_share(global_batch, rank, world_size)
            local_loss = torch.zeros((), device=device)
            poisoned = args.nan_at_step == step + 1 and rank == 0 and nans_injected < args.nan_repeat
            poisoned = poisoned or (rank == 0 and bad_batch is not None and global_batch == bad_batch)
            nans_injected += int(poisoned)
            gradient_factor = _grad_spike(args, step + 1)
            with watchdog.watch(f"step {step + 1}"):
                for micro in micro_batches(batch, args.micro_batch, world_size, args.global_batch):
                    inputs, targets = (tensor.to(device) for tensor in dataset.batch(micro.indices))
                    # Gradients are reduced on a micro-batch's backward unless DDP is told not to.
                    context = (
                        ddp.no_sync()
                        if isinstance(ddp, DistributedDataParallel) and not micro.sync
                        else _nullcontext()
                    )
                    with context:
                        logits = ddp(inputs)
                        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
                        if poisoned:
                            loss = loss * float("nan")
                        scaled = loss * micro.loss_scale
                        if micro.sync:
                            # Before the backward that all-reduces the gradients: the time spent here is
                            # waiting for slower ranks, not this rank's own work.
                            clock.sync_point()
                        (scaled * gradient_factor if gradient_factor != 1.0 else scaled).backward()
                    local_loss = local_loss + scaled.detach()
                mean_loss = global_mean_loss(local_loss)
            if not math.isfinite(mean_loss) and not args.no_loss_guard:
                optimizer.zero_grad(set_to_none=True)
                step = restore("non-finite loss", guard.rollback)
                continue
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_value = mean_loss
            if args.step_delay:
                time.sleep(args.step_delay)
            if grown is not None:
                grown.follow(step)
            publisher.publish(phase="saving")
            ckpt.save(step, force_durable=preflight.save_due(step))
            preflight.check(step, loss_value)
            timing = clock.stop()
            publisher.publish(
                phase="training",
                step=step,
                loss=loss_value,
                step_seconds=timing.step_seconds,
                compute_seconds=timing.compute_seconds,
                samples_per_second=args.global_batch / timing.step_seconds,
                grad_norm=grad_norm,
                checkpoint_step=int(ckpt.stats["last_durable_step"]),
                checkpoint_stall_seconds=float(ckpt.stats["last_stall_seconds"]),
                checkpoint_save_seconds=ckpt.save_seconds,
                checkpoint_interval=ckpt.interval_steps,
            )
            if rank == 0:
                append_json(
                    args.log_file,
                    {"step": step, "loss": loss_value, "world_size": world_size, "time": time.time()},
                )
                if args.print_every and step % args.print_every == 0:
                    print(f"step {step} loss {loss_value:.4f} world {world_size}", flush=True)
            if args.fail_at_step and step == args.fail_at_step and rank == world_size - 1:
                _fail_once(args)
            livegroup.check()
        # Said as a save: the final durable save waits for the copy in flight (to object storage, say), and a
        # heartbeat that still said `training` at the last step read as a hung step on a loaded machine.
        publisher.publish(phase="saving")
        ckpt.save(step, force_durable=True)
        ckpt.wait()
    except Terminated:
        publisher.publish(phase="saving")
        saved = ckpt.emergency_save()
        ckpt.close()
        print(
            f"phalanx: SIGTERM: saved step {saved}" if saved is not None else "", file=sys.stderr, flush=True
        )
        raise
    ckpt.close()
    publisher.publish(phase="finished", step=step)
    return {
        "final_step": step,
        "final_loss": loss_value,
        "checksum": checksum(model),
        "world_size": world_size,
        "rank": rank,
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "restores": restores,
        "rollbacks": guard.rollbacks,
        "wall_seconds": round(time.time() - started, 3),
        "device": str(device),
    }


def _lr_spike(args: argparse.Namespace, step: int) -> float:
    """The learning-rate factor of training step `step` (1-based): the test knob of a divergence."""
    spiked = args.lr_spike_at_step and step >= args.lr_spike_at_step
    return args.lr_spike_factor if spiked else 1.0


def _grad_spike(args: argparse.Namespace, step: int) -> float:
    """The factor on the gradients of training step `step` (1-based): the test knob of a gradient burst."""
    start = args.grad_spike_at_step
    spiked = start and start <= step < start + args.grad_spike_steps
    return args.grad_spike_factor if spiked else 1.0


def _batch_of_step(fresh: ElasticSampler, args: argparse.Namespace) -> list[int] | None:
    """The global batch of step `--nan-batch-of-step` in an undisturbed run (None: the knob is off)."""
    if args.nan_batch_of_step <= 0:
        return None
    for _ in range(args.nan_batch_of_step - 1):
        fresh.next_global_batch()
    return fresh.next_global_batch()


def _hang_here(_signum: int, _frame: Any) -> None:
    """SIGUSR1: hang where the signal found the main thread (tests and benchmarks of hang detection). The
    process stays alive and keeps its threads; only a restart of the worker group (or SIGTERM) ends it."""
    print("phalanx example: hanging on request (SIGUSR1)", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def _fail_once(args: argparse.Namespace) -> None:
    """Crash once per checkpoint directory, so a resumed run passes the step."""
    marker = Path(args.checkpoint_dir) / f".fail-at-step-{args.fail_at_step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    print(f"phalanx example: failing on purpose at step {args.fail_at_step}", file=sys.stderr, flush=True)
    os._exit(1)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> int:

    args = parse_args(argv)
    try:
        summary = train(args)
    except Terminated:
        _leave_group()
        # Saved and out of the group: nothing is left to do, and the interpreter's teardown of torch takes
        # seconds (4 on a busy two-core machine) that the pod's deletion, and so a preemption or a
        # replacement, would wait for.
        _exit_now(int(LauncherExit.TERMINATED))
    except NonFiniteLossError as error:
        print(f"phalanx example: {error}", file=sys.stderr, flush=True)
        _leave_group()  # an abort at exit would turn exit code 86 into a retried failure
        return int(TrainerExit.NON_FINITE_LOSS)
    except RuntimeError as error:
        if not livegroup.peer_lost(error):
            raise
        # Expected when another rank dies: the launcher re-forms the group; no traceback needed. The group
        # is not torn down here: with a peer gone that could wait on it, and the launcher must see the exit.
        print(
            f"phalanx example: lost a peer: {str(error).splitlines()[0][:200]}", file=sys.stderr, flush=True
        )
        return 1
    if summary["rank"] == 0:
        line = json.dumps({key: value for key, value in summary.items() if key != "rank"})
        print(line, flush=True)
        if args.summary_file:
            Path(args.summary_file).write_text(line + "\n")
    _leave_group()
    return 0


def _exit_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _leave_group() -> None:
    """Tear the process group down now: its C++ threads must not meet the interpreter's teardown."""
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
