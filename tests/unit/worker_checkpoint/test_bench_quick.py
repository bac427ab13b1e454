"""The checkpoint benchmark's quick mode runs and reports every field (never judged on speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_quick_benchmark_writes_a_complete_report(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "phalanx.bench.checkpoint_stall", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    report = json.loads((tmp_path / "checkpoint_stall.json").read_text())
    assert [row["size_mb"] for row in report["sizes"]] == [10, 100]
    for row in report["sizes"]:
        for kind in ("copy", "sync", "async_stall", "async_persist"):
            assert set(row[kind]) == {"p50_s", "p95_s", "n"}
            assert row[kind]["p50_s"] > 0
        assert row["stall_over_copy"] > 0 and row["sync_over_stall"] > 0
    assert {"step_alone_s", "step_during_persist_s", "slowdown_fraction", "persist_s"} <= set(
        report["slowdown"]
    )
    assert report["slowdown"]["steps_during_persist"] >= 1
    markdown = (tmp_path / "checkpoint_stall.md").read_text()
    assert "| 100 MB |" in markdown and "slowdown" in markdown
