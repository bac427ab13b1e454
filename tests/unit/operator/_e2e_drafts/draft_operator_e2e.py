"""Draft end-to-end tests of the operator (not collected: the e2e fixtures live in tests/e2e/).

Each scenario below was run by hand against `phalanx dev up` with the chart installed through Helm's SDK.
They assume a running local cluster whose kubeconfig is in $KUBECONFIG and `kubectl` on PATH; the lead's
fixtures should replace `kubectl()` / `install_chart()` with theirs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "examples" / "tinygpt.yaml"


def kubectl(*args: str, check: bool = True) -> str:
    result = subprocess.run(["kubectl", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result.stdout + result.stderr


def job(name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "tj", name, "-o", "json"))


def condition(name: str, condition_type: str) -> dict[str, Any] | None:
    conditions = job(name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == condition_type), None)


def pods(name: str) -> list[dict[str, Any]]:
    return json.loads(kubectl("get", "pods", "-l", f"phalanx.dev/job-name={name}", "-o", "json"))["items"]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def apply(manifest: dict[str, Any]) -> None:
    subprocess.run(["kubectl", "apply", "-f", "-"], input=yaml.safe_dump(manifest), text=True, check=True)


def example(name: str, trainer_args: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"].update(spec)
    if trainer_args is not None:
        manifest["spec"]["template"]["spec"]["containers"][0]["args"] = trainer_args
    return manifest


def install_chart(values: dict[str, Any] | None = None) -> None:
    config = helm_python.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace="phalanx-system")
    config.install(ROOT / "charts" / "phalanx", "phalanx", values=values or {}, create_namespace=True)
    kubectl("-n", "phalanx-system", "rollout", "status", "deploy/phalanx", "--timeout=120s")


def draft_helm_install_and_train_to_success() -> None:
    """Issue 4 test 1: the operator runs as a pod under the chart's RBAC; the example succeeds."""
    install_chart()
    kubectl("apply", "-f", str(EXAMPLE))
    kubectl("wait", "--for=condition=Succeeded", "tj/tinygpt", "--timeout=600s")
    row = kubectl("get", "tj", "tinygpt", "--no-headers").split()
    assert row[3] == "300" and row[5] == "Succeeded"  # STEP, STATE columns filled
    logs = kubectl("-n", "phalanx-system", "logs", "deploy/phalanx")
    assert "Forbidden" not in logs and "403" not in logs
    remaining = {p["metadata"]["labels"]["phalanx.dev/role"] for p in pods("tinygpt")}
    assert remaining == {"worker"}  # spares and the rendezvous pod were removed


def draft_invalid_specs_fail_with_the_field_and_no_pods() -> None:
    """Issue 4 test 2."""
    cases = {
        "bad-bounds": ({"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas"),
        "bad-spares": ({"spares": -1}, "spec.spares"),
    }
    for name, (spec, _field) in cases.items():
        apply(example(name, **spec))
    no_command = example("bad-command")
    del no_command["spec"]["template"]["spec"]["containers"][0]["command"]
    apply(no_command)
    cases["bad-command"] = ({}, "spec.template.spec.containers[0].command")
    for name, (_, field) in cases.items():
        wait_for(lambda name=name: condition(name, "Failed") is not None, 30, f"{name} Failed")
        failed = condition(name, "Failed")
        assert failed is not None and failed["reason"] == "InvalidSpec" and field in failed["message"]
        assert pods(name) == []
        events = kubectl(
            "get", "events", "--field-selector", f"involvedObject.name={name},reason=InvalidSpec"
        )
        assert field in events
    typed = example("bad-type")
    typed["spec"]["replicas"] = "two"
    result = subprocess.run(
        ["kubectl", "apply", "-f", "-"], input=yaml.safe_dump(typed), text=True, check=False
    )
    assert result.returncode != 0


def draft_gang_too_big_deletes_all_then_retries() -> None:
    """Issue 4 test 3 (the 'starts once capacity appears' half needs a node added by the fixture)."""
    manifest = example(
        "toobig", replicas=3, spares=1, gang={"scheduleTimeoutSeconds": 15, "backoffSeconds": 10}
    )
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "5"}}
    apply(manifest)  # 3 nodes of 8 CPUs: 3 of 4 pods fit
    wait_for(lambda: (condition("toobig", "GangScheduled") or {}).get("reason") == "Backoff", 60, "backoff")
    assert pods("toobig") == [] or all(p["metadata"].get("deletionTimestamp") for p in pods("toobig"))
    assert job("toobig")["status"]["gang"]["attempts"] >= 1
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=toobig,reason=ScheduleTimeout")
    assert "Insufficient cpu" in events


def draft_pack_puts_the_gang_in_one_zone() -> None:
    """Issue 4 test 4 (Spread: same with policy Spread and at least two zones used)."""
    apply(
        example("packed", topology={"key": "topology.kubernetes.io/zone", "policy": "Pack", "required": True})
    )
    wait_for(
        lambda: (condition("packed", "GangScheduled") or {}).get("status") == "True", 60, "gang scheduled"
    )
    zones = {w["zone"] for w in job("packed")["status"]["workers"]}
    assert len(zones) == 1


def draft_scale_within_and_outside_bounds() -> None:
    """Issue 4 test 5."""
    apply(example("elastic", ["--steps", "600", "--step-delay", "0.2"], minReplicas=1, maxReplicas=4))
    wait_for(lambda: job("elastic")["status"].get("state") == "Running", 60, "running")
    kubectl("scale", "tj/elastic", "--replicas=3")
    wait_for(lambda: job("elastic")["status"]["replicas"]["active"] == 3, 30, "3 active")
    before = sorted(p["metadata"]["name"] for p in pods("elastic"))
    kubectl("scale", "tj/elastic", "--replicas=6")
    wait_for(lambda: (condition("elastic", "SpecValid") or {}).get("status") == "False", 30, "refused")
    assert "spec.replicas" in (condition("elastic", "SpecValid") or {})["message"]
    assert sorted(p["metadata"]["name"] for p in pods("elastic")) == before


def draft_rendezvous_pod_is_recreated() -> None:
    """Issue 4 test 6."""
    apply(example("rdzv", ["--steps", "400", "--step-delay", "0.2"]))
    wait_for(lambda: job("rdzv")["status"].get("step", 0) > 20, 120, "training")
    kubectl("delete", "pod", "rdzv-rdzv", "--wait=false")
    wait_for(
        lambda: any(
            p["metadata"]["name"] == "rdzv-rdzv" and p["status"].get("phase") == "Running"
            for p in pods("rdzv")
        ),
        30,
        "rendezvous back",
    )
    kubectl("wait", "--for=condition=Succeeded", "tj/rdzv", "--timeout=600s")


def draft_operator_restart_creates_no_duplicates() -> None:
    """Issue 4 test 7: delete the active operator pod mid-job (with replicaCount 2 the standby takes over)."""
    apply(example("restart", ["--steps", "400", "--step-delay", "0.1"]))
    wait_for(lambda: job("restart")["status"].get("state") == "Running", 60, "running")
    names_before = sorted(p["metadata"]["name"] for p in pods("restart"))
    kubectl("-n", "phalanx-system", "delete", "pods", "-l", "app.kubernetes.io/name=phalanx", "--wait=false")
    time.sleep(15)
    assert sorted(p["metadata"]["name"] for p in pods("restart")) == names_before
    kubectl("wait", "--for=condition=Succeeded", "tj/restart", "--timeout=600s")


def draft_suspend_resume_and_delete_leave_nothing() -> None:
    """Issue 4 test 8."""
    apply(example("pause", ["--steps", "400", "--step-delay", "0.2"]))
    wait_for(lambda: job("pause")["status"].get("state") == "Running", 60, "running")
    kubectl("patch", "tj", "pause", "--type", "merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: pods("pause") == [], 60, "pods removed")
    assert (condition("pause", "Suspended") or {}).get("status") == "True"
    assert job("pause")["status"]["startTime"]  # status kept
    kubectl("patch", "tj", "pause", "--type", "merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len(pods("pause")) == 4, 60, "pods back")
    kubectl("delete", "tj", "pause")
    leftovers = kubectl("get", "pods,svc,sa,role,rolebinding,lease", "-o", "name")
    assert "pause" not in leftovers
