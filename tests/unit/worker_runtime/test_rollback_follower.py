"""Rollback requests on the launcher side (worker/rollback.py): passing them to the trainers, and one restart
of the group for each, claimed in the rendezvous store."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from localjob import LocalJob, wait_for

from phalanx.worker import rendezvous
from phalanx.worker.checkpoint.rollback import ROLLBACK_ENV, RollbackRequest
from phalanx.worker.env import ROLLBACK_EPOCH_KEY
from phalanx.worker.regroup import Claim
from phalanx.worker.rollback import RollbackFollower, claim_rollback, needs_restart, rollback_of


@pytest.fixture
def store() -> Iterator[dist.Store]:
    server = rendezvous.serve("127.0.0.1", 0)
    yield rendezvous.connect("127.0.0.1", server.port, timeout=5)
    del server


def job_with(rollback: Any) -> dict[str, Any]:
    return {"spec": {"replicas": 2}, "status": {"rollback": rollback}}


REQUEST = {"epoch": 2, "atOrBeforeStep": 29, "skipBatches": 0, "fromStep": 41, "reason": "NonFiniteLoss: nan"}


def test_the_request_of_a_trainingjob() -> None:
    assert rollback_of(job_with(REQUEST)) == RollbackRequest(2, 29, 0, 41, "NonFiniteLoss: nan")
    assert rollback_of(job_with(None)) is None
    assert rollback_of(job_with({"epoch": "x"})) is None
    assert rollback_of(None) is None


def test_needs_restart_only_for_a_group_started_before_the_request_reached_it() -> None:
    assert needs_restart(100.0, 101.0)
    assert not needs_restart(102.0, 101.0)
    assert not needs_restart(None, 101.0)


def test_one_claim_of_many_wins(store: dist.Store) -> None:
    store.set(ROLLBACK_EPOCH_KEY, "1")
    claims = [claim_rollback(store, 2, f"launcher-{index}") for index in range(3)]
    assert claims.count(Claim.WON) == 1 and claims.count(Claim.DONE) == 2
    assert claim_rollback(store, 1, "late") is Claim.DONE


def test_an_absent_key_is_seeded_without_a_restart(store: dist.Store) -> None:
    assert claim_rollback(store, 3, "a") is Claim.SEEDED


class Launcher:
    """One launcher's follower over a shared store, with its own environment and group start time."""

    def __init__(self, store: dist.Store, job: dict[str, Any], started: float | None, now: float) -> None:
        self.job = job
        self.started = started
        self.now = now
        self.environ: dict[str, str] = {}
        self.follower = RollbackFollower(
            lambda: self.job,
            lambda: store,
            lambda: self.started,
            writer=f"w{id(self)}",
            interval=1.0,
            environ=self.environ,
            clock=lambda: self.now,
        )


def test_a_request_restarts_the_running_groups_once(store: dist.Store) -> None:
    job = job_with(None)
    launchers = [Launcher(store, job, started=100.0, now=200.0) for _ in range(3)]
    for launcher in launchers:
        launcher.follower.seed()
    assert store.get(ROLLBACK_EPOCH_KEY).decode() == "0"
    assert all(launcher.follower.tick() is None for launcher in launchers)
    epoch_before = rendezvous.read_restart_epoch(store)
    job["status"]["rollback"] = REQUEST
    claims = [launcher.follower.tick() for launcher in launchers]
    assert claims.count(Claim.WON) == 1 and claims.count(Claim.DONE) == 2
    assert rendezvous.read_restart_epoch(store) == epoch_before + 1
    for launcher in launchers:
        assert json.loads(launcher.environ[ROLLBACK_ENV])["atOrBeforeStep"] == 29
    # Looked at again (the groups restarted, or not yet): nothing more.
    assert all(launcher.follower.tick() is None for launcher in launchers)
    assert rendezvous.read_restart_epoch(store) == epoch_before + 1


def test_a_group_started_with_the_request_or_none_at_all_is_not_restarted(store: dist.Store) -> None:
    job = job_with(REQUEST)
    idle = Launcher(store, job, started=None, now=200.0)
    idle.follower.seed()
    epoch_before = rendezvous.read_restart_epoch(store)
    assert idle.follower.tick() is None and ROLLBACK_ENV in idle.environ
    idle.started = 201.0  # the next group starts with the request in its environment
    assert idle.follower.tick() is None and idle.follower.settled == 2
    assert rendezvous.read_restart_epoch(store) == epoch_before
    # A newer request reaches a running group: it restarts; an older one is ignored.
    job["status"]["rollback"] = {**REQUEST, "epoch": 3, "atOrBeforeStep": 50}
    idle.now = 300.0
    assert idle.follower.tick() is Claim.WON
    assert json.loads(idle.environ[ROLLBACK_ENV])["epoch"] == 3
    job["status"]["rollback"] = REQUEST
    assert idle.follower.tick() is None and json.loads(idle.environ[ROLLBACK_ENV])["epoch"] == 3


# -- real launchers ---------------------------------------------------------------------------------


def write_job(path: Path, rollback: dict[str, Any] | None) -> None:
    job = {"metadata": {"name": "job"}, "spec": {"replicas": 2}, "status": {}}
    if rollback is not None:
        job["status"]["rollback"] = rollback
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(job))
    os.replace(temporary, path)


def test_a_rollback_request_restarts_the_group_from_a_checkpoint_before_the_anomaly(
    job: LocalJob, tmp_path: Path
) -> None:
    job_file = tmp_path / "trainingjob.json"
    write_job(job_file, None)
    # Step 12's batch gives a NaN loss whenever it is trained; trained through, every later loss is NaN.
    example = ["--steps", "40", "--step-delay", "0.1", "--global-batch", "16", "--checkpoint-interval", "5"]
    example += ["--checkpoint-keep", "10", "--nan-batch-of-step", "12", "--no-loss-guard"]
    follow = ["--job-file", str(job_file), "--heartbeat-interval", "1"]
    job.start_node("a", example, launcher_args=follow)
    job.start_node("b", example, launcher_args=follow)
    wait_for(lambda: job.last_step() >= 16, 120, "the group to train past the NaN")
    assert all(math.isnan(record["loss"]) for record in job.steps() if record["step"] >= 12)
    reached = job.last_step()
    request = {"epoch": 1, "atOrBeforeStep": 10, "skipBatches": "all", "fromStep": reached, "reason": "NaN"}
    write_job(job_file, request)
    for name in ("a", "b"):
        assert job.wait_node(name, 180) == 0, job.node_output(name)

    outputs = {name: job.node_output(name) for name in ("a", "b")}
    claimers = [
        name for name, text in outputs.items() if "rollback 1 (NaN): restarting the worker group" in text
    ]
    assert len(claimers) == 1, outputs
    rolled = [event for event in job.restores() if event["reason"] == "start" and 0 < event["step"] <= 10]
    assert rolled and {event["step"] for event in rolled} == {10}, job.restores()
    assert {event["source"] for event in rolled} == {"disk"}
    # Once restored, the run never goes back again, and the bad batch (skipped) never returns.
    after = [record for record in job.steps() if record["time"] > rolled[0]["time"]]
    assert after[0]["step"] == 11 and all(math.isfinite(record["loss"]) for record in after)
    summary = job.any_summary()
    assert summary["final_step"] == 40 and math.isfinite(summary["final_loss"])
    assert (job.checkpoint_dir / "rolled-back" / "epoch-1" / "step-15").is_dir()
