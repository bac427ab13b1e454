"""The reconcile-cost benchmark reconciles the operator's own pods: a steady gang's pods are all index ranges,
and its status stays far below the per-worker memory it held in full before."""

from __future__ import annotations

from phalanx.bench import reconcile_cost


def test_a_steady_gang_is_reconciled_and_its_status_stays_small() -> None:
    figures = reconcile_cost.measure(64, rounds=2)
    assert len(figures["seconds"]) == 2 and all(seconds > 0 for seconds in figures["seconds"])
    assert figures["pods"] == 64 + 8 and figures["stored_tracks"] == 0
    assert figures["status_bytes"] < figures["full_tracking_bytes"]


def test_the_quick_run_reports_every_size_against_its_bounds() -> None:
    result = reconcile_cost.run(None, quick=True)
    names = {metric.name for metric in result.metrics}
    assert {f"status, {size} workers" for size in reconcile_cost.QUICK_SIZES} <= names
    assert all(metric.verdict().met for metric in result.metrics if metric.name.startswith("status"))
    assert result.series[0].x == [float(size) for size in reconcile_cost.QUICK_SIZES]
