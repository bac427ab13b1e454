"""The machine a benchmark ran on: cores, memory, measured memory-copy bandwidth and fsync latency, load."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import psutil

from phalanx.bench.core import Model, percentile

MB = 1 << 20


class Machine(Model):
    """Facts and probes of the host, measured when the harness starts."""

    cpus: int
    """Logical CPUs."""
    cpu_model: str
    """CPU model name from /proc/cpuinfo (empty when unknown)."""
    memory_gib: float
    """Total memory."""
    memory_available_gib: float
    """Memory available when measured."""
    memcpy_gb_per_s: float
    """Best of several copies of a large buffer (GB copied per second, 1 GB = 1e9 bytes)."""
    memcpy_median_gb_per_s: float
    """Median of the same copies (the load of other processes shows here)."""
    fsync_ms_p50: float
    """Median latency of writing 4 KiB and fsync in the benchmark's scratch folder."""
    fsync_ms_p95: float
    """95th percentile of that latency."""
    fsync_ms_max: float
    """Largest of that latency."""
    cpu_busy_percent: float
    """Share of all CPUs busy over one second before the benchmarks (other processes included)."""
    load_average: list[float]
    """1, 5 and 15 minute load averages when measured."""
    python: str
    """Python version."""
    torch: str
    """torch version (empty when not importable)."""
    kernel: str
    """Operating system release."""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def memcpy_gb_per_s(size_mb: int, repeats: int) -> tuple[float, float]:
    """(best, median) bandwidth of copying a `size_mb` buffer into another, after one untimed copy."""
    source = np.ones(size_mb * MB, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # first touch of the target pages outside the timing
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        rates.append(source.nbytes / (time.perf_counter() - started) / 1e9)
    return max(rates), percentile(rates, 0.5)


def fsync_latencies_ms(directory: Path, repeats: int) -> list[float]:
    """Latency of one 4 KiB write plus fsync, `repeats` times, into a file in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe.bin"
    block = os.urandom(4096)
    latencies = []
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            os.write(descriptor, block)
            os.fsync(descriptor)
            latencies.append((time.perf_counter() - started) * 1e3)
    finally:
        os.close(descriptor)
        path.unlink(missing_ok=True)
    return latencies


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def torch_version() -> str:
    try:
        import torch
    except ImportError:
        return ""
    return str(torch.__version__)


def measure(scratch: Path, quick: bool) -> Machine:
    """Probe the host (a few seconds; less in quick mode)."""
    busy = psutil.cpu_percent(interval=1.0)
    best, median = memcpy_gb_per_s(64 if quick else 256, 3 if quick else 7)
    fsync = fsync_latencies_ms(scratch, 20 if quick else 60)
    memory = psutil.virtual_memory()
    return Machine(
        cpus=os.cpu_count() or 0,
        cpu_model=cpu_model(),
        memory_gib=round(memory.total / 2**30, 1),
        memory_available_gib=round(memory.available / 2**30, 1),
        memcpy_gb_per_s=round(best, 2),
        memcpy_median_gb_per_s=round(median, 2),
        fsync_ms_p50=round(percentile(fsync, 0.5), 3),
        fsync_ms_p95=round(percentile(fsync, 0.95), 3),
        fsync_ms_max=round(max(fsync), 3),
        cpu_busy_percent=busy,
        load_average=load_average(),
        python=platform.python_version(),
        torch=torch_version(),
        kernel=platform.release(),
    )
