"""A standby launcher replaces a lost node with state from peers; SIGTERM leaves a durable checkpoint."""

from __future__ import annotations

import signal

from localjob import LocalJob, wait_for


def test_standby_replaces_a_killed_node_with_state_from_peers(job: LocalJob) -> None:
    example = ["--steps", "45", "--step-delay", "0.1", "--global-batch", "16"]
    job.start_node("a", example)
    job.start_node("b", example)
    wait_for(lambda: job.last_step() >= 3, 90, "the group to train")
    job.start_node("spare", example, launcher_args=["--role", "spare"])
    wait_for(lambda: "-> standby" in job.node_output("spare"), 60, "the spare to stand by")
    wait_for(lambda: job.last_step() >= 12, 90, "training to go on while the spare stands by")
    assert not [event for event in job.restores() if event["step"] > 0], "the spare forced a restart"

    step_before_kill = job.last_step()
    job.kill_node("b")

    assert job.wait_node("a", 120) == 0, job.node_output("a")
    assert job.wait_node("spare", 120) == 0, job.node_output("spare")
    summary = job.any_summary()
    assert summary["final_step"] == 45 and summary["world_size"] == 2
    resumed = [event for event in job.restores() if event["step"] > 0]
    assert sorted(event["source"] for event in resumed) == ["memory", "peer"], resumed
    assert min(event["step"] for event in resumed) >= step_before_kill - 1


def test_sigterm_saves_durably_and_a_fresh_run_resumes_from_disk(job: LocalJob) -> None:
    example = ["--steps", "30", "--step-delay", "0.15", "--checkpoint-interval", "1000"]
    job.start_node("a", example)
    job.start_node("b", example)
    wait_for(lambda: job.last_step() >= 8, 90, "training to reach step 8")
    for name in ("a", "b"):
        job.nodes[name].send_signal(signal.SIGTERM)
    assert job.wait_node("a", 60) == 143, job.node_output("a")
    assert job.wait_node("b", 60) == 143, job.node_output("b")
    saved_at = job.last_step()
    assert saved_at < 30

    # New pods: empty /dev/shm, same durable directory, same job.
    fresh = {"a2": "a2", "b2": "b2"}
    for name in fresh:
        job.start_node(name, example)
    for name in fresh:
        assert job.wait_node(name, 120) == 0, job.node_output(name)
    resumed = [event for event in job.restores() if event["step"] > 0]
    assert resumed and {event["source"] for event in resumed} == {"disk"}, resumed
    assert min(event["step"] for event in resumed) >= saved_at - 1
    assert job.any_summary()["final_step"] == 30
