"""The operator's memory of its own pod writes until its pod index shows them."""

from __future__ import annotations

from typing import Any

from phalanx.operator import gang, names, ownwrites


def pod(name: str, uid: str = "u1", role: str = "spare", gated: bool = False) -> dict[str, Any]:
    summary = {"metadata": {"name": name, "uid": uid, "labels": {names.LABEL_ROLE: role}}, "spec": {}}
    return gang.gated(summary) if gated else summary


def test_a_change_is_laid_over_until_the_index_shows_it() -> None:
    writes = ownwrites.OwnWrites()
    writes.wrote("ml", "demo", "demo-worker-2", "u1", ownwrites.RoleLabel("worker"))
    writes.wrote("ml", "demo", "demo-worker-2", "u1", ownwrites.GateLifted())
    indexed = [pod("demo-worker-2", gated=True)]
    (seen,) = writes.laid_over("ml", "demo", indexed)
    assert seen["metadata"]["labels"][names.LABEL_ROLE] == "worker" and not gang.is_gated(seen)
    assert gang.is_gated(indexed[0]), "the index's own object is never changed"
    assert writes.laid_over("ml", "other", indexed) == indexed, "one job's writes are never another's"
    (shown,) = writes.laid_over("ml", "demo", [pod("demo-worker-2", role="worker")])
    assert len(writes) == 0 and shown["metadata"]["labels"][names.LABEL_ROLE] == "worker"


def test_a_change_to_a_pod_that_is_gone_or_another_one_now_is_forgotten() -> None:
    writes = ownwrites.OwnWrites()
    writes.wrote("ml", "demo", "a", "u1", ownwrites.RoleLabel("worker"))
    writes.wrote("ml", "demo", "b", "u1", ownwrites.RoleLabel("worker"))
    (remade,) = writes.laid_over("ml", "demo", [pod("a", uid="u2")])
    assert remade["metadata"]["labels"][names.LABEL_ROLE] == "spare"
    assert len(writes) == 0


def test_a_created_pod_counts_as_existing_until_indexed_or_for_the_limit_at_most() -> None:
    moment = [0.0]
    writes = ownwrites.OwnWrites(limit_seconds=60, clock=lambda: moment[0])
    made = {"metadata": {"name": "demo-worker-0"}, "spec": {}}
    writes.wrote("ml", "demo", "demo-worker-0", None, ownwrites.Created(made))
    assert writes.laid_over("ml", "demo", []) == [made]
    moment[0] = 59.0
    assert writes.laid_over("ml", "demo", []) == [made]
    moment[0] = 61.0
    assert writes.laid_over("ml", "demo", []) == [] and len(writes) == 0
    writes.wrote("ml", "demo", "demo-worker-0", None, ownwrites.Created(made))
    indexed = [pod("demo-worker-0", role="worker")]
    assert writes.laid_over("ml", "demo", indexed) == indexed and len(writes) == 0


def test_a_deleted_job_s_writes_are_forgotten() -> None:
    writes = ownwrites.OwnWrites()
    writes.wrote("ml", "demo", "a", None, ownwrites.Created({"metadata": {"name": "a"}}))
    writes.wrote("ml", "keep", "b", None, ownwrites.Created({"metadata": {"name": "b"}}))
    writes.forget("ml", "demo")
    assert [pod for pod, _ in writes.pending("ml", "keep")] == ["b"] and len(writes) == 1
