"""Two launcher nodes train the example; a killed training process costs at most one step."""

from __future__ import annotations

from localjob import LocalJob, wait_for

EXAMPLE = ["--steps", "40", "--step-delay", "0.1", "--global-batch", "16", "--micro-batch", "8"]


def test_killed_trainer_resumes_from_memory_and_matches_an_uninterrupted_run(job: LocalJob) -> None:
    job.start_node("a", EXAMPLE)
    job.start_node("b", EXAMPLE)
    wait_for(lambda: job.last_step() >= 12, 90, "training to reach step 12")
    victim = job.trainers("b")
    assert len(victim) == 1
    step_before_kill = job.last_step()
    victim[0].kill()

    assert job.wait_node("a", 120) == 0, job.node_output("a")
    assert job.wait_node("b", 120) == 0, job.node_output("b")
    summary = job.any_summary()
    assert summary["final_step"] == 40
    assert summary["world_size"] == 2

    resumed = [event for event in job.restores() if event["reason"] == "start" and event["step"] > 0]
    assert resumed, f"no resume after the kill: {job.restores()}"
    assert {event["source"] for event in resumed} <= {"memory", "peer"}
    assert min(event["step"] for event in resumed) >= step_before_kill - 1

    # The same job without a fault, in a fresh directory, reaches bit-identical parameters.
    reference = LocalJob(job.root / "reference", run_id=job.run_id + "-ref")
    reference.root.mkdir()
    reference.start_store()
    try:
        reference.start_node("a", EXAMPLE)
        reference.start_node("b", EXAMPLE)
        assert reference.wait_node("a", 120) == 0, reference.node_output("a")
        assert reference.wait_node("b", 120) == 0
        assert reference.any_summary()["checksum"] == summary["checksum"]
    finally:
        reference.close()
