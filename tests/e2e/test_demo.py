"""The README's main command, run against the test session's cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import Cluster, Operator

pytestmark = pytest.mark.e2e


def test_demo_trains_through_an_injected_failure(cluster: Cluster, operator: Operator, tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "phalanx.cli",
            "demo",
            "--state-dir",
            str(cluster.state_dir),
            "--report",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result"] == "Succeeded"
    assert summary["steps"] == 300
    assert summary["preflight"]["state"] == "Passed", summary["preflight"]
    assert summary["killed_worker"].startswith("tinygpt-worker-")
    assert summary["final_loss"] < summary["first_loss"]
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert "=== Phalanx demo ===" in result.stdout
