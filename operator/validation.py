"""Cross-field rules of a TrainingJob, as pure functions: what the CRD's CEL rules cannot express (the pod
template, quantities, the operator's own limits such as `maxGangPods`), and the CEL rules again, for objects
stored before a rule existed or on a cluster that does not run CEL.

Each problem is a `SpecIssue(field, message)` whose `field` is the wire path (e.g. `spec.minReplicas`), so the
condition and the Event tell the user exactly what to fix.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from phalanx.operator import api, formats, names

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


def trainer_container_index(template: dict[str, Any], name: str = names.TRAINER_CONTAINER) -> int | None:
    """Index of the container running training in a pod or pod template: the one called `name`
    (`spec.trainerContainer`); None without one. Never a guess: training in a sidecar is worse than no
    training."""
    containers = (template.get("spec") or {}).get("containers") or []
    for index, container in enumerate(containers):
        if isinstance(container, dict) and container.get("name") == name:
            return index
    return None


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
    `maxReplicas` lets it be scaled to. The field named is the one that broke the limit: `replicas` when
    it alone is over, else `spares`, which pushed it over; `maxReplicas` when only scaling up would."""
    if max_gang_pods is None:
        return []
    limit = f"the operator's limit of {max_gang_pods} pods per job (maxGangPods)"
    asked = spec.replicas + spec.spares
    if spec.replicas > max_gang_pods:
        return [SpecIssue("spec.replicas", f"replicas ({spec.replicas}) exceeds {limit}")]
    if asked > max_gang_pods:
        return [
            SpecIssue(
                "spec.spares",
                f"spares ({spec.spares}) with replicas ({spec.replicas}) makes {asked} pods, over {limit}",
            )
        ]
    if spec.max_replicas is not None and spec.max_replicas + spec.spares > max_gang_pods:
        total = spec.max_replicas + spec.spares
        return [
            SpecIssue(
                "spec.maxReplicas",
                f"maxReplicas ({spec.max_replicas}) with spares ({spec.spares}) makes {total} pods, over {limit}",
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
    name = spec.trainer_container
    index = trainer_container_index(spec.template, name)
    if index is None:
        found = ", ".join(repr(c.get("name")) for c in containers if isinstance(c, dict)) or "none named"
        return [
            SpecIssue(
                "spec.trainerContainer",
                f"no container of spec.template.spec.containers is named {name!r} (found {found}): name the "
                f"container that runs training {name!r}, or set spec.trainerContainer to its name",
            )
        ]
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


def _quantity_issue(path: str, value: Any) -> tuple[SpecIssue | None, Any]:
    try:
        return None, formats.parse_quantity(value)
    except ValueError as error:
        return SpecIssue(path, str(error)), None


def _resources_issues(path: str, resources: Any) -> list[SpecIssue]:
    """A container's requests and limits: each a non-negative quantity, no request above its limit (the API
    server refuses the pod otherwise, on every attempt)."""
    if not isinstance(resources, dict):
        return []
    issues, amounts = [], {}
    for kind in ("limits", "requests"):
        entries = resources.get(kind)
        if not isinstance(entries, dict):
            continue
        for resource, value in entries.items():
            issue, amount = _quantity_issue(f"{path}.{kind}.{resource}", value)
            if issue is not None:
                issues.append(issue)
            else:
                amounts[kind, resource] = amount
    for (kind, resource), amount in amounts.items():
        limit = amounts.get(("limits", resource))
        if kind == "requests" and limit is not None and amount > limit:
            issues.append(
                SpecIssue(
                    f"{path}.requests.{resource}",
                    f"the request ({resources['requests'][resource]}) is above the limit "
                    f"({resources['limits'][resource]})",
                )
            )
    return issues


def _empty_dir_issues(path: str, volume: Any) -> list[SpecIssue]:
    empty_dir = volume.get("emptyDir") if isinstance(volume, dict) else None
    if not isinstance(empty_dir, dict) or empty_dir.get("sizeLimit") is None:
        return []
    issue, _ = _quantity_issue(f"{path}.emptyDir.sizeLimit", empty_dir["sizeLimit"])
    return [issue] if issue is not None else []


def _quantity_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    """The quantities the free-form parts of the spec carry (the pod template, `checkpoint.volume`): the
    CRD cannot check them, and one the API server refuses would fail every pod creation."""
    pod_spec = spec.template.get("spec")
    issues = _empty_dir_issues("spec.checkpoint.volume", spec.checkpoint.volume)
    issues += _resources_issues("spec.rendezvous.resources", spec.rendezvous.resources.model_dump())
    if not isinstance(pod_spec, dict):
        return issues
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(pod_spec.get(kind) or []):
            if isinstance(container, dict):
                path = f"spec.template.spec.{kind}[{index}].resources"
                issues += _resources_issues(path, container.get("resources"))
    for index, volume in enumerate(pod_spec.get("volumes") or []):
        issues += _empty_dir_issues(f"spec.template.spec.volumes[{index}]", volume)
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
    if local.path == checkpoint.path:  # both normalised by their type
        issues.append(SpecIssue("spec.checkpoint.localTier.path", "must differ from checkpoint.path"))
    return issues


CREDENTIAL_KEY = re.compile(
    r"secret|password|passwd|token|credential|private|access_?key|(^|_)key(_id)?$", re.I
)
"""Storage option names that hold a credential (s3fs's `key`/`secret`/`token`, AWS's `aws_access_key_id`, ...)."""


def _storage_option_issues(spec: api.TrainingJobSpec) -> list[SpecIssue]:
    """Credentials in `storageOptions` would be readable by everyone who can read the job (and they land in
    the trainer's plain environment): they belong in the Secret that `secretName` names."""
    store = spec.checkpoint.object_store
    issues: list[SpecIssue] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            where = f"{path}.{key}"
            if CREDENTIAL_KEY.search(str(key)):
                message = "looks like a credential: put it in the Secret that objectStore.secretName names"
                issues.append(SpecIssue(where, message))
            else:
                walk(value, where)

    if store is not None:
        walk(store.storage_options, "spec.checkpoint.objectStore.storageOptions")
    return issues


def validate_spec(
    spec: api.TrainingJobSpec, job_name: str = "", max_gang_pods: int | None = None
) -> list[SpecIssue]:
    """Every cross-field problem of a parsed spec (empty when the spec is usable). `max_gang_pods`: the
    operator's limit on pods per job (None: no limit)."""
    issues = _replica_issues(spec) + _gang_size_issues(spec, max_gang_pods)
    issues += _template_issues(spec) + _quantity_issues(spec) + _failure_policy_issues(spec)
    if spec.checkpoint.claim_name and spec.checkpoint.volume:
        issues.append(
            SpecIssue("spec.checkpoint.volume", "set either checkpoint.claimName or checkpoint.volume")
        )
    issues += _checkpoint_tier_issues(spec) + _storage_option_issues(spec)
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


@dataclass(frozen=True)
class Admission:
    """What this operator lets a job's template have beyond a pod of its own (the chart's values)."""

    host_path_prefix: str = ""
    """`hostPathPrefix`: a local tier on the node only under `<prefix>/<namespace>/<job>`; empty: none."""
    service_accounts: frozenset[str] = frozenset()
    """`workerServiceAccounts`: accounts a template may name, to which the operator then binds the worker Role;
    others (and `default`, always) are refused, and a template naming none runs as the job's own account."""
    heartbeat_writes_per_second: float | None = None
    """`heartbeatWritesPerSecond`: a job's heartbeat interval must be at least its pods divided by this (None:
    no floor)."""
    min_gang_timeout_seconds: int = 1
    """`minGangTimeoutSeconds`: the least gang timeout and back-off a job may set."""


def check(
    raw_spec: dict[str, Any] | None,
    job_name: str = "",
    max_gang_pods: int | None = None,
    admission: Admission | None = None,
    namespace: str = "",
) -> tuple[api.TrainingJobSpec | None, list[SpecIssue]]:
    """Parse and validate; the spec is returned only when there is no issue. `admission`: the operator's
    limits on host paths and service accounts (None: not judged)."""
    spec, issues = parse_spec(raw_spec)
    if spec is None:
        return None, issues
    issues = validate_spec(spec, job_name, max_gang_pods)
    if admission is not None:
        issues += _host_path_issues(spec, admission.host_path_prefix, namespace, job_name)
        issues += _service_account_issues(spec, admission.service_accounts)
        issues += _floor_issues(spec, admission)
    return (None, issues) if issues else (spec, [])


def _floor_issues(spec: api.TrainingJobSpec, admission: Admission) -> list[SpecIssue]:
    """The operator's floors on what a job costs the API server: heartbeat writes per second, and how often a
    gang that cannot be placed is made again."""
    issues: list[SpecIssue] = []
    budget = admission.heartbeat_writes_per_second
    pods = spec.effective_max_replicas + spec.spares
    # Through the hub a job writes one Lease per interval, whatever its size.
    hub = spec.heartbeat_reporting == "hub"
    writers = 1 if hub else pods
    if budget is not None and spec.heartbeat.interval_seconds * budget < writers:
        floor = writers / budget
        who = "the job's heartbeat hub" if hub else f"{pods} pods"
        issues.append(
            SpecIssue(
                "spec.heartbeat.intervalSeconds",
                f"must be at least {floor:g} for {who}: the operator allows {budget:g} heartbeat writes "
                "per second per job (the chart's heartbeatWritesPerSecond)",
            )
        )
    least = admission.min_gang_timeout_seconds
    for field, value in (
        ("scheduleTimeoutSeconds", spec.gang.schedule_timeout_seconds),
        ("backoffSeconds", spec.gang.backoff_seconds),
    ):
        if value < least:
            issues.append(
                SpecIssue(
                    f"spec.gang.{field}",
                    f"must be at least {least} (the chart's minGangTimeoutSeconds): a gang that cannot be placed "
                    "would be made again every few seconds",
                )
            )
    return issues


def _service_account_issues(spec: api.TrainingJobSpec, allowed: frozenset[str]) -> list[SpecIssue]:
    """The worker Role is bound to the account the template names: `default` never (every pod of the
    namespace runs as it), another only when the chart lists it."""
    pod_spec = spec.template.get("spec") or {}
    issues = []
    for key in ("serviceAccountName", "serviceAccount"):
        account = pod_spec.get(key)
        if not account:
            continue
        field = f"spec.template.spec.{key}"
        if account == "default":
            issues.append(SpecIssue(field, "the worker Role is never bound to default: leave it out"))
        elif account not in allowed:
            why = f"{account} is not among the operator's workerServiceAccounts: leave it out (the job gets its own)"
            issues.append(SpecIssue(field, why))
    return issues


def _host_path_issues(
    spec: api.TrainingJobSpec, prefix: str, namespace: str, job_name: str
) -> list[SpecIssue]:
    """A local tier on the host only where the operator allows one: under `<prefix>/<namespace>/<job>`."""
    host_path = spec.checkpoint.local_tier.host_path if spec.checkpoint.local_tier.enabled else None
    if not host_path:
        return []
    field = "spec.checkpoint.localTier.hostPath"
    if not prefix:
        why = "this operator allows no host path (its chart's hostPathPrefix is empty): leave hostPath out"
        return [SpecIssue(field, why)]
    allowed = posixpath.join(posixpath.normpath(prefix), namespace, job_name)
    if host_path != allowed and not host_path.startswith(allowed + "/"):
        return [
            SpecIssue(field, f"must lie under {allowed} (the operator's hostPathPrefix, then namespace/job)")
        ]
    return []
