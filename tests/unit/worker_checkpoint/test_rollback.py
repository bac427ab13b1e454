"""Rollback to a step chosen by the operator: the pure rules, the data cursor's skip, and real restores (one
process, and a group whose ranks were given different requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import advance_to, build_state, expected_fingerprint, fingerprint, run_ranks

from phalanx.worker import Checkpointer
from phalanx.worker.checkpoint import durable, rollback, shm_store
from phalanx.worker.checkpoint.rollback import RollbackRequest
from phalanx.worker.data import ElasticSampler

# ------------------------------------------------------------------------------------------- pure rules


def test_a_request_from_the_status_or_the_environment() -> None:
    raw = {"epoch": 2, "atOrBeforeStep": 29, "skipBatches": "all", "fromStep": 41, "reason": "NaN"}
    request = rollback.request_from(raw)
    assert request == RollbackRequest(2, 29, rollback.SKIP_SEEN, 41, "NaN")
    assert rollback.from_env({rollback.ROLLBACK_ENV: request.to_env()}) == request
    assert rollback.from_env({}) is None
    assert rollback.from_env({rollback.ROLLBACK_ENV: "{not json"}) is None
    assert rollback.request_from({"epoch": 0, "atOrBeforeStep": 3}) is None
    assert rollback.request_from({"epoch": 1, "atOrBeforeStep": -1}) is None
    assert rollback.request_from({"epoch": True, "atOrBeforeStep": 3}) is None
    assert rollback.request_from({"epoch": 1, "atOrBeforeStep": 3, "skipBatches": "x"}) == RollbackRequest(
        1, 3
    )
    assert rollback.parse_skip(5) == 5 and rollback.parse_skip("ALL") == rollback.SKIP_SEEN
    assert rollback.parse_skip(-4) == 0


def test_ranks_follow_the_newest_request_any_of_them_was_given() -> None:
    newer, older = RollbackRequest(3, 20, 5, 44), RollbackRequest(2, 30)
    offers = [older.as_ints(), rollback.NO_REQUEST_INTS, newer.as_ints()]
    assert rollback.agree(offers) == RollbackRequest(3, 20, 5, 44)
    assert rollback.agree([rollback.NO_REQUEST_INTS, rollback.NO_REQUEST_INTS]) is None
    assert rollback.from_ints(RollbackRequest(1, 0).as_ints()) == RollbackRequest(1, 0)


def test_the_abandoned_run_is_never_restored() -> None:
    request = RollbackRequest(epoch=2, at_or_before_step=30)
    assert rollback.restorable(30, 0, request) and rollback.restorable(12, 1, request)
    assert not rollback.restorable(31, 1, request)  # saved before the rollback, past its step
    assert rollback.restorable(45, 2, request) and rollback.restorable(45, 3, request)  # the new run
    assert rollback.restorable(99, 0, None)
    assert rollback.abandoned(31, 1, request) and not rollback.abandoned(31, 2, request)
    assert rollback.newest_restorable([(40, 1), (30, 0), (20, 1)], request) == (30, 0)
    assert rollback.newest_restorable([(40, 1), (35, 2)], request) == (35, 2)
    assert rollback.newest_restorable([(40, 1)], request) is None


def test_a_rollback_applies_once() -> None:
    request = RollbackRequest(epoch=2, at_or_before_step=30)
    assert rollback.applies(request, 1) and rollback.applies(request, 0)
    assert not rollback.applies(request, 2) and not rollback.applies(None, 0)
    assert rollback.lineage_epoch(request, 1) == 2 and rollback.lineage_epoch(None, 2) == 2
    assert rollback.epoch_of({rollback.EPOCH_KEY: 4}) == 4 and rollback.epoch_of({}) == 0
    assert rollback.epoch_of(None) == 0


def test_memory_candidates_of_the_newest_step_and_epoch() -> None:
    assert rollback.newest_held([(30, 0), (30, 1), (20, 1)]) == (30, 1, [1])
    assert rollback.newest_held([(30, 1), (-1, 0), (30, 1)]) == (30, 1, [0, 2])
    assert rollback.newest_held([(-1, 0), (-1, 0)]) == (-1, 0, [])


def test_batches_to_skip() -> None:
    assert rollback.batches_to_skip(RollbackRequest(1, 30, 7, 45), 20) == 7
    assert rollback.batches_to_skip(RollbackRequest(1, 30, rollback.SKIP_SEEN, 45), 20) == 25
    assert rollback.batches_to_skip(RollbackRequest(1, 30, rollback.SKIP_SEEN, None), 20) == 0
    assert rollback.batches_to_skip(RollbackRequest(1, 30, rollback.SKIP_SEEN, 10), 20) == 0


def test_the_sampler_skips_whole_global_batches_across_epochs() -> None:
    sampler = ElasticSampler(10, global_batch_size=4, seed=1)  # two batches per epoch
    reference = ElasticSampler(10, global_batch_size=4, seed=1)
    sampler.next_global_batch()
    reference.next_global_batch()
    assert sampler.skip_batches(3) == [(0, 4), (1, 0), (1, 4)]
    for _ in range(3):
        reference.next_global_batch()
    assert sampler.next_global_batch() == reference.next_global_batch()
    assert sampler.skip_batches(0) == []


# ------------------------------------------------------------------------------------------- one process


def train(ckpt: Checkpointer, state: object, first: int, last: int) -> None:
    for step in range(first, last + 1):
        advance_to(state, step)
        ckpt.save(step)
        if step % 10 == 0:
            ckpt.wait()  # every durable save lands under its own step
    ckpt.wait()


def snapshot_steps(directory: Path) -> list[int]:
    store = shm_store.SnapshotStore(shm_store.store_dir(shm_store.job_namespace(directory), 0))
    return sorted(int(h["step"]) for h in store.headers().values() if h and h.get("state") == "committed")


def test_rollback_restores_at_or_before_the_step_and_only_once(workdir: Path) -> None:
    directory = workdir / "ckpt"
    state = build_state()
    ckpt = Checkpointer(state, directory, interval_steps=10, keep=5, snapshot_every=1)
    train(ckpt, state, 1, 40)
    ckpt.close()
    assert durable.complete_steps(directory) == [40, 30, 20, 10]

    request = RollbackRequest(epoch=1, at_or_before_step=25, skip_batches=3, from_step=40)
    state = build_state()
    ckpt = Checkpointer(state, directory, interval_steps=10, keep=5, rollback_request=request)
    assert ckpt.load() == 20
    assert ckpt.last_restore is not None and ckpt.last_restore.source == "disk"
    rolled = ckpt.last_restore.rolled_back
    assert rolled is not None and (rolled.epoch, rolled.set_aside, rolled.dropped) == (
        1,
        (30, 40),
        (38, 39, 40),
    )
    assert rolled.skipped_batches == 0  # the test cursor cannot skip: said in the log, trained again
    assert fingerprint(state) == expected_fingerprint(20)
    assert durable.complete_steps(directory) == [20, 10]
    assert sorted(p.name for p in (directory / "rolled-back" / "epoch-1").iterdir()) == ["step-30", "step-40"]
    assert snapshot_steps(directory) == [20]  # the restored state, as the new run's
    train(ckpt, state, 21, 33)
    ckpt.close()
    manifest = json.loads((directory / "step-30" / "manifest.json").read_text())
    assert manifest[rollback.EPOCH_KEY] == 1

    # A saver of the abandoned run that outlived its trainer commits one more checkpoint late.
    orphan = durable.new_tmp_dir(directory, 45)
    (orphan / "state.bin").write_bytes(b"abandoned")
    durable.commit(orphan, 45, "replicated", None, {"world_size": 1})

    # An ordinary restart later (a lost worker), the same request still in the environment: the newest state
    # of the new run, no second rollback; the late checkpoint is put away with the others.
    state = build_state()
    again = Checkpointer(state, directory, interval_steps=10, keep=5, rollback_request=request)
    assert again.load() == 33
    assert again.last_restore is not None and again.last_restore.rolled_back is None
    assert durable.complete_steps(directory) == [30, 20, 10]
    assert (directory / "rolled-back" / "epoch-1" / "step-45").is_dir()
    assert again.rollback_epoch == 1 and fingerprint(state) == expected_fingerprint(33)
    again.close()
    # Without memory (a new pod): the new run's durable checkpoint, not the abandoned run's.
    shm_store.cleanup_snapshots(directory=directory)
    state = build_state()
    cold = Checkpointer(state, directory, interval_steps=10, keep=5)
    assert cold.load() == 30 and cold.rollback_epoch == 1
    assert fingerprint(state) == expected_fingerprint(30)
    cold.close()


def test_no_state_at_or_before_the_step_starts_from_scratch(workdir: Path) -> None:
    directory = workdir / "ckpt"
    state = build_state()
    ckpt = Checkpointer(state, directory, interval_steps=10, keep=2, snapshot_every=1)
    train(ckpt, state, 1, 30)
    ckpt.close()
    assert durable.complete_steps(directory) == [30, 20]
    state = build_state()
    ckpt = Checkpointer(state, directory, interval_steps=10, rollback_request=RollbackRequest(1, 15))
    assert ckpt.load() == 0
    assert ckpt.last_restore is not None and ckpt.last_restore.source == "none"
    assert ckpt.last_restore.rolled_back is not None and ckpt.last_restore.rolled_back.set_aside == (20, 30)
    assert durable.complete_steps(directory) == []
    ckpt.close()


class SkippingCursor:
    def __init__(self) -> None:
        self.position = 0
        self.skipped = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])

    def skip_batches(self, count: int) -> None:
        self.skipped += count


@pytest.mark.parametrize(("skip", "expected"), [(4, 4), (rollback.SKIP_SEEN, 18)])
def test_the_cursor_skips_the_batches_asked_for(workdir: Path, skip: int, expected: int) -> None:
    directory = workdir / "ckpt"
    state = build_state()
    state.data_cursor = SkippingCursor()
    ckpt = Checkpointer(state, directory, interval_steps=0, snapshot_every=1)
    train(ckpt, state, 1, 24)
    ckpt.close()
    state.data_cursor = SkippingCursor()
    ckpt = Checkpointer(state, directory, interval_steps=0, rollback_request=RollbackRequest(1, 22, skip, 40))
    assert ckpt.load() == 22  # a snapshot at or before the step, in memory
    assert ckpt.last_restore is not None and ckpt.last_restore.source == "memory"
    assert state.data_cursor.skipped == expected
    ckpt.close()


# ------------------------------------------------------------------------------------------- a group


def test_a_group_agrees_on_the_request_of_its_most_informed_rank(workdir: Path) -> None:
    env = [{"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(2)]
    run_ranks("rollback_group", 2, workdir, env, extra={"phase": "train", "last_step": 40})
    # Rank 1's launcher has not seen the request yet: rank 0's carries it for both.
    request = RollbackRequest(epoch=1, at_or_before_step=25, from_step=40)
    env[0][rollback.ROLLBACK_ENV] = request.to_env()
    results = run_ranks("rollback_group", 2, workdir, env, extra={"phase": "load", "last_step": 23})
    assert [(r["step"], r["source"], r["epoch"]) for r in results] == [(20, "disk", 1), (20, "disk", 1)]
    assert results[0]["rolled_back"] == [1, [30, 40], [38, 39, 40]]
    assert results[1]["rolled_back"] == [1, [], [38, 39, 40]]
    assert durable.complete_steps(workdir / "ckpt") == [20]
    # A later restart with the request everywhere: the new run's newest state, from memory, no rollback.
    env[1][rollback.ROLLBACK_ENV] = request.to_env()
    again = run_ranks("rollback_group", 2, workdir, env, extra={"phase": "load"})
    assert [(r["step"], r["source"], r["rolled_back"]) for r in again] == [(23, "memory", None)] * 2
    assert again[0]["cursor"] == expected_fingerprint(23)["cursor"]


def test_sharded_state_rolls_back_too(workdir: Path) -> None:
    env = [{"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(2)]
    saved = run_ranks("sharded_rollback", 2, workdir, env, extra={"phase": "save"})
    assert durable.complete_steps(workdir / "ckpt") == [6, 3]
    for rank_env in env:
        rank_env[rollback.ROLLBACK_ENV] = RollbackRequest(epoch=1, at_or_before_step=4).to_env()
    results = run_ranks("sharded_rollback", 2, workdir, env, extra={"phase": "load"})
    assert [(r["step"], r["source"]) for r in results] == [(3, "memory"), (3, "memory")]
    assert all(result["full"] == saved[0]["full"] for result in results)
    assert results[0]["set_aside"] == [6] and durable.complete_steps(workdir / "ckpt") == [3]
