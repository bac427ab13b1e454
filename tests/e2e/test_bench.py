"""`phalanx bench --quick` for the benchmarks that need the cluster, against the session's local cluster.

Smoke mode keeps them from rotting: each must finish and report every metric with samples. Speed is never
judged here (that is what the report is for); only what the harness sets up must hold (the one-short gang
really is one short, every trial deletes a worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import BENCH_SMOKE_TIMEOUT, Cluster, Operator, run_bench_smoke

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.bench,
    pytest.mark.timeout(BENCH_SMOKE_TIMEOUT + 100),
]

CLUSTER_BENCHMARKS = ["gang-creation", "operator-scale", "operator-takeover", "rerendezvous"]


def metrics_of(result: dict) -> dict[str, dict]:
    return {metric["name"]: metric for metric in result["metrics"]}


def test_cluster_benchmarks_in_smoke_mode(cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    out = tmp_path / "results"
    run, results = run_bench_smoke(cluster, CLUSTER_BENCHMARKS, out)
    for result in results.values():
        assert result["error"] is None, result["error"]
        assert result["timeouts"], f"{result['name']} reports no timeouts"
    assert "(reused)" in run["cluster"]["state dir"]

    gang = results["gang-creation"]
    gang_metrics = metrics_of(gang)
    assert gang_metrics["pods created per second"]["samples"][0] > 0
    assert gang_metrics["partially placed gangs left"]["samples"] == [0.0, 0.0]
    gang_size = gang["details"]["gang_pods"]
    assert gang["details"]["short"]["most_bound"] == gang_size - 1  # the capacity really was one pod short
    assert gang["details"]["short"]["left_bound"] == []

    scale = metrics_of(results["operator-scale"])
    # every trial deleted a worker (one not replaced in time counts with the wait's length)
    assert len(scale["event -> action latency"]["samples"]) == 5
    assert results["operator-scale"]["details"]["skipped"] == 0
    # the same trials beside a 100,000-worker job and one over the nodes' capacity, which never got a pod
    assert len(scale["event -> action latency beside absurd jobs"]["samples"]) == 5
    assert scale["pods of the absurd jobs"]["samples"] == [0.0]
    assert results["operator-scale"]["details"]["absurd"]["skipped"] == 0
    assert min(scale["operator RSS"]["samples"]) > 0
    assert scale["operator API writes per second"]["samples"]

    takeover = metrics_of(results["operator-takeover"])
    for how in ("killed", "stopped"):
        assert len(takeover[f"leader {how} -> standby acts"]["samples"]) == 1
        assert takeover[f"leader {how} -> standby holds the Lease"]["samples"][0] > 0

    rendezvous = metrics_of(results["rerendezvous"])
    assert len(rendezvous["scale to 3 -> training at 3"]["samples"]) == 1
    assert len(rendezvous["scale to 2 -> training at 2"]["samples"]) == 1
    assert rendezvous["re-rendezvous"]["samples"]

    text = (out / "report.md").read_text()
    for name in CLUSTER_BENCHMARKS:
        assert f"(`{name}`)" in text
        assert (out / f"{name}.png").stat().st_size > 0
    assert "## Machine" in text and "## Local cluster" in text and "Timeouts and intervals in force" in text
