"""DRAFT, not collected on its own: the function below has no `test_` prefix, so pytest finds no test here.

It belongs in tests/e2e/test_real_node.py, which has what it needs: the module's `real` fixture (a
RealNodeCluster brought up with `--nodes 0 --real-nodes 1`), its `realnode`/`slow` markers and its imports.
To merge: move the function there below the operator-image test, rename it `test_demo_...`, drop the
TYPE_CHECKING import and this file.

`phalanx demo --real-nodes` against that cluster: its own `up` finds the cluster running (`up` is idempotent),
it builds the images (cached by the earlier image test: seconds), imports them, trains the tiny GPT and kills
a worker's container for real (SIGKILL to its task through `ctr`), then writes the same summary.json as the
default demo (tests/e2e/test_demo.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx import demo
from phalanx.devcluster.realnode import node as real_node

if TYPE_CHECKING:
    from .test_real_node import RealNodeCluster


def demo_real_nodes_trains_through_a_sigkilled_container(real: RealNodeCluster, tmp_path: Path) -> None:
    wheels = os.environ.get("PIP_FIND_LINKS") or ("/opt/wheels" if Path("/opt/wheels").is_dir() else "")
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "demo", "--real-nodes", "--state-dir", str(real.state_dir),
         "--report", str(tmp_path), *(["--wheels", wheels] if wheels else [])],
        capture_output=True, text=True, timeout=2400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result"] == "Succeeded"
    assert summary["steps"] == 300
    assert summary["preflight"]["state"] == "Passed", summary["preflight"]
    assert summary["killed_worker"].startswith("tinygpt-worker-")
    assert summary["final_loss"] < summary["first_loss"]
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert "=== Phalanx demo ===" in result.stdout

    # The kill was a real one: SIGKILL to the worker's container on the real node, not the agent's annotation.
    assert summary["kill_method"] == demo.CONTAINER_KILL, summary
    container = summary["killed_container"]
    assert re.fullmatch(r"[0-9a-f]{64}", container or ""), container
    assert "SIGKILL to its container's task through ctr" in result.stdout
    assert int((summary["restarts"] or {}).get("total") or 0) >= 1, summary["restarts"]
    # Whatever pods of the job are left ran on the real node: there is no other.
    pods = json.loads(real.kubectl("get", "pods", "-n", demo.DEMO_NAMESPACE, "-o", "json"))["items"]
    assert {pod["spec"].get("nodeName") for pod in pods} <= {real_node.NODE_NAME}
    # containerd no longer runs the killed container's task (gone, or stopped by the SIGKILL).
    tasks = subprocess.run(
        ["ctr", "--namespace", "k8s.io", "tasks", "ls"], capture_output=True, text=True, check=True
    ).stdout
    assert not any(line.split()[:1] == [container] and "RUNNING" in line for line in tasks.splitlines())
