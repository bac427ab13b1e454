"""A standby launcher replaces a lost node with state from peers; SIGTERM leaves a durable checkpoint."""

from __future__ import annotations

import signal

import pytest
from localjob import LocalJob, wait_for

from phalanx.worker.rendezvous import RoundView, spare_may_join


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_standby_replaces_a_killed_node_with_state_from_peers(job: LocalJob) -> None:
    example = ["--steps", "45", "--step-delay", "0.1", "--global-batch", "16"]
    job.start_pair_with_spare(example, trained=12)
    assert not [event for event in job.restores() if event["step"] > 0], "the spare forced a restart"

    step_before_kill = job.last_step()
    job.kill_node("b")
    job.assert_spare_finished_from_memory(45, step_before_kill)


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_spare_started_first_leaves_both_slots_to_the_workers(job: LocalJob) -> None:
    # 1:2 nodes: the first round forms with worker a alone, so a spare that joined then would take
    # worker b's slot when b arrives a little later.
    # Enough steps that worker a is still training alone when b has started up, on a busy machine too.
    example = ["--steps", "150", "--step-delay", "0.1", "--global-batch", "16"]
    job.start_node("spare", example, nnodes="1:2", env={"PHALANX_ROLE": "spare"})
    wait_for(lambda: "-> standby" in job.node_output("spare"), 60, "the spare to stand by")
    job.start_node("a", example, nnodes="1:2")
    wait_for(lambda: "group attempt 1" in job.node_output("a"), 90, "the first round to form with a alone")
    job.start_node("b", example, nnodes="1:2")
    # The spare sees the group full and stands by, or joins the round that forms for b and leaves b its place
    # (it holds no state, b may): either way b trains and the spare does not.
    wait_for(lambda: "group attempt" in job.node_output("b"), 90, "b to join the group")

    assert job.wait_node("a", 120) == 0, job.node_output("a")
    assert job.wait_node("b", 120) == 0, job.node_output("b")
    assert job.wait_node("spare", 60) == 0, job.node_output("spare")
    assert "group attempt" in job.node_output("b")
    assert "group attempt" not in job.node_output("spare"), "the spare took a worker's slot"
    assert "stood by" in job.node_output("spare")
    summary = job.any_summary()
    assert (summary["final_step"], summary["world_size"]) == (150, 2)


@pytest.mark.parametrize(
    ("view", "waited_out", "joins"),
    [
        (RoundView(round=0, complete=False, participants=0, waiting=0), False, False),
        (RoundView(round=0, complete=False, participants=1, waiting=0), False, False),
        (RoundView(round=0, complete=True, participants=1, waiting=0), False, False),
        (RoundView(round=0, complete=True, participants=2, waiting=0), False, True),
        (RoundView(round=1, complete=False, participants=1, waiting=1), False, False),
        (RoundView(round=1, complete=True, participants=1, waiting=1), False, False),
        (RoundView(round=1, complete=True, participants=1, waiting=0), False, True),
        (RoundView(round=0, complete=True, participants=1, waiting=0), True, True),
    ],
)
def test_a_spare_joins_only_where_it_cannot_take_a_workers_slot(
    view: RoundView, waited_out: bool, joins: bool
) -> None:
    assert (spare_may_join(view, max_nodes=2, waited_out=waited_out) is not None) == joins


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
