"""Checkpoint stall per save: synchronous torch.save+fsync vs Phalanx's Checkpointer vs a bare copy.

Run from the repository root: ``python -m bench.checkpoint_stall --quick --out /tmp/bench`` (or as a
plain script). Writes ``checkpoint_stall.json`` and ``checkpoint_stall.md`` into ``--out``.

For each state size it measures, over repeated saves (p50/p95):
- ``copy``: copying the state's tensors into a preallocated host buffer (the floor for any snapshot);
- ``sync``: ``torch.save`` to a file plus fsync (what a plain training loop blocks on);
- ``async``: the training loop's stall in ``Checkpointer.save`` on a durable step (snapshot copy into
  shared memory and hand-off to the saver process), and how long the saver took to persist;
and, at the largest size, the slowdown of a CPU matmul loop while a save persists in the background.
Targets: stall <= 2x copy; >= 20x below sync at >= 100 MB; slowdown <= 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots

MB = 1 << 20
CHUNK_ELEMENTS = 4 * MB  # 16 MB float32 tensors, like the layers of a model


class Blob(torch.nn.Module):
    """A model that is nothing but ``size_bytes`` of float32 parameters."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__()
        remaining = size_bytes // 4
        chunks = []
        while remaining > 0:
            count = min(CHUNK_ELEMENTS, remaining)
            chunks.append(torch.nn.Parameter(torch.randn(count)))
            remaining -= count
        self.chunks = torch.nn.ParameterList(chunks)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_s": statistics.median(values), "p95_s": percentile(values, 0.95), "n": len(values)}


def measure_copy(model: Blob, repeats: int) -> list[float]:
    tensors = [parameter.detach() for parameter in model.parameters()]
    buffers = [torch.empty_like(tensor) for tensor in tensors]
    for buffer, tensor in zip(buffers, tensors, strict=True):
        buffer.copy_(tensor)  # first touch outside the timing, as a reused buffer would be
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for buffer, tensor in zip(buffers, tensors, strict=True):
            buffer.copy_(tensor)
        times.append(time.perf_counter() - started)
    return times


def measure_sync(model: Blob, directory: Path, repeats: int) -> list[float]:
    times = []
    for index in range(repeats):
        path = directory / f"sync-{index}.pt"
        started = time.perf_counter()
        with open(path, "wb") as handle:
            torch.save(model.state_dict(), handle)
            handle.flush()
            os.fsync(handle.fileno())
        times.append(time.perf_counter() - started)
        path.unlink()
    return times


def measure_async(model: Blob, directory: Path, repeats: int) -> tuple[list[float], list[float]]:
    state = TrainState(model=model)
    ckpt = Checkpointer(state, directory, interval_steps=1, keep=2, snapshot_every=1)
    stalls, persists = [], []
    try:
        ckpt.save(0)  # warm-up: starts the saver process and touches the snapshot slots
        ckpt.wait()
        ckpt.save(0)
        ckpt.wait()
        for step in range(1, repeats + 1):
            started = time.perf_counter()
            ckpt.save(step)
            stalls.append(time.perf_counter() - started)
            ckpt.wait()
            persists.append(ckpt.stats["last_persist_seconds"])
    finally:
        ckpt.close()
        cleanup_snapshots(namespace=ckpt.namespace)
    return stalls, persists


def matmul_step(a: torch.Tensor, b: torch.Tensor, rounds: int = 8) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        torch.mm(a, b)
    return time.perf_counter() - started


def measure_slowdown(model: Blob, directory: Path, baseline_steps: int) -> dict[str, float]:
    """Mean step time of a CPU matmul loop alone vs while the saver persists a durable save."""
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    state = TrainState(model=model)
    ckpt = Checkpointer(state, directory, interval_steps=0, keep=2, snapshot_every=0)
    try:
        ckpt.save(0, force_durable=True)  # warm-up
        ckpt.wait()
        for _ in range(5):
            matmul_step(a, b)
        alone = [matmul_step(a, b) for _ in range(baseline_steps)]
        ckpt.save(1, force_durable=True)
        during: list[float] = []
        while ckpt.stats["last_durable_step"] < 1:
            during.append(matmul_step(a, b))
            ckpt.save(1)  # a non-durable step: only notices when the saver is done
        persist_seconds = ckpt.stats["last_persist_seconds"]
    finally:
        ckpt.close()
        cleanup_snapshots(namespace=ckpt.namespace)
    mean_alone = statistics.mean(alone)
    mean_during = statistics.mean(during) if during else mean_alone
    return {
        "step_alone_s": mean_alone,
        "step_during_persist_s": mean_during,
        "steps_during_persist": len(during),
        "slowdown_fraction": mean_during / mean_alone - 1.0,
        "persist_s": persist_seconds,
    }


def run(quick: bool, out: Path, workdir: Path) -> dict[str, Any]:
    torch.set_num_threads(1)  # the "training" loop uses one core; the saver may use another
    sizes_mb = [10, 100] if quick else [10, 100, 1024]
    repeats = {10: (20, 5, 8), 100: (10, 3, 5), 1024: (5, 2, 3)}
    results = []
    largest_model = None
    for size_mb in sizes_mb:
        copy_n, sync_n, async_n = repeats[size_mb]
        model = Blob(size_mb * MB)
        copy = measure_copy(model, copy_n)
        sync = measure_sync(model, workdir, sync_n)
        stalls, persists = measure_async(model, workdir / f"async-{size_mb}", async_n)
        row = {
            "size_mb": size_mb,
            "copy": summary(copy),
            "sync": summary(sync),
            "async_stall": summary(stalls),
            "async_persist": summary(persists),
        }
        row["stall_over_copy"] = row["async_stall"]["p50_s"] / row["copy"]["p50_s"]
        row["sync_over_stall"] = row["sync"]["p50_s"] / row["async_stall"]["p50_s"]
        results.append(row)
        largest_model = model
    assert largest_model is not None
    slowdown = measure_slowdown(largest_model, workdir / "slowdown", baseline_steps=20 if quick else 40)
    report = {
        "benchmark": "checkpoint_stall",
        "quick": quick,
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.is_available(),
            "torch_threads": 1,
        },
        "targets": {"stall_over_copy_max": 2.0, "sync_over_stall_min_at_100mb": 20.0, "slowdown_max": 0.10},
        "sizes": results,
        "slowdown": {"size_mb": sizes_mb[-1], **slowdown},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_stall.json").write_text(json.dumps(report, indent=2))
    (out / "checkpoint_stall.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Checkpoint stall per save",
        "",
        f"Host: {report['host']['cpus']} CPUs, torch {report['host']['torch']}, CUDA {report['host']['cuda']}; "
        "training loop on 1 thread. Times in milliseconds (p50 / p95).",
        "",
        "| state | copy | sync torch.save+fsync | async stall | stall / copy | sync / stall | background persist |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["sizes"]:

        def ms(entry: dict[str, float]) -> str:
            return f"{entry['p50_s'] * 1e3:.1f} / {entry['p95_s'] * 1e3:.1f}"

        lines.append(
            f"| {row['size_mb']} MB | {ms(row['copy'])} | {ms(row['sync'])} | {ms(row['async_stall'])} | "
            f"{row['stall_over_copy']:.2f}x | {row['sync_over_stall']:.1f}x | {ms(row['async_persist'])} |"
        )
    slow = report["slowdown"]
    lines += [
        "",
        f"Step slowdown while a {slow['size_mb']} MB save persists: {slow['slowdown_fraction'] * 100:.1f}% "
        f"({slow['step_alone_s'] * 1e3:.2f} ms alone, {slow['step_during_persist_s'] * 1e3:.2f} ms during, "
        f"{slow['steps_during_persist']} steps).",
        "",
        "Targets: stall <= 2x copy; sync >= 20x the stall at >= 100 MB; slowdown <= 10%.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 MB and 100 MB only (under 30 s)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results"), help="folder for JSON and Markdown"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(
        prefix="phalanx-ckpt-bench-", dir=os.environ.get("PHALANX_BENCH_DIR")
    ) as tmp:
        report = run(args.quick, args.out, Path(tmp))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
