"""Cross-field rules of a TrainingJob that Kubernetes 1.20 cannot check (no CEL): pure functions.

Each problem is a `SpecIssue(field, message)` whose `field` is the wire path (e.g. `spec.minReplicas`), so the
condition and the Event tell the user exactly what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from phalanx.operator import api, names

DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
"""An RFC 1035 label: what a Service's name must be (and a pod's hostname, which also allows a leading digit)."""


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a TrainingJob spec."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _wire_path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: dict[str, Any] | None) -> tuple[api.TrainingJobSpec | None, list[SpecIssue]]:
    """The typed spec, or the type errors (as issues) when the object bypassed the CRD's schema."""
    try:
        return api.TrainingJobSpec.model_validate(raw or {}), []
    except ValidationError as error:
        return None, [
            SpecIssue(_wire_path(tuple(item["loc"])), item["msg"]) for item in error.errors(include_url=False)
        ]


def trainer_container_index(template: dict[str, Any]) -> int | None:
    """Index of the container running training: the one named `trainer`, else the first."""
    containers = (template.get("spec") or {}).get("containers") or []
    for index, container in enumerate(containers):
        if isinstance(container, dict) and container.get("name") == names.TRAINER_CONTAINER:
            return index
    return 0 if containers else None


def _replica_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    # Each count's own range (replicas >= 1, spares >= 0) is the schema's: the API server and `parse_spec`
    # refuse a value outside it before these rules run.
    issues = []
    low, high = spec.effective_min_replicas, spec.effective_max_replicas
    if spec.min_replicas is not None and spec.max_replicas is not None and low > high:
        issues.append(
            SpecIssue("spec.minReplicas", f"minReplicas ({low}) is greater than maxReplicas ({high})")
        )
    elif not low <= spec.replicas <= high:
        issues.append(
            SpecIssue(
                "spec.replicas",
                f"replicas ({spec.replicas}) is outside minReplicas..maxReplicas ({low}..{high})",
            )
        )
    return issues


def _gang_size_issues(spec: api.TrainingJobSpec, max_gang_pods: int | None) -> list[SpecIssue]:
    """The operator-wide limit on pods per job (`maxGangPods`): what the spec asks for now, and what
    `maxReplicas` lets it be scaled to."""
    if max_gang_pods is None:
        return []
    asked = spec.replicas + spec.spares
    if asked > max_gang_pods:
        return [
            SpecIssue(
                "spec.replicas",
                f"replicas + spares ({asked}) exceeds the operator's limit of {max_gang_pods} pods per "
                "job (maxGangPods)",
            )
        ]
    if spec.max_replicas is not None and spec.max_replicas + spec.spares > max_gang_pods:
        return [
            SpecIssue(
                "spec.maxReplicas",
                f"maxReplicas + spares ({spec.max_replicas + spec.spares}) exceeds the operator's limit of "
                f"{max_gang_pods} pods per job (maxGangPods)",
            )
        ]
    return []


def _template_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    pod_spec = spec.template.get("spec")
    if not isinstance(pod_spec, dict):
        return [SpecIssue("spec.template.spec", "the pod template needs a spec with containers")]
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [SpecIssue("spec.template.spec.containers", "at least one container is required")]
    index = trainer_container_index(spec.template)
    assert index is not None
    container = containers[index]
    path = f"spec.template.spec.containers[{index}]"
    if not isinstance(container, dict):
        return [SpecIssue(path, "must be a container object")]
    issues = []
    command = container.get("command")
    if not command or not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        issues.append(
            SpecIssue(
                f"{path}.command", "the trainer container needs a command (a list of strings) to launch"
            )
        )
    if not container.get("image"):
        issues.append(SpecIssue(f"{path}.image", "the trainer container needs an image"))
    return issues


def _failure_policy_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    issues = []
    for index, rule in enumerate(spec.failure_policy.rules):
        if not any(value for value in rule.match.model_dump().values()):
            path = f"spec.failurePolicy.rules[{index}].match"
            issues.append(SpecIssue(path, "the rule matches nothing: set at least one criterion"))
    return issues


def _checkpoint_tier_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    checkpoint = spec.checkpoint
    local = checkpoint.local_tier
    if not local.enabled:
        return []
    issues = []
    if local.path.rstrip("/") == checkpoint.path.rstrip("/"):
        issues.append(SpecIssue("spec.checkpoint.localTier.path", "must differ from checkpoint.path"))
    return issues


def validate_spec(
    spec: api.TrainingJobSpec, job_name: str = "", max_gang_pods: int | None = None
) -> list[SpecIssue]:
    """Every cross-field problem of a parsed spec (empty when the spec is usable). `max_gang_pods`: the
    operator's limit on pods per job (None: no limit)."""
    issues = _replica_issues(spec) + _gang_size_issues(spec, max_gang_pods)
    issues += _template_issues(spec) + _failure_policy_issues(spec)
    if spec.checkpoint.claim_name and spec.checkpoint.volume:
        issues.append(
            SpecIssue("spec.checkpoint.volume", "set either checkpoint.claimName or checkpoint.volume")
        )
    issues += _checkpoint_tier_issues(spec)
    if spec.heartbeat.timeout_seconds <= spec.heartbeat.interval_seconds:
        issues.append(
            SpecIssue("spec.heartbeat.timeoutSeconds", "must be greater than heartbeat.intervalSeconds")
        )
    rendezvous = spec.rendezvous
    if rendezvous.keepalive_timeout_seconds < rendezvous.keepalive_interval_seconds:
        issues.append(
            SpecIssue(
                "spec.rendezvous.keepaliveTimeoutSeconds",
                "must be at least rendezvous.keepaliveIntervalSeconds",
            )
        )
    if spec.gang.max_backoff_seconds < spec.gang.backoff_seconds:
        issues.append(SpecIssue("spec.gang.maxBackoffSeconds", "must be at least gang.backoffSeconds"))
    if spec.gang.pod_group == "Kueue" and not spec.gang.queue_name:
        issues.append(SpecIssue("spec.gang.queueName", "Kueue needs the name of a LocalQueue"))
    if spec.topology is not None and not spec.topology.key:
        issues.append(SpecIssue("spec.topology.key", "must name a node label"))
    if job_name and len(job_name) + names.WORKER_SUFFIX_ROOM > names.MAX_HOSTNAME:
        limit = names.MAX_HOSTNAME - names.WORKER_SUFFIX_ROOM
        issues.append(
            SpecIssue("metadata.name", f"must be at most {limit} characters (pods use it as hostname)")
        )
    if job_name and not DNS_LABEL.fullmatch(job_name):
        # A TrainingJob's name may hold dots or start with a digit; its Services' names and its pods'
        # hostnames may not, and the API server would refuse every one of them.
        issues.append(
            SpecIssue(
                "metadata.name",
                "must be lowercase letters, digits and '-', starting with a letter (Services and pod "
                "hostnames are named after it)",
            )
        )
    return issues


def check(
    raw_spec: dict[str, Any] | None, job_name: str = "", max_gang_pods: int | None = None
) -> tuple[api.TrainingJobSpec | None, list[SpecIssue]]:
    """Parse and validate; the spec is returned only when there is no issue."""
    spec, issues = parse_spec(raw_spec)
    if spec is None:
        return None, issues
    issues = validate_spec(spec, job_name, max_gang_pods)
    return (None, issues) if issues else (spec, [])
