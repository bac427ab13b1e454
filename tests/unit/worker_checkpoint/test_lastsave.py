"""The launcher's save on SIGTERM of a snapshot its trainer left unsaved (worker/checkpoint/lastsave.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import advance_to, build_state, expected_fingerprint, fingerprint

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import durable, lastsave, shm_store, slots


@pytest.fixture
def pod_memory(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own shared memory: no other test's snapshots are found."""
    root = workdir / "shm"
    root.mkdir()
    monkeypatch.setenv("PHALANX_SNAPSHOT_DIR", str(root))
    return root


def snapshot_only(workdir: Path, step: int) -> None:
    """A trainer that took snapshots up to `step` and died before any durable save."""
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=1000)
    for done in range(1, step + 1):
        advance_to(state, done)
        ckpt.save(done)
    ckpt.close()


def rewrite_newest_header(root: Path, **changes: object) -> None:
    newest = max(shm_store.held_snapshots(root), key=lambda info: (info.step, info.seq))
    fd = os.open(newest.path, os.O_RDWR)
    try:
        slots.write_header_fd(fd, {**newest.header, **changes})
    finally:
        os.close(fd)


def test_the_writers_unsaved_snapshot_is_written_and_restores(workdir: Path, pod_memory: Path) -> None:
    snapshot_only(workdir, 3)
    assert durable.complete_steps(workdir / "ckpt") == []

    assert lastsave.save_unsaved() == 3
    assert durable.complete_steps(workdir / "ckpt") == [3]
    manifest, problem = durable.verify(workdir / "ckpt" / "step-3", 3)
    assert problem is None and manifest is not None and manifest["world_size"] == 1

    cleanup_snapshots(directory=workdir / "ckpt")  # a new pod: nothing in memory
    resumed = build_state()
    again = Checkpointer(resumed, workdir / "ckpt")
    assert again.load() == 3
    assert again.last_restore is not None and again.last_restore.source == "disk"
    assert fingerprint(resumed) == expected_fingerprint(3)
    again.close()


def test_nothing_is_written_when_the_trainer_saved_as_far(workdir: Path, pod_memory: Path) -> None:
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=1000)
    advance_to(state, 2)
    ckpt.save(2, force_durable=True)
    ckpt.wait()
    ckpt.close()
    assert durable.complete_steps(workdir / "ckpt") == [2]
    assert lastsave.save_unsaved() is None
    assert durable.complete_steps(workdir / "ckpt") == [2]


@pytest.mark.parametrize("changes", [{"rank": 1}, {"sharded": True}, {lastsave.DIRECTORY_KEY: None}])
def test_only_a_replicated_snapshot_taken_as_rank_0_is_the_launchers_to_write(
    workdir: Path, pod_memory: Path, changes: dict[str, object]
) -> None:
    snapshot_only(workdir, 2)
    rewrite_newest_header(pod_memory, **changes)
    # The newest is not the writer's: at most the older step 1 (rank 0, replicated) is written.
    assert lastsave.save_unsaved() == 1
    assert durable.complete_steps(workdir / "ckpt") == [1]


def test_a_pod_holding_no_snapshot_writes_nothing(workdir: Path, pod_memory: Path) -> None:
    assert lastsave.save_unsaved() is None
    assert not (workdir / "ckpt").exists()
