"""The failure policy (rules, defaults, budgets by cause) and incident timing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from phalanx.operator import api, detection, incidents, policy
from phalanx.operator.timeutil import format_micro_time, format_time


def failure(cause: str, **fields: object) -> detection.Failure:
    return detection.Failure(cause=cause, pod="demo-worker-1", uid="u1", node="node-a", message="m", **fields)


KILLED = failure("Killed", exit_code=137)
USER = failure("ExitCode", exit_code=1)
HUNG = failure("NoProgress")
LOST = failure("NodeLost", node_conditions=frozenset({"NotReady"}))


@pytest.mark.parametrize(
    ("found", "action", "rule", "counts"),
    [
        (KILLED, "ReplaceWorker", "default-infrastructure", False),
        (failure("Killed", exit_code=143), "ReplaceWorker", "default-infrastructure", False),
        (LOST, "ReplaceWorker", "default-infrastructure", False),
        (failure("HeartbeatTimeout"), "ReplaceWorker", "default-infrastructure", False),
        (HUNG, "ReplaceWorker", "default-infrastructure", False),
        (failure("TrainerStopped"), "ReplaceWorker", "default-infrastructure", False),
        (failure("Straggler"), "ReplaceWorker", "default-infrastructure", False),
        (
            failure("PodDeleted", pod_conditions=frozenset({"PodDeleted"})),
            "ReplaceWorker",
            "default-infrastructure",
            False,
        ),
        (
            failure("Evicted", pod_conditions=frozenset({"Evicted"})),
            "ReplaceWorker",
            "default-infrastructure",
            False,
        ),
        (USER, "ReplaceWorker", "default", True),
        (failure("ContainerRestart", exit_code=1), "ReplaceWorker", "default", True),
        (
            failure("ExitCode", exit_code=137, pod_conditions=frozenset({"OOMKilled"})),
            "ReplaceWorker",
            "default-oom",
            True,
        ),
        (failure("ExitCode", exit_code=5), "FailJob", "default-permanent", True),
    ],
)
def test_defaults(found: detection.Failure, action: str, rule: str, counts: bool) -> None:
    decision = policy.decide(found, api.FailurePolicySpec())
    assert (decision.action, decision.rule) == (action, rule)
    if action != "FailJob":
        assert decision.counts is counts


def test_user_rules_come_first_and_match_every_class() -> None:
    rules = [
        api.FailureRule(name="oops", match=api.FailureMatch(exit_codes=[1]), action="FailJob"),
        api.FailureRule(match=api.FailureMatch(no_progress=True), action="RestartJob"),
        api.FailureRule(name="nodes", match=api.FailureMatch(node_conditions=["NotReady"]), action="Ignore"),
        api.FailureRule(
            name="kills", match=api.FailureMatch(exit_codes=[137]), counts_toward_max_restarts=True
        ),
    ]
    spec = api.FailurePolicySpec(rules=rules)
    assert policy.decide(USER, spec).action == "FailJob"
    hung = policy.decide(HUNG, spec)
    assert (hung.action, hung.rule, hung.counts) == ("RestartJob", "rule-2", False)
    assert policy.decide(LOST, spec).action == "Ignore"
    killed = policy.decide(KILLED, spec)
    assert (killed.rule, killed.counts) == ("kills", True)
    # Unmatched classes still get the defaults.
    assert policy.decide(failure("HeartbeatTimeout"), spec).rule == "default-infrastructure"
    assert policy.decide(failure("TrainerStopped"), spec).rule == "default-infrastructure"
    stopped = api.FailureRule(match=api.FailureMatch(trainer_stopped=True), action="RestartJob")
    assert (
        policy.decide(failure("TrainerStopped"), api.FailurePolicySpec(rules=[stopped])).action
        == "RestartJob"
    )


def test_infrastructure_restarts_never_spend_the_users_budget() -> None:
    spec = api.FailurePolicySpec(max_restarts=1)
    restarts = api.RestartCounts()
    for _ in range(5):
        budget = policy.spend(restarts, policy.decide(KILLED, spec), "Killed", spec.max_restarts)
        assert budget.allowed
        restarts = budget.restarts
    assert restarts.total == 5 and restarts.counted == 0 and restarts.by_cause == {"Killed": 5}
    first = policy.spend(restarts, policy.decide(USER, spec), "ExitCode", spec.max_restarts)
    assert first.allowed and first.restarts.counted == 1
    second = policy.spend(first.restarts, policy.decide(USER, spec), "ExitCode", spec.max_restarts)
    assert not second.allowed and "budget (1)" in second.message
    assert second.restarts.by_cause == {"Killed": 5, "ExitCode": 2}


def test_a_rules_own_budget() -> None:
    rule = api.FailureRule(name="hangs", match=api.FailureMatch(no_progress=True), max_restarts=1)
    spec = api.FailurePolicySpec(rules=[rule])
    decision = policy.decide(HUNG, spec)
    once = policy.spend(api.RestartCounts(), decision, "NoProgress", spec.max_restarts)
    twice = policy.spend(once.restarts, decision, "NoProgress", spec.max_restarts)
    assert once.allowed and not twice.allowed and "hangs" in twice.message


def beats(now: datetime, *steps: int) -> list[incidents.Beat]:
    return [incidents.Beat(step=step, renewed=now) for step in steps]


def opened(now: datetime, step: int | None = 20) -> api.Incident:
    decision = policy.decide(KILLED, api.FailurePolicySpec())
    found = failure("Killed", exit_code=137)
    return incidents.open_incident(found, decision, now, step, unreported=2)


def test_incident_resumes_only_past_the_detected_step_and_the_unreported_ones(now: datetime) -> None:
    incident = opened(now)
    assert incident.resume_step == 22 and incidents.is_open(incident)
    # A late heartbeat of a survivor (steps done before the failure) is not a resumption.
    late = incidents.observe_progress([incident], beats(now, 21, 22), now + timedelta(seconds=1))
    assert late.recovered == [] and late.incidents[0].resumed_from_step == 21
    # The group restored step 20 and trained on.
    restored = incidents.observe_progress(late.incidents, beats(now, 20), now + timedelta(seconds=2))
    done = incidents.observe_progress(restored.incidents, beats(now, 23, 23), now + timedelta(seconds=4))
    (closed,) = done.recovered
    assert closed.resumed_at == format_time(now + timedelta(seconds=4))
    assert closed.seconds_to_recover == 4.0 and closed.steps_lost == 0
    assert done.recovery_seconds == 4.0 and not incidents.is_open(closed)


def test_steps_lost_is_detected_minus_resumed_from(now: datetime) -> None:
    incident = opened(now, step=30)
    # A heartbeat renewed before the detection (a lagging Lease) says nothing about the resumption.
    stale = [incidents.Beat(step=25, renewed=now - timedelta(seconds=1))]
    assert incidents.observe_progress([incident], stale, now).incidents[0].resumed_from_step is None
    first = incidents.observe_progress([incident], beats(now, 28), now + timedelta(seconds=1))
    (closed,) = incidents.observe_progress(
        first.incidents, beats(now, 33), now + timedelta(seconds=3)
    ).recovered
    assert closed.steps_lost == 2 and closed.resumed_from_step == 28


def test_goodput_counts_closed_and_open_recoveries(now: datetime) -> None:
    start = format_time(now - timedelta(seconds=100))
    assert incidents.goodput(start, now, 0.0, []) == 1.0
    assert incidents.goodput(start, now, 10.0, []) == 0.9
    still_open = opened(now - timedelta(seconds=5))
    assert incidents.goodput(start, now, 10.0, [still_open]) == 0.85
    assert incidents.goodput(None, now, 0.0, []) is None


def test_unreported_steps_follow_the_step_time() -> None:
    assert incidents.unreported_steps(1, [0.25, 0.25]) == 4
    assert incidents.unreported_steps(5, [10.0]) == 1
    assert incidents.unreported_steps(1, []) == 1


def test_event_texts_tell_the_story() -> None:
    incident = opened(datetime(2026, 1, 1, 12, 0, 0).astimezone())
    text = incidents.detected_text(incident)
    assert "node node-a" in text and "step 20" in text and "ReplaceWorker" in text
    incident.seconds_to_recover, incident.steps_lost, incident.resumed_from_step = 3.5, 1, 19
    assert "3.5s after Killed of demo-worker-1; 1 step(s) lost" in incidents.recovered_text(incident)


# ------------------------------------------------------------------------- exact figures from heartbeats


def opened_at(occurred: datetime, detected: datetime, step: int = 30) -> api.Incident:
    decision = policy.decide(KILLED, api.FailurePolicySpec())
    found = failure("Killed", exit_code=137, occurred_at=occurred)
    return incidents.open_incident(found, decision, detected, step, unreported=2)


def group_beat(
    step: int, started: datetime, resumed: datetime | None = None, **fields: object
) -> incidents.Beat:
    return incidents.Beat(step=step, renewed=started, group_started=started, resumed_at=resumed, **fields)  # type: ignore[arg-type]


def test_an_incident_records_when_its_failure_happened(now: datetime) -> None:
    incident = opened_at(now - timedelta(seconds=2), now)
    assert (
        incident.occurred_at == "2026-01-01T11:59:58.000000Z"
        and incident.detected_at == "2026-01-01T12:00:00Z"
    )


def test_the_group_formed_after_the_failure_gives_exact_figures(now: datetime) -> None:
    failed = now - timedelta(seconds=2)
    incident = opened_at(failed, now, step=30)
    old_group = now - timedelta(minutes=5)
    # A survivor's late heartbeat from the failed group: it had reached step 31 (lost with the group).
    late = incidents.observe_progress([incident], [group_beat(31, old_group)], now)
    assert late.recovered == [] and late.incidents[0].detected_step == 31
    # By one heartbeat interval's steps at most: the threshold of the estimate stays where it was.
    higher = incidents.observe_progress(late.incidents, [group_beat(45, old_group)], now).incidents[0]
    assert (higher.detected_step, higher.resume_step) == (32, 32)
    # The new group formed and restored step 28, but has not completed a step yet: still open.
    started = now + timedelta(seconds=1)
    forming = incidents.observe_progress(
        late.incidents, [group_beat(28, started, restored_step=28, restored_from="peer")], now
    )
    assert forming.recovered == []
    resumed = now + timedelta(seconds=3, milliseconds=400)
    beats = [
        group_beat(29, started, resumed, restored_step=28, restored_from="peer"),
        group_beat(29, started, resumed + timedelta(milliseconds=5), restored_step=28, restored_from="peer"),
    ]
    done = incidents.observe_progress(forming.incidents, beats, now + timedelta(seconds=5))
    (closed,) = done.recovered
    assert closed.resumed_at == "2026-01-01T12:00:03.400000Z"
    assert closed.seconds_to_recover == 5.4  # from the failure, not from its detection
    assert (closed.steps_lost, closed.restored_step, closed.restored_from) == (3, 28, "peer")
    assert done.recovery_seconds == 5.4
    assert "from step 28 (peer)" in incidents.recovered_text(closed)


def test_a_group_older_than_the_failure_never_closes_it(now: datetime) -> None:
    incident = opened_at(now - timedelta(seconds=2), now)
    before = now - timedelta(seconds=10)
    stale = [group_beat(35, before, before + timedelta(seconds=1), restored_step=20)]
    progress = incidents.observe_progress([incident], stale, now)
    assert progress.recovered == [] and progress.incidents[0].resumed_at is None


def test_without_group_figures_the_estimate_stays(now: datetime) -> None:
    incident = opened_at(now - timedelta(seconds=2), now, step=30)
    first = incidents.observe_progress([incident], beats(now, 29), now + timedelta(seconds=1))
    (closed,) = incidents.observe_progress(
        first.incidents, beats(now, 33), now + timedelta(seconds=3)
    ).recovered
    assert closed.steps_lost == 1 and closed.restored_step is None
    assert closed.resumed_at == "2026-01-01T12:00:03Z" and closed.seconds_to_recover == 5.0


def test_a_lost_rendezvous_is_replaced_and_open_until_training_advances(now: datetime) -> None:
    lost = detection.Failure(
        cause="RendezvousLost", pod="demo-rdzv", uid="r", node="node-a", message="gone", occurred_at=now
    )
    incident = incidents.open_incident(lost, None, now, 40, unreported=1)
    assert incident.action == "ReplaceRendezvous" and incident.rule is None and incidents.is_open(incident)
    assert incidents.detected_text(incident) == "gone on node node-a at step 40: ReplaceRendezvous"
    # The group that trained through the loss keeps its old start: its steps do not move the baseline.
    old = now - timedelta(minutes=1)
    trained_on = incidents.Beat(step=42, renewed=now, group_started=old)
    (closed,) = incidents.observe_progress([incident], [trained_on], now).recovered
    assert closed.detected_step == 40 and closed.steps_lost == 0


def test_a_survivor_between_groups_tells_the_step_its_group_stopped_at(now: datetime) -> None:
    # Detected from a Lease that lagged (step 30); the survivor left its group and said at once it had reached
    # step 31. Between groups it tells what was lost, never where training resumed.
    incident = opened_at(now - timedelta(seconds=2), now, step=30)
    between = incidents.Beat(step=31, renewed=now, active=False)
    seen = incidents.observe_progress([incident], [between], now + timedelta(seconds=1))
    (still_open,) = seen.incidents
    assert seen.recovered == [] and still_open.detected_step == 31 and still_open.resumed_from_step is None
    # Even far past the step, a worker between groups closes nothing.
    past = incidents.Beat(step=40, renewed=now + timedelta(seconds=2), active=False)
    assert incidents.observe_progress(seen.incidents, [past], now + timedelta(seconds=2)).recovered == []


def test_overlapping_failures_close_when_training_resumed_after_both(now: datetime) -> None:
    # A worker dies at step 31; the spare taking its slot dies 0.8 s later, before its group trained a step.
    first_failed = now - timedelta(seconds=2)
    second_failed = first_failed + timedelta(milliseconds=800)
    first = opened_at(first_failed, now - timedelta(seconds=1), step=31)
    decision = policy.decide(KILLED, api.FailurePolicySpec())
    spare = failure("Killed", exit_code=137, occurred_at=second_failed, spare=False)
    second = incidents.open_incident(spare, decision, now, 31, unreported=2)
    assert incidents.is_open(second)
    # The group the spare joined formed after the first failure but never completed a step: it closes nothing.
    formed = first_failed + timedelta(milliseconds=300)
    broken = group_beat(31, formed, restored_step=31, restored_from="memory")
    progress = incidents.observe_progress([first, second], [broken], now)
    assert progress.recovered == []
    # The next group restored step 31 and completed step 32.
    started = now + timedelta(seconds=3)
    resumed = now + timedelta(seconds=4)
    beat = group_beat(32, started, resumed, restored_step=31, restored_from="memory")
    done = incidents.observe_progress(progress.incidents, [beat], now + timedelta(seconds=5))
    first_closed, second_closed = done.recovered
    for closed in (first_closed, second_closed):
        assert closed.resumed_at == format_micro_time(resumed) and closed.steps_lost == 0
    assert (first_closed.seconds_to_recover, second_closed.seconds_to_recover) == (6.0, 5.2)
    assert done.recovery_seconds == 6.0  # the union of both


def test_a_group_that_resumed_then_broke_closes_the_incident_it_followed(now: datetime) -> None:
    # The spare that took the failed worker's place died right after the group's first step: the survivor is
    # between groups again, and its Lease still says when that group started and resumed.
    failed = now - timedelta(seconds=2)
    incident = opened_at(failed, now, step=35)  # from a Lease that lagged its worker
    started, resumed = failed + timedelta(milliseconds=600), failed + timedelta(milliseconds=900)
    survivor = incidents.Beat(
        step=38,
        renewed=now,
        group_started=started,
        resumed_at=resumed,
        restored_step=37,
        restored_from="memory",
        active=False,
    )
    (closed,) = incidents.observe_progress([incident], [survivor], now).recovered
    assert closed.resumed_at == format_micro_time(resumed) and closed.seconds_to_recover == 0.9
    # The state restored had been reached before the failure: the step at detection was short of it.
    assert (closed.detected_step, closed.restored_step, closed.steps_lost) == (37, 37, 0)


def test_a_survivor_still_showing_its_broken_group_closes_nothing(now: datetime) -> None:
    # Detected from a Lease that lagged (step 30, resume past 32). The survivor's Lease, renewed after the
    # detection, still shows its old group, which trained on to step 34 before its collective failed: that
    # is no resumption, and where training resumed comes only from the group formed after the failure.
    failed = now - timedelta(seconds=2)
    incident = opened_at(failed, now, step=30)
    old_group = now - timedelta(minutes=5)
    survivor = incidents.Beat(step=34, renewed=now + timedelta(seconds=1), group_started=old_group)
    seen = incidents.observe_progress([incident], [survivor], now + timedelta(seconds=1))
    assert seen.recovered == [] and seen.incidents[0].resumed_from_step is None
    started = now + timedelta(seconds=2)
    resumed = group_beat(33, started, now + timedelta(seconds=3), restored_step=32, restored_from="memory")
    (closed,) = incidents.observe_progress(seen.incidents, [resumed], now + timedelta(seconds=4)).recovered
    assert (closed.restored_from, closed.restored_step, closed.steps_lost) == ("memory", 32, 0)
