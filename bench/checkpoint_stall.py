"""Checkpoint stall per save: synchronous torch.save+fsync vs Phalanx's Checkpointer vs a bare copy.

Part of ``phalanx bench`` (``--only checkpoint-stall``); also runs on its own:
``python -m phalanx.bench.checkpoint_stall --quick --out /tmp/bench``, which writes
``checkpoint_stall.json`` and ``checkpoint_stall.md`` into ``--out``.

For each state size it measures, over repeated saves (p50/p95):
- ``copy``: copying the state's tensors into a preallocated host buffer the way a snapshot copies them (the
  floor for any snapshot);
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

from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots
from phalanx.worker.checkpoint import payload, shm_store

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
    """The floor: the state's tensors copied into a preallocated, already touched host buffer, the way a
    snapshot copies them (`payload.copy_host`: memmove, shared with a helper thread from 32 MB)."""
    tensors = [parameter.detach() for parameter in model.parameters()]
    buffers = [torch.empty_like(tensor) for tensor in tensors]
    ranges = [
        (buffer.data_ptr(), tensor.data_ptr(), tensor.numel() * tensor.element_size())
        for buffer, tensor in zip(buffers, tensors, strict=True)
    ]
    payload.copy_host(ranges)  # first touch outside the timing, as a reused buffer would be
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        payload.copy_host(ranges)
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
        # Warm-up: starts the saver process and writes every snapshot slot once. The first save into a slot
        # also faults its pages in (about a second per GB here), once per slot for the life of the process.
        for _ in range(shm_store.SLOT_COUNT + 1):
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


def measure_slowdown(
    model: Blob, directory: Path, baseline_steps: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Mean step time of a CPU matmul loop alone vs while the saver persists a durable save (and the steps)."""
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
    figures = {
        "step_alone_s": mean_alone,
        "step_during_persist_s": mean_during,
        "steps_during_persist": len(during),
        "slowdown_fraction": mean_during / mean_alone - 1.0,
        "persist_s": persist_seconds,
    }
    return figures, {"alone": alone, "during": during}


def measure_all(quick: bool, workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every measurement: the summarized report and the raw samples behind it (seconds)."""
    torch.set_num_threads(1)  # the "training" loop uses one core; the saver may use another
    sizes_mb = [10, 100] if quick else [10, 100, 1024]
    repeats = {10: (20, 5, 8), 100: (10, 3, 5), 1024: (5, 2, 3)}
    results = []
    samples: dict[str, Any] = {"sizes": {}}
    largest_model = None
    for size_mb in sizes_mb:
        copy_n, sync_n, async_n = repeats[size_mb]
        model = Blob(size_mb * MB)
        copy = measure_copy(model, copy_n)
        sync = measure_sync(model, workdir, sync_n)
        stalls, persists = measure_async(model, workdir / f"async-{size_mb}", async_n)
        row: dict[str, Any] = {
            "size_mb": size_mb,
            "copy": summary(copy),
            "sync": summary(sync),
            "async_stall": summary(stalls),
            "async_persist": summary(persists),
        }
        row["stall_over_copy"] = row["async_stall"]["p50_s"] / row["copy"]["p50_s"]
        row["sync_over_stall"] = row["sync"]["p50_s"] / row["async_stall"]["p50_s"]
        results.append(row)
        samples["sizes"][size_mb] = {
            "copy": copy,
            "sync": sync,
            "async_stall": stalls,
            "async_persist": persists,
        }
        largest_model = model
    assert largest_model is not None
    slowdown, steps = measure_slowdown(
        largest_model, workdir / "slowdown", baseline_steps=20 if quick else 40
    )
    samples["slowdown_steps"] = steps
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
    return report, samples


def write_files(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_stall.json").write_text(json.dumps(report, indent=2))
    (out / "checkpoint_stall.md").write_text(markdown(report))


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


# ------------------------------------------------------------------------------ harness entry point

NAME = "checkpoint-stall"
TITLE = "Checkpoint stall per save"
STALL_BASELINE = "PyTorch DCP async: 148.8 s -> 6.3 s stall (23.6x); DLRover flash checkpoint: 2 min -> 0.2 s"


def to_metrics(report: dict[str, Any], samples: dict[str, Any]) -> list[Any]:
    """The harness's metrics from one measurement: raw times per size, the two ratios, the slowdown."""
    from phalanx.bench.core import Baseline, Metric, Target

    metrics = []
    for row in report["sizes"]:
        size = row["size_mb"]
        raw = samples["sizes"][size]
        copy_p50, sync_p50 = row["copy"]["p50_s"], row["sync"]["p50_s"]
        stall_p50 = statistics.median(raw["async_stall"])
        fixed_cost = (
            f"every save has a cost besides copying the state (median stall less median copy: "
            f"{(stall_p50 - copy_p50) * 1e3:.1f} ms: the RNG gather, the snapshot header, handing the job to the "
            f"saver process), and at {size} MB the copy itself takes only {copy_p50 * 1e3:.2f} ms"
        )
        sync_over_copy = sync_p50 / copy_p50
        if sync_over_copy < 20:
            storage_bound = (
                f"a stall can never be shorter than the in-memory copy, and here a synchronous save of {size} MB "
                f"takes only {sync_over_copy:.1f}x that copy ({sync_p50 * 1e3:.0f} ms vs {copy_p50 * 1e3:.1f} "
                "ms: the page cache and the local disk absorb it), so no stall can be 20x below it on this "
                "machine; the target assumes storage far slower than memory (the DCP and DLRover figures are "
                "for remote storage)"
            )
        else:
            storage_bound = (
                f"a synchronous save of {size} MB takes {sync_over_copy:.1f}x the in-memory copy here, so 20x "
                f"below it leaves a stall of at most {sync_over_copy / 20:.2f}x that copy; the saves stalled "
                f"{stall_p50 / copy_p50:.2f}x it (the copy into shared memory plus the fixed cost of a save), "
                "within the <= 2x target but not that close to a bare copy"
            )
        metrics += [
            Metric(
                name=f"stall / copy, {size} MB",
                unit="x",
                samples=[stall / copy_p50 for stall in raw["async_stall"]],
                description="each save's stall over the median in-memory copy of the state",
                target=Target(op="<=", value=2.0, text="<= 2x the time to copy the state in memory"),
                baseline=Baseline(text="DLRover flash checkpoint: 0.2 s stall (state in memory first)"),
                why_missed=fixed_cost,
            ),
            Metric(
                name=f"sync / stall, {size} MB",
                unit="x",
                samples=[sync_p50 / stall for stall in raw["async_stall"]],
                description="median synchronous torch.save+fsync over each save's stall",
                target=Target(op=">=", value=20.0, text=">= 20x below a synchronous save at >= 100 MB")
                if size >= 100
                else None,
                baseline=Baseline(text=STALL_BASELINE, value=23.6),
                why_missed=storage_bound,
            ),
            Metric(
                name=f"async stall, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in raw["async_stall"]],
                description="training loop blocked in Checkpointer.save on a durable step",
            ),
            Metric(
                name=f"in-memory copy, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in raw["copy"]],
                description="copy of the state into a preallocated buffer, as a snapshot copies it (the floor)",
            ),
            Metric(
                name=f"sync save, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in raw["sync"]],
                description="torch.save to a file plus fsync",
            ),
            Metric(
                name=f"background persist, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in raw["async_persist"]],
                description="the saver process writing, hashing, fsyncing and committing",
            ),
        ]
    steps = samples["slowdown_steps"]
    mean_alone = statistics.mean(steps["alone"])
    slowdowns = [(step / mean_alone - 1.0) * 100 for step in steps["during"]]
    contention = (
        f"{os.cpu_count()} cores are shared by the training loop, the saver process writing and hashing "
        f"{report['slowdown']['size_mb']} MB, and the kernel's writeback of it; the median step is only "
        f"{statistics.median(slowdowns):.1f}% slower, the mean is carried by the steps that meet the writeback "
        "(a training node has cores to spare for the saver)"
    )
    metrics.append(
        Metric(
            name=f"step slowdown while persisting, {report['slowdown']['size_mb']} MB",
            unit="%",
            samples=slowdowns,
            description="each matmul step during a background save over the mean step alone",
            target=Target(op="<=", value=10.0, stat="mean", text="<= 10% step slowdown while persisting"),
            baseline=Baseline(text="Meta: -55% for 7 min with a saver thread; fixed with a process"),
            why_missed=contention,
        )
    )
    return metrics


def run(context: Any, quick: bool) -> Any:
    """Harness entry point (`phalanx bench --only checkpoint-stall`)."""
    from phalanx.bench.core import BenchResult

    if getattr(context, "device", "cpu") != "cpu":
        from phalanx.bench import checkpoint_device

        on_device = checkpoint_device.measure_all(context.device, quick, context.scratch(NAME))
        return BenchResult(
            name=NAME,
            title=f"{TITLE} on {on_device['device']}",
            metrics=checkpoint_device.to_metrics(on_device),
            notes=[checkpoint_device.markdown(on_device), (checkpoint_device.__doc__ or "").split("\n\n")[0]],
            details=on_device,
        )
    report, samples = measure_all(quick, context.scratch(NAME))
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=to_metrics(report, samples),
        notes=[
            "No cluster: one process saves a model made of float32 tensors; the training loop runs on one "
            "torch thread, the saver is a separate niced process.",
            "Sizes: "
            + ", ".join(f"{row['size_mb']} MB" for row in report["sizes"])
            + f"; step slowdown measured at {report['slowdown']['size_mb']} MB over "
            f"{report['slowdown']['steps_during_persist']} steps during one background save.",
            "No timeouts are involved.",
        ],
        details=report,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 MB and 100 MB only (under 30 s)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for JSON and Markdown"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(
        prefix="phalanx-ckpt-bench-", dir=os.environ.get("PHALANX_BENCH_DIR")
    ) as tmp:
        report, _ = measure_all(args.quick, Path(tmp))
    write_files(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
