"""Peer recovery over gloo with 3 real processes, and agreement on one restore step."""

from __future__ import annotations

from pathlib import Path

from helpers import expected_fingerprint, run_ranks


def pod_env(workdir: Path, world: int) -> list[dict[str, str]]:
    """Each process plays one pod: its own /dev/shm (a folder here) and LOCAL_RANK 0."""
    return [
        {"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(world)
    ]


def test_newcomer_without_snapshot_gets_state_from_peers(workdir: Path) -> None:
    env = pod_env(workdir, 3)
    run_ranks("peer_phase1", 3, workdir, env, extra={"last_step": [5, 5, 5]})
    # Rank 2's pod is replaced: a new pod with an empty snapshot store.
    env[2]["PHALANX_SNAPSHOT_DIR"] = str(workdir / "pod-new")
    results = run_ranks("peer_phase2", 3, workdir, env)
    assert [result["step"] for result in results] == [5, 5, 5]
    assert [result["source"] for result in results] == ["memory", "memory", "peer"]
    for result in results:
        assert result["state"] == expected_fingerprint(5)
    assert not (workdir / "ckpt").exists() or not list((workdir / "ckpt").glob("step-*"))


def test_ranks_agree_on_the_newest_step_any_rank_holds(workdir: Path) -> None:
    env = pod_env(workdir, 3)
    run_ranks("peer_phase1", 3, workdir, env, extra={"last_step": [3, 6, 4]})
    results = run_ranks("peer_phase2", 3, workdir, env)
    assert [result["step"] for result in results] == [6, 6, 6]
    assert [result["source"] for result in results] == ["peer", "memory", "peer"]
    for result in results:
        assert result["state"] == expected_fingerprint(6)


def test_group_resumes_from_disk_when_no_pod_kept_memory(workdir: Path) -> None:
    env = pod_env(workdir, 3)
    run_ranks("durable_then_resume", 3, workdir, env, extra={"phase": "save", "steps": 4, "interval": 4})
    fresh = [{**entry, "PHALANX_SNAPSHOT_DIR": entry["PHALANX_SNAPSHOT_DIR"] + "-new"} for entry in env]
    results = run_ranks("durable_then_resume", 3, workdir, fresh, extra={"phase": "load", "interval": 4})
    assert [(result["step"], result["source"]) for result in results] == [(4, "disk")] * 3
    for result in results:
        assert result["state"] == expected_fingerprint(4)


def test_a_peer_state_that_does_not_match_its_donors_digest_is_refused(workdir: Path) -> None:
    env = pod_env(workdir, 3)
    run_ranks("peer_phase1", 3, workdir, env, extra={"last_step": [5, 5, 5]})
    env[2]["PHALANX_SNAPSHOT_DIR"] = str(workdir / "pod-new")
    results = run_ranks("peer_forged", 3, workdir, env)
    assert [result.get("source") for result in results[:2]] == ["memory", "memory"]
    assert "does not match the digest" in results[2]["refused"]
    # Nothing of the changed bytes was loaded.
    assert results[2]["state"] != expected_fingerprint(5)
