"""`phalanx bench --quick --only scale`: one job of 64 pods of 8 GPUs on the benchmark's own cluster of simulated
nodes, its launchers emulated with the launcher's heartbeat code, the operator installed from the chart.

A smoke, not a measurement (speed is the report's business): the run must finish, the job's heartbeats must cost
what its pods' Leases cost and no more, the gang's pods must each be created and released once, the operator
must find the worker whose launcher fell silent and act on the launchers' verdicts, and a group restart must
reach the job's Leases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

SMOKE_TIMEOUT = 1100


def test_a_64_pod_job_on_simulated_gpu_nodes_beats_and_a_silent_worker_is_found(tmp_path: Path) -> None:
    from phalanx.bench import operator_scale, scale

    out = tmp_path / "results"
    command = [sys.executable, "-m", "phalanx.cli", "bench", "--quick", "--only", "scale", "--out", str(out)]
    try:
        process = subprocess.run(command, capture_output=True, text=True, timeout=SMOKE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as expired:
        printed = expired.stderr or b""
        text = printed.decode(errors="replace") if isinstance(printed, bytes) else printed
        pytest.fail(f"phalanx bench ran past {SMOKE_TIMEOUT} s; it last printed:\n{text[-6000:]}")
    assert process.returncode == 0, process.stderr[-6000:]
    (result,) = json.loads((out / "results.json").read_text())["results"]
    assert result["error"] is None, result["error"]
    metrics = {metric["name"]: metric["samples"] for metric in result["metrics"]}
    pods = 64 + scale.spares_for(64)
    # Below 128 pods each pod renews its own Lease once per interval: the job writes about that, never more.
    (heartbeat_writes,) = metrics["the job's heartbeat writes/s, N=64"]
    assert 0 < heartbeat_writes <= 1.5 * pods / scale.INTERVAL, heartbeat_writes
    (running,) = metrics["gang Running, N=64"]
    assert running > 0
    assert metrics["operator RSS, N=64"][0] > 0 and metrics["operator watch events/s, N=64"][0] > 0
    (found,) = metrics["silent worker found past the timeout, N=64"]
    assert -scale.INTERVAL < found < scale.TIMEOUT, found
    # One creation and one gate lift a pod, none sent again while the operator's pod index catches up.
    (pod_writes,) = metrics["operator's pod writes per gang pod, N=64"]
    assert pod_writes == 2.0, pod_writes
    for kind in scale.VERDICT_REASONS:
        (acted,) = metrics[f"launcher's verdict '{kind}' acted on, N=64"]
        assert 0 < acted < scale.DETECTION_WAIT, (kind, acted)
    # Per-worker detail is the heartbeats', never the status's.
    assert 0 < max(metrics["TrainingJob status size, N=64"]) <= scale.STATUS_BOUND_KIB
    # Small jobs beside the gang: each replacement made, the gang's verdicts still acted on.
    replacements = metrics["event -> action beside the gang, 3 small jobs, N=64"]
    assert replacements and all(0 < latency < operator_scale.REPLACE_WAIT for latency in replacements)
    (beside_verdict,) = metrics["launcher's verdict 'stopped' acted on beside 3 small jobs, N=64"]
    assert 0 < beside_verdict < scale.DETECTION_WAIT, beside_verdict
    assert 0 < max(metrics["largest small job's status beside the gang, N=64"]) <= scale.STATUS_BOUND_KIB
    (reported,) = metrics["group restart reported, N=64"]
    assert 0 <= reported < scale.DETECTION_WAIT, reported
    details = result["details"]["64"]
    assert details["hub"] is False and details["misses"] == [] and details["partial"] is False
    assert details["false_alarms"] == [], details["false_alarms"]
