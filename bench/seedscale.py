"""The report's section on the seeds' scale: one table by job size N (pods of 8 GPUs) of what decides whether a
big job is kept alive, from the `scale` and `rendezvous-scale` results of the same report, beside Kubernetes'
scalability envelope and torchelastic's published rendezvous time.

Sizes a benchmark did not run show "-"; projections stay in the benchmarks' own notes, labelled as such.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from phalanx.bench.core import BenchResult, Metric, fmt

SIZE = re.compile(r"^(?P<name>.*), N=(?P<n>\d+)$")
GPUS_PER_POD = 8
ENVELOPE = (
    "Kubernetes' scalability envelope: 5,000 nodes, 150,000 pods, API call latency p99 <= 1 s, each node's "
    "heartbeat Lease every 10 s (500 writes/s at 5,000 nodes)."
)
TORCHELASTIC = "torchelastic's published c10d rendezvous time: about 10 s at 4,000 hosts."

Statistic = Callable[[Metric], str]


def p50(metric: Metric) -> str:
    return fmt(metric.summary().p50, metric.unit)


def p50_and_max(metric: Metric) -> str:
    summary = metric.summary()
    return f"{fmt(summary.p50, metric.unit)} ({fmt(summary.max, metric.unit)} max)"


COLUMNS: tuple[tuple[str, str, str, Statistic], ...] = (
    ("API writes/s, all", "scale", "API writes/s in all", p50),
    ("the job's writes/s", "scale", "the job's writes/s in all", p50),
    ("operator CPU", "scale", "operator CPU", p50),
    ("operator RSS", "scale", "operator RSS", p50),
    ("silent worker found past the timeout", "scale", "silent worker found past the timeout", p50_and_max),
    ("stopped trainer acted on", "scale", "launcher's verdict 'stopped' acted on", p50_and_max),
    ("hung trainer acted on", "scale", "launcher's verdict 'hung' acted on", p50_and_max),
    ("gang bound", "scale", "gang bound", p50),
    (
        "TrainingJob status, max",
        "scale",
        "TrainingJob status size",
        lambda metric: fmt(metric.summary().max, metric.unit),
    ),
    ("re-form, store rounds", "rendezvous-scale", "store rounds: re-form", p50),
    (
        "re-form, store rounds without the gate",
        "rendezvous-scale",
        "store rounds without the gate: re-form",
        p50,
    ),
    ("re-form, torch's c10d", "rendezvous-scale", "re-form", p50),
    ("bytes per re-form, store rounds", "rendezvous-scale", "store rounds: bytes per re-form", p50),
)


def by_size(results: list[BenchResult]) -> dict[tuple[str, str, int], Metric]:
    """(benchmark, metric name without its size, N) -> metric, for the metrics named `..., N=<n>`."""
    found: dict[tuple[str, str, int], Metric] = {}
    for result in results:
        for metric in result.metrics:
            match = SIZE.match(metric.name)
            if match and metric.samples:
                found[(result.name, match["name"], int(match["n"]))] = metric
    return found


def section_lines(results: list[BenchResult]) -> list[str]:
    """The section's Markdown (none when neither benchmark is in the report)."""
    metrics = by_size(results)
    sizes = sorted({n for (_, _, n) in metrics})
    if not sizes:
        return []
    columns = [column for column in COLUMNS if any((column[1], column[2], n) in metrics for n in sizes)]
    header = ["N (GPUs)", *[title for title, _, _, _ in columns]]
    rows = []
    for n in sizes:
        cells = [f"{n:,} ({n * GPUS_PER_POD:,})"]
        for _, benchmark, name, statistic in columns:
            metric = metrics.get((benchmark, name, n))
            cells.append(statistic(metric) if metric is not None else "-")
        rows.append(cells)
    table = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    table += ["| " + " | ".join(cells) + " |" for cells in rows]
    return [
        "## At the seeds' scale",
        "",
        "One TrainingJob of N pods of 8 GPUs (`scale`: simulated nodes, emulated launchers, the real API server "
        "and operator) and one group of N emulated launchers re-forming through the job's store "
        "(`rendezvous-scale`), each as measured in this report; p50 unless marked. Projections to the sizes "
        "this machine does not carry are in each benchmark's notes, labelled as projections.",
        "",
        *table,
        "",
        f"- {ENVELOPE}",
        f"- {TORCHELASTIC}",
        "",
    ]
