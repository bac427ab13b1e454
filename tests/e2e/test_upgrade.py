"""Upgrading Phalanx under a running job: `phalanx crd --apply` upgrades the CRD (Helm never upgrades a chart's
CRDs), then `helm upgrade` rolls the operator. The job keeps training on the same pods, and the field the new CRD
adds works on it. The "older build" is the current CRD without `spec.activeDeadlineSeconds`."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import setproctitle
import yaml

from phalanx import assets
from phalanx.helmsdk import Helm

from .conftest import REPO_ROOT, Cluster, Operator, operator_ready, wait_for
from .test_operator import condition, get_job, job_pods, trainingjob

pytestmark = pytest.mark.e2e

NEW_FIELD = "activeDeadlineSeconds"


def current_crd() -> dict[str, Any]:
    return yaml.safe_load((assets.crds_dir() / "trainingjobs.phalanx.dev.yaml").read_text())


def older_crd() -> dict[str, Any]:
    older = copy.deepcopy(current_crd())
    spec = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"][NEW_FIELD]
    return older


def crd_apply(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "crd", "--apply"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_crd_and_operator_upgrade_keeps_the_job_training_and_the_new_field_works(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # The older build's CRD, as a `helm install` of it would have left it.
    cluster.kubectl("replace", "-f", "-", input=json.dumps(older_crd()))
    try:
        cluster.apply(trainingjob("steady", replicas=2, spares=1, steps=100000, step_delay=0.05), namespace)
        wait_for(lambda: (get_job(cluster, namespace, "steady").get("status") or {}).get("step", 0) >= 5, 180)
        before = {pod.metadata.name: pod.metadata.uid for pod in job_pods(cluster, namespace, "steady")}
        patch = json.dumps({"spec": {NEW_FIELD: 30}})
        # The older schema does not know the field: the API server drops it, and says so.
        dropped = cluster.kubectl(
            "patch", "trainingjob", "steady", "-n", namespace, "--type=merge", "-p", patch
        )
        assert f'unknown field "spec.{NEW_FIELD}"' in dropped.stderr, dropped.stdout + dropped.stderr
        assert NEW_FIELD not in get_job(cluster, namespace, "steady")["spec"]

        applied = crd_apply(cluster)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "applied trainingjobs.phalanx.dev (serving v1alpha1" in applied.stdout, applied.stdout
        # A new operator pod, as a `helm upgrade` to a new build rolls it.
        helm = Helm(cluster.kubeconfig, operator.namespace)
        old_operator = {pod.metadata.uid for pod in operator.pods(cluster)}
        helm.upgrade(
            REPO_ROOT / "charts" / "phalanx",
            operator.release,
            {"podAnnotations": {"phalanx.dev/build": "next"}},
            reuse_values=True,
        )
        wait_for(
            lambda: (
                operator_ready(cluster)
                and not old_operator
                & {p.metadata.uid for p in operator.pods(cluster) if p.metadata.deletion_timestamp is None}
            ),
            120,
            message="the upgraded operator to run",
        )
        step = (get_job(cluster, namespace, "steady").get("status") or {}).get("step", 0)
        wait_for(
            lambda: (get_job(cluster, namespace, "steady").get("status") or {}).get("step", 0) > step + 20,
            120,
            message="training to go on under the upgraded operator",
        )
        status = get_job(cluster, namespace, "steady")["status"]
        assert {
            pod.metadata.name: pod.metadata.uid for pod in job_pods(cluster, namespace, "steady")
        } == before
        assert (status.get("restarts") or {}).get("total", 0) == 0, status.get("restarts")

        # The new field is accepted now, and works on the running job.
        cluster.kubectl("patch", "trainingjob", "steady", "-n", namespace, "--type=merge", "-p", patch)
        assert get_job(cluster, namespace, "steady")["spec"][NEW_FIELD] == 30
        failed = wait_for(
            lambda: (
                (found := condition(get_job(cluster, namespace, "steady"), "Failed"))
                and found["status"] == "True"
                and found
            ),
            90,
            message="the job to end at its new deadline",
        )
        assert failed["reason"] == "DeadlineExceeded", failed
    finally:
        # Whatever happened, the other tests get the current CRD back.
        restored = crd_apply(cluster)
        assert restored.returncode == 0, restored.stdout + restored.stderr


def test_the_release_upgrades_from_a_process_titled_unlike_its_installer(
    cluster: Cluster, operator: Operator
) -> None:
    """Helm's SDK names its field manager after argv[0], which a process title overwrites (pytest-xdist sets the
    running test's id): installed under one title and upgraded under another, every field of the release used
    to conflict. phalanx.helmsdk makes each call as Helm's CLI, under `helm`."""
    before = setproctitle.getproctitle()
    setproctitle.setproctitle("/".join(["a-title-no-installer-had"] * 8))
    try:
        Helm(cluster.kubeconfig, operator.namespace).upgrade(
            REPO_ROOT / "charts" / "phalanx", operator.release, reuse_values=True
        )
    finally:
        setproctitle.setproctitle(before)
    deployment = cluster.get_json(
        "deployment", operator.release, "-n", operator.namespace, "--show-managed-fields"
    )
    policy = cluster.get_json("validatingadmissionpolicy", "phalanx-worker-leases", "--show-managed-fields")
    for written in (deployment, policy):
        fields = written["metadata"]["managedFields"]
        # The API server's own writers (the status of each, the Deployment's replica count) aside.
        assert {e["manager"] for e in fields if e["operation"] == "Apply" and "subresource" not in e} == {
            "helm"
        }
    wait_for(lambda: operator_ready(cluster), 120, message="the operator Ready after the upgrade")
