"""Durable checkpoints: atomic commit, keep-K purge, fallback past a corrupted checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers import advance_to, build_state, expected_fingerprint, fingerprint

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import durable, layout, skipped


def saved_steps(directory: Path) -> list[int]:
    return sorted(durable.complete_steps(directory))


def fresh_load(workdir: Path) -> tuple[int, str, dict]:
    """Load as a new job would after losing every in-memory snapshot."""
    cleanup_snapshots(directory=workdir / "ckpt")
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt")
    step = ckpt.load()
    assert ckpt.last_restore is not None
    source = ckpt.last_restore.source
    ckpt.close()
    return step, source, fingerprint(state)


def train_and_save(workdir: Path, steps: int, interval: int, keep: int) -> None:
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=interval, keep=keep)
    for step in range(1, steps + 1):
        advance_to(state, step)
        ckpt.save(step)
        ckpt.wait()  # one durable save per interval, so the purge is deterministic
    ckpt.close()


def test_save_writes_manifest_and_loads_exact_state(workdir: Path) -> None:
    train_and_save(workdir, steps=4, interval=2, keep=3)
    assert saved_steps(workdir / "ckpt") == [2, 4]
    manifest = json.loads((workdir / "ckpt" / "step-4" / layout.MANIFEST_NAME).read_text())
    entry = manifest["files"][layout.STATE_FILE]
    assert entry["bytes"] == (workdir / "ckpt" / "step-4" / layout.STATE_FILE).stat().st_size
    assert len(entry["sha256"]) == 64
    assert not [p for p in (workdir / "ckpt").iterdir() if p.name.startswith(".tmp")]
    step, source, state = fresh_load(workdir)
    assert (step, source) == (4, "disk")
    assert state == expected_fingerprint(4)


def test_save_and_purge_keeps_last_k_checkpoints(workdir: Path) -> None:
    train_and_save(workdir, steps=10, interval=1, keep=3)
    assert saved_steps(workdir / "ckpt") == [8, 9, 10]


def test_folder_without_manifest_or_with_tmp_name_is_never_loaded(workdir: Path) -> None:
    train_and_save(workdir, steps=2, interval=2, keep=3)
    ckpt_dir = workdir / "ckpt"
    (ckpt_dir / "step-9").mkdir()
    (ckpt_dir / "step-9" / layout.STATE_FILE).write_bytes(b"torn")
    (ckpt_dir / ".tmp-step-11-123-abc").mkdir()
    step, source, state = fresh_load(workdir)
    assert (step, source) == (2, "disk")
    assert state == expected_fingerprint(2)


def test_corrupted_newest_checkpoint_falls_back_to_previous(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train_and_save(workdir, steps=6, interval=3, keep=3)
    newest = workdir / "ckpt" / "step-6" / layout.STATE_FILE
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[-1] ^= 0x01
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="phalanx.worker.checkpoint.durable"):
        step, source, state = fresh_load(workdir)
    assert (step, source) == (3, "disk")
    assert state == expected_fingerprint(3)
    assert any(
        "step-6" in record.message and "sha256 mismatch" in record.message for record in caplog.records
    )


def test_fresh_start_without_any_state(workdir: Path) -> None:
    step, source, _ = fresh_load(workdir)
    assert (step, source) == (0, "none")


def test_purge_removes_leftovers_of_dead_writers(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        tmp = durable.new_tmp_dir(tmp_path, step)
        (tmp / "a.bin").write_bytes(b"x" * step)
        durable.commit(tmp, step, "replicated")
    (tmp_path / ".tmp-step-2-1-dead").mkdir()
    (tmp_path / "step-1x").mkdir()
    (tmp_path / "step-0").mkdir()
    removed = {path.name for path in durable.purge(tmp_path, keep=2)}
    assert removed == {"step-1", ".tmp-step-2-1-dead", "step-0"}
    assert saved_steps(tmp_path) == [2, 3]


def test_manifest_problems_are_named() -> None:
    manifest = layout.build_manifest(5, {"state.bin": (3, "ab" * 32)}, "replicated")
    assert layout.manifest_problem(manifest, 5) is None
    assert "names step 5" in (layout.manifest_problem(manifest, 6) or "")
    assert layout.steps_to_purge([1, 5, 3, 4], keep=2) == [3, 1]
    assert layout.steps_to_purge([1, 2], keep=0) == []


def test_resumed_training_keeps_going_from_the_loaded_step(workdir: Path) -> None:
    train_and_save(workdir, steps=4, interval=4, keep=3)
    cleanup_snapshots(directory=workdir / "ckpt")
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=2, keep=3)
    start = ckpt.load()
    for step in range(start + 1, start + 3):
        advance_to(state, step)
        ckpt.save(step)
    ckpt.close()
    assert saved_steps(workdir / "ckpt") == [4, 6]


def plant_torn(directory: Path, step: int) -> None:
    """A step folder renamed into place whose manifest was never written (a writer died in between)."""
    (directory / layout.step_dir_name(step)).mkdir()
    (directory / layout.step_dir_name(step) / layout.STATE_FILE).write_bytes(b"half a checkpoint")


def plant_copy(directory: Path, source: int, step: int, **manifest_changes: object) -> Path:
    """Step `source`'s checkpoint again as step `step`, its manifest changed as given."""
    target = directory / layout.step_dir_name(step)
    target.mkdir()
    original = directory / layout.step_dir_name(source)
    (target / layout.STATE_FILE).write_bytes((original / layout.STATE_FILE).read_bytes())
    manifest = json.loads((original / layout.MANIFEST_NAME).read_text())
    manifest.update(step=step, **manifest_changes)
    (target / layout.MANIFEST_NAME).write_text(json.dumps(manifest))
    return target


def test_a_restore_names_every_checkpoint_it_passed_over_and_why(workdir: Path) -> None:
    train_and_save(workdir, steps=6, interval=2, keep=3)
    ckpt_dir = workdir / "ckpt"
    plant_torn(ckpt_dir, 12)
    plant_copy(ckpt_dir, 6, 10, format=layout.MANIFEST_FORMAT + 1)
    sharded = durable.new_tmp_dir(ckpt_dir, 9)
    (sharded / "__0_0.distcp").write_bytes(b"a shard")
    durable.commit(sharded, 9, "sharded")
    corrupt = plant_copy(ckpt_dir, 6, 8)
    data = bytearray((corrupt / layout.STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / layout.STATE_FILE).write_bytes(bytes(data))
    (ckpt_dir / "step-7").mkdir()
    (ckpt_dir / "step-7" / layout.MANIFEST_NAME).write_text("{not json")
    (ckpt_dir / ".tmp-step-14-123-abc").mkdir()  # being written: no checkpoint yet, so none passed over

    cleanup_snapshots(directory=ckpt_dir)
    state = build_state()
    ckpt = Checkpointer(state, ckpt_dir, durable_tier=None)
    assert ckpt.load() == 6
    assert state.step == 6 and fingerprint(state) == expected_fingerprint(6)
    info = ckpt.last_restore
    ckpt.close()
    assert info is not None and info.source == "disk"
    # Newest first; the older step 4 and 2 were never looked at, so they are not named.
    assert [(entry.step, entry.tier, entry.reason) for entry in info.skipped] == [
        (12, skipped.TIER_DURABLE, skipped.TORN),
        (10, skipped.TIER_DURABLE, skipped.OTHER_FORMAT),
        (9, skipped.TIER_DURABLE, skipped.OTHER_FORMAT),
        (8, skipped.TIER_DURABLE, skipped.CORRUPT),
        (7, skipped.TIER_DURABLE, skipped.CORRUPT),
    ]
    messages = {entry.step: entry.message for entry in info.skipped}
    assert messages[12] == "no manifest (incomplete)"
    assert messages[10] == f"unknown manifest format {layout.MANIFEST_FORMAT + 1}"
    assert messages[9] == "a sharded checkpoint; this restore takes replicated ones"
    assert messages[8] == "state.bin: sha256 mismatch (file corrupt)"
    assert messages[7].startswith("unreadable manifest:")


def test_a_restore_that_passed_over_nothing_names_nothing(workdir: Path) -> None:
    train_and_save(workdir, steps=4, interval=2, keep=3)
    cleanup_snapshots(directory=workdir / "ckpt")
    ckpt = Checkpointer(build_state(), workdir / "ckpt", durable_tier=None)
    assert ckpt.load() == 4
    assert ckpt.last_restore is not None and ckpt.last_restore.skipped == ()
    # A torn folder older than the state restored was never a candidate: the purge's business, not the restore's.
    plant_torn(workdir / "ckpt", 3)
    cleanup_snapshots(directory=workdir / "ckpt")
    again = Checkpointer(build_state(), workdir / "ckpt", durable_tier=None)
    assert again.load() == 4 and again.last_restore is not None and again.last_restore.skipped == ()
    ckpt.close()
    again.close()


def test_each_restore_names_only_what_it_passed_over(workdir: Path) -> None:
    """A restore from memory looks at no checkpoint older than the snapshot; a later one starts a new list."""
    train_and_save(workdir, steps=4, interval=2, keep=3)
    plant_torn(workdir / "ckpt", 9)
    cleanup_snapshots(directory=workdir / "ckpt")
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=100, durable_tier=None)
    assert ckpt.load() == 4
    assert ckpt.last_restore is not None
    assert [entry.step for entry in ckpt.last_restore.skipped] == [9]
    for step in range(5, 11):
        advance_to(state, step)
        ckpt.save(step)
    # The snapshot of step 10 is newer than the torn folder: nothing on disk is looked at.
    assert ckpt.load() == 10
    assert ckpt.last_restore is not None and ckpt.last_restore.source == "memory"
    assert ckpt.last_restore.skipped == ()
    ckpt.close()


def test_a_step_folder_appears_with_its_manifest_and_two_writers_of_one_step_both_end_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer's emergency save on SIGTERM and its persister may commit the same step at once. Each used to
    take the other's folder, renamed in but not yet given its manifest, for a dead writer's and remove it
    under the other's manifest write (`FileNotFoundError` in the save on SIGTERM)."""
    real_rename = durable.os.rename
    renamed: list[bool] = []

    def other_writer_first(source: str | Path, target: str | Path) -> None:
        # Whatever is renamed into place already carries its manifest.
        renamed.append((Path(source) / layout.MANIFEST_NAME).exists())
        if not renamed[1:]:
            rival = durable.new_tmp_dir(tmp_path, 8)
            (rival / "state.bin").write_bytes(b"same state")
            durable.commit(rival, 8, "replicated")  # the other writer wins the race to the name
        real_rename(source, target)

    monkeypatch.setattr(durable.os, "rename", other_writer_first)
    mine = durable.new_tmp_dir(tmp_path, 8)
    (mine / "state.bin").write_bytes(b"same state")
    final = durable.commit(mine, 8, "replicated")
    assert final == tmp_path / "step-8"
    assert all(renamed) and len(renamed) == 2
    manifest, problem = durable.verify(final, 8)
    assert problem is None and manifest is not None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step-8"]
