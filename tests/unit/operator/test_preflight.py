"""The preflight as the operator follows it: heartbeats -> status.preflight, PreflightPassed, a failed job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator import api, builders
from phalanx.operator.reconcile import Observed, Plan, plan

MakeJob = Callable[..., dict[str, Any]]
MakePod = Callable[..., dict[str, Any]]
PREFLIGHT = {"enabled": True, "steps": 10}


def _gang(make_pod: MakePod) -> list[dict[str, Any]]:
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-worker-2", role="spare")]
    return [*pods, make_pod("demo-rdzv", role="rendezvous")]


def _leases(now: datetime, **preflight: dict[str, str]) -> dict[str, dict[str, Any]]:
    renewed = (now - timedelta(seconds=0.2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    leases = {}
    for name, phase in (
        ("demo-worker-0", "training"),
        ("demo-worker-1", "training"),
        ("demo-worker-2", "standby"),
    ):
        leases[name] = {
            "step": "3",
            "phase": phase,
            "renewTime": renewed,
            **preflight.get(name.replace("-", "_"), {}),
        }
    return leases


def _condition(result: Plan, condition_type: str) -> dict[str, Any] | None:
    return next((c for c in result.status["conditions"] if c["type"] == condition_type), None)


def _reconcile(
    job: dict[str, Any], pods: list[dict[str, Any]], leases: dict[str, Any], now: datetime
) -> Plan:
    return plan(job, Observed(pods=pods, now=now, leases=leases))


def _empty_strings(value: Any, path: str = "status") -> list[str]:
    """Where the status holds "": the API server stores it as null, which the CRD's string schema refuses."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _empty_strings(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [
            found for index, item in enumerate(value) for found in _empty_strings(item, f"{path}[{index}]")
        ]
    return [path] if value == "" else []


def test_a_running_preflight_is_shown_as_such(make_job: MakeJob, make_pod: MakePod, now: datetime) -> None:
    result = _reconcile(make_job(preflight=PREFLIGHT), _gang(make_pod), _leases(now), now)
    assert result.status["preflight"]["state"] == "Running"
    assert _empty_strings(result.status) == []
    passed = _condition(result, "PreflightPassed")
    assert passed is not None and passed["status"] == "False" and passed["reason"] == "PreflightRunning"
    assert "10 steps with a durable checkpoint after 5" in passed["message"]
    assert _condition(_reconcile(make_job(), _gang(make_pod), _leases(now), now), "PreflightPassed") is None


def test_a_passed_preflight_sets_the_condition_once(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(preflight=PREFLIGHT)
    told = {"preflight": "passed", "preflight-reason": "Passed", "preflight-message": "matched bitwise"}
    result = _reconcile(job, _gang(make_pod), _leases(now, demo_worker_1=told), now)
    silent = {"preflight": "passed", "preflight-reason": "Passed", "preflight-message": ""}
    assert (
        _empty_strings(_reconcile(job, _gang(make_pod), _leases(now, demo_worker_1=silent), now).status) == []
    )
    passed = _condition(result, "PreflightPassed")
    assert passed is not None and passed["status"] == "True" and passed["reason"] == "Passed"
    assert passed["message"] == "matched bitwise (pod demo-worker-1)"
    assert (
        result.status["preflight"]["state"] == "Passed"
        and result.status["preflight"]["pod"] == "demo-worker-1"
    )
    assert [event.reason for event in result.events if event.reason == "Passed"] == ["Passed"]
    again = _reconcile(
        {**job, "status": result.status}, _gang(make_pod), _leases(now, demo_worker_1=told), now
    )
    assert again.status["preflight"] == result.status["preflight"] and again.events == []
    assert result.delete_pods == [] and result.status["state"] != "Failed"


def test_a_failed_preflight_fails_the_job_and_removes_its_pods(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    job = make_job(preflight=PREFLIGHT)
    passed = {"preflight": "passed", "preflight-reason": "Passed"}
    failed = {
        "preflight": "failed",
        "preflight-reason": "ResumeMismatch",
        "preflight-message": "loss at step 6 differs",
    }
    running = _reconcile(job, _gang(make_pod), _leases(now), now)
    job = {**job, "status": running.status}
    result = _reconcile(job, _gang(make_pod), _leases(now, demo_worker_0=passed, demo_worker_1=failed), now)
    assert result.status["state"] == "Failed"
    failed_condition = _condition(result, "Failed")
    assert failed_condition is not None and failed_condition["reason"] == "PreflightFailed"
    assert (
        "ResumeMismatch" in failed_condition["message"]
        and "loss at step 6 differs" in failed_condition["message"]
    )
    preflight = _condition(result, "PreflightPassed")
    assert (
        preflight is not None and preflight["status"] == "False" and preflight["reason"] == "ResumeMismatch"
    )
    assert {event.reason for event in result.events} >= {"ResumeMismatch", "PreflightFailed"}
    assert sorted(result.delete_pods) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]


def test_new_pods_run_the_preflight_only_until_it_passed(make_job: MakeJob) -> None:
    def steps(job: dict[str, Any]) -> str:
        spec = api.TrainingJobSpec.model_validate(job["spec"])
        env = {entry["name"]: entry.get("value") for entry in builders.contract_env(job, spec, "worker")}
        return env["PHALANX_PREFLIGHT_STEPS"]

    assert steps(make_job()) == "0"
    job = make_job(preflight=PREFLIGHT)
    assert steps(job) == "10"
    assert steps({**job, "status": {"preflight": {"state": "Running"}}}) == "10"
    assert steps({**job, "status": {"preflight": {"state": "Passed"}}}) == "0"


def test_a_launcher_exiting_for_the_preflight_fails_it_without_a_heartbeat(
    make_job: MakeJob, make_pod: MakePod, now: datetime
) -> None:
    pods = _gang(make_pod)
    pods[0] = make_pod("demo-worker-0", phase="Failed", exit_code=6)
    result = _reconcile(make_job(preflight=PREFLIGHT), pods, {}, now)
    failed = _condition(result, "Failed")
    assert failed is not None and failed["reason"] == "PreflightFailed"
    assert (
        result.status["preflight"]["state"] == "Failed"
        and result.status["preflight"]["pod"] == "demo-worker-0"
    )
    # Without a preflight, exit 6 is just another permanent failure.
    plain = _reconcile(make_job(), pods, {}, now)
    assert (_condition(plain, "Failed") or {}).get("reason") == "PermanentFailure"
