"""Statistics, target verdicts and the texts saying by how much a target was missed."""

from __future__ import annotations

import pytest

from phalanx.bench.core import Metric, Target, fmt, judge, percentile, summarize


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [10.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 10.0
    assert percentile(values, 0.95) == pytest.approx(4.0 + 0.8 * 6.0)
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_summary_of_samples_and_of_none() -> None:
    summary = summarize([1.0, 2.0, 3.0, 4.0])
    assert (summary.n, summary.p50, summary.max, summary.min, summary.mean) == (4, 2.5, 4.0, 1.0, 2.5)
    empty = summarize([])
    assert empty.n == 0 and empty.p50 is None and empty.max is None


def test_at_most_target_met_and_missed_with_ratio() -> None:
    metric = Metric(
        name="latency", unit="s", samples=[0.2, 0.4, 2.8], target=Target(op="<=", value=1, stat="max")
    )
    verdict = judge(metric)
    assert verdict.met is False and verdict.observed == 2.8
    assert verdict.text == "missed by 1.8 s (max 2.8 s vs <= 1 s, 2.8x the bound)"
    metric.target = Target(op="<=", value=1, stat="p50")
    assert judge(metric).met is True and judge(metric).text == "met"


def test_at_least_target_missed_says_how_short() -> None:
    metric = Metric(name="rate", unit="pods/s", samples=[62.0], target=Target(op=">=", value=100))
    assert judge(metric).text == "missed by 38 pods/s (p50 62 pods/s vs >= 100 pods/s, 38% short)"


def test_zero_bound_and_missing_target_or_samples() -> None:
    corrupt = Metric(
        name="corrupt", unit="count", samples=[0, 3, 0], target=Target(op="<=", value=0, stat="max")
    )
    assert judge(corrupt).text == "missed by 3 (max 3 vs <= 0)"
    assert judge(Metric(name="x", unit="s", samples=[1.0])).met is None
    no_samples = Metric(name="x", unit="s", target=Target(op="<=", value=1))
    assert judge(no_samples).met is None and judge(no_samples).text == "no samples"


def test_numbers_keep_three_significant_digits() -> None:
    assert fmt(None) == "-"
    assert fmt(0.0123456, "s") == "0.0123 s"
    assert fmt(1234.5, "ms") == "1234 ms" or fmt(1234.5, "ms") == "1235 ms"
    assert fmt(3.0, "count") == "3"
    assert fmt(2.5, "x") == "2.5x"
    assert fmt(12.25, "%") == "12.2%"
