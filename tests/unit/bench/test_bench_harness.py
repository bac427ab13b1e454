"""`phalanx bench`: the registry, the command line, and the benchmarks that need no cluster in smoke mode.

The cluster benchmarks' smoke runs are in tests/e2e/test_bench.py. Nothing here judges speed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from phalanx.bench import checkpoint_stall, registry
from phalanx.bench.harness import git_commit
from phalanx.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[3]


def test_every_registered_benchmark_loads_with_its_name() -> None:
    assert registry.names()[:7] == [
        "checkpoint-stall",
        "kill-during-save",
        "warm-start",
        "gang-creation",
        "operator-scale",
        "operator-takeover",
        "rerendezvous",
    ]
    for entry in registry.BENCHMARKS:
        module = entry.load()
        assert entry.name == module.NAME and module.TITLE


def test_select_keeps_registry_order_and_refuses_unknown_names() -> None:
    assert [e.name for e in registry.select(["rerendezvous", "checkpoint-stall"])] == [
        "checkpoint-stall",
        "rerendezvous",
    ]
    assert len(registry.select(None)) == len(registry.BENCHMARKS)
    with pytest.raises(ValueError, match="unknown benchmark"):
        registry.select(["nope"])


def test_list_and_unknown_name_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in registry.names())
    assert main(["bench", "--only", "nope", "--out", "/nonexistent"]) == 2
    assert "unknown benchmark(s): nope" in capsys.readouterr().err


def test_checkpoint_metrics_carry_targets_at_100_mb_and_above() -> None:
    report = {
        "sizes": [
            {"size_mb": 10, "copy": {"p50_s": 0.001}, "sync": {"p50_s": 0.02}},
            {"size_mb": 100, "copy": {"p50_s": 0.01}, "sync": {"p50_s": 0.2}},
        ],
        "slowdown": {"size_mb": 100},
    }
    samples = {
        "sizes": {
            size: {"copy": [0.01], "sync": [0.2], "async_stall": [0.01, 0.02], "async_persist": [0.5]}
            for size in (10, 100)
        },
        "slowdown_steps": {"alone": [1.0, 1.0], "during": [1.1, 1.3]},
    }
    metrics = {metric.name: metric for metric in checkpoint_stall.to_metrics(report, samples)}
    assert metrics["sync / stall, 10 MB"].target is None
    assert metrics["sync / stall, 100 MB"].samples == [20.0, 10.0]
    assert metrics["sync / stall, 100 MB"].verdict().met is False
    assert metrics["stall / copy, 100 MB"].samples == [1.0, 2.0]
    slowdown = metrics["step slowdown while persisting, 100 MB"]
    assert slowdown.samples == pytest.approx([10.0, 30.0])
    assert slowdown.verdict().text.startswith("missed by 10%")


def test_local_benchmarks_in_smoke_mode_write_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    code = main(["bench", "--quick", "--only", "checkpoint-stall", "kill-during-save", "--out", str(out)])
    assert code == 0
    run = json.loads((out / "results.json").read_text())
    assert run["quick"] is True and run["machine"]["cpus"] >= 1 and run["machine"]["memcpy_gb_per_s"] > 0
    results = {result["name"]: result for result in run["results"]}
    assert set(results) == {"checkpoint-stall", "kill-during-save"}
    assert all(result["error"] is None for result in results.values())
    kills = {metric["name"]: metric for metric in results["kill-during-save"]["metrics"]}
    assert kills["corrupt loads"]["samples"] == [0.0] * 5
    assert kills["committed checkpoints lost"]["samples"] == [0.0] * 5
    stall = {metric["name"] for metric in results["checkpoint-stall"]["metrics"]}
    assert {"stall / copy, 100 MB", "sync / stall, 100 MB", "step slowdown while persisting, 100 MB"} <= stall
    text = (out / "report.md").read_text()
    assert "## Machine" in text and "## Kill during checkpoint save (`kill-during-save`)" in text
    for name in ("checkpoint-stall.png", "kill-during-save.png"):
        assert (out / name).stat().st_size > 0

    # --only keeps the other benchmarks' results unless --fresh
    (out / "results.json").write_text(json.dumps({**run, "results": run["results"][:1]}))
    assert main(["bench", "--quick", "--only", "kill-during-save", "--out", str(out)]) == 0
    kept = [result["name"] for result in json.loads((out / "results.json").read_text())["results"]]
    assert kept == ["checkpoint-stall", "kill-during-save"]


def test_the_report_names_the_commit_of_an_editable_install_and_none_without_a_checkout(
    tmp_path: Path,
) -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert git_commit() == head.stdout.strip()
    assert git_commit(tmp_path) == ""


def test_the_report_goes_to_the_working_directory_by_default_never_into_the_package() -> None:
    assert build_parser().parse_args(["bench"]).out == Path("bench-results")
