"""One reconcile of a TrainingJob as a pure function: (job, observed cluster state) -> Plan.

Level-based: the plan depends only on what is observed now (pods from the index, heartbeat Leases, nodes)
and on the job's last status, never on which event woke the operator. Running it twice, or after an
operator restart, asks for the same deterministic names, so nothing is ever duplicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from phalanx.operator import api, builders, conditions, gang, names, validation
from phalanx.operator import status as observe
from phalanx.operator.timeutil import format_time, parse_time

MAX_INCIDENTS = 20


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the job, posted only after the status write succeeded."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the operator sees of one job's world."""

    pods: list[dict[str, Any]]
    """Summaries of every pod labelled with the job's name."""
    now: datetime
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Heartbeat summaries by pod name."""
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Labels of the nodes, by node name."""


@dataclass
class Plan:
    """Everything one reconcile wants done, in the order the handler applies it."""

    ensure: list[dict[str, Any]] = field(default_factory=list)
    """Per-job objects created when missing (RBAC, Services, PodGroup)."""
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class _Builder:
    """Accumulates one reconcile's status changes and events."""

    def __init__(self, job: dict[str, Any], observed: Observed) -> None:
        self.job = job
        self.observed = observed
        self.now = observed.now
        self.generation = job["metadata"].get("generation")
        self.status = api.TrainingJobStatus.model_validate(job.get("status") or {})
        self.plan = Plan()

    def condition(
        self,
        condition_type: str,
        value: bool,
        reason: str,
        message: str,
        event: Literal["Normal", "Warning"] | None = None,
    ) -> bool:
        self.status.conditions, changed = conditions.set_condition(
            self.status.conditions,
            condition_type,
            value,
            reason,
            message,
            now=self.now,
            generation=self.generation,
        )
        if changed and event is not None:
            self.event(event, reason, message)
        return changed

    def event(self, event_type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.plan.events.append(Event(event_type, reason, message))

    def delete(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            name = observe.pod_name(pod)
            if not observe.is_terminating(pod) and name not in self.plan.delete_pods:
                self.plan.delete_pods.append(name)

    def finish(self) -> Plan:
        self.status.observed_generation = self.generation
        self.plan.status = self.status.to_wire()
        return self.plan


def _trainer_name(spec: api.TrainingJobSpec | None, job: dict[str, Any]) -> str:
    template = spec.template if spec is not None else (job.get("spec") or {}).get("template") or {}
    index = validation.trainer_container_index(template)
    containers = (template.get("spec") or {}).get("containers") or []
    if index is None or not isinstance(containers[index], dict):
        return names.TRAINER_CONTAINER
    return containers[index].get("name") or names.TRAINER_CONTAINER


def _observe_into_status(b: _Builder, spec: api.TrainingJobSpec | None, trainer: str, desired: int) -> None:
    trainers = [pod for pod in b.observed.pods if observe.is_trainer(pod)]
    visible = [pod for pod in trainers if not observe.is_terminating(pod)]
    b.status.replicas = observe.replica_counts(desired, trainers, trainer)
    b.status.ready_workers = f"{b.status.replicas.ready}/{desired}"
    b.status.selector = names.active_worker_selector(b.job["metadata"]["name"])
    topology_spec = spec.topology if spec is not None else None
    b.status.workers = observe.worker_statuses(
        visible, b.observed.leases, b.observed.node_labels, topology_spec
    )
    step = observe.latest_step(trainers, b.observed.leases)
    if step is not None:
        # The heartbeats' word, even if lower: a job resumed without a durable checkpoint starts again.
        b.status.step = step


def _terminal(b: _Builder) -> bool:
    if conditions.is_true(b.status.conditions, conditions.SUCCEEDED):
        return True
    failed = conditions.find(b.status.conditions, conditions.FAILED)
    return failed is not None and failed.status == "True" and failed.reason != conditions.REASON_INVALID_SPEC


def _finish_job(b: _Builder, succeeded: bool, reason: str, message: str) -> None:
    """Mark the job done and remove what it no longer needs (spares, rendezvous; every live pod on failure)."""
    if succeeded:
        b.condition(conditions.SUCCEEDED, True, reason, message, "Normal")
        b.condition(conditions.FAILED, False, conditions.REASON_NOT_FAILED, "the job has not failed")
        b.status.state = "Succeeded"
    else:
        b.condition(conditions.FAILED, True, reason, message, "Warning")
        b.status.state = "Failed"
    b.condition(conditions.RUNNING, False, reason, message)
    b.status.completion_time = b.status.completion_time or format_time(b.now)
    _clean_up_finished(b, succeeded)


def _clean_up_finished(b: _Builder, succeeded: bool) -> None:
    # Finished workers stay for their logs; what still runs goes.
    for pod in b.observed.pods:
        spare = observe.role(pod) == names.ROLE_SPARE
        running_worker = observe.is_trainer(pod) and not succeeded and observe.is_live(pod)
        if observe.is_rendezvous(pod) or spare or running_worker:
            b.delete([pod])


def _match_rule(rules: list[api.FailureRule], exit_code: int) -> api.FailureRule | None:
    for rule in rules:
        if rule.match.exit_codes and exit_code in rule.match.exit_codes:
            return rule
    return None


def _rule_restarts(b: _Builder, rule: api.FailureRule) -> int:
    return sum(
        1 for incident in b.status.incidents if incident.rule == rule.name and incident.action != "Ignore"
    )


def _handle_failed_pods(b: _Builder, spec: api.TrainingJobSpec, trainer: str) -> bool:
    """Apply the failure policy to trainer pods whose trainer exited non-zero; True when the job failed.

    Each pod's failure is handled once (its uid is recorded as an incident), so a slow deletion never
    spends the restart budget twice.
    """
    handled = {incident.pod_uid for incident in b.status.incidents}
    for pod in sorted(b.observed.pods, key=observe.index):
        code = observe.trainer_exit_code(pod, trainer) if observe.is_trainer(pod) else None
        if code is None or code == 0 or observe.is_terminating(pod):
            continue
        uid = pod["metadata"].get("uid")
        if uid in handled:
            b.delete([pod])
            continue
        rule = _match_rule(spec.failure_policy.rules, code)
        action = rule.action if rule is not None else "ReplaceWorker"
        rule_text = f" (rule {rule.name})" if rule is not None and rule.name else ""
        name = observe.pod_name(pod)
        message = f"{name} exited with code {code}{rule_text}"
        incident = api.Incident(
            cause="ExitCode",
            worker=name,
            pod_uid=uid,
            node=(pod.get("spec") or {}).get("nodeName"),
            action=action,
            rule=rule.name if rule is not None else None,
            message=message,
            detected_at=format_time(b.now),
        )
        b.status.incidents = [*b.status.incidents, incident][-MAX_INCIDENTS:]
        if action == "FailJob":
            _finish_job(b, False, conditions.REASON_PERMANENT_FAILURE, message)
            return True
        if action != "Ignore":
            counts = rule is None or rule.counts_toward_max_restarts is not False
            restarts = b.status.restarts
            restarts.total += 1
            restarts.by_cause["ExitCode"] = restarts.by_cause.get("ExitCode", 0) + 1
            over_rule = (
                rule is not None
                and rule.max_restarts is not None
                and _rule_restarts(b, rule) > rule.max_restarts
            )
            if (counts and restarts.total > spec.failure_policy.max_restarts) or over_rule:
                limit = spec.failure_policy.max_restarts
                _finish_job(
                    b,
                    False,
                    conditions.REASON_RESTARTS_EXCEEDED,
                    f"{message}; restart budget ({limit}) spent",
                )
                return True
        b.event("Warning", "WorkerFailed", f"{message}: {action}")
        if action == "RestartJob":
            b.delete([p for p in b.observed.pods if observe.is_trainer(p)])
        else:
            b.delete([pod])
    return False


def _free_indices(pods: list[dict[str, Any]], job_name: str, count: int) -> list[int]:
    """The `count` lowest indices whose pod name no existing pod (even a terminating one) holds."""
    taken = {observe.pod_name(pod) for pod in pods}
    result: list[int] = []
    index = 0
    while len(result) < count:
        if names.worker_pod_name(job_name, index) not in taken:
            result.append(index)
        index += 1
    return result


def _scale_down(b: _Builder, live: list[dict[str, Any]], wanted: int) -> None:
    """Delete the surplus: unscheduled pods first, then the highest indices."""
    if len(live) <= wanted:
        return
    order = sorted(live, key=lambda pod: (gang.is_scheduled(pod), -observe.index(pod)))
    b.delete(order[: len(live) - wanted])


def _plan_pods(b: _Builder, spec: api.TrainingJobSpec, trainer: str) -> None:
    """Rendezvous pod, worker and spare pods, under the gang's all-or-nothing rule."""
    job, job_name = b.job, b.job["metadata"]["name"]
    rendezvous = [pod for pod in b.observed.pods if observe.is_rendezvous(pod)]
    if not rendezvous:
        b.plan.create_pods.append(builders.build_rendezvous_pod(job, spec))
    b.delete([pod for pod in rendezvous if observe.phase(pod) in observe.FINISHED_PHASES])

    trainers = [pod for pod in b.observed.pods if observe.is_trainer(pod)]
    live = [
        pod
        for pod in trainers
        if observe.is_live(pod, trainer) and observe.pod_name(pod) not in b.plan.delete_pods
    ]
    workers = [pod for pod in live if observe.role(pod) == names.ROLE_WORKER]
    spares = [pod for pod in live if observe.role(pod) == names.ROLE_SPARE]
    expected = spec.replicas + spec.spares
    gang_state = b.status.gang

    retry_after = parse_time(gang_state.retry_after)
    if not live and retry_after is not None and b.now < retry_after:
        # The reason stays the timeout (the why); the message and the state say a retry is pending.
        previous = conditions.find(b.status.conditions, conditions.GANG_SCHEDULED)
        why = previous.message if previous is not None else "the gang was not scheduled in time"
        if "; next attempt" not in why:
            why = f"{why}; next attempt ({gang_state.attempts + 1}) at {gang_state.retry_after}"
        b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_SCHEDULE_TIMEOUT, why)
        b.status.state = "Backoff"
        return

    if gang_state.scheduled_time is None and spec.gang.pod_group == "None" and live:
        decision = gang.decide(live, expected, spec.gang, gang_state.attempts, b.now)
        if decision.action == "DeleteAll":
            b.delete(live)
            gang_state.attempts += 1
            gang_state.retry_after = format_time(decision.retry_after or b.now)
            b.condition(conditions.GANG_SCHEDULED, False, decision.reason, decision.message)
            b.event("Warning", decision.reason, decision.message)
            b.status.state = "Backoff"
            return

    _scale_down(b, workers, spec.replicas)
    _scale_down(b, spares, spec.spares)
    missing_workers = max(spec.replicas - len(workers), 0)
    missing_spares = max(spec.spares - len(spares), 0)
    indices = _free_indices(b.observed.pods, job_name, missing_workers + missing_spares)
    roles: list[names.Role] = [names.ROLE_WORKER] * missing_workers + [names.ROLE_SPARE] * missing_spares
    new_pods = [
        builders.build_worker_pod(job, spec, index, role) for index, role in zip(indices, roles, strict=True)
    ]
    b.plan.create_pods.extend(new_pods)
    if new_pods:
        b.status.start_time = b.status.start_time or format_time(b.now)
        b.event("Normal", "CreatedPods", "created " + ", ".join(pod["metadata"]["name"] for pod in new_pods))

    remaining = [pod for pod in live if observe.pod_name(pod) not in b.plan.delete_pods]
    scheduled = sum(1 for pod in remaining if gang.is_scheduled(pod))
    if gang_state.scheduled_time is None:
        if not new_pods and len(remaining) >= expected and scheduled == len(remaining):
            gang_state.scheduled_time = format_time(b.now)
            gang_state.retry_after = None
            message = f"all {len(remaining)} pods of the gang are scheduled"
            b.condition(conditions.GANG_SCHEDULED, True, conditions.REASON_ALL_SCHEDULED, message, "Normal")
        else:
            message = f"{scheduled} of {expected} pods of the gang scheduled"
            b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_SCHEDULING, message)
            b.status.state = "Scheduling"
            return

    ready = sum(1 for pod in remaining if observe.role(pod) == names.ROLE_WORKER and observe.is_running(pod))
    if ready >= spec.effective_min_replicas:
        b.condition(
            conditions.RUNNING, True, conditions.REASON_TRAINING, f"{ready} workers running", "Normal"
        )
        b.status.state = "Running"
    else:
        message = f"{ready} of at least {spec.effective_min_replicas} workers running"
        b.condition(conditions.RUNNING, False, conditions.REASON_WAITING, message)
        b.status.state = "Pending"


def _completed(b: _Builder, trainer: str) -> tuple[bool, bool]:
    """(some worker finished training, every worker is done)."""
    workers = [
        pod
        for pod in b.observed.pods
        if observe.role(pod) == names.ROLE_WORKER and not observe.is_terminating(pod)
    ]
    codes = [observe.trainer_exit_code(pod, trainer) for pod in workers]
    some = any(code == 0 for code in codes)
    return some, some and all(code is not None for code in codes)


def plan(job: dict[str, Any], observed: Observed) -> Plan:
    """Decide one reconcile of `job`."""
    b = _Builder(job, observed)
    job_name = job["metadata"]["name"]
    spec, issues = validation.check(job.get("spec"), job_name)
    trainer = _trainer_name(spec, job)
    accepted_replicas = spec.replicas if spec is not None else b.status.replicas.desired
    _observe_into_status(b, spec, trainer, accepted_replicas)

    if _terminal(b):
        succeeded = conditions.is_true(b.status.conditions, conditions.SUCCEEDED)
        _clean_up_finished(b, succeeded)
        return b.finish()

    if spec is None:
        message = "; ".join(str(issue) for issue in issues)
        if b.condition(conditions.SPEC_VALID, False, conditions.REASON_INVALID_SPEC, message):
            for issue in issues:
                b.event("Warning", conditions.REASON_INVALID_SPEC, str(issue))
        started = b.status.start_time is not None or any(observe.is_trainer(pod) for pod in observed.pods)
        if not started:
            b.condition(conditions.FAILED, True, conditions.REASON_INVALID_SPEC, message)
            b.status.state = "Invalid"
        return b.finish()

    b.condition(conditions.SPEC_VALID, True, conditions.REASON_VALID_SPEC, "the spec is valid")
    failed = conditions.find(b.status.conditions, conditions.FAILED)
    if failed is None or failed.status == "True":
        b.condition(conditions.FAILED, False, conditions.REASON_NOT_FAILED, "the job has not failed")
    b.plan.ensure = builders.build_fixed_children(job, spec)

    if spec.suspend:
        b.delete([pod for pod in observed.pods if not observe.is_terminating(pod)])
        b.condition(conditions.SUSPENDED, True, conditions.REASON_SUSPENDED, "the job is suspended", "Normal")
        b.condition(conditions.RUNNING, False, conditions.REASON_SUSPENDED, "the job is suspended")
        b.condition(conditions.GANG_SCHEDULED, False, conditions.REASON_SUSPENDED, "the job is suspended")
        # A resumed job schedules a fresh gang, with a fresh timeout.
        b.status.gang = api.GangStatus(attempts=b.status.gang.attempts)
        b.status.state = "Suspended"
        return b.finish()
    was_suspended = conditions.is_true(b.status.conditions, conditions.SUSPENDED)
    reason = conditions.REASON_RESUMED if was_suspended else conditions.REASON_NOT_SUSPENDED
    message = "the job was resumed" if was_suspended else "the job is not suspended"
    b.condition(conditions.SUSPENDED, False, reason, message, "Normal" if was_suspended else None)

    if _handle_failed_pods(b, spec, trainer):
        return b.finish()

    some_done, all_done = _completed(b, trainer)
    if all_done:
        _finish_job(b, True, conditions.REASON_FINISHED, "every active worker finished training")
        return b.finish()
    if some_done:
        # Training has finished somewhere: replacing or adding pods now would start it again.
        b.status.state = "Finishing"
        return b.finish()

    _plan_pods(b, spec, trainer)
    return b.finish()
