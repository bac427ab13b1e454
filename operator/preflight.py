"""The preflight's outcome as the workers' heartbeats tell it (pure functions; worker/preflight.py runs it).

Every pod publishes `phalanx.dev/preflight` (`running`, `passed`, `failed`) with a reason and a message. A
failure anywhere decides (the first pod by name that reports one, so replays agree); else a pass anywhere
(every worker of the group compared, and they agreed before any of them published it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.operator import api
from phalanx.operator import status as observe

PASSED = "passed"
FAILED = "failed"
REASON_RUNNING = "PreflightRunning"
REASON_PASSED = "Passed"
REASON_FAILED = "PreflightFailed"
"""The `Failed` condition's reason when the preflight stopped the job."""
REASON_RESTART = "PreflightRestart"
"""The preflight's planned restart of the worker group (a Normal Event, `PreflightPassed` False and `Degraded`
False with this reason while it runs): no failure, nothing spent."""
RESTART_CAUSE_PREFIX = "preflight:"
"""How a launcher's `restart-cause` heartbeat starts after the preflight's planned restart (worker/heartbeat.py,
`PREFLIGHT_RESTART_CAUSE`)."""
LAUNCHER_EXIT_FAILED = 6
"""The launcher's exit code for a failed preflight (worker/exitcodes.py, `LauncherExit.PREFLIGHT_FAILED`)."""


@dataclass(frozen=True)
class Outcome:
    state: api.PreflightState
    reason: str
    message: str
    pod: str


def outcome(pods: list[dict[str, Any]], leases: dict[str, dict[str, Any]]) -> Outcome | None:
    """The preflight's outcome among the job's trainer pods' heartbeats; None while none has told one."""
    told: dict[str, list[Outcome]] = {PASSED: [], FAILED: []}
    for pod in sorted(pods, key=observe.pod_name):
        lease = leases.get(observe.pod_name(pod)) or {}
        word = lease.get("preflight")
        if word in told:
            state: api.PreflightState = "Passed" if word == PASSED else "Failed"
            reason = lease.get("preflight-reason") or (REASON_PASSED if word == PASSED else REASON_FAILED)
            # Never empty: the API server would store an empty string as null, which the schema refuses.
            message = lease.get("preflight-message") or reason
            told[word].append(Outcome(state, reason, message, observe.pod_name(pod)))
    found = told[FAILED] or told[PASSED]
    return found[0] if found else None


def planned_restart(lease: dict[str, Any] | None) -> bool:
    """Whether the heartbeat says its launcher last restarted the worker group for the preflight."""
    return str((lease or {}).get("restart-cause") or "").startswith(RESTART_CAUSE_PREFIX)


def restart_message(spec: api.PreflightSpec) -> str:
    middle = max(1, spec.steps // 2)
    return (
        f"the preflight's planned restart: the workers trained {spec.steps} steps and restart from the durable "
        f"checkpoint taken after {middle} of them, as after a failure (nothing failed, no restart is counted); "
        "torch may give the standby's place to another pod"
    )


def running_message(spec: api.PreflightSpec) -> str:
    middle = max(1, spec.steps // 2)
    return (
        f"the preflight runs: {spec.steps} steps with a durable checkpoint after {middle}, then a restart "
        f"from it that must resume the run ({'bitwise' if spec.tolerance == 0 else f'within {spec.tolerance:g}'})"
    )
