"""Events and conditions tell the truth: a spare's loss is no restart, no promotion without one, a finished job
is never Degraded, and the preflight's planned restart is no failure."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]
HEALTHY_NODES = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}
PREFLIGHT = {"enabled": True, "steps": 20}
PREFLIGHT_CAUSE = "preflight: restart from its checkpoint"


def _gang(make_pod: MakePod) -> list[dict[str, Any]]:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-worker-2", role="spare")]
    return [*pods, make_pod("demo-rdzv", role="rendezvous")]


def _lease(now: datetime, step: int | None, phase: str = "training", **extra: str) -> dict[str, Any]:
    renewed = (now - timedelta(seconds=0.2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "step": "" if step is None else str(step),
        "phase": phase,
        "renewTime": renewed,
        "step-seconds": "0.5",
        **extra,
    }


def _leases(now: datetime, step: int) -> dict[str, dict[str, Any]]:
    return {
        "demo-worker-0": _lease(now, step, rank="0"),
        "demo-worker-1": _lease(now, step, rank="1"),
        "demo-worker-2": _lease(now, None, phase="standby"),
    }


def _reconcile(
    job: dict[str, Any], pods: list[dict[str, Any]], leases: dict[str, Any], now: datetime
) -> Plan:
    return plan(job, Observed(pods=pods, now=now, leases=leases, nodes=HEALTHY_NODES))


def _with_status(job: dict[str, Any], result: Plan) -> dict[str, Any]:
    return {**job, "status": result.status}


def _condition(result: Plan, condition_type: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == condition_type)


def _exited(make_pod: MakePod, name: str, code: int, role: str = "worker") -> dict[str, Any]:
    pod = make_pod(name, role=role, phase="Failed" if code else "Succeeded", exit_code=code)
    pod["status"]["containerStatuses"][0]["terminated"]["finishedAt"] = "2026-01-01T11:59:59Z"
    return pod


def _reasons(result: Plan) -> list[str]:
    return [event.reason for event in result.events]


# ------------------------------------------------------------------------------------ a spare lost


def test_losing_a_standby_spare_is_spare_replaced_not_a_restart(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    later = now + timedelta(seconds=2)
    pods[2] = _exited(make_pod, "demo-worker-2", 137, role="spare")
    lost = _reconcile(_with_status(job, steady), pods, _leases(later, 11), later)
    assert lost.status["incidents"] == [] and lost.detected == []
    assert lost.status["restarts"] == {"total": 0, "byCause": {}, "counted": 0, "byRule": {}}
    assert _condition(lost, "Recovering")["status"] == "False" and "regroup" not in lost.status
    (event,) = [event for event in lost.events if event.reason == "SpareReplaced"]
    # Killed from outside: infrastructure, nothing for the user to fix.
    assert event.type == "Normal" and "demo-worker-2" in event.message and "Killed" in event.message
    assert [e.reason for e in lost.events if e.type == "Warning"] == []
    assert lost.spares_lost == ["Killed"]
    # The lost spare goes and a new one refills the pool; the workers are left alone.
    assert [
        (p["metadata"]["name"], p["metadata"]["labels"]["phalanx.dev/role"]) for p in lost.create_pods
    ] == [("demo-worker-3", "spare")]
    assert lost.delete_pods == ["demo-worker-2"] and lost.force_delete_pods == []
    # Seen again, it is not reported twice.
    again = _reconcile(_with_status(job, lost), pods, _leases(later, 11), later)
    assert "SpareReplaced" not in _reasons(again) and again.status["restarts"]["total"] == 0


def test_a_spare_lost_to_a_cause_the_policy_charges_is_a_warning(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    pods[2] = _exited(make_pod, "demo-worker-2", 1, role="spare")
    lost = _reconcile(_with_status(job, steady), pods, _leases(now, 10), now)
    (event,) = [event for event in lost.events if event.reason == "SpareReplaced"]
    assert event.type == "Warning" and "ExitCode" in event.message
    assert lost.status["restarts"]["total"] == 0 and lost.status["incidents"] == []


def test_a_spare_lost_while_torch_takes_it_into_the_group_is_a_workers_loss(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # worker-1 failed a moment ago; torch is taking the spare into the new group (its heartbeat says
    # rendezvous) when it dies too: the group being formed is broken, training waits.
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    leases = {**_leases(now, 10), "demo-worker-2": _lease(now, None, phase="rendezvous")}
    pods[2] = _exited(make_pod, "demo-worker-2", 137, role="spare")
    lost = _reconcile(_with_status(job, steady), pods, leases, now)
    (incident,) = lost.status["incidents"]
    assert incident["worker"] == "demo-worker-2" and incident.get("resumedAt") is None
    assert lost.status["restarts"]["total"] == 1 and "SpareReplaced" not in _reasons(lost)


def test_a_lost_spare_counts_as_a_failure_in_the_metrics() -> None:
    metrics = OperatorMetrics()
    metrics.record_recovery([], [], 0, ["Killed"])
    assert metrics.registry.get_sample_value("phalanx_failures_total", {"cause": "Killed"}) == 1


# ------------------------------------------------------------------------------ promotions


def test_the_spare_released_when_training_finished_is_no_promotion(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # Both workers finished training and write their last checkpoint; the standby spare was released when the
    # rendezvous closed and its launcher ended with `finished` (it never trained: no rank).
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    assert _condition(steady, "Degraded")["status"] == "False"
    leases = {
        "demo-worker-0": _lease(now, 50, phase="finished", rank="0"),
        "demo-worker-1": _lease(now, 50, phase="finished", rank="1"),
        "demo-worker-2": _lease(now, None, phase="finished"),
    }
    for spare in (
        make_pod("demo-worker-2", role="spare"),
        _exited(make_pod, "demo-worker-2", 0, role="spare"),
    ):
        pods[2] = spare
        ending = _reconcile(_with_status(job, steady), pods, leases, now)
        assert "SparePromoted" not in _reasons(ending) and ending.relabel_pods == {}
        assert ending.spare_swaps == 0 and ending.create_pods == []
        assert ending.status["state"] == "Finishing"
        assert _condition(ending, "Degraded")["status"] == "False"


def test_a_spare_promoted_after_a_failure_names_the_failed_worker_and_its_rank(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    pods[1] = _exited(make_pod, "demo-worker-1", 137)
    killed = _reconcile(_with_status(job, steady), pods, _leases(now, 10), now)
    later = now + timedelta(seconds=2)
    pods = [pods[0], pods[2], make_pod("demo-worker-3", role="spare"), pods[3]]
    leases = {
        "demo-worker-0": _lease(later, 10, phase="restoring", rank="0"),
        "demo-worker-2": _lease(later, 10, phase="restoring", rank="1"),
        "demo-worker-3": _lease(later, None, phase="standby"),
    }
    promoted = _reconcile(_with_status(job, killed), pods, leases, later)
    (event,) = [event for event in promoted.events if event.reason == "SparePromoted"]
    assert event.message == (
        "spare demo-worker-2 on node node-a took the slot of failed worker demo-worker-1 as rank 1; now a worker"
    )
    assert promoted.relabel_pods == {"demo-worker-2": "worker"} and promoted.spare_swaps == 1


def test_a_spare_promoted_after_the_recovery_was_seen_still_names_the_failed_worker(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    # The survivor's heartbeat saying the new group resumed is seen first: the incident is closed before
    # the spare's own heartbeat shows it trains.
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    pods[1] = _exited(make_pod, "demo-worker-1", 137)
    killed = _reconcile(_with_status(job, steady), pods, _leases(now, 10), now)
    later = now + timedelta(seconds=3)
    group = {
        "group-started": _stamp(now + timedelta(seconds=1)),
        "resumed-at": _stamp(now + timedelta(seconds=2)),
        "restored-step": "10",
        "restore-source": "memory",
    }
    pods = [pods[0], pods[2], make_pod("demo-worker-3", role="spare"), pods[3]]
    leases = {
        "demo-worker-0": _lease(later, 11, rank="0", **group),
        "demo-worker-2": _lease(later, None, phase="rendezvous"),
        "demo-worker-3": _lease(later, None, phase="standby"),
    }
    recovered = _reconcile(_with_status(job, killed), pods, leases, later)
    assert _reasons(recovered) == ["Recovered"]
    leases["demo-worker-2"] = _lease(later, 11, rank="1", **group)
    promoted = _reconcile(_with_status(job, recovered), pods, leases, later)
    (event,) = [event for event in promoted.events if event.reason == "SparePromoted"]
    assert "took the slot of failed worker demo-worker-1 as rank 1" in event.message
    # A spare taking a place long after, when torch re-forms on its own, took no failed worker's slot.
    much_later = later + timedelta(seconds=60)
    regroup = {**group, "group-started": _stamp(much_later), "resumed-at": _stamp(much_later)}
    swapped = {
        "demo-worker-0": _lease(much_later, 90, rank="0", **regroup),
        "demo-worker-2": _lease(much_later, 90, phase="standby"),
        "demo-worker-3": _lease(much_later, 90, rank="1", **regroup),
    }
    pods[1]["metadata"]["labels"]["phalanx.dev/role"] = "worker"
    again = _reconcile(_with_status(job, promoted), pods, swapped, much_later)
    (event,) = [event for event in again.events if event.reason == "SparePromoted"]
    assert (
        "demo-worker-3" in event.message and "took a worker's place in the group as rank 1" in event.message
    )


# ------------------------------------------------------------------------------ a gang coming up


def test_a_gang_coming_up_is_not_degraded(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    job = make_job()
    created = _reconcile(job, [], {}, now)
    # Every pod is placed; one worker runs, the other and the spare are still starting.
    pods = _gang(make_pod)
    for pod in pods[1:3]:
        pod["status"]["phase"] = "Pending"
    leases = {"demo-worker-0": _lease(now, None, phase="rendezvous")}
    coming = _reconcile(_with_status(job, created), pods, leases, now)
    assert [(e.type, e.reason) for e in coming.events] == [("Normal", "AllScheduled")]
    degraded = _condition(coming, "Degraded")
    assert degraded["status"] == "False" and degraded["reason"] == "Starting"
    assert _condition(coming, "Running")["status"] == "False" and coming.status["state"] == "Pending"
    # The workers run; the spare is still starting: training runs, nothing is missing.
    pods[1]["status"]["phase"] = "Running"
    training = _reconcile(_with_status(job, coming), pods, _leases(now, 1), now)
    assert _reasons(training) == ["Training"] and _condition(training, "Degraded")["reason"] == "Starting"
    pods[2]["status"]["phase"] = "Running"
    full = _reconcile(_with_status(job, training), pods, _leases(now, 2), now)
    assert full.events == [] and _condition(full, "Degraded")["reason"] == "FullStrength"
    # From then on a shortfall is one.
    short = _reconcile(_with_status(job, full), pods[:2] + pods[3:], _leases(now, 3), now)
    assert _condition(short, "Degraded")["reason"] == "SparesMissing"


def test_a_resumed_gang_coming_up_is_not_degraded(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    suspended = _reconcile(_with_status(make_job(suspend=True), steady), pods, _leases(now, 10), now)
    assert _condition(suspended, "Degraded")["reason"] == "Suspended"
    resumed = _reconcile(_with_status(job, suspended), [], {}, now)
    pods = _gang(make_pod)
    pods[1]["status"]["phase"] = "Pending"
    coming = _reconcile(_with_status(job, resumed), pods, {"demo-worker-0": _lease(now, 10)}, now)
    assert "BelowMinReplicas" not in _reasons(coming)
    assert _condition(coming, "Degraded")["reason"] == "Starting"


# ------------------------------------------------------------------------------ finished jobs


def test_a_finished_job_is_never_degraded(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    job = make_job()
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    # The spare left before the workers' exits were seen: the pool looked short.
    short = _reconcile(_with_status(job, steady), pods[:2] + pods[3:], _leases(now, 10), now)
    assert _condition(short, "Degraded")["reason"] == "SparesMissing"
    done = [_exited(make_pod, "demo-worker-0", 0), _exited(make_pod, "demo-worker-1", 0)]
    finished = _reconcile(_with_status(job, short), done, {}, now)
    assert _condition(finished, "Succeeded")["status"] == "True"
    degraded = _condition(finished, "Degraded")
    assert degraded["status"] == "False" and degraded["reason"] == "TrainingFinished"
    assert "Degraded" not in _reasons(finished)
    # A job stored finished and Degraded (by an earlier operator) is put right by its next reconcile.
    stored = _with_status(job, finished)
    for condition in stored["status"]["conditions"]:
        if condition["type"] == "Degraded":
            condition.update(status="True", reason="SparesMissing")
    assert _condition(_reconcile(stored, done, {}, now), "Degraded")["status"] == "False"


def test_a_failed_job_is_never_degraded(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    job = make_job(failurePolicy={"maxRestarts": 0})
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 10), now)
    short = _reconcile(_with_status(job, steady), pods[:2] + pods[3:], _leases(now, 10), now)
    pods[0] = _exited(make_pod, "demo-worker-0", 1)
    failed = _reconcile(_with_status(job, short), pods[:2] + pods[3:], _leases(now, 10), now)
    assert _condition(failed, "Failed")["status"] == "True"
    degraded = _condition(failed, "Degraded")
    assert degraded["status"] == "False" and degraded["reason"] == "MaxRestartsExceeded"


# ------------------------------------------------------------------------------ the preflight's restart


def _preflight_leases(now: datetime, **phases: tuple[str, bool]) -> dict[str, dict[str, Any]]:
    """Per pod (worker_0=...): its phase and whether its launcher restarted its group for the preflight."""
    leases = {}
    for key, (phase, restarted) in phases.items():
        name = key.replace("_", "-")
        extra = {"preflight": "running", "restart-cause": PREFLIGHT_CAUSE} if restarted else {}
        group = {} if phase in ("standby", "rendezvous") else {"rank": name[-1], "group-started": _stamp(now)}
        leases[f"demo-{name}"] = _lease(now, 20, phase=phase, **extra, **group)
    return leases


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_the_preflights_planned_restart_has_its_own_event_and_no_failures(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(preflight=PREFLIGHT)
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 20), now)
    assert _condition(steady, "Running")["status"] == "True"
    # The workers recorded the preflight's run and their launchers restart the group; torch gives the
    # standby's place to whoever joins first: here worker-1 is left over and stands by.
    restarting = _preflight_leases(
        now,
        worker_0=("rendezvous", True),
        worker_1=("standby", True),
        worker_2=("rendezvous", False),
    )
    first = _reconcile(_with_status(job, steady), pods, restarting, now)
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "PreflightRestart")]
    assert "planned restart" in first.events[0].message
    passed = _condition(first, "PreflightPassed")
    assert passed["status"] == "False" and passed["reason"] == "PreflightRestart"
    degraded = _condition(first, "Degraded")
    assert degraded["status"] == "False" and degraded["reason"] == "PreflightRestart"
    assert _condition(first, "Running")["status"] == "True" and first.status["state"] == "Running"
    assert first.status["incidents"] == [] and first.status["restarts"]["total"] == 0
    # The group re-formed with the former spare: roles follow, without a promotion's story.
    later = now + timedelta(seconds=3)
    re_formed = _preflight_leases(
        later,
        worker_0=("restoring", True),
        worker_1=("standby", True),
        worker_2=("restoring", False),
    )
    second = _reconcile(_with_status(job, first), pods, re_formed, later)
    assert second.relabel_pods == {"demo-worker-2": "worker", "demo-worker-1": "spare"}
    assert second.events == [] and second.spare_swaps == 0
    assert _condition(second, "Degraded")["status"] == "False"
    # The verdict, seen before the relabels were (the labels still say spare): the condition passes, with
    # the preflight's own Event, and still no promotion.
    told = {"preflight": "passed", "preflight-reason": "Passed", "preflight-message": "matched bitwise"}
    verdict = {**re_formed, "demo-worker-0": {**re_formed["demo-worker-0"], **told}}
    done = _reconcile(_with_status(job, first), pods, verdict, later + timedelta(seconds=2))
    assert [(e.type, e.reason) for e in done.events] == [("Normal", "Passed")]
    assert _condition(done, "PreflightPassed")["status"] == "True"
    assert done.relabel_pods == {"demo-worker-2": "worker", "demo-worker-1": "spare"}
    assert _condition(done, "Degraded")["status"] == "False"
    # Long after the verdict torch re-forms and the spare takes a worker's place: that is a promotion.
    much_later = later + timedelta(seconds=60)
    swapped = {
        "demo-worker-0": _lease(much_later, 90, rank="0", **{"group-started": _stamp(much_later)}),
        "demo-worker-1": _lease(much_later, 90, phase="standby"),
        "demo-worker-2": _lease(much_later, 90, rank="1", **{"group-started": _stamp(much_later)}),
    }
    promoted = _reconcile(_with_status(job, done), pods, swapped, much_later)
    (event,) = [event for event in promoted.events if event.reason == "SparePromoted"]
    assert "took a worker's place in the group as rank 1" in event.message


def test_a_failure_during_the_preflights_restart_is_still_a_failure(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(preflight=PREFLIGHT)
    pods = _gang(make_pod)
    steady = _reconcile(job, pods, _leases(now, 20), now)
    restarting = _preflight_leases(
        now, worker_0=("rendezvous", True), worker_1=("rendezvous", True), worker_2=("standby", False)
    )
    first = _reconcile(_with_status(job, steady), pods, restarting, now)
    # worker-1 is killed while the group re-forms: an incident, and a shortfall that is one.
    pods[1] = _exited(make_pod, "demo-worker-1", 137)
    killed = _reconcile(_with_status(job, first), pods, restarting, now)
    assert [incident["worker"] for incident in killed.status["incidents"]] == ["demo-worker-1"]
    assert "Killed" in _reasons(killed) and "PreflightRestart" not in _reasons(killed)
    later = now + timedelta(seconds=2)
    pods = [pods[0], pods[2], make_pod("demo-worker-3", role="spare", node=None), pods[3]]
    leases = {
        "demo-worker-0": restarting["demo-worker-0"],
        "demo-worker-2": _lease(later, 20, phase="restoring", rank="1"),
    }
    promoted = _reconcile(_with_status(job, killed), pods, leases, later)
    assert "SparePromoted" in _reasons(promoted)
