"""Checkpoints planted before a job starts: a torn one (no manifest) and a corrupt one (a file that fails its
sha256). The job trains from the newest good checkpoint, and its status (`status.checkpoint.skipped`) and one
Warning Event name both, with their reasons. And another job's checkpoints: passed over (`OtherJob`) unless the
job opts in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phalanx.worker.checkpoint import durable, layout

from .conftest import Cluster, Operator, wait_for
from .test_fault_scenarios import _checkpoint_claim, _claim_directory, lease_annotations
from .test_operator import events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

CHECKPOINT = {"claimName": "checkpoints", "path": "/ckpt", "intervalSteps": 5}
GOOD, CORRUPT, TORN = 10, 15, 20


def plant(directory: Path) -> None:
    """Above the good step 10: step 15 with step 10's files and a matching manifest, one byte of its state
    flipped (corrupt), and step 20 renamed into place without its manifest (torn)."""
    good = directory / layout.step_dir_name(GOOD)
    corrupt = directory / layout.step_dir_name(CORRUPT)
    corrupt.mkdir()
    data = bytearray((good / layout.STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / layout.STATE_FILE).write_bytes(bytes(data))
    manifest = json.loads((good / layout.MANIFEST_NAME).read_text())
    (corrupt / layout.MANIFEST_NAME).write_text(json.dumps({**manifest, "step": CORRUPT}))
    torn = directory / layout.step_dir_name(TORN)
    torn.mkdir()
    (torn / layout.STATE_FILE).write_bytes((good / layout.STATE_FILE).read_bytes()[:4096])


def rank0_restore(cluster: Cluster, namespace: str, name: str) -> dict[str, str] | None:
    """Rank 0's heartbeat once it has restored and trains."""
    for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
        annotations = lease_annotations(cluster, namespace, pod.metadata.name) if pod.status.pod_ip else {}
        if annotations.get("phalanx.dev/rank") == "0" and annotations.get("phalanx.dev/restored-step"):
            return annotations
    return None


def seeded_claim(cluster: Cluster, namespace: str) -> Path:
    """The claim's folder once a first job (`seed`) left good checkpoints of steps 5 and 10 there."""
    cluster.apply(_checkpoint_claim(), namespace)
    cluster.apply(trainingjob("seed", steps=GOOD, checkpoint=CHECKPOINT), namespace)
    wait_succeeded(cluster, namespace, "seed", timeout=300)
    directory = _claim_directory(cluster, namespace, "seed")
    assert durable.complete_steps(directory)[:2] == [GOOD, 5], durable.complete_steps(directory)
    return directory


def skipped_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    return ((job.get("status") or {}).get("checkpoint") or {}).get("skipped") or []


def test_a_job_started_on_torn_and_corrupt_checkpoints_trains_from_the_good_one_and_names_both(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    directory = seeded_claim(cluster, namespace)
    plant(directory)

    # Another job's checkpoints, in the folder it names: this one restores them because it says so.
    resumed = {**CHECKPOINT, "folder": f"{namespace}/seed", "acceptOtherJobs": True}
    cluster.apply(trainingjob("resumed", steps=40, step_delay=0.1, checkpoint=resumed), namespace)
    beat = wait_for(lambda: rank0_restore(cluster, namespace, "resumed"), 240, message="rank 0 restored")
    print(f"rank 0 heartbeat: {beat}")
    assert beat["phalanx.dev/restored-step"] == str(GOOD), beat
    assert beat["phalanx.dev/restore-source"] == "durable", beat

    def both_named() -> list[dict[str, Any]] | None:
        named = skipped_of(get_job(cluster, namespace, "resumed"))
        return named if {entry["step"] for entry in named} >= {CORRUPT, TORN} else None

    wait_for(both_named, 120, message="status.checkpoint.skipped naming steps 15 and 20")
    final = wait_succeeded(cluster, namespace, "resumed", timeout=300)
    assert final["status"]["step"] == 40, final["status"]
    named = skipped_of(final)
    print(f"status.checkpoint.skipped: {named}")
    assert [(entry["step"], entry["tier"], entry["reason"]) for entry in named] == [
        (TORN, "durable", "Torn"),
        (CORRUPT, "durable", "Corrupt"),
    ], named
    assert named[0]["message"] == "no manifest (incomplete)", named
    assert named[1]["message"] == "state.bin: sha256 mismatch (file corrupt)", named
    assert all(entry["pod"].startswith("resumed-worker-") and entry["seenAt"] for entry in named), named

    warnings = [
        event
        for event in events_for(cluster, namespace, "resumed")
        if event["reason"] == "CheckpointSkipped" and event["type"] == "Warning"
    ]
    print(f"CheckpointSkipped events: {[(e['message'], e.get('count')) for e in warnings]}")
    (warning,) = warnings
    assert (warning.get("count") or 1) == 1, warning
    assert f"step {TORN} on the durable tier (Torn: no manifest (incomplete))" in warning["message"]
    assert f"step {CORRUPT} on the durable tier (Corrupt: state.bin: sha256 mismatch" in warning["message"]


def test_another_jobs_checkpoints_are_passed_over_and_named(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    directory = seeded_claim(cluster, namespace)

    # Another job's folder, no opt-in: it trains from the start (its own saves at steps the seed's
    # checkpoints do not hold).
    own = {**CHECKPOINT, "intervalSteps": 3, "folder": f"{namespace}/seed"}
    cluster.apply(trainingjob("stranger", steps=12, step_delay=0.1, checkpoint=own), namespace)
    # Beside it, a job on the same claim with the default folder (`<namespace>/<job>`): it never sees the
    # seed's checkpoints at all.
    cluster.apply(trainingjob("neighbour", steps=6, checkpoint={**CHECKPOINT, "intervalSteps": 3}), namespace)
    beat = wait_for(lambda: rank0_restore(cluster, namespace, "stranger"), 240, message="rank 0 restored")
    print(f"rank 0 heartbeat: {beat}")
    assert beat["phalanx.dev/restored-step"] == "0", beat
    final = wait_succeeded(cluster, namespace, "stranger", timeout=300)
    named = skipped_of(final)
    print(f"status.checkpoint.skipped: {named}")
    assert [(entry["step"], entry["tier"], entry["reason"]) for entry in named] == [
        (GOOD, "durable", "OtherJob"),
        (5, "durable", "OtherJob"),
    ], named
    assert f"written by job {namespace}/seed" in named[0]["message"], named
    manifest = json.loads((directory / layout.step_dir_name(12) / layout.MANIFEST_NAME).read_text())
    assert (manifest["job"]["namespace"], manifest["job"]["name"]) == (namespace, "stranger"), manifest

    neighbour = wait_succeeded(cluster, namespace, "neighbour", timeout=300)
    assert skipped_of(neighbour) == [], skipped_of(neighbour)
    assert durable.complete_steps(_claim_directory(cluster, namespace, "neighbour"))[0] == 6
    writers = {
        json.loads((directory / layout.step_dir_name(step) / layout.MANIFEST_NAME).read_text())["job"]["name"]
        for step in durable.complete_steps(directory)
    }
    assert writers <= {"seed", "stranger"}, writers
