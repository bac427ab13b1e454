"""Checkpoints of a state on an accelerator, against the link's own speed (`phalanx bench --only checkpoint-stall
--device cuda`).

For each size (1, 8 and 32 GiB; `--quick`: 64 MiB and 256 MiB) one model of that many bytes of float32
parameters lives on the device, trained by SGD, with a step of matmuls calibrated to last at least as long as the
state's copy to the host. Measured:
- the physical reference: the whole state copied to pinned host memory (D2H) and back (H2D), non-blocking, then
  one synchronisation;
- the first save after a start, while the slots are still being prepared, and warm saves: the stall of a save is
  the time spent in `Checkpointer.save` plus what the next step took beyond a step without a save (the optimizer
  waits for the side stream's copies there);
- the durable save's persist time (the saver process), a restore from memory (this process's own snapshot, into
  the model's tensors) and one from disk, each checked bitwise against the saved state;
- the ratios the worker promises: stall / D2H copy <= 0.25, restore from memory / H2D copy <= 2, first save /
  warm save <= 1.5.
On a machine without the device this refuses to run; `device="cpu"` runs the same steps on the host (the
benchmark's own test), where "pinned" is plain memory.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots
from phalanx.worker.checkpoint import shm_store

GIB = 1 << 30
MIB = 1 << 20
SIZES = (1 * GIB, 8 * GIB, 32 * GIB)
QUICK_SIZES = (64 * MIB, 256 * MIB)
CHUNK_ELEMENTS = 64 * MIB  # 256 MiB float32 tensors: a large model's layers
WARM_SAVES = 3
TARGETS = {"stall_over_d2h": 0.25, "restore_over_h2d": 2.0, "first_over_warm": 1.5}


class DeviceBlob(torch.nn.Module):
    """`size_bytes` of float32 parameters on `device`, in chunks."""

    def __init__(self, size_bytes: int, device: torch.device) -> None:
        super().__init__()
        remaining, chunks = size_bytes // 4, []
        while remaining > 0:
            count = min(CHUNK_ELEMENTS, remaining)
            chunks.append(torch.nn.Parameter(torch.rand(count, device=device)))
            remaining -= count
        self.chunks = torch.nn.ParameterList(chunks)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reference_copies(model: DeviceBlob, device: torch.device) -> tuple[float, float]:
    """Seconds to copy every parameter to pinned host memory and back (best of three each way)."""
    pinned = device.type == "cuda"
    hosts = [torch.empty(p.numel(), dtype=p.dtype, pin_memory=pinned) for p in model.parameters()]
    d2h, h2d = [], []
    for _ in range(3):
        synchronize(device)
        started = time.perf_counter()
        for host, parameter in zip(hosts, model.parameters(), strict=True):
            host.copy_(parameter.detach(), non_blocking=pinned)
        synchronize(device)
        d2h.append(time.perf_counter() - started)
        started = time.perf_counter()
        with torch.no_grad():
            for host, parameter in zip(hosts, model.parameters(), strict=True):
                parameter.copy_(host, non_blocking=pinned)
        synchronize(device)
        h2d.append(time.perf_counter() - started)
    del hosts
    return min(d2h), min(h2d)


class Compute:
    """The forward and backward of a step: matmuls that last at least `at_least` seconds on the device."""

    def __init__(self, device: torch.device, at_least: float) -> None:
        side = 4096 if device.type == "cuda" else 256
        self.a = torch.rand(side, side, device=device)
        self.device = device
        self.rounds = 1
        while self.run() < at_least and self.rounds < 1 << 16:
            self.rounds *= 2

    def run(self) -> float:
        synchronize(self.device)
        started = time.perf_counter()
        for _ in range(self.rounds):
            self.a = torch.mm(self.a, self.a).clamp_(0, 1)
        synchronize(self.device)
        return time.perf_counter() - started


def train_step(model: DeviceBlob, optimizer: torch.optim.Optimizer, compute: Compute) -> float:
    """One step (compute, gradients, the optimizer's step); returns its seconds, device work included."""
    started = time.perf_counter()
    compute.run()
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3) if parameter.grad is None else parameter.grad
    optimizer.step()
    synchronize(compute.device)
    return time.perf_counter() - started


def slots_for(size_bytes: int, snapshot_dir: Path) -> int:
    """3 slots where they fit in 80% of the snapshot folder's free space, else 2 (the spec's choice)."""
    free = shutil.disk_usage(snapshot_dir).free
    return 3 if 3 * (size_bytes + MIB) <= 0.8 * free else 2


def measure_size(size_bytes: int, device: torch.device, workdir: Path) -> dict[str, Any]:
    model = DeviceBlob(size_bytes, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = TrainState(model=model, optimizer=optimizer)
    d2h, h2d = reference_copies(model, device)
    compute = Compute(device, at_least=1.5 * d2h)
    slots = slots_for(size_bytes, shm_store.snapshot_root())
    os.environ[shm_store.SLOTS_ENV] = str(slots)
    directory = workdir / f"ckpt-{size_bytes}"
    ckpt = Checkpointer(state, directory, interval_steps=0, keep=1)
    try:
        ckpt.load()  # nothing to restore: starts preparing the slots, as at a (re)start
        plain = [train_step(model, optimizer, compute) for _ in range(2)]
        step = 2

        def stalled_save() -> float:
            nonlocal step
            step += 1
            started = time.perf_counter()
            ckpt.save(step)
            in_save = time.perf_counter() - started
            after = train_step(model, optimizer, compute)  # its optimizer step waits for the copies
            return in_save + max(0.0, after - statistics.median(plain))

        first = stalled_save()
        warm = [stalled_save() for _ in range(WARM_SAVES)]
        step += 1
        ckpt.save(step, force_durable=True)
        ckpt.wait()
        persist = float(ckpt.stats["last_persist_seconds"])
        saved_step = step
        expected = [parameter.detach().clone() for parameter in model.parameters()]
    finally:
        ckpt.close()

    def restore(source: str) -> float:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
        reader = Checkpointer(state, directory, interval_steps=0, keep=1)
        try:
            synchronize(device)
            started = time.perf_counter()
            restored = reader.load()
            synchronize(device)
            seconds = time.perf_counter() - started
            assert reader.last_restore is not None and reader.last_restore.source == source, (
                reader.last_restore
            )
        finally:
            reader.close()
        assert restored == saved_step
        assert all(torch.equal(p, e) for p, e in zip(model.parameters(), expected, strict=True)), source
        return seconds

    from_memory = restore("memory")
    namespace = shm_store.job_namespace(directory)
    cleanup_snapshots(namespace=namespace)
    from_disk = restore("disk")
    cleanup_snapshots(namespace=namespace)
    shutil.rmtree(directory, ignore_errors=True)
    os.environ.pop(shm_store.SLOTS_ENV, None)
    warm_p50 = statistics.median(warm)
    return {
        "size_bytes": size_bytes,
        "slots": slots,
        "d2h_s": d2h,
        "h2d_s": h2d,
        "step_s": statistics.median(plain),
        "first_save_s": first,
        "warm_saves_s": warm,
        "persist_s": persist,
        "restore_memory_s": from_memory,
        "restore_disk_s": from_disk,
        "stall_over_d2h": warm_p50 / d2h,
        "restore_over_h2d": from_memory / h2d,
        "first_over_warm": first / warm_p50,
    }


def size_label(size: int) -> str:
    return f"{size / GIB:g} GiB" if size >= GIB else f"{size / MIB:g} MiB"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"host CPU, torch {torch.__version__}"


def measure_all(
    device_kind: str, quick: bool, workdir: Path, sizes: tuple[int, ...] | None = None
) -> dict[str, Any]:
    if device_kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: this machine has no CUDA device torch can use")
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    return {
        "device": device_name(device),
        "measured_on": time.strftime("%Y-%m-%d", time.gmtime()),
        "targets": TARGETS,
        "sizes": [measure_size(size, device, workdir) for size in sizes],
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Device: {report['device']}, measured {report['measured_on']}. Seconds; ratios against the pinned copies.",
        "",
        "| state | slots | D2H copy | H2D copy | warm stall p50 | first save | persist | restore memory | "
        "restore disk | stall / D2H | restore / H2D | first / warm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["sizes"]:
        label = size_label(row["size_bytes"])
        lines.append(
            f"| {label} | {row['slots']} | {row['d2h_s']:.3f} | {row['h2d_s']:.3f} | "
            f"{statistics.median(row['warm_saves_s']):.3f} | {row['first_save_s']:.3f} | {row['persist_s']:.2f} | "
            f"{row['restore_memory_s']:.3f} | {row['restore_disk_s']:.2f} | {row['stall_over_d2h']:.2f}x | "
            f"{row['restore_over_h2d']:.2f}x | {row['first_over_warm']:.2f}x |"
        )
    lines += [
        "",
        "Targets: stall <= 0.25x D2H; restore from memory <= 2x H2D; first save <= 1.5x a warm save.",
        "",
    ]
    return "\n".join(lines)


def to_metrics(report: dict[str, Any]) -> list[Any]:
    from phalanx.bench.core import Metric, Target

    metrics = []
    for row in report["sizes"]:
        label = size_label(row["size_bytes"])
        metrics += [
            Metric(
                name=f"{label}: stall / D2H copy",
                unit="x",
                samples=[stall / row["d2h_s"] for stall in row["warm_saves_s"]],
                description="a warm save's stall (in save, plus the next step beyond a plain one) over the copy",
                target=Target(op="<=", value=TARGETS["stall_over_d2h"], text="<= 0.25x the pinned D2H copy"),
            ),
            Metric(
                name=f"{label}: restore from memory / H2D copy",
                unit="x",
                samples=[row["restore_over_h2d"]],
                description="Checkpointer.load from this process's own snapshot over the pinned H2D copy",
                target=Target(op="<=", value=TARGETS["restore_over_h2d"], text="<= 2x the pinned H2D copy"),
            ),
            Metric(
                name=f"{label}: first save / warm save",
                unit="x",
                samples=[row["first_over_warm"]],
                description="the first save after a start over the median warm save",
                target=Target(op="<=", value=TARGETS["first_over_warm"], text="<= 1.5x a warm save"),
            ),
        ]
    return metrics
