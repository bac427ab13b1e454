"""SIGTERM emergency save and exact RNG restore."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from helpers import WORKER, advance_to, build_state, expected_fingerprint, fingerprint, run_ranks

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import durable


def test_sigterm_emergency_save_then_fresh_process_resumes(workdir: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(WORKER), "sigterm_save", "0", "1", "0", str(workdir), '{"steps": 7}'],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while not (workdir / "ready").exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "trainer never got ready"
        time.sleep(0.05)
    assert durable.complete_steps(workdir / "ckpt") == [], "snapshot-only training wrote to disk"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert durable.complete_steps(workdir / "ckpt") == [7]
    cleanup_snapshots(directory=workdir / "ckpt")  # a new pod: nothing in memory
    reader = run_ranks("snapshot_reader", 1, workdir)[0]
    assert (reader["step"], reader["source"]) == (7, "disk")
    assert reader["state"] == expected_fingerprint(7)


def draws() -> list[float]:
    return [random.random(), float(np.random.rand()), *torch.rand(4).tolist(), *torch.randn(2).tolist()]


def test_rng_states_are_restored_from_memory_and_from_disk(workdir: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=2)
    advance_to(state, 2)
    draws()  # move the generators away from their seeds
    ckpt.save(2)
    ckpt.close()
    after_save = draws()

    for wipe_memory, source in ((False, "memory"), (True, "disk")):
        if wipe_memory:
            cleanup_snapshots(directory=workdir / "ckpt")
        random.seed(100)
        np.random.seed(100)
        torch.manual_seed(100)
        resumed = build_state()
        again = Checkpointer(resumed, workdir / "ckpt")
        assert again.load() == 2
        assert again.last_restore is not None and again.last_restore.source == source
        assert draws() == after_save
        assert fingerprint(resumed) == expected_fingerprint(2)
        again.close()


def test_rng_restored_per_rank_after_group_resume_from_disk(workdir: Path) -> None:
    env = [{"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(2)]
    saved = run_ranks(
        "durable_then_resume", 2, workdir, env, extra={"phase": "save", "steps": 2, "interval": 2}
    )
    fresh = [{**entry, "PHALANX_SNAPSHOT_DIR": entry["PHALANX_SNAPSHOT_DIR"] + "-new"} for entry in env]
    resumed = run_ranks("durable_then_resume", 2, workdir, fresh, extra={"phase": "load", "interval": 2})
    assert [result["source"] for result in resumed] == ["disk", "disk"]
    assert [result["draws"] for result in resumed] == [result["draws"] for result in saved]
    assert saved[0]["draws"] != saved[1]["draws"]


def test_the_sigterm_save_completes_when_it_interrupted_a_save_holding_the_slot_locks(workdir: Path) -> None:
    """The SIGTERM save runs in a signal handler on the training thread, which may be inside a save holding
    the store's locks: the handler's own save must not wait for them (it would wait for itself forever)."""
    import contextlib
    import threading

    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=1000)
    advance_to(state, 1)
    ckpt.save(1)
    advance_to(state, 2)  # a step finished, its snapshot not taken: the handler takes it
    store = ckpt.store
    outcome: list[int | None] = []

    def interrupted_save() -> None:
        # As the handler finds them: this very thread holds the store's lock and every slot's.
        with contextlib.ExitStack() as held:
            for lock in (store._lock, *store._slot_locks.values()):
                held.enter_context(lock)
            outcome.append(ckpt.emergency_save())

    thread = threading.Thread(target=interrupted_save, daemon=True)
    thread.start()
    thread.join(120)  # a save that waits for itself never ends; a loaded machine may take long to save
    assert not thread.is_alive(), "the emergency save waited for locks its own thread held"
    ckpt.close()
    assert outcome == [2] and durable.complete_steps(workdir / "ckpt") == [2]
