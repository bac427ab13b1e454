"""Operator settings, read from `PHALANX_OPERATOR_*` environment variables (and overridden by flags)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from phalanx.errors import UserFacingError

ENV_PREFIX = "PHALANX_OPERATOR_"
# Fixed, not configurable: two operators disagreeing about these would fight over the same objects.
FINALIZER = "phalanx.dev/finalizer"
STORAGE_PREFIX = "phalanx.dev"
PEERING_DEFAULT = "phalanx"


class OperatorSettings(BaseModel):
    """How `phalanx operator run` behaves. Each field reads `PHALANX_OPERATOR_<FIELD NAME IN CAPITALS>`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch (comma-separated in the environment); empty watches the whole cluster."""
    peering: str = ""
    """Name of the kopf peering object shared by the operator's replicas, so exactly one is active;
    empty runs standalone (one replica only)."""
    priority: int | None = None
    """Peering priority of this replica; the highest live priority is the active one. Unset: a random
    priority, because kopf pauses every replica when two share the highest priority."""
    leader_election: bool = False
    """Of the replicas that share `leaderElectionName`, only the one holding that Lease acts; the others stand by
    and take over when it stops renewing it (operator/leadership.py). The chart turns it on; off, this process
    acts alone and must be the only one."""
    leader_election_name: str = "phalanx-operator"
    """Name of the Lease the replicas compete for."""
    leader_election_namespace: str = ""
    """Namespace of that Lease (the chart sets the operator's own); empty: `viewNamespace`, else `default`."""
    leader_identity: str = ""
    """This replica's name in the Lease (the chart sets the pod's name, so that a restarted container takes its
    own Lease back at once); empty: the host's name."""
    lease_duration_seconds: float = Field(default=8.0, gt=0, le=300)
    """A standby takes over once the Lease has gone unrenewed this long (a leader that stops cleanly releases it
    at once): a killed leader is replaced after about this, plus `leaseRetrySeconds` and the start."""
    lease_renew_deadline_seconds: float = Field(default=6.0, gt=0, le=300)
    """The leader acts only until this long after its last successful renewal began, then renews before its
    next write (less than `leaseDurationSeconds`, so a paused leader stops before a standby starts)."""
    lease_retry_seconds: float = Field(default=1.0, gt=0, le=60)
    """Seconds between the leader's renewals and between the standbys' reads of the Lease."""
    reconcile_interval_seconds: float = Field(default=5.0, gt=0)
    """Seconds between periodic reconciles of each job (events trigger one at once as well)."""
    step_report_seconds: float = Field(default=30.0, ge=0, le=3600)
    """Seconds a job's status waits before it is written for its training step alone (`status.step`, the
    STEP column): written whenever it moved, it would be written at every periodic reconcile of every training
    job. Any other change of the status is written at once, with the step. The operator's metrics
    (`phalanx_job_step`) carry the live step. 0 writes every step seen."""
    recheck_children_seconds: float = Field(default=600.0, gt=0)
    """Seconds after which a job's Services, RBAC objects, store Secret, NetworkPolicy and PodGroup are checked
    again (made again if deleted), each object 1 to 1.5 times this long, fixed by its name. Deletions of most of
    them are seen at once by a watch, and the store Secret and PodGroup, which no watch covers, are checked again
    at the reconcile after the job created pods: this bounds what neither caught."""
    bind_host: str = "0.0.0.0"
    """Address the liveness and metrics endpoints listen on (the pod IP on a shared-port-space node)."""
    liveness_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the liveness endpoint `/healthz`; 0 turns it off."""
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the Prometheus endpoint `/metrics`; 0 turns it off."""
    max_workers: int = Field(default=8, ge=1)
    """Threads running reconciles at once (each job is reconciled by one thread at a time) for what happened to a
    job; the periodic reconciles run on a quarter as many threads of their own (at least one), so that however
    many jobs there are, they never queue ahead of a job that needs acting on."""
    clock_skew_seconds: float = Field(default=0.25, ge=0, le=60)
    """Clock skew tolerated between nodes and the operator: a worker group that started less than this after a
    failure is still re-formed on the operator's word (status.regroup), as it may include the failed worker."""
    api_concurrency: int = Field(default=32, ge=1, le=512)
    """Requests of one reconcile's kind (pod creations, deletions) sent to the API server at once: a gang of
    a thousand pods is created in parallel instead of one request after another."""
    max_gang_pods: int = Field(default=2000, ge=1, le=100000)
    """Most pods one TrainingJob may ask for (`replicas` + `spares`, and `maxReplicas` + `spares`); a larger
    job is refused with `InvalidSpec` before any of its pods exists. A gang is one pod per node, and few
    clusters have more than a couple of thousand nodes, so a larger number is almost always a typo whose pods
    would only fill the API server's storage. 2000 leaves room for the 1,000-pod gangs this operator is
    measured with; raise it on a cluster that really runs larger gangs."""
    worker_service_accounts: tuple[str, ...] = ()
    """Service accounts a job's template may name (`serviceAccountName`): the operator binds the worker Role to
    them. Any other is refused with `InvalidSpec`, and `default` always: every pod of the namespace runs as it.
    A template naming none runs as the job's own account (`<job>-worker`). Comma-separated in the
    environment."""
    worker_lease_role: str = ""
    """The ClusterRole (the chart's `<release>-worker`) bound to each job's workers for their heartbeat Leases:
    the operator holds `bind` on it, not the Lease verbs it grants. Empty: each job's own Role grants them, which
    the operator can only do while it holds them itself."""
    network_policy: bool = True
    """Give each job a NetworkPolicy: only the job's own pods reach its pods (the rendezvous store, torch's
    stores and collectives carry no credentials of their own), plus the metrics port from `metricsNamespace`.
    Needs a CNI that enforces NetworkPolicy; elsewhere the object is created and has no effect."""
    metrics_namespace: str = ""
    """The namespace (of Prometheus, say) whose pods may scrape the workers' metrics port through the job's
    NetworkPolicy; empty: no pod outside the job."""
    heartbeat_writes_per_second: float = Field(default=100.0, gt=0, le=100000)
    """Heartbeat writes per second one job may cause (each worker pod renews its Lease every
    `heartbeat.intervalSeconds`): a job whose interval is below `pods / this` is refused with `InvalidSpec`,
    naming the floor, so that no job's heartbeats can flood the API server."""
    min_gang_timeout_seconds: int = Field(default=3, ge=1, le=86400)
    """The least `gang.scheduleTimeoutSeconds` and `gang.backoffSeconds` a job may set: below it a gang that
    cannot be placed would be deleted and created again every few seconds."""
    free_replacements_per_hour: int = Field(default=10, ge=0, le=100000)
    """Replacements of failures that spend no `maxRestarts` (exits 3, 137 and 143, lost nodes, evictions) a job
    gets at once in an hour; each one after waits for a back-off (`replacementBackoffSeconds`), so code that
    exits 143 in a loop does not delete and create a pod every few seconds forever."""
    replacement_backoff_seconds: float = Field(default=10.0, gt=0, le=3600)
    """The first wait of such a replacement past `freeReplacementsPerHour`; it doubles with each further one in
    the hour, up to `replacementMaxBackoffSeconds`."""
    replacement_max_backoff_seconds: float = Field(default=600.0, gt=0, le=3600)
    """The longest wait of one such replacement."""
    max_replacements_per_hour: int = Field(default=100, ge=1, le=100000)
    """At most this many such replacements for one job in any hour: past it the pods wait until the oldest of
    the hour is an hour old."""
    host_path_prefix: str = ""
    """The node folder under which a job may keep its local checkpoint tier (`checkpoint.localTier.hostPath`):
    a job's host path must lie under `<prefix>/<namespace>/<job>`. Empty (the default): no job gets a host path,
    since a writable folder of any node path is far more than a pod of one's own (and fails Pod Security
    "restricted" besides)."""
    create_batch: int = Field(default=100, ge=1, le=10000)
    """Pods of one job created per reconcile: a large gang is created over several reconciles, so one job's
    creations never queue ahead of every other job's requests for long."""
    create_backoff_seconds: float = Field(default=1.0, gt=0, le=60)
    """First pause of a job's pod creations after the API server answered one with 429 (throttled), a 5xx, or
    another 4xx refusing the pod itself (a `FailedCreate` Event); doubles with each further refusal (up to
    `createMaxBackoffSeconds`), or follows its `Retry-After`."""
    create_max_backoff_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Longest pause of a job's pod creations after refusals by the API server."""
    view_interval_seconds: float = Field(default=1.0, ge=0, le=10)
    """Seconds between renewals of the operator's view canary, a Lease of its own that it sees through the
    same watch as the heartbeats: when the newest renewal it has seen is older than `viewLagSeconds`, its view
    is stale (paused, restarted, a stalled watch) and no heartbeat is judged late for that time. 0 turns it
    off: heartbeats are then judged by the wall clock alone."""
    view_lag_seconds: float = Field(default=3.0, gt=0, le=60)
    """How old the newest canary renewal seen may be before the operator's view counts as stale."""
    view_namespace: str = ""
    """Namespace of the view canary when the operator watches the whole cluster (the chart sets the
    operator's own); empty: `default`. Watching some namespaces, each gets a canary of its own."""
    log_level: str = "INFO"
    """Python log level of the operator."""
    log_format: Literal["text", "json"] = "text"
    """`text`: readable lines; `json`: one JSON object per line (time, level, logger, message, and the
    record's own fields), for a cluster's log pipeline."""

    @field_validator("namespaces", "worker_service_accounts", mode="before")
    @classmethod
    def _split_namespaces(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="after")
    def _lease_times_in_order(self) -> OperatorSettings:
        if not self.lease_retry_seconds < self.lease_renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "leaseRetrySeconds < leaseRenewDeadlineSeconds < leaseDurationSeconds must hold (got "
                f"{self.lease_retry_seconds}, {self.lease_renew_deadline_seconds}, {self.lease_duration_seconds})"
            )
        return self

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def view_namespaces(self) -> tuple[str, ...]:
        """Namespaces the view canary is written to (none when it is off; namespace patterns get none)."""
        if not self.view_interval_seconds:
            return ()
        if self.clusterwide:
            return (self.view_namespace or "default",)
        return tuple(namespace for namespace in self.namespaces if not any(c in namespace for c in "*?[!"))

    @property
    def liveness_endpoint(self) -> str | None:
        return f"http://{self.bind_host}:{self.liveness_port}/healthz" if self.liveness_port else None


def settings_from(env: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> OperatorSettings:
    """Settings from the environment, then `overrides` (None values ignored)."""
    values: dict[str, Any] = {}
    for name in OperatorSettings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = raw
    values.update({key: value for key, value in (overrides or {}).items() if value is not None})
    try:
        return OperatorSettings.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{ENV_PREFIX}{str(item['loc'][0]).upper() if item['loc'] else ''}: {item['msg']}"
            for item in error.errors()
        )
        raise UserFacingError(f"invalid operator settings: {problems}") from None
