"""The report of a harness run: results.json, report.md and one PNG per benchmark.

`render_markdown` and `to_json` are pure; `write_plots` needs matplotlib (the `bench` extra).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import Field

from phalanx.bench import peers, seedscale
from phalanx.bench.core import BenchResult, Metric, Model, fmt
from phalanx.bench.machine import Machine

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


class Run(Model):
    """One harness invocation: the machine, how it was called, and every benchmark's result."""

    started_at: str
    """UTC start time (ISO 8601)."""
    command: str
    """The command line."""
    quick: bool
    """Smoke mode."""
    commit: str = ""
    """The checkout's git commit, when known."""
    machine: Machine
    """The host and its load when the run started."""
    cluster: dict[str, Any] = Field(default_factory=dict)
    """The local cluster the cluster benchmarks used (nodes, simulated nodes, operator settings)."""
    results: list[BenchResult] = Field(default_factory=list)
    """Benchmarks in the order they ran."""


def rounded(value: Any, digits: int = 6, decimals: int = 3) -> Any:
    """Floats to `digits` significant digits but never fewer than `decimals` decimals, recursively: the JSON
    stays readable and small, and a Unix time (ten digits before the point) keeps its milliseconds."""
    if isinstance(value, float):
        if not math.isfinite(value) or value == 0:
            return value
        magnitude = math.floor(math.log10(abs(value)))
        return round(value, max(digits - 1 - magnitude, decimals))
    if isinstance(value, dict):
        return {key: rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item, digits) for item in value]
    return value


def to_json(run: Run) -> str:
    return json.dumps(rounded(run.model_dump(mode="json")), indent=1) + "\n"


def from_json(text: str) -> Run:
    return Run.model_validate_json(text)


def merge(previous: Run | None, current: Run) -> Run:
    """`current`'s results replace same-named ones of `previous`; the others are kept (`--only` runs)."""
    if previous is None:
        return current
    fresh = {result.name for result in current.results}
    kept = [result for result in previous.results if result.name not in fresh]
    return current.model_copy(update={"results": kept + current.results})


# ---------------------------------------------------------------------------------------------- markdown


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(row) for row in rows)]


def target_text(metric: Metric) -> str:
    target = metric.target
    if target is None:
        return "-"
    return f"{target.stat} {target.op} {fmt(target.value, metric.unit)}"


def verdict_text(metric: Metric) -> str:
    verdict = metric.verdict()
    if verdict.met is True:
        return "met"
    if verdict.met is False:
        return "**" + verdict.text + "**"
    return verdict.text if metric.target else "-"


def machine_lines(machine: Machine) -> list[str]:
    return [
        *_table(
            [
                "cores",
                "memory",
                "memcpy (best / median)",
                "fsync 4 KiB (p50 / p95 / max)",
                "CPU busy",
                "load 1/5/15",
            ],
            [
                [
                    f"{machine.cpus} ({machine.cpu_model or 'unknown CPU'})",
                    f"{machine.memory_gib} GiB ({machine.memory_available_gib} GiB available)",
                    f"{machine.memcpy_gb_per_s} / {machine.memcpy_median_gb_per_s} GB/s",
                    f"{machine.fsync_ms_p50} / {machine.fsync_ms_p95} / {machine.fsync_ms_max} ms",
                    f"{machine.cpu_busy_percent:.0f}%",
                    " / ".join(f"{value:.2f}" for value in machine.load_average),
                ]
            ],
        ),
        "",
        f"Python {machine.python}, torch {machine.torch or '-'}, kernel {machine.kernel}. "
        "Other processes share these cores: the load columns say how much.",
    ]


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Timeout|Exit)\b")


def error_line(error: str) -> str:
    """The exception line of a traceback (the last one naming an exception, else the last line)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    named = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (named or lines or ["error"])[-1][:200]


def summary_lines(results: list[BenchResult]) -> list[str]:
    rows = []
    for result in results:
        if result.error:
            rows.append([result.name, "(did not finish)", "", "", "", "", "", "", error_line(result.error)])
        for metric in result.metrics:
            summary = metric.summary()
            rows.append(
                [
                    result.name,
                    metric.name,
                    str(summary.n),
                    fmt(summary.p50, metric.unit),
                    fmt(summary.p95, metric.unit),
                    fmt(summary.max, metric.unit),
                    target_text(metric),
                    metric.baseline.text if metric.baseline else "-",
                    verdict_text(metric),
                ]
            )
    return _table(["benchmark", "metric", "n", "p50", "p95", "max", "target", "baseline", "verdict"], rows)


def peer_lines(results: list[BenchResult], started_at: str = "") -> list[str]:
    """The peers measured on this machine, each figure over Phalanx's from the same invocation."""
    rows = peers.comparison_rows(results, started_at)
    if not rows:
        return []
    return [
        "## Peers, measured",
        "",
        "Each peer ran the same failure or the same saves on this machine; the ratio is the peer's figure over "
        "Phalanx's (above 1: the peer takes longer or loses more), both from this invocation.",
        "",
        *_table(
            ["benchmark", "peer metric", "peer", "Phalanx metric", "Phalanx", "peer / Phalanx", "published"],
            [
                [
                    row.benchmark,
                    row.metric,
                    row.peer,
                    row.phalanx_metric,
                    row.phalanx,
                    row.ratio,
                    row.published,
                ]
                for row in rows
            ],
        ),
        "",
    ]


def missed_lines(results: list[BenchResult]) -> list[str]:
    lines = []
    for result in results:
        for metric in result.metrics:
            verdict = metric.verdict()
            if verdict.met is False:
                why = f" Why: {metric.why_missed}" if metric.why_missed else ""
                lines.append(f"- {result.name} / {metric.name}: {verdict.text}.{why}")
        if result.error:
            lines.append(f"- {result.name}: did not finish ({error_line(result.error)})")
    return lines or ["None."]


def result_lines(result: BenchResult) -> list[str]:
    mode = "quick" if result.quick else "full"
    lines = [
        f"## {result.title} (`{result.name}`)",
        "",
        f"{mode} mode, started {result.started_at}, {result.seconds:.0f} s; load average "
        f"{' / '.join(f'{v:.2f}' for v in result.load_before) or '-'} before, "
        f"{' / '.join(f'{v:.2f}' for v in result.load_after) or '-'} after.",
        "",
    ]
    if result.error:
        lines += ["**Did not finish:**", "", "```", result.error.strip()[-2000:], "```", ""]
    if result.metrics:
        rows = []
        for metric in result.metrics:
            summary = metric.summary()
            rows.append(
                [
                    metric.name,
                    str(summary.n),
                    fmt(summary.p50, metric.unit),
                    fmt(summary.p95, metric.unit),
                    fmt(summary.p99, metric.unit),
                    fmt(summary.max, metric.unit),
                    target_text(metric),
                    verdict_text(metric),
                    metric.description,
                ]
            )
        lines += _table(["metric", "n", "p50", "p95", "p99", "max", "target", "verdict", "what"], rows)
        lines.append("")
    baselines = [metric for metric in result.metrics if metric.baseline]
    if baselines:
        lines += ["Baselines:", ""]
        lines += [f"- {metric.name}: {metric.baseline.text}" for metric in baselines if metric.baseline]
        lines.append("")
    if result.timeouts:
        lines += ["Timeouts and intervals in force:", ""]
        lines += _table(
            ["timeout", "seconds", "set by"],
            [[timeout.name, fmt(timeout.seconds), timeout.source] for timeout in result.timeouts],
        )
        lines.append("")
    if result.notes:
        lines += [f"- {note}" for note in result.notes]
        lines.append("")
    if plot_wanted(result):
        lines += [f"![{result.name}]({plot_name(result)})", ""]
    return lines


def render_markdown(run: Run) -> str:
    lines = [
        "# Phalanx benchmarks",
        "",
        f"Run {run.started_at}, {'quick (smoke)' if run.quick else 'full'} mode"
        + (f", commit `{run.commit[:12]}`" if run.commit else "")
        + f": `{run.command}`. Targets from the project's targets table; p50/p95/p99 interpolate "
        "between ranks, so with few samples they lie close to the max.",
        "",
        "## Machine",
        "",
        *machine_lines(run.machine),
        "",
    ]
    if run.cluster:
        lines += ["## Local cluster", ""]
        lines += [f"- {key}: {value}" for key, value in run.cluster.items()]
        lines.append("")
    lines += ["## Summary", "", *summary_lines(run.results), ""]
    lines += peer_lines(run.results, run.started_at)
    lines += seedscale.section_lines(run.results)
    lines += ["## Targets missed", ""]
    lines += missed_lines(run.results)
    lines.append("")
    for result in run.results:
        lines += result_lines(result)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------- plots


def plot_name(result: BenchResult) -> str:
    return f"{result.name}.png"


MAX_PANELS = 9


def plotted_metrics(result: BenchResult) -> list[Metric]:
    """Metrics whose samples differ (a single number is in the tables already), those with a target
    first, at most `MAX_PANELS` in all with the series."""
    varied = [metric for metric in result.metrics if len(set(metric.samples)) > 1]
    varied.sort(key=lambda metric: metric.target is None)
    charts = {series.chart or series.name for series in result.series}
    return varied[: max(0, MAX_PANELS - len(charts))]


def plot_wanted(result: BenchResult) -> bool:
    return bool(plotted_metrics(result) or result.series)


def write_plots(results: list[BenchResult], out: Path) -> list[Path]:
    """One PNG per benchmark: a box with every sample per metric (target as a red line), then the series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for result in results:
        if not plot_wanted(result):
            continue
        metrics = plotted_metrics(result)
        charts: dict[str, list[Any]] = {}
        for series in result.series:
            charts.setdefault(series.chart or series.name, []).append(series)
        panels = len(metrics) + len(charts)
        columns = min(3, panels)
        rows = (panels + columns - 1) // columns
        figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
        flat = [axis for row in axes for axis in row]
        for axis, metric in zip(flat, metrics, strict=False):
            axis.boxplot(metric.samples, widths=0.5, showfliers=False)
            jitter = [1 + 0.15 * ((index * 7919) % 11 - 5) / 5 for index in range(len(metric.samples))]
            axis.scatter(jitter, metric.samples, s=8, alpha=0.6)
            if metric.target is not None:
                axis.axhline(metric.target.value, color="red", linestyle="--", linewidth=1)
            axis.set_title(metric.name, fontsize=8)
            axis.set_ylabel(metric.unit, fontsize=8)
            axis.set_xticks([])
            axis.tick_params(labelsize=7)
        for axis, (chart, series_list) in zip(flat[len(metrics) :], charts.items(), strict=False):
            for series in series_list:
                axis.plot(series.x, series.y, label=series.name, linewidth=1)
            if any(series.log_log for series in series_list):
                axis.set_xscale("log")
                axis.set_yscale("log")
            axis.set_title(chart, fontsize=8)
            axis.set_xlabel(series_list[0].x_label, fontsize=8)
            axis.set_ylabel(series_list[0].y_label, fontsize=8)
            axis.tick_params(labelsize=7)
            if len(series_list) > 1:
                axis.legend(fontsize=7)
        for axis in flat[panels:]:
            axis.set_visible(False)
        figure.suptitle(result.title, fontsize=10)
        figure.tight_layout()
        path = out / plot_name(result)
        figure.savefig(path, dpi=72)
        plt.close(figure)
        written.append(path)
    return written


def write(run: Run, out: Path) -> list[Path]:
    """results.json, report.md and the plots into `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(to_json(run))
    (out / REPORT_FILE).write_text(render_markdown(run))
    return [out / RESULTS_FILE, out / REPORT_FILE, *write_plots(run.results, out)]
