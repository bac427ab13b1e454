"""What anyone who can write a Lease sends the operator is bounded before it is kept."""

from __future__ import annotations

import json

from phalanx.operator import status


def test_a_junk_lease_costs_the_operator_at_most_its_budget() -> None:
    junk = {f"phalanx.dev/field-{index}": "x" * 250_000 for index in range(64)}
    junk["phalanx.dev/phase"] = "Running"
    summary = status.summarize_lease({"metadata": {"annotations": junk}, "spec": {}})
    assert len(json.dumps(summary)) <= status.MAX_LEASE_SUMMARY + 1024
    assert all(len(value) <= status.MAX_LEASE_VALUE for value in summary.values() if isinstance(value, str))


def test_a_worker_s_heartbeat_is_kept_whole() -> None:
    from phalanx.worker.heartbeat import PodStatus, lease_annotations

    record = PodStatus(phase="Running", step=12, fault_message="m" * 2000, restart_cause="c" * 2000)
    annotations = lease_annotations(record)
    summary = status.summarize_lease({"metadata": {"annotations": annotations}, "spec": {}})
    expected = {key.removeprefix("phalanx.dev/"): value for key, value in annotations.items()}
    assert {key: summary[key] for key in expected} == expected
