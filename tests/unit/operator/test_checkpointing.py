"""The automatic checkpoint interval (`intervalSteps: auto`): Young/Daly, the MTBF prior, the change threshold,
the spec's validation, and the reconcile that writes `status.checkpoint` with one Event per change."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from phalanx.operator import api, checkpointing
from phalanx.operator.checkpointing import Measurements, choose
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Observed, Plan, plan
from phalanx.operator.timeutil import format_time

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]

AUTO = api.CheckpointSpec.model_validate({"intervalSteps": "auto"})
# Bounds wide open: the arithmetic alone decides.
OPEN = api.CheckpointSpec.model_validate(
    {"intervalSteps": "auto", "autoInterval": {"minIntervalSeconds": 0, "maxIntervalSeconds": 1e9}}
)


# ------------------------------------------------------------------------------------------ pure parts


def test_young_daly_is_the_square_root_of_twice_save_cost_times_mtbf() -> None:
    assert checkpointing.young_daly_seconds(2.0, 3600.0) == pytest.approx(120.0)
    assert checkpointing.young_daly_seconds(0.5, 100.0) == pytest.approx(10.0)
    # Four times the MTBF: twice the interval; four times the save cost: twice too.
    base = checkpointing.young_daly_seconds(1.0, 1000.0)
    assert checkpointing.young_daly_seconds(1.0, 4000.0) == pytest.approx(2 * base)
    assert checkpointing.young_daly_seconds(4.0, 1000.0) == pytest.approx(2 * base)
    assert checkpointing.young_daly_seconds(0.0, 1000.0) == 0.0


def test_seconds_become_whole_steps_and_never_fewer_than_one() -> None:
    assert checkpointing.steps_for(120.0, 0.5) == 240
    assert checkpointing.steps_for(10.0, 3.0) == 3
    assert checkpointing.steps_for(0.01, 1.0) == 1
    assert checkpointing.steps_for(5.0, 0.0) == 1


def test_the_prior_weighs_like_failures_already_seen() -> None:
    prior = {"prior_mtbf_seconds": 86400.0, "prior_failures": 1.0}
    # No history: the prior itself.
    assert checkpointing.mtbf_seconds(0, 0.0, **prior) == pytest.approx(86400.0)
    # One failure ten minutes in halves it (about), instead of calling the MTBF ten minutes.
    early = checkpointing.mtbf_seconds(1, 600.0, **prior)
    assert early == pytest.approx((86400.0 + 600.0) / 2)
    assert early > 40000
    # A long history outweighs the prior: 100 failures in 100 days is about one a day whatever the prior.
    long_run = checkpointing.mtbf_seconds(100, 100 * 86400.0, prior_mtbf_seconds=600.0, prior_failures=1.0)
    assert long_run == pytest.approx(86400.0, rel=0.02)
    # A heavier prior moves less for the same failure.
    heavy = checkpointing.mtbf_seconds(1, 600.0, prior_mtbf_seconds=86400.0, prior_failures=4.0)
    assert heavy > early
    # Failures only lower it; running time without failures raises it.
    assert checkpointing.mtbf_seconds(2, 600.0, **prior) < early
    assert checkpointing.mtbf_seconds(0, 86400.0, **prior) > 86400.0


def test_the_clusters_other_jobs_count_in_this_jobs_worker_seconds() -> None:
    prior = {"prior_mtbf_seconds": 86400.0, "prior_failures": 1.0}
    # Other jobs: 5 infrastructure failures in 100 worker-hours. A job of 10 workers lives through those
    # 100 worker-hours in 10 hours: the cluster says it fails about every 2 hours.
    cluster = checkpointing.ClusterHistory(failures=5, worker_seconds=100 * 3600.0, jobs=2)
    mtbf = checkpointing.mtbf_seconds(0, 0.0, **prior, cluster=cluster, workers=10)
    assert mtbf == pytest.approx((86400.0 + 36000.0) / 6)
    # Twice the workers, twice the failures per hour: half the seconds of evidence.
    assert checkpointing.mtbf_seconds(0, 0.0, **prior, cluster=cluster, workers=20) < mtbf
    # No failures anywhere in a long history: the cluster vouches for a long MTBF.
    quiet = checkpointing.ClusterHistory(failures=0, worker_seconds=1000 * 3600.0, jobs=3)
    assert checkpointing.mtbf_seconds(0, 0.0, **prior, cluster=quiet, workers=10) > 86400.0


def test_a_jobs_history_is_its_infrastructure_failures_over_its_workers_running_time() -> None:
    t0 = datetime(2027, 1, 1, 8, 0, 0, tzinfo=UTC)
    job = {
        "metadata": {"uid": "u1"},
        "spec": {"replicas": 4},
        "status": {
            "startTime": format_time(t0),
            "restarts": {"total": 5, "counted": 2},  # 2 were the user's: they say nothing of the cluster
            "replicas": {"desired": 8},
        },
    }
    history = checkpointing.job_history(job)
    assert history is not None and (history.failures, history.workers, history.ended) == (3, 8, None)
    assert history.worker_seconds(t0 + timedelta(hours=1)) == pytest.approx(8 * 3600.0)
    finished = {
        **job,
        "metadata": {"uid": "u3"},
        "status": {**job["status"], "completionTime": format_time(t0 + timedelta(hours=2))},
    }
    ended = checkpointing.job_history(finished)
    assert ended is not None and ended.worker_seconds(t0 + timedelta(days=9)) == pytest.approx(16 * 3600.0)
    never = checkpointing.job_history({"metadata": {"uid": "u2"}, "spec": {"replicas": 2}})
    total = checkpointing.cluster_history([history, ended, never, None], "u1", t0 + timedelta(hours=1))
    # The job itself and the one that never started are left out.
    assert (total.failures, total.worker_seconds, total.jobs) == (3, 16 * 3600.0, 1)
    assert checkpointing.job_history({"spec": {}}) is None


def test_other_jobs_failures_lower_a_new_jobs_interval_and_the_status_says_so() -> None:
    flaky = checkpointing.ClusterHistory(failures=6, worker_seconds=12 * 3600.0, jobs=2)
    alone = choose(OPEN, None, _measured(running=60)).status
    with_cluster = choose(OPEN, None, Measurements(0.02, 0.25, 0, 60.0, workers=2, cluster=flaky)).status
    assert with_cluster.mtbf_seconds is not None and alone.mtbf_seconds is not None
    assert with_cluster.mtbf_seconds < alone.mtbf_seconds
    assert with_cluster.interval_steps < alone.interval_steps
    assert (with_cluster.cluster_failures_seen, with_cluster.cluster_worker_hours) == (6, 12.0)
    assert "other jobs' 6 in 12 worker-hours" in with_cluster.reason
    # The spec can keep other jobs out of it.
    own = api.CheckpointSpec.model_validate(
        {
            "intervalSteps": "auto",
            "autoInterval": {"minIntervalSeconds": 0, "maxIntervalSeconds": 1e9, "clusterHistory": False},
        }
    )
    ignored = choose(own, None, Measurements(0.02, 0.25, 0, 60.0, workers=2, cluster=flaky)).status
    assert ignored.mtbf_seconds == alone.mtbf_seconds and ignored.cluster_failures_seen is None
    # A change in the other jobs' failures is named in the Event.
    more = checkpointing.ClusterHistory(failures=30, worker_seconds=13 * 3600.0, jobs=2)
    after = choose(OPEN, with_cluster, Measurements(0.02, 0.25, 0, 90.0, workers=2, cluster=more))
    assert after.event is not None and "other jobs' failures 6 -> 30" in after.event


def test_bounds_clamp_the_interval_and_say_so() -> None:
    bounds = api.AutoIntervalSpec(min_interval_seconds=30, max_interval_seconds=600)
    assert checkpointing.clamp_seconds(100.0, bounds) == (100.0, "")
    low, why = checkpointing.clamp_seconds(3.0, bounds)
    assert low == 30 and "minIntervalSeconds" in why
    high, why = checkpointing.clamp_seconds(5000.0, bounds)
    assert high == 600 and "maxIntervalSeconds" in why


def test_only_a_change_beyond_the_threshold_counts() -> None:
    assert not checkpointing.is_meaningful_change(100, 100)
    assert not checkpointing.is_meaningful_change(100, 119)
    assert not checkpointing.is_meaningful_change(100, 81)
    assert checkpointing.is_meaningful_change(100, 121)
    assert checkpointing.is_meaningful_change(100, 79)
    assert checkpointing.is_meaningful_change(2, 3)
    assert checkpointing.CHANGE_THRESHOLD == 0.2


def test_the_figures_come_from_the_slowest_save_and_the_median_step() -> None:
    assert checkpointing.save_seconds_from([0.01, None, 0.03, float("nan")]) == 0.03
    assert checkpointing.save_seconds_from([None]) is None
    assert checkpointing.step_seconds_from([0.2, 0.3, 5.0], [9.0]) == 0.3
    assert checkpointing.step_seconds_from([], [0.4, None, 0.6]) == pytest.approx(0.5)
    assert checkpointing.step_seconds_from([None], [None]) is None


# ------------------------------------------------------------------------------------------ decisions


def _measured(
    save: float | None = 0.02, step: float | None = 0.25, failures: int = 0, running: float = 0.0
) -> Measurements:
    return Measurements(save_seconds=save, step_seconds=step, failures=failures, running_seconds=running)


def test_a_fixed_interval_is_the_specs_number() -> None:
    spec = api.CheckpointSpec(interval_steps=40)
    decision = choose(spec, None, _measured())
    assert decision.status == api.CheckpointStatus(
        mode="fixed", interval_steps=40, reason="spec.checkpoint.intervalSteps"
    )
    assert decision.event is None
    assert choose(spec, decision.status, _measured(save=9.0)).status == decision.status


def test_auto_bootstraps_until_a_save_cost_is_measured() -> None:
    decision = choose(AUTO, None, _measured(save=None))
    assert decision.status.mode == "auto"
    assert decision.status.interval_steps == checkpointing.BOOTSTRAP_STEPS
    assert decision.status.save_seconds is None and decision.status.reason.startswith("bootstrap")
    assert decision.event is None
    # Still nothing measured: the bootstrap stays as it is (no status write).
    assert choose(AUTO, decision.status, _measured(save=None)).status == decision.status


def test_the_first_measured_save_cost_sets_the_interval_with_an_event() -> None:
    boot = choose(OPEN, None, _measured(save=None)).status
    decision = choose(OPEN, boot, _measured(save=0.02, step=0.25))
    expected_seconds = math.sqrt(2 * 0.02 * 86400.0)
    status = decision.status
    assert status.interval_steps == round(expected_seconds / 0.25)
    assert (status.save_seconds, status.step_seconds, status.failures_seen) == (0.02, 0.25, 0)
    assert status.mtbf_seconds == 86400.0
    assert "Young/Daly" in status.reason and "sqrt(2 x 0.02 s save x 8.64e+04 s MTBF)" in status.reason
    assert decision.event is not None and f"10 (bootstrap) -> {status.interval_steps} steps" in decision.event


def test_failures_lower_the_mtbf_and_the_interval() -> None:
    spec = api.CheckpointSpec.model_validate(
        {
            "intervalSteps": "auto",
            "autoInterval": {"priorMtbfSeconds": 600, "priorFailures": 1, "minIntervalSeconds": 0},
        }
    )
    before = choose(spec, None, _measured(save=0.02, step=0.05, running=60)).status
    after = choose(spec, before, _measured(save=0.02, step=0.05, failures=2, running=90))
    assert after.status.mtbf_seconds is not None and before.mtbf_seconds is not None
    assert after.status.mtbf_seconds < before.mtbf_seconds
    assert after.status.interval_steps < before.interval_steps
    assert after.status.failures_seen == 2
    assert after.event is not None
    assert f"{before.interval_steps} -> {after.status.interval_steps} steps" in after.event
    assert "failures 0 -> 2" in after.event and "MTBF 660 s -> 230 s" in after.event


def test_a_costlier_save_raises_the_interval() -> None:
    before = choose(OPEN, None, _measured(save=0.02)).status
    after = choose(OPEN, before, _measured(save=0.08)).status
    assert after.interval_steps == pytest.approx(2 * before.interval_steps, abs=1)


def test_small_moves_keep_the_status_as_it_is() -> None:
    before = choose(OPEN, None, _measured(save=0.02, step=0.25)).status
    # 20% more save cost: about 10% longer interval, under the threshold.
    wobble = choose(OPEN, before, _measured(save=0.024, step=0.26, running=300))
    assert wobble.status is before and wobble.event is None


def test_figures_missing_now_keep_the_last_ones() -> None:
    before = choose(OPEN, None, _measured(save=0.02, step=0.25)).status
    # A group re-forming: nobody reports a save cost at the moment, yet a failure was seen.
    after = choose(OPEN, before, _measured(save=None, step=None, failures=3, running=100)).status
    assert after.save_seconds == 0.02 and after.step_seconds == 0.25
    assert after.failures_seen == 3 and after.interval_steps < before.interval_steps


def test_the_bounds_hold_and_the_reason_names_them() -> None:
    status = choose(AUTO, None, _measured(save=0.0001, step=0.25)).status
    assert status.interval_steps == round(30 / 0.25)
    assert "raised to minIntervalSeconds 30 s" in status.reason
    slow = choose(AUTO, None, _measured(save=2000.0, step=1.0)).status
    assert slow.interval_steps == 14400 and "lowered to maxIntervalSeconds" in slow.reason


def test_switching_to_a_fixed_interval_says_so() -> None:
    auto = choose(OPEN, None, _measured()).status
    fixed = choose(api.CheckpointSpec(interval_steps=50), auto, _measured())
    assert fixed.status.mode == "fixed" and fixed.status.interval_steps == 50
    assert fixed.event == "checkpoint interval 50 steps (fixed by the spec)"


# ------------------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize("value", [0, -5, "fast", "Auto", 2.5, True, None, "0"])
def test_anything_but_a_positive_integer_or_auto_is_an_invalid_spec_naming_the_field(
    make_job: MakeJob, now: datetime, value: Any
) -> None:
    result = plan(make_job(checkpoint={"intervalSteps": value}), Observed(pods=[], now=now))
    valid = next(c for c in result.status["conditions"] if c["type"] == "SpecValid")
    assert valid["status"] == "False" and "spec.checkpoint.intervalSteps" in valid["message"]
    assert [e.reason for e in result.events] == ["InvalidSpec"]
    assert "spec.checkpoint.intervalSteps" in result.events[0].message
    assert result.create_pods == []


@pytest.mark.parametrize("value", [1, 100, "auto", "25"])
def test_a_positive_integer_or_auto_is_accepted(make_job: MakeJob, now: datetime, value: Any) -> None:
    result = plan(make_job(checkpoint={"intervalSteps": value}), Observed(pods=[], now=now))
    valid = next(c for c in result.status["conditions"] if c["type"] == "SpecValid")
    assert valid["status"] == "True"


def test_auto_reaches_the_workers_environment(make_job: MakeJob, now: datetime) -> None:
    result = plan(make_job(checkpoint={"intervalSteps": "auto"}), Observed(pods=[], now=now))
    worker = next(pod for pod in result.create_pods if pod["metadata"]["name"] == "demo-worker-0")
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["PHALANX_CHECKPOINT_INTERVAL"] == "auto"


# ------------------------------------------------------------------------------------------ reconcile


def _gang(make_pod: MakePod) -> list[dict[str, Any]]:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-worker-2", role="spare")]
    return [*pods, make_pod("demo-rdzv", role="rendezvous")]


def _leases(now: datetime, step: int, save: str = "0.02") -> dict[str, dict[str, Any]]:
    renewed = (now - timedelta(seconds=0.2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    beat = {
        "phase": "training",
        "renewTime": renewed,
        "step-seconds": "0.25",
        "checkpoint-save-seconds": save,
    }
    return {
        "demo-worker-0": {**beat, "step": str(step)},
        "demo-worker-1": {**beat, "step": str(step)},
        "demo-worker-2": {"phase": "standby", "renewTime": renewed, "step": "0"},
    }


def _auto_job(make_job: MakeJob, prior_mtbf: float, started: datetime) -> dict[str, Any]:
    """A running job with `intervalSteps: auto`, the given prior MTBF and no lower bound on the interval."""
    job = make_job(
        checkpoint={
            "intervalSteps": "auto",
            "autoInterval": {"priorMtbfSeconds": prior_mtbf, "minIntervalSeconds": 0},
        }
    )
    job["status"] = {"startTime": format_time(started)}
    return job


def _reconcile(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    now: datetime,
    cluster: checkpointing.ClusterHistory | None = None,
    **leases: Any,
) -> Plan:
    observed = Observed(
        pods=pods,
        now=now,
        leases=_leases(now, **leases),
        nodes={"node-a": {"ready": "True"}},
        cluster=cluster,
    )
    return plan(job, observed)


def test_the_reconcile_writes_the_interval_and_its_inputs_once_and_posts_one_event(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = _auto_job(make_job, prior_mtbf=3600, started=now - timedelta(seconds=120))
    pods = _gang(make_pod)
    first = _reconcile(job, pods, now, step=12)
    checkpoint = first.status["checkpoint"]
    assert (
        checkpoint["mode"] == "auto"
        and checkpoint["saveSeconds"] == 0.02
        and checkpoint["stepSeconds"] == 0.25
    )
    assert checkpoint["failuresSeen"] == 0 and checkpoint["mtbfSeconds"] == 3720.0
    assert checkpoint["intervalSteps"] == round(math.sqrt(2 * 0.02 * 3720) / 0.25)
    assert [e.reason for e in first.events if e.reason == "CheckpointInterval"] == ["CheckpointInterval"]
    # Later reconciles with figures that barely moved: the same status, no Event.
    later = _reconcile(
        {**job, "status": first.status}, pods, now + timedelta(seconds=30), step=40, save="0.021"
    )
    assert later.status["checkpoint"] == checkpoint
    assert not [e for e in later.events if e.reason == "CheckpointInterval"]


def test_the_interval_falls_after_failures_in_the_reconcile(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = _auto_job(make_job, prior_mtbf=600, started=now - timedelta(seconds=60))
    pods = _gang(make_pod)
    first = _reconcile(job, pods, now, step=12)
    status = {
        **first.status,
        "restarts": {"total": 3, "byCause": {"PodDeleted": 3}, "counted": 0, "byRule": {}},
    }
    after = _reconcile({**job, "status": status}, pods, now + timedelta(seconds=10), step=30)
    assert after.status["checkpoint"]["failuresSeen"] == 3
    assert after.status["checkpoint"]["mtbfSeconds"] < first.status["checkpoint"]["mtbfSeconds"]
    assert after.status["checkpoint"]["intervalSteps"] < first.status["checkpoint"]["intervalSteps"]
    (event,) = [e for e in after.events if e.reason == "CheckpointInterval"]
    assert event.type == "Normal" and "failures 0 -> 3" in event.message


def test_the_reconcile_weighs_the_clusters_history_by_the_jobs_workers(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = _auto_job(make_job, prior_mtbf=3600, started=now - timedelta(seconds=120))
    pods = _gang(make_pod)
    cluster = checkpointing.ClusterHistory(failures=4, worker_seconds=7200.0, jobs=3)
    alone = _reconcile(job, pods, now, step=12).status["checkpoint"]
    weighed = _reconcile(job, pods, now, cluster=cluster, step=12).status["checkpoint"]
    workers = job["spec"]["replicas"]
    assert weighed["mtbfSeconds"] == pytest.approx((3600 + 120 + 7200 / workers) / 5, rel=1e-3)
    assert weighed["mtbfSeconds"] < alone["mtbfSeconds"]
    assert (weighed["clusterFailuresSeen"], weighed["clusterWorkerHours"]) == (4, 2.0)
    assert "clusterFailuresSeen" not in alone


def test_a_fixed_interval_job_shows_its_interval(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    result = _reconcile(make_job(), _gang(make_pod), now, step=12)
    assert result.status["checkpoint"] == {
        "mode": "fixed",
        "intervalSteps": 100,
        "reason": "spec.checkpoint.intervalSteps",
    }
    assert not [e for e in result.events if e.reason == "CheckpointInterval"]


def test_the_interval_gauge_follows_the_stored_status() -> None:
    metrics = OperatorMetrics()
    metrics.job_checkpoint_interval("ml", "demo", {"mode": "auto", "intervalSteps": 42})
    value = metrics.registry.get_sample_value
    labels = {"namespace": "ml", "trainingjob": "demo"}
    assert value("phalanx_job_checkpoint_interval_steps", {**labels, "mode": "auto"}) == 42
    metrics.job_checkpoint_interval("ml", "demo", {"mode": "fixed", "intervalSteps": 100})
    assert value("phalanx_job_checkpoint_interval_steps", {**labels, "mode": "auto"}) is None
    assert value("phalanx_job_checkpoint_interval_steps", {**labels, "mode": "fixed"}) == 100
    metrics.job_checkpoint_interval("ml", "demo", None)
    assert value("phalanx_job_checkpoint_interval_steps", {**labels, "mode": "fixed"}) is None
