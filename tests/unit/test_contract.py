"""The contract between operator and worker (phalanx.contract): each side reads what the other writes, through
their own code, and neither imports the other."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from phalanx import contract
from phalanx.operator import api, detection, names, reconcile
from phalanx.operator import status as observe
from phalanx.worker import heartbeat, lease

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=5)


def a_pod(name: str = "demo-worker-0", uid: str = "uid-demo-worker-0") -> dict:
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "creationTimestamp": "2026-01-01T11:50:00Z",
            "labels": {contract.LABEL_JOB_NAME: "demo", contract.LABEL_ROLE: contract.ROLE_WORKER},
        },
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize("phase", contract.PHASES)
def test_the_operator_reads_every_heartbeat_field_the_worker_writes(phase: contract.Phase) -> None:
    written = heartbeat.PodStatus(
        phase=phase,
        phase_since=STARTED.timestamp(),
        step=1234,
        step_at=NOW.timestamp(),
        loss=2.5,
        step_seconds=0.25,
        checkpoint_step=1200,
        rank=3,
        world_size=8,
        group_started=STARTED.timestamp(),
        restored_step=1100,
        restore_source="memory",
        resumed_at=NOW.timestamp(),
        compute_seconds=0.2,
        checkpoint_interval=50,
        exit_code=0,
    )
    body = heartbeat.lease_body(
        pod_name="demo-worker-0",
        namespace="ml",
        pod_uid="uid-demo-worker-0",
        status=written,
        now=NOW,
        lease_duration_seconds=10,
    )
    read = observe.summarize_lease(body)
    # Through the operator's own readers: the pod's Lease is its own, and every figure comes back.
    assert detection.heartbeat_of(a_pod(), {"demo-worker-0": read}) is read
    assert detection.heartbeat_of(a_pod(uid="another-pod"), {"demo-worker-0": read}) is None
    # A Lease its launcher did not write (no owner: one made by hand, say) is no heartbeat of the pod.
    unowned = observe.summarize_lease({**body, "metadata": {**body["metadata"], "ownerReferences": []}})
    assert unowned["ownerUid"] is None and detection.heartbeat_of(a_pod(), {"demo-worker-0": unowned}) is None
    assert read["phase"] == phase
    assert detection.lease_step(read) == 1234
    assert detection.lease_number(read, "checkpoint-step") == 1200
    assert detection.lease_number(read, "step-seconds") == 0.25
    assert detection.lease_number(read, "compute-seconds") == pytest.approx(0.2)
    assert detection.lease_number(read, "checkpoint-interval") == 50
    assert (read["rank"], read["world-size"], read["restore-source"]) == ("3", "8", "memory")
    # Every phase means something to the operator: in a group, joining one, standing by, or out of one.
    roles = {observe.observed_role(a_pod(), read), observe.standing_by(a_pod(), read)}
    if phase in contract.IN_GROUP_PHASES:
        assert phase in reconcile.GROUP_PHASES and observe.observed_role(a_pod(), read) == names.ROLE_WORKER
    elif phase == contract.PHASE_STANDBY:
        assert roles == {names.ROLE_SPARE, True}
    elif phase == contract.PHASE_RENDEZVOUS:
        assert observe.standing_by(a_pod(), read) is False
    assert phase in heartbeat.PHASES


def test_both_sides_spell_the_api_labels_and_phases_alike() -> None:
    assert (api.GROUP, api.VERSION, api.PLURAL, api.KIND) == (
        contract.GROUP,
        contract.VERSION,
        contract.PLURAL,
        contract.KIND,
    )
    assert (lease.TRAININGJOB_GROUP, lease.TRAININGJOB_VERSION, lease.TRAININGJOB_PLURAL) == (
        api.GROUP,
        api.VERSION,
        api.PLURAL,
    )
    assert heartbeat.ANNOTATION_PREFIX == observe.LEASE_ANNOTATION_PREFIX == contract.LEASE_ANNOTATION_PREFIX
    assert (names.LABEL_JOB_NAME, names.LABEL_ROLE, names.LABEL_INDEX, names.LABEL_COMPONENT) == (
        contract.LABEL_JOB_NAME,
        contract.LABEL_ROLE,
        contract.LABEL_INDEX,
        contract.LABEL_COMPONENT,
    )
    assert set(api.JOB_STATES) == set(contract.JobState.__args__)  # type: ignore[attr-defined]
    assert set(heartbeat.LAUNCHER_PHASES) <= set(contract.PHASES)


@pytest.mark.parametrize(
    ("side", "other"),
    [("phalanx.worker.launch", "phalanx.operator"), ("phalanx.operator.handlers", "phalanx.worker")],
)
def test_neither_side_imports_the_other(side: str, other: str) -> None:
    """The operator's image has no torch and the worker's no kopf: the contract is all they share."""
    check = (
        f"import sys, {side}; "
        f"found = sorted(m for m in sys.modules if m == {other!r} or m.startswith({other!r} + '.')); "
        "print(found); sys.exit(1 if found else 0)"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "phalanx.contract"
        in subprocess.run(
            [sys.executable, "-c", f"import sys, {side}; print(sorted(sys.modules))"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )
