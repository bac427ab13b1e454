"""SIGKILL of the saver process at random moments never leaves a checkpoint that loads torn."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import torch
from helpers import advance_to, build_state, fingerprint

from phalanx.worker import Checkpointer
from phalanx.worker.checkpoint import durable, layout, payload

SAVES = 60
WIDTH = 512
"""About 2 MB of state: large enough that a kill often lands inside the write or the fsync."""


def load_checkpoint(path: Path) -> dict:
    """Read one durable checkpoint's state the way the loader does (after verification)."""
    buffer = torch.frombuffer(bytearray((path / layout.STATE_FILE).read_bytes()), dtype=torch.uint8)
    content = payload.read_from(buffer)
    state = build_state(width=WIDTH)
    state.load_state_dict(content["state"])
    return fingerprint(state)


def expected(step: int) -> dict:
    state = build_state(width=WIDTH)
    advance_to(state, step)
    return fingerprint(state)


def test_sigkill_of_saver_never_yields_a_torn_checkpoint(workdir: Path) -> None:
    rng = random.Random(20240601)
    directory = workdir / "ckpt"
    state = build_state(width=WIDTH)
    ckpt = Checkpointer(state, directory, interval_steps=1, keep=0)
    kills = 0
    verified_loads = 0
    for step in range(1, SAVES + 1):
        advance_to(state, step)
        ckpt.save(step)
        pid = ckpt.saver_pid
        if pid is not None and rng.random() < 0.5:
            # Anywhere from the saver's start-up to after its commit.
            time.sleep(rng.uniform(0.0, 0.25))
            try:
                os.kill(pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        else:
            ckpt.wait()
        found = durable.newest_loadable(directory)
        if found is not None:
            assert load_checkpoint(found.path) == expected(found.step), f"torn load at step {found.step}"
            verified_loads += 1
    ckpt.close()
    assert kills >= 15
    assert ckpt.stats["persists_total"] >= 10
    complete = durable.complete_steps(directory)
    assert complete, "no checkpoint survived at all"
    for step in complete:
        path = directory / layout.step_dir_name(step)
        manifest, problem = durable.verify(path, step)
        assert manifest is not None, f"{path.name} has a manifest but fails verification: {problem}"
        assert load_checkpoint(path) == expected(step)
    assert verified_loads > 0
    assert ckpt.stats["saver_restarts_total"] >= 1
