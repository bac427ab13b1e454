"""The preflight on real launcher processes: record, restart from the durable checkpoint, compare."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from localjob import LocalJob

from phalanx.worker import preflight
from phalanx.worker.checkpoint import durable
from phalanx.worker.checkpoint.durable import probe_directory as probe_storage
from phalanx.worker.exitcodes import LauncherExit

EXAMPLE = ["--steps", "16", "--global-batch", "16", "--micro-batch", "8", "--checkpoint-interval", "50"]
PREFLIGHT = {"PHALANX_PREFLIGHT_STEPS": "8"}


def _preflight_files(job: LocalJob) -> set[str]:
    return {path.name for path in (job.checkpoint_dir / "preflight").iterdir()}


def test_the_preflight_restarts_from_the_durable_checkpoint_and_training_goes_on(job: LocalJob) -> None:
    job.start_node("a", EXAMPLE, env=PREFLIGHT)
    job.start_node("b", EXAMPLE, env=PREFLIGHT)
    assert job.wait_node("a", 180) == 0, job.node_output("a")
    assert job.wait_node("b", 180) == 0, job.node_output("b")
    assert job.any_summary()["final_step"] == 16
    # The group restarted once for the preflight, without spending a restart on it, and every rank
    # restored the half-way checkpoint from the durable storage although its memory held newer steps.
    assert "preflight: restart from its checkpoint" in job.node_output("a")
    from_disk = [event for event in job.restores() if event["step"] == 4]
    assert {(event["rank"], event["source"]) for event in from_disk} == {(0, "disk"), (1, "disk")}
    assert {"passed-rank-0.json", "passed-rank-1.json"} <= _preflight_files(job)
    verdict = json.loads((job.checkpoint_dir / "preflight" / "passed-rank-0.json").read_text())
    assert verdict["passed"] and "bitwise" in verdict["message"]
    # Steps 5-8 were trained twice with the same losses; the run went on from step 8 once.
    losses = {}
    for record in job.steps():
        assert losses.setdefault(record["step"], record["loss"]) == record["loss"]
    assert sorted(losses) == list(range(1, 17))


def test_a_resume_that_does_not_continue_the_run_fails_the_preflight(job: LocalJob) -> None:
    broken = [*EXAMPLE, "--nondeterministic-resume"]
    job.start_node("a", broken, env=PREFLIGHT)
    job.start_node("b", broken, env=PREFLIGHT)
    assert job.wait_node("a", 180) == LauncherExit.PREFLIGHT_FAILED, job.node_output("a")
    assert job.wait_node("b", 180) == LauncherExit.PREFLIGHT_FAILED, job.node_output("b")
    verdict = json.loads((job.checkpoint_dir / "preflight" / "failed.json").read_text())
    assert verdict["reason"] == "ResumeMismatch" and "loss at step 5" in verdict["message"]
    assert max(record["step"] for record in job.steps()) <= 8  # nothing trained past the preflight


def test_a_checkpoint_location_the_pods_do_not_share_fails_the_preflight(job: LocalJob) -> None:
    for name in ("a", "b"):
        job.start_node(name, [*EXAMPLE, "--checkpoint-dir", str(job.root / f"local-{name}")], env=PREFLIGHT)
    assert job.wait_node("a", 180) == LauncherExit.PREFLIGHT_FAILED, job.node_output("a")
    assert job.wait_node("b", 180) == LauncherExit.PREFLIGHT_FAILED, job.node_output("b")
    verdicts = [json.loads(path.read_text()) for path in job.root.glob("local-*/preflight/failed.json")]
    (verdict,) = verdicts  # written by rank 0
    assert verdict["reason"] == "RestoreFailed" and "not shared by the pods" in verdict["message"]


def test_with_a_node_local_tier_the_preflight_restores_from_the_durable_tier(job: LocalJob) -> None:
    durable_dir = job.root / "durable"
    tiered = {
        **PREFLIGHT,
        "PHALANX_CHECKPOINT_LOCAL_TIER": "1",
        "PHALANX_CHECKPOINT_DURABLE_URL": str(durable_dir),
        "PHALANX_CHECKPOINT_DURABLE_EVERY": "3",
    }
    for name in ("a", "b"):
        job.start_node(name, [*EXAMPLE, "--checkpoint-dir", str(job.root / f"local-{name}")], env=tiered)
    assert job.wait_node("a", 180) == 0, job.node_output("a")
    assert job.wait_node("b", 180) == 0, job.node_output("b")
    assert job.any_summary()["final_step"] == 16
    # The records and verdicts live on the durable tier, the one place both pods share; the restart found
    # nothing on its node-local tier and restored the half-way checkpoint fetched from the durable tier.
    verdict = json.loads((durable_dir / "preflight" / "passed-rank-0.json").read_text())
    assert verdict["passed"] and "bitwise" in verdict["message"]
    from_disk = [event for event in job.restores() if event["step"] == 4]
    assert {(event["rank"], event["source"]) for event in from_disk} == {(0, "disk"), (1, "disk")}
    assert 4 in durable.complete_steps(durable_dir) and 16 in durable.complete_steps(durable_dir)


def test_an_unusable_checkpoint_location_fails_the_preflight_before_training(
    job: LocalJob, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    env = {**PREFLIGHT, "PHALANX_CHECKPOINT_DIR": str(blocker / "checkpoints")}
    job.start_node("a", EXAMPLE, nnodes="1", env=env)
    assert job.wait_node("a", 60) == LauncherExit.PREFLIGHT_FAILED, job.node_output("a")
    output = job.node_output("a")
    assert "preflight failed" in output and "cannot create the directory" in output
    assert job.steps() == []


@pytest.mark.parametrize("preflight_on", [True, False], ids=["preflight", "no-preflight"])
def test_a_rendezvous_out_of_reach_fails_the_preflight_and_names_it(
    job: LocalJob, preflight_on: bool
) -> None:
    job.stop_store()  # nothing listens at the job's rendezvous endpoint any more
    env = PREFLIGHT if preflight_on else {}
    job.start_node("a", EXAMPLE, nnodes="1", env=env, launcher_args=["--join-timeout", "3"])
    code = job.wait_node("a", 60)
    output = job.node_output("a")
    if preflight_on:
        assert code == LauncherExit.PREFLIGHT_FAILED, output
        assert "preflight failed: a cannot reach the job's rendezvous" in output and job.endpoint in output
    else:  # an infrastructure fault the operator replaces the pod for, as before
        assert code == LauncherExit.RENDEZVOUS_UNREACHABLE, output
    assert job.steps() == []


def test_the_preflight_is_pending_until_the_job_says_it_passed() -> None:
    steps = {"PHALANX_PREFLIGHT_STEPS": "8"}
    assert preflight.pending(steps, None)
    assert preflight.pending(steps, {"status": {"preflight": {"state": "Running"}}})
    assert not preflight.pending(steps, {"status": {"preflight": {"state": "Passed"}}})
    assert not preflight.pending({"PHALANX_PREFLIGHT_STEPS": "0"}, None)
    assert not preflight.pending({}, None)


def test_probing_storage_writes_reads_and_cleans_up(tmp_path: Path) -> None:
    assert probe_storage(tmp_path / "new" / "dir") is None
    assert list((tmp_path / "new" / "dir").iterdir()) == []
    (tmp_path / "file").write_text("")
    problem = probe_storage(tmp_path / "file" / "dir")
    assert problem is not None and "cannot create the directory" in problem


def test_a_permission_problem_says_who_runs_and_who_owns_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root passes every permission check, so the refusal a non-root image meets is simulated."""
    target = tmp_path / "claim" / "job"
    (tmp_path / "claim").mkdir(mode=0o755)

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    problem = probe_storage(target)
    assert problem is not None and "cannot create the directory: Permission denied" in problem
    assert f"runs as uid {os.getuid()}" in problem
    assert f"{tmp_path / 'claim'} belongs to uid" in problem and "mode 755" in problem
    assert "fsGroup" in problem
