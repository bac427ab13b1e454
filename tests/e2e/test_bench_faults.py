"""`phalanx bench --quick` for the fault benchmarks (recovery, hang detection, goodput) on the session's
local cluster: real training pods killed, frozen, hung.

Smoke mode keeps them from rotting: each must finish without an error and report its measurements with
samples. Timings are never judged here (that is what the report is for).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.bench.recovery import QUICK_TRIALS

from .conftest import BENCH_SMOKE_TIMEOUT, Cluster, Operator, run_bench_smoke

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.bench,
    pytest.mark.timeout(BENCH_SMOKE_TIMEOUT + 100),
]

FAULT_BENCHMARKS = ["recovery", "hang-detection", "goodput"]


def metrics_of(result: dict) -> dict[str, dict]:
    return {metric["name"]: metric for metric in result["metrics"]}


def test_fault_benchmarks_in_smoke_mode(cluster: Cluster, operator: Operator, tmp_path: Path) -> None:
    out = tmp_path / "results"
    _, results = run_bench_smoke(cluster, FAULT_BENCHMARKS, out)
    for result in results.values():
        assert result["error"] is None, result["error"]
        names = {timeout["name"] for timeout in result["timeouts"]}
        assert {"heartbeat interval", "heartbeat timeout", "rendezvous keep-alive timeout"} <= names

    recovery = results["recovery"]
    trials = recovery["details"]["trials"]["hot-spare"]
    assert len(trials) == QUICK_TRIALS and all(trial["error"] is None for trial in trials), trials
    rec = metrics_of(recovery)
    for stage in ("kill -> first step", "detect", "replace", "trainer start-up", "first step", "steps lost"):
        assert len(rec[f"hot-spare: {stage}"]["samples"]) == QUICK_TRIALS, stage
    assert all(trial["restore_sources"] for trial in trials)  # the state came from somewhere known

    hang = metrics_of(results["hang-detection"])
    assert len(hang["frozen pod: freeze -> detected"]["samples"]) == 1
    assert len(hang["stopped trainer: stop -> detected"]["samples"]) == 1
    assert len(hang["hung trainer: hang -> detected"]["samples"]) == 1
    assert len(hang["false alarms during frequent saves"]["samples"]) == 1
    causes = {fault["kind"]: fault["cause"] for fault in results["hang-detection"]["details"]["faults"]}
    # A frozen pod goes silent; a stopped trainer's launcher says so; a hung one's judges the missing step.
    assert causes == {
        "frozen pod": "HeartbeatTimeout",
        "stopped trainer": "TrainerStopped",
        "hung trainer": "NoProgress",
    }

    good = results["goodput"]
    figures = metrics_of(good)
    for name in (
        "goodput vs the undisturbed run",
        "goodput (step log)",
        "undisturbed twin: goodput (step log)",
        "goodput (job status, window)",
        "goodput (Lease timeline)",
    ):
        assert len(figures[name]["samples"]) == 1, name
    assert len(good["details"]["failures"]) == 1
    assert good["details"]["failures"][0]["resumed"] is not None
    assert good["details"]["twin"]["steps"] > 0
    assert {series["name"] for series in good["series"]} == {"loss", "kill", "job", "undisturbed twin"}

    text = (out / "report.md").read_text()
    for name in FAULT_BENCHMARKS:
        assert f"(`{name}`)" in text
        assert (out / f"{name}.png").stat().st_size > 0
