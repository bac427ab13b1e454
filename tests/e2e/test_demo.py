"""The README's main command, run against the test session's cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import Cluster, Operator, assert_demo_succeeded

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
    summary = assert_demo_succeeded(result, tmp_path)
    assert summary["kill_method"] == "agent"  # the node agent's fault injection: its nodes run processes
