"""`phalanx bench --quick` for the peers: torchft and DLRover really run here, beside Phalanx, and leave nothing.

No cluster: the peers run as local processes (torchft's lighthouse and replica groups on gloo, DLRover's flash
checkpoint with its own saver). Speed is never judged here; only that each peer ran (no "could not run"), every
metric has its samples, the report sets each peer beside Phalanx, and no process or shared memory is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from phalanx.bench import peer_dlrover, peer_torchft

# With the Kubernetes-native peers' smoke under `make test-peers`: a baseline's, not Phalanx's, and minutes CI has not.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.peers, pytest.mark.timeout(900)]


def leftovers(folder: Path) -> list[str]:
    """Processes still running in `folder` (every process the bench started inherits its working directory)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if Path(process.cwd()).is_relative_to(folder):
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])}")
        except (psutil.Error, OSError):
            continue
    return found


def test_peers_run_beside_phalanx_in_smoke_mode(tmp_path: Path) -> None:
    out = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "bench",
        "--quick",
        "--only",
        "peer-torchft",
        "peer-dlrover",
    ]
    process = subprocess.run(
        [*command, "--out", str(out)],
        cwd=tmp_path,
        env={**os.environ, "PHALANX_BENCH_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-6000:]
    results = {result["name"]: result for result in json.loads((out / "results.json").read_text())["results"]}
    assert list(results) == ["peer-torchft", "peer-dlrover"]
    for result in results.values():
        assert result["error"] is None, result["error"]
        assert not result["details"].get("unavailable"), result["details"]["unavailable"]
        assert result["timeouts"]

    torchft = {metric["name"]: metric for metric in results["peer-torchft"]["metrics"]}
    assert results["peer-torchft"]["details"]["torchft_version"] == "0.2.0"
    recovery = torchft["torchft: kill -> next committed step"]["samples"]
    assert len(recovery) == peer_torchft.QUICK_TRIALS and min(recovery) > 0
    assert len(torchft["torchft: steps lost"]["samples"]) == peer_torchft.QUICK_TRIALS
    assert min(torchft["torchft: step time before the kill"]["samples"]) > 0
    timeouts = {timeout["name"] for timeout in results["peer-torchft"]["timeouts"]}
    assert "lighthouse heartbeat timeout (a replica silent this long is dead)" in timeouts

    dlrover = {metric["name"]: metric for metric in results["peer-dlrover"]["metrics"]}
    assert results["peer-dlrover"]["details"]["dlrover_version"] == "0.6.1"
    for system in ("phalanx", "dlrover"):
        for figure in ("stall", "persist"):
            samples = dlrover[f"{system} {figure}, 10 MB"]["samples"]
            assert len(samples) == peer_dlrover.QUICK_SAVES[10] and min(samples) > 0, (system, figure)

    report = (out / "report.md").read_text()
    peers_table = report[report.index("## Peers, measured") : report.index("## Targets missed")]
    assert "| peer-dlrover | dlrover stall, 10 MB |" in peers_table
    assert "| recovery not run in this invocation | published: Ray+torchft ~5 s |" in peers_table
    stall_row = next(line for line in peers_table.splitlines() if "| dlrover stall, 10 MB |" in line)
    assert stall_row.split(" | ")[5].endswith("x")  # a ratio: both sides measured in this run

    assert leftovers(tmp_path) == []
    assert not list(Path("/dev/shm").glob("phalanx-bench-dlrover-*"))
