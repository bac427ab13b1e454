"""In-memory snapshots outlive the process that wrote them, and a crash mid-write keeps the previous one."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import WORKER, advance_to, build_state, expected_fingerprint, fingerprint, run_ranks

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import payload, shm_store, slots


def test_snapshot_survives_the_writing_process(workdir: Path) -> None:
    writer = run_ranks("snapshot_writer", 1, workdir, extra={"steps": 4})[0]
    reader = run_ranks("snapshot_reader", 1, workdir)[0]
    assert reader["pid"] != writer["pid"]
    assert (reader["step"], reader["source"]) == (4, "memory")
    assert reader["state"] == expected_fingerprint(4)
    assert not (workdir / "ckpt").exists() or not list((workdir / "ckpt").iterdir()), "disk was touched"


def test_crash_mid_write_leaves_previous_snapshot_intact(workdir: Path) -> None:
    # The writer kills itself, so it runs without the result file run_ranks expects.
    process = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            "snapshot_writer",
            "0",
            "1",
            "0",
            str(workdir),
            '{"steps": 5, "crash_at": 5, "width": 256}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == -9, process.stdout + process.stderr
    store = shm_store.SnapshotStore(shm_store.store_dir(shm_store.job_namespace(workdir / "ckpt"), 0))
    states = sorted(
        (header.get("state"), header.get("step")) for header in store.headers().values() if header
    )
    assert ("writing", None) in states, f"the crash did not happen mid-write: {states}"
    reader = run_ranks("snapshot_reader", 1, workdir, extra={"width": 256})[0]
    assert (reader["step"], reader["source"]) == (4, "memory")
    expected = build_state(width=256)
    advance_to(expected, 4)
    assert reader["state"] == fingerprint(expected)


def test_snapshot_store_keys_by_job_and_local_rank(workdir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PHALANX_JOB_UID", "job-a")
    a = shm_store.job_namespace(workdir / "ckpt")
    monkeypatch.setenv("PHALANX_JOB_UID", "job-b")
    b = shm_store.job_namespace(workdir / "ckpt")
    monkeypatch.delenv("PHALANX_JOB_UID")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    assert shm_store.job_namespace(workdir / "ckpt") == a
    assert a != b
    assert shm_store.store_dir(a, 0) != shm_store.store_dir(a, 1)


def test_torn_header_is_ignored_and_cleanup_removes_snapshots(workdir: Path) -> None:
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    ckpt.save(1)
    ckpt.save(2)
    newest = ckpt.store.newest()
    assert newest is not None and newest.step == 2
    with open(newest.path, "r+b") as handle:
        handle.seek(40)
        handle.write(b"\x00\x01\x02")
    assert slots.read_header(newest.path) is None
    survivor = ckpt.store.newest()
    assert survivor is not None and survivor.step == 1
    ckpt.close()
    assert cleanup_snapshots(directory=workdir / "ckpt") == 1
    assert not shm_store.store_dir(ckpt.namespace, 0).exists()


def test_a_snapshot_that_does_not_fit_says_what_to_change(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A full tmpfs would SIGBUS a write into the mapping; the slot's memory is claimed first instead."""
    store = shm_store.SnapshotStore(tmp_path / "store")
    slot = store.slot_paths[0]

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(shm_store.SnapshotSpaceError, match=r"spec\.sharedMemory\.sizeLimit") as raised:
        store._mapping(slot, 5 * 2**20, pin=False)
    assert "a slot needs 5 MiB" in str(raised.value) and "64 MiB" in str(raised.value)
    assert not slot.exists() or slot.stat().st_size == 0  # nothing was mapped over unreserved memory


def test_a_save_interrupted_while_holding_the_stores_lock_still_gets_a_slot_the_helper_is_preparing(
    tmp_path: Path,
) -> None:
    """SIGTERM may interrupt the training thread while it holds the store's lock (opening a slot's file), as the
    slot-preparing helper starts on a slot whose file is not open yet. The handler's save on that thread must
    still get the slot: the helper never holds a slot's lock while it waits for the store's."""
    import threading
    import time

    store = shm_store.SnapshotStore(tmp_path / "store")
    slot = store.slot_paths[0]
    got: list[object] = []

    def handler_on_the_training_thread() -> None:
        with store._lock:  # the interrupted code's hold
            helper = threading.Thread(target=store._mapping, args=(slot, 2**20, False), daemon=True)
            helper.start()
            time.sleep(0.5)  # the helper is at the store's lock by now
            got.append(store._mapping(slot, 2**20, pin=False))  # the handler's save

    training = threading.Thread(target=handler_on_the_training_thread, daemon=True)
    training.start()
    training.join(60)
    assert not training.is_alive(), "the handler's save waits for a slot the helper holds"
    assert len(got) == 1
    store.close()


def test_slot_files_removed_under_the_preparing_helper_end_it_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's folder removed while the helper prepares its slots (a pod's /dev/shm wiped, a test's folder
    cleaned up): torch cannot map a file that is gone and raises RuntimeError, not OSError. The helper logs it
    and stops, as for a slot that does not fit; it never dies with an unhandled exception."""
    import shutil
    import threading

    store = shm_store.SnapshotStore(tmp_path / "store")
    open_fd = store._fd

    def open_then_removed(slot: Path) -> int:
        fd = open_fd(slot)
        shutil.rmtree(slot.parent, ignore_errors=True)
        return fd

    monkeypatch.setattr(store, "_fd", open_then_removed)
    unhandled: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))
    store.prepare(2**20, pin=False)
    store.wait_prepared()
    assert unhandled == []
    store.close()


def _commit(root: Path, namespace: str, local_rank: int, step: int) -> None:
    store = shm_store.SnapshotStore(shm_store.store_dir(namespace, local_rank, root))
    plan = payload.plan({"step": step, "weights": torch.zeros(4)})
    store.write(plan, {"step": step})
    store.close()


def test_the_launcher_reads_the_newest_step_its_pod_holds_from_the_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a launcher offers when its group re-forms (worker/rendezvous.py): any checkpointer of this job, any
    # local rank, committed snapshots only; other jobs' snapshots on the node do not count.
    monkeypatch.setenv("PHALANX_JOB_UID", "job")
    assert shm_store.newest_held_step(tmp_path) == -1
    _commit(tmp_path, shm_store.job_namespace(tmp_path / "ckpt"), 0, 12)
    _commit(tmp_path, shm_store.job_namespace(tmp_path / "ckpt"), 1, 13)
    _commit(tmp_path, shm_store.job_namespace(tmp_path / "other-ckpt"), 0, 9)
    monkeypatch.setenv("PHALANX_JOB_UID", "job-2")  # a job whose id starts with this one's
    _commit(tmp_path, shm_store.job_namespace(tmp_path / "ckpt"), 0, 99)
    monkeypatch.setenv("PHALANX_JOB_UID", "job")
    assert shm_store.newest_held_step(tmp_path) == 13
    newest = shm_store.SnapshotStore(
        shm_store.store_dir(shm_store.job_namespace(tmp_path / "ckpt"), 1, tmp_path)
    )
    newest.drop(lambda info: True)  # a rollback abandoned it: not held any more
    assert shm_store.newest_held_step(tmp_path) == 12
