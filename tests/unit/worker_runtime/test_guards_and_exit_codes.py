"""Non-finite loss rollback under the launcher, the restart-epoch hook, and the launcher's exit codes."""

from __future__ import annotations

import sys

from localjob import LocalJob, wait_for

from phalanx.worker import rendezvous, storeevents, termination
from phalanx.worker.env import RESTART_EPOCH_KEY
from phalanx.worker.exitcodes import LauncherExit, TrainerExit


def test_nan_loss_is_rolled_back_and_training_finishes(job: LocalJob) -> None:
    job.start_node("a", ["--steps", "12", "--nan-at-step", "5"], nnodes="1")
    assert job.wait_node("a", 90) == 0, job.node_output("a")
    summary = job.any_summary()
    assert summary["rollbacks"] == 1
    assert summary["final_step"] == 12
    assert [event["step"] for event in job.restores() if event["reason"] == "non-finite loss"] == [4]
    steps = [record["step"] for record in job.steps()]
    assert steps == list(range(1, 13))


def test_loss_that_stays_non_finite_exits_5_without_a_restart(job: LocalJob) -> None:
    diverging = ["--steps", "12", "--nan-at-step", "4", "--nan-repeat", "3", "--max-rollbacks", "2"]
    job.start_node("a", diverging, nnodes="1")
    assert job.wait_node("a", 90) == LauncherExit.LOSS_DIVERGED, job.node_output("a")
    output = job.node_output("a")
    assert "not retried" in output
    assert output.count("group attempt") == 1, "the launcher restarted a diverged run"
    rollbacks = [event["step"] for event in job.restores() if event["reason"] == "non-finite loss"]
    assert rollbacks == [3, 3], "two rollbacks are allowed, the third non-finite loss ends the run"
    assert job.last_step() == 3


# A training command that completes a step (a new one each attempt), then fails: failures that are not
# the user's command being broken, so each one spends the restart budget.
PROGRESS_THEN_FAIL = (
    "import os, sys\n"
    "from phalanx.worker.heartbeat import StatusPublisher\n"
    "attempt = int(os.environ['PHALANX_GROUP_ATTEMPT'])\n"
    "StatusPublisher.from_env().publish(phase='training', step=attempt)\n"
    "sys.exit(3)\n"
)


def test_restart_budget_spent_on_failures_exits_4(job: LocalJob) -> None:
    job.start_node(
        "a",
        [],
        nnodes="1",
        launcher_args=["--max-restarts", "2"],
        command=[sys.executable, "-c", PROGRESS_THEN_FAIL],
    )
    assert job.wait_node("a", 90) == LauncherExit.RESTART_BUDGET_EXHAUSTED, job.node_output("a")
    output = job.node_output("a")
    assert "restart budget of 2 spent" in output
    assert output.count("group attempt") == 3, "one start and two restarts"


def test_restart_epoch_makes_the_group_restart_at_once(job: LocalJob) -> None:
    job.start_node("a", ["--steps", "30", "--step-delay", "0.1"], nnodes="1")
    wait_for(lambda: job.last_step() >= 5, 60, "training to start")
    store = rendezvous.connect("127.0.0.1", job.port, timeout=5)
    rendezvous.request_restart(store)
    assert job.wait_node("a", 90) == 0, job.node_output("a")
    assert "restart-epoch 0->1" in job.node_output("a")
    resumed = [event for event in job.restores() if event["step"] > 0]
    assert [event["source"] for event in resumed] == ["memory"]


def test_a_launcher_of_a_large_group_looks_at_the_store_when_told_not_at_every_tick(job: LocalJob) -> None:
    """Up to 100,000 nodes (`idle_look_interval`: 200 s between unasked looks), a restart epoch moved without
    an announcement waits for that look, and the announcement is acted on at once."""
    job.start_node("a", ["--steps", "400", "--step-delay", "0.1"], nnodes="1:100000")
    wait_for(lambda: job.last_step() >= 5, 60, "training to start")
    store = rendezvous.connect("127.0.0.1", job.port, timeout=5)
    store.add(RESTART_EPOCH_KEY, 1)  # not announced
    step = job.last_step()
    wait_for(lambda: job.last_step() >= step + 10, 60, "training to go on")
    assert "restart-epoch" not in job.node_output("a")
    storeevents.announce(store)
    wait_for(lambda: "restart-epoch 0->1" in job.node_output("a"), 30, "the announced restart")
    job.nodes["a"].terminate()
    job.wait_node("a", 60)


def test_training_survives_the_rendezvous_store_restarting(job: LocalJob) -> None:
    job.start_node("a", ["--steps", "40", "--step-delay", "0.1"], nnodes="1")
    wait_for(lambda: job.last_step() >= 5, 60, "training to start")
    port = job.port
    job.stop_store()
    wait_for(lambda: "store lost" in job.node_output("a"), 30, "the launcher to notice")
    job.start_store(port)
    assert job.wait_node("a", 90) == 0, job.node_output("a")
    assert "re-forming the group" in job.node_output("a")
    assert job.any_summary()["final_step"] == 40


def test_user_error_exits_1(job: LocalJob) -> None:
    job.start_node("a", [], nnodes="1", command=[sys.executable, "-c", "import sys; sys.exit(7)"])
    assert job.wait_node("a", 90) == LauncherExit.USER_CODE_FAILED, job.node_output("a")
    assert "without completing a step" in job.node_output("a")


def test_a_spare_released_by_a_failed_group_does_not_report_success(job: LocalJob) -> None:
    """The launcher that gives up without an operator closes the rendezvous (torchrun's rule); a spare
    standing by leaves then, with the group's failure, not with 0 (from which the operator would count the
    job finished)."""
    failing = [sys.executable, "-c", "import sys, time; time.sleep(5); sys.exit(7)"]
    # The first failure ends the group: with a restart in between, the spare could win the group's one place
    # in the new round (and fail on its own), which is not what this test is about.
    job.start_node(
        "a", [], nnodes="1", command=failing, launcher_args=["--max-failures-without-progress", "1"]
    )
    job.start_node("spare", [], nnodes="1", command=failing, env={"PHALANX_ROLE": "spare"})
    wait_for(lambda: "-> standby" in job.node_output("spare"), 60, "the spare to stand by")
    assert job.wait_node("a", 120) == LauncherExit.USER_CODE_FAILED, job.node_output("a")
    assert job.wait_node("spare", 60) == LauncherExit.USER_CODE_FAILED, job.node_output("spare")
    assert "the job's group failed: a: " in job.node_output("spare"), job.node_output("spare")


# tinygpt, except on the pod named "a", where the command fails before any step (a node whose training
# crashes while the others' would not).
FAILS_ON_A = (
    "import os, sys, time\n"
    "if os.environ['POD_NAME'] == 'a':\n"
    "    time.sleep(2)\n"
    "    sys.exit(7)\n"
    "from phalanx.worker.examples import tinygpt\n"
    "sys.exit(tinygpt.main(sys.argv[1:]))\n"
)


def test_under_the_operator_a_launcher_that_gives_up_leaves_the_rendezvous_to_its_replacement(
    job: LocalJob, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Under the operator (PHALANX_JOB_NAME) a replaceable give-up (exit 1) does not close the rendezvous: the
    pod that takes the failed one's place (a spare, a replacement) joins and trains, and the operator decides
    about the pod that left. Closed, it took every spare and replacement down with it: one node's crash loop
    ended the job."""
    supervised = {"PHALANX_JOB_NAME": "demo"}
    args = [
        "--steps", "15", "--checkpoint-dir", str(job.checkpoint_dir), "--log-file", str(job.log_file),
        "--summary-file", str(tmp_path / "summary-b.json"),
    ]  # fmt: skip
    command = [sys.executable, "-c", FAILS_ON_A, *args]
    job.start_node("a", [], nnodes="1", command=command, env=supervised)
    assert job.wait_node("a", 120) == LauncherExit.USER_CODE_FAILED, job.node_output("a")
    assert "without completing a step" in job.node_output("a")
    job.start_node("b", [], nnodes="1", command=command, env=supervised)
    assert job.wait_node("b", 120) == 0, job.node_output("b")
    assert job.last_step() == 15


def test_bad_config_exits_2(job: LocalJob) -> None:
    job.start_node("a", [], nnodes="3:1")
    assert job.wait_node("a", 30) == LauncherExit.BAD_CONFIG, job.node_output("a")
    job.start_node("b", [], nnodes="1", command=["no-such-command-phalanx"])
    assert job.wait_node("b", 30) == LauncherExit.BAD_CONFIG
    assert "command not found" in job.node_output("b")


def test_unreachable_rendezvous_exits_3(job: LocalJob) -> None:
    job.stop_store()
    job.start_node("a", [], nnodes="1", launcher_args=["--join-timeout", "3", "--store-timeout", "1"])
    assert job.wait_node("a", 60) == LauncherExit.RENDEZVOUS_UNREACHABLE, job.node_output("a")


# tinygpt whose snapshots find /dev/shm full: the memory cannot be claimed, as in a pod whose shared memory is
# smaller than its state.
SHM_FULL = (
    "import errno, os, sys\n"
    "def full(fd, offset, length):\n"
    "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "os.posix_fallocate = full\n"
    "from phalanx.worker.examples import tinygpt\n"
    "sys.exit(tinygpt.main(sys.argv[1:]))\n"
)


def test_a_snapshot_that_does_not_fit_stops_the_pod_at_once_with_the_reason(job: LocalJob, tmp_path) -> None:  # type: ignore[no-untyped-def]
    termination_log = tmp_path / "termination-log"
    job.start_node(
        "a",
        [],
        nnodes="1",
        command=[
            sys.executable,
            "-c",
            SHM_FULL,
            "--steps",
            "12",
            "--checkpoint-dir",
            str(job.checkpoint_dir),
        ],
        env={termination.TERMINATION_LOG_ENV: str(termination_log)},
    )
    assert job.wait_node("a", 90) == LauncherExit.BAD_CONFIG, job.node_output("a")
    output = job.node_output("a")
    assert output.count("group attempt") == 1, "the launcher retried a setting no restart can fix"
    said = termination_log.read_text()
    assert "does not fit" in said and "spec.sharedMemory.sizeLimit" in said, said
    assert f"exit codes [{TrainerExit.NO_SNAPSHOT_SPACE}]" in said, said
