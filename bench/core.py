"""What a benchmark returns: metrics with their samples, targets and baselines, the timeouts in force.

Pure code: statistics, target verdicts and the texts that say by how much a target was missed. The harness
(`phalanx.bench.harness`) runs benchmarks and `phalanx.bench.report` writes what they return.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Statistic = Literal["p50", "p95", "p99", "max", "min", "mean"]


class Model(BaseModel):
    """Base of the result models: field docstrings describe the JSON, unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class Target(Model):
    """What Phalanx promises for a metric (docs: /work/shared/TARGETS.md, "Numbers to beat")."""

    op: Literal["<=", ">="]
    """The observed statistic must be at most (`<=`) or at least (`>=`) `value`."""
    value: float
    """The bound, in the metric's unit."""
    stat: Statistic = "p50"
    """Which statistic of the samples is judged."""
    text: str = ""
    """The target as written in the targets table."""


class Baseline(Model):
    """What other systems achieve for the same quantity, shown beside the metric."""

    text: str
    """Systems and their published numbers."""
    value: float | None = None
    """One comparable number in the metric's unit, when there is one."""


class Versus(Model):
    """The Phalanx figure a peer's metric is set beside: the report shows the peer's over Phalanx's."""

    benchmark: str
    """Registry name of the benchmark that measures Phalanx's figure (it may be the peer's own)."""
    metric: str
    """Name of Phalanx's metric in that benchmark."""
    stat: Statistic = "p50"
    """Which statistic of both metrics is compared."""


class Summary(Model):
    """Statistics of a metric's samples (None when there are no samples)."""

    n: int
    """Number of samples."""
    p50: float | None
    """Median (linear interpolation between the closest ranks)."""
    p95: float | None
    """95th percentile."""
    p99: float | None
    """99th percentile."""
    max: float | None
    """Largest sample."""
    min: float | None
    """Smallest sample."""
    mean: float | None
    """Arithmetic mean."""

    def get(self, stat: Statistic) -> float | None:
        return getattr(self, stat)


class Verdict(Model):
    """A metric judged against its target."""

    met: bool | None
    """True when the target is met, False when missed, None when there is no target or no sample."""
    observed: float | None
    """The judged statistic."""
    text: str
    """`met`, `no target`, `no samples`, or by how much the target was missed."""


class Metric(Model):
    """One measured quantity: every sample, so the report can show p50/p95/max and plot them."""

    name: str
    """Short name, unique within its benchmark."""
    unit: str
    """Unit of the samples (`s`, `ms`, `pods/s`, `MB`, `count`, `%`, `x`)."""
    samples: list[float] = Field(default_factory=list)
    """Every observation."""
    description: str = ""
    """What one sample is."""
    target: Target | None = None
    """Phalanx's target for this quantity, if it has one."""
    baseline: Baseline | None = None
    """Other systems' numbers for this quantity, if any."""
    why_missed: str = ""
    """Why the target is out of reach in this run, from what the run itself measured (shown only when missed)."""
    versus: Versus | None = None
    """For a peer's metric: the Phalanx metric of the same run it is compared with, as a ratio."""

    def summary(self) -> Summary:
        return summarize(self.samples)

    def verdict(self) -> Verdict:
        return judge(self)


class Timeout(Model):
    """A timeout or interval in force during the benchmark: published recovery times are dominated by them."""

    name: str
    """What it bounds."""
    seconds: float
    """Its value in force."""
    source: str = ""
    """Where it is set (a TrainingJob field, a chart value, a launcher default)."""


class Series(Model):
    """A curve to plot (for example pods created over time)."""

    name: str
    """Legend label."""
    x: list[float]
    """X values."""
    y: list[float]
    """Y values."""
    x_label: str = ""
    """X axis label."""
    y_label: str = ""
    """Y axis label."""
    chart: str = ""
    """Series with the same chart name share one set of axes (empty: the series' own name)."""
    log_log: bool = False
    """Both axes logarithmic (any series of a chart asking makes the chart so): for figures against N that
    span orders of magnitude."""


class BenchResult(Model):
    """Everything one benchmark run produced."""

    name: str
    """Registry name of the benchmark (e.g. `gang-creation`)."""
    title: str
    """Heading in the report."""
    quick: bool = False
    """Whether it ran in smoke mode (small sizes, few repeats)."""
    started_at: str = ""
    """UTC start time (ISO 8601)."""
    seconds: float = 0.0
    """Wall time of the benchmark."""
    metrics: list[Metric] = Field(default_factory=list)
    """What was measured."""
    timeouts: list[Timeout] = Field(default_factory=list)
    """Every timeout and interval in force."""
    notes: list[str] = Field(default_factory=list)
    """Setup, caveats and correctness observations, one sentence each."""
    series: list[Series] = Field(default_factory=list)
    """Curves to plot besides the metrics' samples."""
    load_before: list[float] = Field(default_factory=list)
    """1, 5 and 15 minute load averages when it started."""
    load_after: list[float] = Field(default_factory=list)
    """Load averages when it ended."""
    error: str | None = None
    """Why the benchmark did not finish (None: it did)."""
    details: dict[str, object] = Field(default_factory=dict)
    """Benchmark-specific raw figures for the JSON file."""

    def metric(self, name: str) -> Metric:
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(f"{self.name} has no metric {name!r}")


# ---------------------------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    weight = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * weight


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(n=0, p50=None, p95=None, p99=None, max=None, min=None, mean=None)
    return Summary(
        n=len(values),
        p50=percentile(values, 0.50),
        p95=percentile(values, 0.95),
        p99=percentile(values, 0.99),
        max=max(values),
        min=min(values),
        mean=sum(values) / len(values),
    )


def fmt(value: float | None, unit: str = "") -> str:
    """A number with three significant digits (integers as they are), and its unit."""
    if value is None:
        return "-"
    if math.isinf(value) or math.isnan(value):
        text = str(value)
    elif value == int(value) and abs(value) < 1e6:
        text = str(int(value))
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    if unit in ("x", "%"):
        return text + unit
    if unit == "count":
        return text
    return f"{text} {unit}" if unit else text


def judge(metric: Metric) -> Verdict:
    """Compare the target's statistic with its bound; a miss says by how much, absolutely and relatively."""
    target = metric.target
    if target is None:
        return Verdict(met=None, observed=None, text="no target")
    observed = metric.summary().get(target.stat)
    if observed is None:
        return Verdict(met=None, observed=None, text="no samples")
    met = observed <= target.value if target.op == "<=" else observed >= target.value
    if met:
        return Verdict(met=True, observed=observed, text="met")
    return Verdict(met=False, observed=observed, text=miss_text(observed, target, metric.unit))


def miss_text(observed: float, target: Target, unit: str) -> str:
    """`missed by 1.8 s (2.8 s vs <= 1 s, 2.8x the bound)` or `... (62 vs >= 100, 38% short)`."""
    gap = abs(observed - target.value)
    head = f"missed by {fmt(gap, unit)} ({target.stat} {fmt(observed, unit)} vs {target.op} {fmt(target.value, unit)}"
    if target.value == 0:
        return head + ")"
    if target.op == "<=":
        return head + f", {observed / target.value:.2g}x the bound)"
    return head + f", {gap / target.value * 100:.0f}% short)"
