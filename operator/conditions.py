"""Conditions keyed by type, following the Kubernetes API conventions (pure functions)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from phalanx.operator.api import Condition
from phalanx.operator.timeutil import format_time

GANG_SCHEDULED = "GangScheduled"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
SPEC_VALID = "SpecValid"
RECOVERING = "Recovering"
DEGRADED = "Degraded"
# Training health (`spec.health`): False with the first active signal as reason (`health.SIGNALS`).
HEALTHY = "Healthy"
PREFLIGHT_PASSED = "PreflightPassed"
CHILDREN_OWNED = "ChildrenOwned"
"""False while an object the job needs (its rendezvous Service, Role, NetworkPolicy, ...) exists under its name
but belongs to someone else: it is never adopted, and no pod of the job is created until it is gone."""
REASON_FOREIGN_OBJECT = "ForeignObject"
REASON_ALL_OWNED = "AllOwned"

# Reasons (one CamelCase word each), shared by conditions and Events.
REASON_INVALID_SPEC = "InvalidSpec"
REASON_VALID_SPEC = "Accepted"
REASON_ALL_SCHEDULED = "AllScheduled"
REASON_SCHEDULING = "Scheduling"
REASON_SCHEDULE_TIMEOUT = "ScheduleTimeout"
# GangScheduled=False: the cluster's schedulable capacity cannot hold the gang; no pod is created.
REASON_INSUFFICIENT_CAPACITY = "InsufficientCapacity"
REASON_TRAINING = "Training"
REASON_WAITING = "WaitingForWorkers"
REASON_FINISHED = "TrainingFinished"
REASON_SUSPENDED = "Suspended"
# Suspended=False while the job's pods are still stopping (each worker saves a checkpoint on SIGTERM):
# `kubectl wait --for=condition=Suspended` then returns once no pod of the job runs and every save is done.
REASON_SUSPENDING = "Suspending"
REASON_RESUMED = "Resumed"
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
REASON_CREATE_REFUSED = "CreateRefused"
REASON_NOT_SUSPENDED = "NotSuspended"
REASON_PERMANENT_FAILURE = "PermanentFailure"
REASON_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
REASON_NOT_FAILED = "NotFailed"
# Recovering: True with the failure cause as reason (e.g. `HeartbeatTimeout`), False with these.
REASON_RECOVERED = "Recovered"
REASON_NO_INCIDENT = "NoIncident"
REASON_SPARE_PROMOTED = "SparePromoted"
# An Event: a standby spare was lost and is replaced (no restart, no incident).
REASON_SPARE_REPLACED = "SpareReplaced"
# An Event: the workers train but their script publishes no steps.
REASON_PROGRESS_UNKNOWN = "ProgressUnknown"
# Degraded.
REASON_BELOW_MIN_REPLICAS = "BelowMinReplicas"
REASON_SHRUNK = "Shrunk"
REASON_PROMOTING_SPARE = "PromotingSpare"
REASON_SPARES_MISSING = "SparesMissing"
REASON_FULL_STRENGTH = "FullStrength"
# Degraded=True: pods replacing failures that spend no `maxRestarts` wait for the operator's back-off or hourly cap.
REASON_REPLACEMENT_BACKOFF = "ReplacementBackoff"
# Degraded False while a new (or resumed) gang comes up, before it first ran at full strength.
REASON_STARTING = "Starting"
# Healthy.
REASON_HEALTHY = "TrainingHealthy"
REASON_HEALTH_PAUSE = "HealthPause"
REASON_HEALTH_ROLLBACK = "HealthRollback"
REASON_ROLLED_BACK = "RolledBack"


def find(conditions: list[Condition], condition_type: str) -> Condition | None:
    return next((condition for condition in conditions if condition.type == condition_type), None)


def is_true(conditions: list[Condition], condition_type: str) -> bool:
    condition = find(conditions, condition_type)
    return condition is not None and condition.status == "True"


def set_condition(
    conditions: list[Condition],
    condition_type: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int | None,
) -> tuple[list[Condition], bool]:
    """A new list with the condition set, and whether its status changed.

    `lastTransitionTime` moves only when the status changes, so reasons and messages can be refined without
    losing when the condition became true.
    """
    wanted: Literal["True", "False"] = "True" if status else "False"
    previous = find(conditions, condition_type)
    changed = previous is None or previous.status != wanted
    transition = format_time(now) if changed or previous is None else previous.last_transition_time
    updated = Condition(
        type=condition_type,
        status=wanted,
        reason=reason,
        # Never empty: the 1.20 API server turned an empty message into null, which the string schema refused.
        message=message or reason,
        last_transition_time=transition,
        observed_generation=generation,
    )
    result = [updated if condition.type == condition_type else condition for condition in conditions]
    if previous is None:
        result.append(updated)
    return result, changed
