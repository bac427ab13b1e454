"""`phalanx bench --quick` for the Kubernetes-native peers on the session's local cluster: Kubeflow Trainer v2 and
JobSet, built from their Go modules and run as host processes, train the tiny GPT under torchrun beside
Phalanx's own recovery, and leave nothing behind.

Speed is never judged here; only that each peer ran (no "could not run"), every kill was measured with its
samples, the frozen worker got its verdict, the report sets each beside Phalanx's hot spare from the same
invocation, and the controllers, their CRDs, webhooks and runtime are gone afterwards. Needs `go` on PATH (the
first run builds the controllers into the Phalanx cache folder: about 3 minutes on 2 cores).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from phalanx.bench import peer_operators
from phalanx.devcluster import peerbuild

from .conftest import BENCH_SMOKE_TIMEOUT, Cluster, Operator, run_bench_smoke

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.peers,
    pytest.mark.timeout(BENCH_SMOKE_TIMEOUT + 100),
]

BENCHMARKS = ["recovery", "peer-kubeflow", "peer-jobset"]


def kubectl(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [str(cluster.state_dir / "bin" / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def controller_processes() -> list[str]:
    binaries = {build.binary for build in peerbuild.MODULE_BUILDS.values()}
    found = []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and Path(cmdline[0]).name in binaries:
            found.append(f"{process.info['pid']}: {' '.join(cmdline)}")
    return found


def test_peer_operators_run_beside_phalanx_in_smoke_mode(
    cluster: Cluster, operator: Operator, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    _, results = run_bench_smoke(cluster, BENCHMARKS, out)
    for name, label, how in (
        ("peer-kubeflow", "kubeflow", "containers restarted in place"),
        ("peer-jobset", "jobset", "JobSet restarted"),
    ):
        result = results[name]
        assert result["error"] is None, result["error"]
        assert not result["details"].get("unavailable"), result["details"]["unavailable"]
        assert result["timeouts"]
        metrics = {metric["name"]: metric for metric in result["metrics"]}
        kills = [trial for trial in result["details"]["trials"] if trial["kind"] == "kill"]
        assert len(kills) == peer_operators.QUICK_TRIALS and all(t["error"] is None for t in kills), kills
        assert {t["how"] for t in kills} == {how}
        for metric in (
            "kill -> first step",
            "steps lost",
            "pods recreated per kill",
            "container restarts per kill",
        ):
            assert len(metrics[f"{label}: {metric}"]["samples"]) == peer_operators.QUICK_TRIALS, metric
        assert min(metrics[f"{label}: kill -> first step"]["samples"]) > 0
        freezes = [trial for trial in result["details"]["trials"] if trial["kind"] == "freeze"]
        assert len(freezes) == 1 and freezes[0]["error"] is None, freezes
        # A verdict either way: noticed (with its time) or never within the cap (said in the report).
        noticed = metrics[f"{label}: frozen worker -> noticed"]["samples"]
        assert len(noticed) == 1 or f"{label}: frozen worker -> noticed" in result["details"]["never"]
    kubeflow = {m["name"]: m for m in results["peer-kubeflow"]["metrics"]}
    jobset = {m["name"]: m for m in results["peer-jobset"]["metrics"]}
    assert min(jobset["jobset: pods recreated per kill"]["samples"]) == 2  # the whole JobSet restarted
    assert max(kubeflow["kubeflow: pods recreated per kill"]["samples"]) == 0  # restarts in place

    report = (out / "report.md").read_text()
    table = report[report.index("## Peers, measured") : report.index("## Targets missed")]
    for label in ("kubeflow", "jobset"):
        row = next(line for line in table.splitlines() if f"| {label}: kill -> first step |" in line)
        assert row.split(" | ")[5].endswith("x"), row  # a ratio: both sides measured in this invocation
        assert "could not run" not in table

    assert controller_processes() == []
    crds = kubectl(cluster, "get", "crd", "-o", "name")
    assert "jobset.x-k8s.io" not in crds and "trainer.kubeflow.org" not in crds
    webhooks = kubectl(
        cluster, "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"
    )
    assert "jobset" not in webhooks and "trainer" not in webhooks
    assert "bench-peer-" not in kubectl(cluster, "get", "namespaces", "-o", "name")
