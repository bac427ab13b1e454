"""Tiered checkpoints end to end: workers commit to their node-local tier every interval and copy every few
checkpoints to the durable tier (the claim, or an S3-compatible store); when every pod is lost at once (no
memory snapshot, no local tier left), the new pods restore from the durable tier and train to the end."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from phalanx.worker.checkpoint import durable, layout, tiers

from .conftest import Cluster, Operator, wait_for
from .test_fault_scenarios import _checkpoint_claim, _claim_directory, _pod_processes, lease_annotations
from .test_fault_tolerance import STEPS, fault_job, incidents_of
from .test_operator import get_job, has_condition, job_pods, live_step, wait_succeeded

pytestmark = pytest.mark.e2e

INTERVAL = 4
DURABLE_EVERY = 3
BUCKET = "phalanx-e2e"
S3_KEY, S3_SECRET = "phalanx", "phalanx-secret"


def tiered_job(name: str, **checkpoint: Any) -> dict[str, Any]:
    spec = {
        "path": "/ckpt",
        "intervalSteps": INTERVAL,
        "keep": 3,
        "durableEvery": DURABLE_EVERY,
        "localTier": {"enabled": True, "keep": 2},
        **checkpoint,
    }
    return fault_job(name, spares=0, checkpoint=spec)


def fast_tier_step(cluster: Cluster, namespace: str, name: str) -> int:
    """The newest checkpoint on rank 0's local tier (its heartbeat's checkpoint step)."""
    for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
        annotations = lease_annotations(cluster, namespace, pod.metadata.name)
        if annotations.get("phalanx.dev/rank") == "0":
            return int(annotations.get("phalanx.dev/checkpoint-step") or -1)
    return -1


def lose_every_pod_when_local_is_ahead(
    cluster: Cluster, namespace: str, name: str, durable_steps: Any
) -> tuple[int, list[int]]:
    """Once the local tier holds a newer checkpoint than the durable tier, SIGKILL every worker at once (no
    emergency save, no snapshot survives); returns the local tier's step and the durable steps then."""
    wait_for(lambda: live_step(cluster, namespace, name) >= 30, 240, message="step 30")
    # Found before the wait, so that the kill follows the look at once: the group trains on meanwhile, and a
    # second's delay let a save reach the durable tier past the local step seen (CI, stop 38).
    processes = [
        pid
        for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker")
        for pid in _pod_processes(pod.metadata.name)
    ]

    def local_ahead() -> tuple[int, list[int]] | None:
        local, on_durable = fast_tier_step(cluster, namespace, name), durable_steps()
        return (local, on_durable) if on_durable and local > on_durable[0] else None

    local, on_durable = wait_for(
        local_ahead, 120, interval=0.1, message="the local tier ahead of the durable one"
    )
    for pid in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return local, durable_steps() or on_durable


def assert_restored_from_durable(final: dict[str, Any], local: int, on_durable: list[int]) -> dict[str, Any]:
    status = final["status"]
    assert status["step"] == STEPS, status
    incidents = incidents_of(final)
    print(f"local tier at {local}, durable tier {on_durable}; incidents {incidents}")
    assert incidents, status
    restored = {(i.get("restoredStep"), i.get("restoredFrom")) for i in incidents}
    assert len(restored) == 1, incidents
    ((step, source),) = restored
    assert source == "durable", incidents
    assert step in on_durable and step < local, (step, local, on_durable)
    assert step % INTERVAL == 0
    return incidents[0]


def test_pods_lost_with_their_local_tier_restore_from_the_claim(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(_checkpoint_claim(), namespace)
    job = tiered_job("tiered", claimName="checkpoints")
    # The preflight rehearses the same restore: records on the claim, local tiers emptied, a fetch from it.
    job["spec"]["preflight"] = {"enabled": True, "steps": 8}
    cluster.apply(job, namespace)
    directory = wait_for(
        lambda: _claim_directory(cluster, namespace, "tiered"), 120, message="the claim's volume"
    )
    local, on_durable = lose_every_pod_when_local_is_ahead(
        cluster, namespace, "tiered", lambda: durable.complete_steps(directory)
    )
    final = wait_succeeded(cluster, namespace, "tiered", timeout=600)
    assert_restored_from_durable(final, local, on_durable)
    assert has_condition(final, "PreflightPassed", "True"), final["status"].get("conditions")
    # Only every third checkpoint reached the claim; the final save always does.
    complete = durable.complete_steps(directory)
    assert complete[0] == STEPS and len(complete) <= 3, complete
    for step in complete:
        assert durable.verify(directory / layout.step_dir_name(step), step)[1] is None


@pytest.mark.long
def test_pods_lost_with_their_local_tier_restore_from_object_storage(
    cluster: Cluster, operator: Operator, namespace: str, s3_endpoint: str, tmp_path: Path
) -> None:
    base = f"s3://{BUCKET}/{namespace}"
    # The job keeps its checkpoints in a folder of its own under the URL it is given: <namespace>/<job>.
    tier = tiers.DurableTier(
        f"{base}/{namespace}/s3tier",
        keep=3,
        options={"endpoint_url": s3_endpoint, "key": S3_KEY, "secret": S3_SECRET},
    )
    fs, root = tier.filesystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-credentials"},
        "data": {
            "AWS_ACCESS_KEY_ID": base64.b64encode(S3_KEY.encode()).decode(),
            "AWS_SECRET_ACCESS_KEY": base64.b64encode(S3_SECRET.encode()).decode(),
        },
    }
    cluster.apply(secret, namespace)
    store = {"url": base, "endpointUrl": s3_endpoint, "secretName": "s3-credentials"}
    cluster.apply(tiered_job("s3tier", volume={"emptyDir": {}}, objectStore=store), namespace)

    def on_store() -> list[int]:
        return [step for step in tiers._url_steps(fs, root) if fs.exists(f"{root}/step-{step}/manifest.json")]

    local, on_durable = lose_every_pod_when_local_is_ahead(cluster, namespace, "s3tier", on_store)
    final = wait_succeeded(cluster, namespace, "s3tier", timeout=600)
    assert_restored_from_durable(final, local, on_durable)
    stored = on_store()
    assert stored[0] == STEPS and len(stored) <= 3, stored
    newest = tiers.newest(tier)
    assert newest is not None and newest.step == STEPS
    assert tiers.fetch(tier, newest, tmp_path) is not None, "the final copy does not match its manifest"
    assert get_job(cluster, namespace, "s3tier")["status"]["restarts"].get("counted", 0) == 0
