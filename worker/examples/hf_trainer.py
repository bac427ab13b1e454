"""A Hugging Face Trainer run under a TrainingJob, made resumable with one line: `callbacks=[PhalanxCallback()]`.

    python -m phalanx.worker.launch --nnodes 2 -- python -m phalanx.worker.examples.hf_trainer --steps 100

Written the way the Trainer's docs write a run: a model from a config (a tiny GPT-2, random weights), a
dataset of random token ids, `TrainingArguments` and `Trainer(...).train()`; under torchrun the Trainer joins
the process group itself (gloo on CPU). Needs the `huggingface` extra.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from phalanx.worker.integrations.huggingface import PhalanxCallback


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, samples: int, length: int, vocab: int) -> None:
        self.tokens = torch.randint(0, vocab, (samples, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class StepDelay(TrainerCallback):
    """Slows every step down (tests)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.examples.hf_trainer", description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (tests)")
    parser.add_argument(
        "--output-dir", default="", help="the Trainer's output_dir (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    callbacks: list[TrainerCallback] = [PhalanxCallback()]
    if args.step_delay:
        callbacks.append(StepDelay(args.step_delay))
    trainer = Trainer(
        model=model, args=training_args, train_dataset=RandomTokens(512, 16, 64), callbacks=callbacks
    )
    trainer.train()


if __name__ == "__main__":
    main()
