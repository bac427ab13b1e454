"""The TrainingJob API (phalanx.dev/v1alpha1): one pydantic model that is the source of truth for the CRD.

Field docstrings become the CRD's descriptions, `Field(ge=..., le=...)` its ranges, `Literal[...]` its enums
and defaults its structural defaults (see `phalanx.operator.crd`). Python names are snake_case; the wire
format is camelCase through aliases. A value that can never be valid on its own (a negative count, a port
beyond 65535) carries its range here, and a bad combination (min above max, a timeout under its interval) a
CEL rule (`cel_rules`), so the API server refuses it at apply time naming the field. `phalanx.operator.
validation` checks those rules again, and what CEL cannot express (the pod template, quantities, the
operator's own limits), and answers with an `InvalidSpec` condition naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from phalanx import contract
from phalanx.operator import formats

GROUP = contract.GROUP
VERSION = contract.VERSION
API_VERSION = contract.API_VERSION
KIND = contract.KIND
LIST_KIND = "TrainingJobList"
PLURAL = contract.PLURAL
SINGULAR = "trainingjob"
SHORT_NAMES = ("tj",)
CRD_NAME = f"{PLURAL}.{GROUP}"

PRESERVE_UNKNOWN: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
POD_TEMPLATE_SCHEMA = "x-phalanx-pod-template-spec"
"""Marks the field whose CRD schema is Kubernetes' PodTemplateSpec (`podschema.py`), not one made from its type."""
DATE_TIME: JsonDict = {"format": "date-time"}

FailureAction = Literal["ReplaceWorker", "RestartJob", "FailJob", "Ignore"]
TopologyPolicy = Literal["Pack", "Spread"]
PodGroupKind = Literal["None", "Coscheduling", "Volcano", "Kueue"]
RendezvousProtocol = Literal["auto", "c10d", "rounds"]
HeartbeatReporting = Literal["auto", "leases", "hub"]
HUB_FROM_PODS = 128
"""With `heartbeat.reporting: auto`, jobs whose group may reach this many pods (maxReplicas + spares) report
through the hub: one Lease renewal per worker per interval is 64 API writes a second at 128 pods every 2 s, and
the operator's watch carries each (`phalanx bench --only scale`)."""
ROUNDS_FROM_PODS = 32
"""With `rendezvous.protocol: auto`, jobs whose group may reach this many pods (maxReplicas + spares) use `rounds`:
torch's c10d rendezvous takes 13 s to re-form 32 members on a 2-core machine and does not form 64 within 5 min
(`phalanx bench --only rendezvous-scale`)."""
JobState = contract.JobState
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
AUTO_INTERVAL = "auto"
IntervalSteps = Annotated[int, Field(ge=1)] | Literal["auto"]
"""A positive number of steps or `auto` (the CRD: an int-or-string with `minimum` and `pattern`)."""
CheckpointMode = Literal["auto", "fixed"]
ExitCode = Annotated[int, Field(ge=0, le=255)]
"""A process exit status as a container reports it (128 + n for a signal n)."""
Quantity = Annotated[
    str,
    BeforeValidator(formats.check_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": formats.QUANTITY_PATTERN}),
]
"""A non-negative Kubernetes quantity (`8Gi`, `500m`, `2`), a string or a number as in a Pod (the CRD: an
int-or-string with a pattern, so `lots` is refused at apply time)."""
AbsolutePath = Annotated[
    str,
    AfterValidator(formats.check_absolute_path),
    Field(json_schema_extra={"pattern": formats.ABSOLUTE_PATH_PATTERN}),
]
"""An absolute, normalised path inside the container: no `.` or `..` segment, no `//`, no trailing `/`, not
`/` itself."""
RelativeFolder = Annotated[
    str,
    AfterValidator(formats.check_relative_folder),
    Field(json_schema_extra={"pattern": formats.RELATIVE_FOLDER_PATTERN}),
]
"""A normalised relative folder (`team/run-7`), or `.`: no leading or trailing `/`, no `.` or `..` segment."""
DEFAULT_TRAINER_CONTAINER = "trainer"
CONTROLLER_NAME = "phalanx.dev/trainingjob-controller"
"""The `spec.managedBy` value of a TrainingJob Phalanx runs (unset means the same)."""
MANAGED_BY_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)*$"
"""A domain-prefixed path, e.g. `kueue.x-k8s.io/multikueue` (as Kubernetes' Job and JobSet ask)."""


class CelRule(NamedTuple):
    """A cross-field rule the API server checks at apply time (the CRD's `x-kubernetes-validations`), so a
    bad value is refused naming its field. The operator checks the same rule too (`validation.py`), for
    objects stored before the rule existed."""

    rule: str
    """A CEL expression over the object the rule sits on (`self`); true when the object is valid."""
    message: str
    """What `kubectl apply` prints after the field's path when the rule is false."""
    field_path: str
    """The field the refusal names, relative to that object (e.g. `.minReplicas`)."""
    example: dict[str, Any]
    """A spec that breaks the rule (merged into a valid one): the rule's documentation, and its tests' input;
    for a transition rule, the change to a valid stored spec that breaks it."""
    transition: bool = False
    """The rule compares the object with its stored self (`oldSelf`): the API server judges updates only,
    and the operator, which sees no earlier version, cannot check it again."""


class ApiModel(BaseModel):
    """Base of every API object: camelCase aliases, docstrings as descriptions, unknown keys ignored."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
    """The object's cross-field rules, for the CRD."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# ---------------------------------------------------------------------------------------------- spec


class AutoIntervalSpec(ApiModel):
    """The automatic checkpoint interval (`intervalSteps: auto`): Young/Daly, interval = sqrt(2 x save cost x
    MTBF), with the MTBF from the job's own failures and a prior, so one early failure does not swing it."""

    prior_mtbf_seconds: float = Field(default=86400.0, gt=0)
    """Mean time between failures assumed before the job has shown its own (seconds of running time)."""
    prior_failures: float = Field(default=1.0, gt=0)
    """Weight of that prior, in failures: the MTBF is (priorFailures x priorMtbfSeconds + running seconds) /
    (priorFailures + failures seen)."""
    min_interval_seconds: float = Field(default=30.0, ge=0)
    """Durable saves no more often than this (seconds of training), however cheap they are."""
    max_interval_seconds: float = Field(default=14400.0, gt=0)
    """Durable saves at least this often (seconds of training), however rare failures are."""
    cluster_history: bool = True
    """Count the other TrainingJobs of the cluster as evidence too: their infrastructure failures (restarts not
    charged to their users) over their workers' running time, scaled to this job's workers. A new job on a
    cluster that fails often then saves often from its start, instead of trusting the prior alone."""


class LocalTierSpec(ApiModel):
    """A fast checkpoint tier on each node's own disk: checkpoints are committed there every interval, and
    every `checkpoint.durableEvery`-th one is copied in the background to the durable tier (the volume at
    `checkpoint.path`, or `checkpoint.objectStore`). A restore takes the newest complete copy on any tier.
    Holds replicated checkpoints only (sharded ones need a location every pod shares)."""

    enabled: bool = False
    """Commit checkpoints to the node-local tier first."""
    path: AbsolutePath = "/phalanx-local-checkpoints"
    """Directory inside the trainer container where the local tier is mounted (absolute and normalised)."""
    host_path: AbsolutePath | None = None
    """A folder on the node to hold the tier, kept for the next pod on that node (a `hostPath` volume of
    type `DirectoryOrCreate`; absolute and normalised); unset: an `emptyDir`, lost with the pod. A `hostPath`
    volume keeps the worker pods out of Pod Security's `restricted` and `baseline` levels: their namespace must
    allow `privileged` pods. Only where the operator allows it: under `<hostPathPrefix>/<namespace>/<job>` (a chart
    value, empty by default: no host path at all)."""
    size_limit: Quantity | None = None
    """The `emptyDir`'s size limit (a non-negative quantity such as `20Gi`)."""
    keep: int = Field(default=2, ge=1)
    """Most recent checkpoints kept on the local tier."""


class ObjectStoreSpec(ApiModel):
    """The durable tier in object storage, through fsspec (`s3://` for S3-compatible stores)."""

    url: str = Field(pattern=r"^[a-z][a-z0-9+.-]*://.+")
    """Where durable checkpoints go, e.g. `s3://bucket/prefix` (one folder per step under it)."""
    endpoint_url: str | None = None
    """The store's endpoint, for S3-compatible stores other than AWS (e.g. `http://minio.storage:9000`)."""
    secret_name: str | None = None
    """A Secret in the job's namespace holding the store's credentials, mounted read-only as files in the
    trainer (never its environment) and passed to the store's filesystem as storage options: a key is the
    option's name (`key`, `secret`, `token`, `account_key`, ...), and S3's usual names are understood too
    (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`)."""
    storage_options: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE_UNKNOWN)
    """Further fsspec storage options for the URL's filesystem (e.g. `{"client_kwargs": {"region_name": ...}}`).
    Never credentials: a key that looks like one (`key`, `secret`, `token`, `password`, ...) is refused, since
    everyone who can read the job reads its spec. Credentials go in the Secret that `secretName` names."""


class CheckpointSpec(ApiModel):
    """Where and how often checkpoints are written: one tier (the volume at `path`), or a fast local tier
    and a durable one (`localTier`, `objectStore`)."""

    cel_rules = (
        CelRule(
            "!(has(self.claimName) && has(self.volume))",
            "set either claimName or volume, not both",
            ".volume",
            {"checkpoint": {"claimName": "data", "volume": {"emptyDir": {}}}},
        ),
        CelRule(
            "!has(self.localTier) || !self.localTier.enabled || self.localTier.path != self.path",
            "must differ from checkpoint.path",
            ".localTier.path",
            {"checkpoint": {"path": "/ckpt", "localTier": {"enabled": True, "path": "/ckpt"}}},
        ),
    )

    claim_name: str | None = None
    """Name of a PersistentVolumeClaim mounted at `path` in every worker (set this or `volume`, not both)."""
    volume: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE_UNKNOWN)
    """A volume source (as in a Pod's `volumes[]` entry, without `name`) mounted at `path`; set this or
    `claimName`, not both. With neither, `path` is used as it is in the container's filesystem."""
    path: AbsolutePath = "/checkpoints"
    """Directory inside the trainer container where checkpoints are written (`PHALANX_CHECKPOINT_DIR`):
    absolute and normalised (no `.` or `..` segment, no `//`, no trailing `/`, not `/` itself)."""
    interval_steps: IntervalSteps = 100
    """Training steps between durable checkpoints (`PHALANX_CHECKPOINT_INTERVAL`), or `auto`: the operator
    chooses the interval from the measured save cost, step time and the job's failure rate (Young/Daly,
    `autoInterval`) and the workers follow it (`status.checkpoint`)."""
    keep: int = Field(default=3, ge=1)
    """Most recent durable checkpoints kept; older ones are deleted (`PHALANX_CHECKPOINT_KEEP`)."""
    auto_interval: AutoIntervalSpec = Field(default_factory=AutoIntervalSpec)
    """How `intervalSteps: auto` chooses the interval (ignored with a fixed interval)."""
    local_tier: LocalTierSpec = Field(default_factory=LocalTierSpec)
    """A fast node-local tier in front of the durable one (off by default)."""
    object_store: ObjectStoreSpec | None = None
    """Durable checkpoints in object storage: every `durableEvery`-th checkpoint committed at `path` (or on
    the local tier) is copied there in the background; `keep` applies to it."""
    durable_every: int = Field(default=1, ge=1)
    """With `localTier` or `objectStore`: every that many checkpoints is also copied to the durable tier
    (a final or emergency save always is)."""
    folder: RelativeFolder | None = Field(default=None, max_length=253)
    """The folder under `path` (and under `objectStore.url`) that holds this job's checkpoints; unset:
    `<namespace>/<job name>`, so that jobs sharing a volume or a bucket never see, prune or overwrite each
    other's. `.` keeps them at `path` itself. Another job's folder, with `acceptOtherJobs`, resumes from its
    checkpoints (to fine-tune from them, say)."""
    accept_other_jobs: bool = False
    """Restore checkpoints that another job wrote in this job's folder (to fine-tune from them, say). Every
    manifest names the job that wrote it (namespace and name); by default a restore passes over another job's
    checkpoints and reports them as `OtherJob` in `status.checkpoint.skipped`. A job created again under the
    same name is the same job and resumes from its own."""

    def folder_of(self, namespace: str, job_name: str) -> str:
        """The job's folder under each shared tier: `folder`, else `<namespace>/<job name>`; "" for `.`."""
        chosen = self.folder if self.folder is not None else f"{namespace}/{job_name}"
        return "" if chosen == "." else chosen

    @field_validator("interval_steps", mode="before")
    @classmethod
    def _positive_or_auto(cls, value: Any) -> Any:
        # One clear message naming the field, instead of one error per member of the union.
        if value == AUTO_INTERVAL or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        if isinstance(value, str) and value.isdigit() and int(value) >= 1:
            return int(value)
        raise ValueError(f"must be a positive integer or {AUTO_INTERVAL!r}, got {value!r}")


class HeartbeatSpec(ApiModel):
    """Worker heartbeats: each worker pod renews a Lease carrying its training step."""

    cel_rules = (
        CelRule(
            "double(self.timeoutSeconds) > self.intervalSeconds",
            "must be greater than heartbeat.intervalSeconds",
            ".timeoutSeconds",
            {"heartbeat": {"intervalSeconds": 5, "timeoutSeconds": 5}},
        ),
    )

    interval_seconds: float = Field(default=5, ge=0.2, le=3600)
    """Seconds between Lease renewals by each worker (`PHALANX_HEARTBEAT_INTERVAL`); fractions allowed, so a
    short `timeoutSeconds` can still leave room for several late renewals (0.5 with a timeout of 2 s)."""
    timeout_seconds: int = Field(default=30, ge=1, le=86400)
    """Seconds without a renewal after which a worker counts as dead or frozen (`PHALANX_HEARTBEAT_TIMEOUT`)."""
    reporting: HeartbeatReporting = "auto"
    """How the workers' heartbeats reach the operator (`PHALANX_HEARTBEAT_REPORTING`). `leases`: each worker pod
    renews its own Lease every interval, one API write per worker per interval. `hub`: the launchers put their
    beats into the job's rendezvous store, and a hub container in the rendezvous pod publishes one summary Lease
    for the whole job each interval, whatever its size; a pod renews its own Lease only until the hub answers and
    while it does not. `auto`: `hub` for groups that may reach 128 pods (maxReplicas + spares), `leases` below."""
    progress_timeout_seconds: int = Field(default=600, ge=1, le=604800)
    """Seconds the step may stay unchanged, while the Lease is renewed and no save or rendezvous is in
    progress, before the worker counts as hung: the outer bound of hang detection, and the only one for a
    worker that publishes no step or has not shown enough steps since its group started."""
    hang_factor: float = Field(default=5.0, ge=0)
    """The worker's launcher calls a training rank hung once it reached no step for longer than this
    multiple of the p99 of its recent step times (saves, restores and rendezvous excluded), but never below
    `hangFloorSeconds` (`PHALANX_HANG_FACTOR`); 0 leaves hangs to `progressTimeoutSeconds`."""
    hang_floor_seconds: float = Field(default=1.0, gt=0, le=86400)
    """The least time without a step that counts as a hang, however short the steps (`PHALANX_HANG_FLOOR`)."""
    straggler_factor: float = Field(default=0.0, ge=0)
    """A worker whose step time stays above this multiple of the job's median counts as a straggler
    (0 turns straggler detection off)."""
    straggler_heartbeats: int = Field(default=5, ge=1)
    """Consecutive heartbeats a worker must be slow for before it counts as a straggler."""


class FailureMatch(ApiModel):
    """Which failures a rule applies to; a failure matches when any listed criterion matches."""

    exit_codes: list[ExitCode] | None = None
    """Exit codes of the trainer container."""
    pod_conditions: list[str] | None = None
    """Pod condition types or reasons, e.g. `DisruptionTarget`, `Evicted`, `OOMKilled`."""
    node_conditions: list[str] | None = None
    """Node problems, e.g. `NotReady`, `Unreachable`, `Deleted`, `NoExecuteTaint`."""
    heartbeat_timeout: bool | None = None
    """Matches a worker whose heartbeat Lease was not renewed within `heartbeat.timeoutSeconds`."""
    no_progress: bool | None = None
    """Matches a worker whose step did not advance within `heartbeat.progressTimeoutSeconds`, or within the
    hang threshold its launcher derived from the step times (`heartbeat.hangFactor`)."""
    trainer_stopped: bool | None = None
    """Matches a worker whose launcher reported a training process stopped (SIGSTOP, a tracing stop)."""
    straggler: bool | None = None
    """Matches a worker detected as a straggler."""


def _any_criterion_set(model: type[ApiModel], path: str) -> str:
    """CEL: some criterion of a match object at `path` is set (a non-empty list, or a flag that is true)."""
    terms = []
    for name, field in model.model_fields.items():
        key = f"{path}.{field.alias or name}"
        is_list = any(get_origin(kind) is list for kind in (field.annotation, *get_args(field.annotation)))
        terms.append(f"(has({key}) && size({key}) > 0)" if is_list else f"(has({key}) && {key})")
    return f"has({path}) && (" + " || ".join(terms) + ")"


class FailureRule(ApiModel):
    """One rule of the failure policy: the first rule whose match fits a failure decides the action."""

    cel_rules = (
        CelRule(
            _any_criterion_set(FailureMatch, "self.match"),
            "the rule matches nothing: set at least one criterion",
            ".match",
            {"failurePolicy": {"rules": [{"name": "nothing", "match": {"exitCodes": []}}]}},
        ),
    )

    name: str | None = None
    """A name for the rule, shown in conditions and Events."""
    match: FailureMatch = Field(default_factory=FailureMatch)
    """The failures this rule applies to."""
    action: FailureAction = "ReplaceWorker"
    """What to do: replace the failed worker (a spare first), restart the whole job, fail the job, or
    ignore the failure."""
    max_restarts: int | None = Field(default=None, ge=0)
    """Restarts this rule may cause over the job's life; beyond it the job fails. Unset: only the
    job-wide `failurePolicy.maxRestarts` applies."""
    counts_toward_max_restarts: bool | None = None
    """Whether restarts from this rule spend the job-wide `maxRestarts`. Unset: user failures (exit codes)
    do, infrastructure failures (nodes, heartbeats, evictions) do not."""


class FailurePolicySpec(ApiModel):
    """How failures are handled: ordered rules, then defaults (infrastructure faults replace the worker)."""

    max_restarts: int = Field(default=10, ge=0)
    """Job-wide restarts caused by user failures before the job fails; counted over the job's whole life."""
    rules: list[FailureRule] = Field(default_factory=list, max_length=64)
    """Ordered rules; the first match wins (at most 64)."""


class TopologySpec(ApiModel):
    """Placement of the gang across a topology domain (a node label)."""

    cel_rules = (CelRule("size(self.key) > 0", "must name a node label", ".key", {"topology": {"key": ""}}),)

    key: str = "topology.kubernetes.io/zone"
    """Node label whose values are the domains, e.g. `topology.kubernetes.io/zone` or a rack label."""
    policy: TopologyPolicy = "Pack"
    """`Pack` puts the whole gang (spares included) in one domain; `Spread` spreads it evenly."""
    required: bool = False
    """Hard constraint when true (pods stay pending rather than break it); a preference otherwise."""


class GangSpec(ApiModel):
    """All-or-nothing scheduling of the worker pods."""

    cel_rules = (
        CelRule(
            "self.maxBackoffSeconds >= self.backoffSeconds",
            "must be at least gang.backoffSeconds",
            ".maxBackoffSeconds",
            {"gang": {"backoffSeconds": 60, "maxBackoffSeconds": 30}},
        ),
        CelRule(
            "self.podGroup != 'Kueue' || (has(self.queueName) && size(self.queueName) > 0)",
            "Kueue needs the name of a LocalQueue",
            ".queueName",
            {"gang": {"podGroup": "Kueue"}},
        ),
    )

    schedule_timeout_seconds: int = Field(default=300, ge=1)
    """Seconds for every pod of the gang to be scheduled; otherwise all are deleted and retried later."""
    backoff_seconds: int = Field(default=10, ge=1)
    """First wait before a new attempt after a gang timeout; doubles per attempt."""
    max_backoff_seconds: int = Field(default=300, ge=1)
    """Longest wait between gang attempts."""
    pod_group: PodGroupKind = "None"
    """Gang scheduler to delegate to: `None` (the operator's own timeout and retry), `Coscheduling`
    (scheduler-plugins PodGroup), `Volcano` (Volcano PodGroup) or `Kueue` (Kueue pod-group labels)."""
    queue_name: str | None = None
    """Queue for Kueue (`kueue.x-k8s.io/queue-name`) or Volcano (`PodGroup.spec.queue`)."""


class RendezvousResources(ApiModel):
    """Requests and limits of the rendezvous pod's container, as in a Pod's `resources`. Both are set by default,
    so that a namespace whose ResourceQuota or LimitRange asks for limits admits the pod."""

    requests: dict[str, Quantity] = Field(default_factory=lambda: {"cpu": "100m", "memory": "640Mi"})
    """What the scheduler reserves for it: the store's process imports torch (about 500 MiB resident)."""
    limits: dict[str, Quantity] = Field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"})
    """The most it may use. A request above its limit is refused (`InvalidSpec`)."""


class RendezvousSpec(ApiModel):
    """The job's rendezvous store: its own pod and headless Service, never inside a worker."""

    cel_rules = (
        CelRule(
            "self.keepaliveTimeoutSeconds >= self.keepaliveIntervalSeconds",
            "must be at least rendezvous.keepaliveIntervalSeconds",
            ".keepaliveTimeoutSeconds",
            {"rendezvous": {"keepaliveIntervalSeconds": 5, "keepaliveTimeoutSeconds": 2}},
        ),
    )

    protocol: RendezvousProtocol = "auto"
    """How the workers form and re-form their group (`PHALANX_RDZV_PROTOCOL`). `c10d`: torch's dynamic rendezvous,
    one shared state that every worker reads and rewrites, its cost per re-form growing with the square of the
    workers. `rounds`: rounds decided in the store, where survivors keep their ranks, a hot spare takes the failed
    worker's, and a re-form costs in proportion to the change. `auto`: `rounds` for groups that may reach 32 pods
    (maxReplicas + spares), `c10d` below."""
    port: int = Field(default=29400, ge=1, le=65535)
    """Port of the rendezvous store."""
    image: str | None = None
    """Image of the rendezvous pod; defaults to the trainer container's image."""
    join_timeout_seconds: int = Field(default=120, ge=1)
    """Seconds to wait for a rendezvous round to form (`PHALANX_RDZV_JOIN_TIMEOUT`; torch default 600)."""
    last_call_timeout_seconds: int = Field(default=1, ge=1)
    """Seconds to wait for more workers once `minReplicas` joined (`PHALANX_RDZV_LAST_CALL_TIMEOUT`;
    torch default 30)."""
    keepalive_interval_seconds: int = Field(default=1, ge=1)
    """Seconds between rendezvous keep-alives (`PHALANX_RDZV_KEEPALIVE_INTERVAL`)."""
    keepalive_timeout_seconds: int = Field(default=5, ge=1)
    """Seconds without keep-alive before a worker leaves the rendezvous (`PHALANX_RDZV_KEEPALIVE_TIMEOUT`)."""
    resources: RendezvousResources = Field(default_factory=RendezvousResources)
    """Requests and limits of the rendezvous pod."""


# ------------------------------------------------------------------------------------- training health
HealthAction = Literal["None", "Pause", "Rollback"]
SKIP_SEEN = "all"
SkipBatches = Annotated[int, Field(ge=0)] | Literal["all"]
"""A number of global batches, or `all` (the CRD: an int-or-string with `minimum` and `pattern`)."""


class HealthSignalSpec(ApiModel):
    """What every training-health signal has: a switch and the action taken when it starts."""

    enabled: bool = True
    """Whether the operator watches for this signal."""
    action: HealthAction = "None"
    """What the operator does when the signal starts: `None` only flags it (condition `Healthy`, an Event, a
    metric); `Pause` suspends the job (`spec.suspend` set to true: the workers get SIGTERM and save a
    checkpoint), and the job stays suspended until someone sets `spec.suspend` back to false; `Rollback`
    restarts every worker from the newest checkpoint taken before the anomaly began (`status.rollback`: at or
    before the step before the last one the heartbeats showed normal ahead of the signal's `sinceStep`) and
    training goes on from there by itself (`health.rollback`: a budget, then `Pause`; batches to skip)."""


class RollbackSpec(ApiModel):
    """How the `Rollback` action of the training-health signals rolls a job back."""

    max_rollbacks: int = Field(default=3, ge=0)
    """Rollbacks allowed over the job's life (`status.health.rollbacks` counts them); once they are spent, a
    signal whose action is `Rollback` pauses the job instead (as `Pause`), so a run that keeps diverging
    does not loop. 0: every `Rollback` pauses."""
    skip_batches: SkipBatches = 0
    """Global batches of data the workers skip after the restored checkpoint, so the batches that led to the
    anomaly are not trained on again: a number, or `all`: every batch the abandoned run trained on after
    that checkpoint, up to the step the job had reached when the rollback was decided (`fromStep`). 0 (the
    default) trains on the same data again. Needs a data cursor that can skip (`ElasticSampler`)."""

    @field_validator("skip_batches", mode="before")
    @classmethod
    def _count_or_all(cls, value: Any) -> Any:
        # One clear message naming the field, instead of one error per member of the union.
        if value == SKIP_SEEN or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
        raise ValueError(f"must be a non-negative integer or {SKIP_SEEN!r}, got {value!r}")


class LossDivergenceSpec(HealthSignalSpec):
    """`LossDiverging`: the mean loss of the recent steps is well above the mean of the steps before them."""

    recent_steps: int = Field(default=50, ge=1)
    """Steps of the recent window, ending at the newest step seen."""
    reference_steps: int = Field(default=100, ge=1)
    """Steps of the reference window just before the recent one."""
    factor: float = Field(default=1.5, ge=1)
    """The signal starts when the recent mean exceeds the reference mean by more than `factor - 1` times the
    reference mean's magnitude (1.5: 50% higher)."""


class NonFiniteLossSpec(HealthSignalSpec):
    """`NonFiniteLoss`: the newest loss a worker reported is NaN or infinite."""


class LossStagnationSpec(HealthSignalSpec):
    """`LossStagnating`: the loss did not improve by a given fraction over a long window."""

    window_steps: int = Field(default=2000, ge=5)
    """Steps of the window; the mean loss of its newest fifth is compared with that of its oldest fifth."""
    min_improvement: float = Field(default=0.001, ge=0)
    """Relative improvement (0.001: 0.1%) the loss must exceed over the window; at or below it, the loss
    counts as stagnating (0: only a loss that does not fall at all)."""


class GradNormSpikeSpec(HealthSignalSpec):
    """`GradNormSpike`: a gradient norm far above the median of the steps before it."""

    factor: float = Field(default=10.0, ge=1)
    """A gradient norm above `factor` x the median of the preceding `windowSteps` is a spike."""
    window_steps: int = Field(default=100, ge=1)
    """Steps before a gradient norm whose median it is compared with."""
    recent_steps: int = Field(default=20, ge=1)
    """The signal stays on while a spike lies within this many steps of the newest step."""


class StepTimeDriftSpec(HealthSignalSpec):
    """`StepTimeDrift`: steps became slower than the run's own baseline."""

    warmup_steps: int = Field(default=20, ge=0)
    """Steps after the first one the operator saw that are left out of the baseline (compilation, caches)."""
    baseline_steps: int = Field(default=100, ge=1)
    """Steps after the warm-up whose median step time is the baseline (kept in `status.health`)."""
    window_steps: int = Field(default=50, ge=1)
    """Steps of the recent window whose median step time is compared with the baseline."""
    slowdown: float = Field(default=0.15, ge=0)
    """Fraction by which the recent median must exceed the baseline for the signal to start (0.15: 15%
    slower)."""


class HealthSpec(ApiModel):
    """Training-health signals computed from the loss, gradient norm and step time of the workers'
    heartbeats, each with its thresholds and its action."""

    min_samples: int = Field(default=5, ge=1)
    """Heartbeat samples (one per step seen) every window needs before a signal is judged."""
    loss_divergence: LossDivergenceSpec = Field(default_factory=LossDivergenceSpec)
    """Loss divergence."""
    non_finite_loss: NonFiniteLossSpec = Field(default_factory=NonFiniteLossSpec)
    """NaN or infinite loss."""
    loss_stagnation: LossStagnationSpec = Field(default_factory=LossStagnationSpec)
    """Loss stagnation."""
    grad_norm_spike: GradNormSpikeSpec = Field(default_factory=GradNormSpikeSpec)
    """Gradient-norm spikes."""
    step_time_drift: StepTimeDriftSpec = Field(default_factory=StepTimeDriftSpec)
    """Step-time drift against the run's own baseline."""
    rollback: RollbackSpec = Field(default_factory=RollbackSpec)
    """The budget and data skipping of the signals' `Rollback` action."""


class DrillsSpec(ApiModel):
    """Failure drills (`phalanx drill`) against this job."""

    allowed: bool = False
    """Whether `phalanx drill` may inject failures (kill a worker or the rendezvous, take a node away from
    the job) into this job; off by default, so no one disrupts a production run by a typo."""


class PreflightSpec(ApiModel):
    """A restore drill before the real run: train, restart from a checkpoint, check the run resumed."""

    enabled: bool = False
    """Whether the job starts with a preflight: every pod first checks it can write, sync, read back and
    remove a file in the checkpoint location; then the workers train `steps` steps with a durable checkpoint
    half-way, restart from that checkpoint (read from the durable storage, not memory) and train the second
    half again, which must match the first time. A failure stops the job (`PreflightPassed` False, the job
    Failed) before it spends its allocation; a pass lets training go on (the steps count)."""
    steps: int = Field(default=20, ge=2, le=100000)
    """Training steps of the preflight; the checkpoint is taken after half of them."""
    tolerance: float = Field(default=0.0, ge=0.0, le=1.0)
    """Relative difference allowed between the two runs' losses and model norms; 0 asks for bitwise equality
    (deterministic training on CPU, or with deterministic kernels, at a fixed world size)."""


class SharedMemorySpec(ApiModel):
    """The trainer containers' /dev/shm: a memory-backed volume, because container runtimes give 64 MiB."""

    enabled: bool = True
    """Mount a memory-backed `emptyDir` at /dev/shm in the trainer container (skipped when the template already
    mounts something there). In-memory snapshots, the launcher's status files and DataLoader workers live there;
    64 MiB holds none of them for a real model."""
    size_limit: Quantity | None = None
    """The volume's size limit (a non-negative quantity such as `8Gi`): room for `snapshotSlots` in-memory
    snapshots of this worker's state (model, optimizer, RNG) plus DataLoader buffers. Unset: no limit of its
    own; its pages count toward the container's memory limit either way. A snapshot that does not fit fails
    with a message naming this field."""
    snapshot_slots: int = Field(default=3, ge=2, le=3)
    """How many in-memory snapshots of its state each training process keeps in /dev/shm
    (`PHALANX_SNAPSHOT_SLOTS`): 3 (two for double buffering, one the durable save in flight reads), or 2 to
    need a third less memory, at the cost of no in-memory snapshot while a durable save is being written."""


class TrainingJobSpec(ApiModel):
    """Desired state of a TrainingJob."""

    cel_rules = (
        CelRule(
            "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            "minReplicas is greater than maxReplicas",
            ".minReplicas",
            {"replicas": 2, "minReplicas": 3, "maxReplicas": 2},
        ),
        CelRule(
            "!has(self.minReplicas) || self.minReplicas <= self.replicas",
            "replicas is below minReplicas",
            ".replicas",
            {"replicas": 2, "minReplicas": 3, "maxReplicas": 4},
        ),
        CelRule(
            "has(self.managedBy) == has(oldSelf.managedBy) && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
            "managedBy is immutable",
            ".managedBy",
            {"managedBy": "kueue.x-k8s.io/multikueue"},
            transition=True,
        ),
        CelRule(
            "!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
            "replicas is above maxReplicas",
            ".replicas",
            {"replicas": 4, "maxReplicas": 3},
        ),
    )

    replicas: int = Field(default=1, ge=1)
    """Active workers (pods, one per node). Scaled by `kubectl scale` within `minReplicas`..`maxReplicas`."""
    min_replicas: int | None = Field(default=None, ge=1)
    """Fewest active workers training may continue with (elastic lower bound). Unset: `replicas`."""
    max_replicas: int | None = Field(default=None, ge=1)
    """Most active workers `replicas` may be scaled to (elastic upper bound). Unset: `replicas`."""
    spares: int = Field(default=0, ge=0)
    """Hot-spare worker pods: scheduled, running and waiting in the rendezvous to replace a failed worker."""
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    """Training processes per worker pod (usually the GPUs per node)."""
    template: dict[str, Any] = Field(json_schema_extra={POD_TEMPLATE_SCHEMA: True})
    """Pod template of the workers, checked against Kubernetes' own PodTemplateSpec schema (a misspelt field is
    refused at apply time). Its container named `trainerContainer` (`trainer` by default) runs the
    training command, which the operator wraps with the Phalanx launcher; a template without it is refused
    (`InvalidSpec`), as is a resource request, limit or `emptyDir` size that is not a quantity. The pods meet
    Pod Security `restricted` by default: where the template leaves them unset, the pod gets `runAsNonRoot:
    true` and the `RuntimeDefault` seccomp profile, and each container and init container
    `allowPrivilegeEscalation: false` and `capabilities.drop: [ALL]`; what the template sets is kept. An image
    that runs as root (or as a user name, not a number) needs `securityContext.runAsUser` set to a non-zero uid
    it can run as, or `runAsNonRoot: false` (which leaves `restricted`); a template with `runAsUser: 0` gets
    no `runAsNonRoot`."""
    trainer_container: str = Field(
        default=DEFAULT_TRAINER_CONTAINER, min_length=1, max_length=63, pattern=formats.DNS_LABEL_PATTERN
    )
    """Name of the template's container that runs training: it gets the launcher, the contract's environment
    and the checkpoint and /dev/shm volumes, and its exits and restarts are the worker's."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Durable checkpoints."""
    shared_memory: SharedMemorySpec = Field(default_factory=SharedMemorySpec)
    """The trainer containers' /dev/shm (in-memory snapshots live there)."""
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)
    """Worker heartbeats and hang detection."""
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    """Restart budget and rules mapping failure classes to actions."""
    topology: TopologySpec | None = None
    """Topology hints for placing the gang; unset: no placement constraint."""
    gang: GangSpec = Field(default_factory=GangSpec)
    """All-or-nothing scheduling."""
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)
    """Rendezvous store and its timeouts."""
    suspend: bool = False
    """When true, all pods are removed and the status kept; setting it back to false recreates them."""
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Seconds the job may be active, as in Kubernetes' Job: counted from `status.startTime` (its first pods'
    creation), or from its last resume (a suspended or queued job's time does not count). Past it, the workers
    get SIGTERM (each saves a checkpoint), every pod goes, and the job fails with reason `DeadlineExceeded`.
    Unset: no deadline."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds a finished job (Succeeded, or Failed other than for an invalid spec) is kept after
    `status.completionTime`, as in Kubernetes' Job: then the operator deletes the TrainingJob, and its pods and
    other objects go with it. Unset: kept until someone deletes it; 0: deleted as soon as it finishes."""
    collective_timeout_seconds: int = Field(default=300, ge=1)
    """Seconds a rank may sit in one collective before its watchdog ends it (`PHALANX_COLLECTIVE_TIMEOUT`)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus port of each worker pod (`PHALANX_METRICS_PORT`); 0 turns it off."""
    health: HealthSpec = Field(default_factory=HealthSpec)
    """Training-health signals (loss divergence, NaN loss, stagnation, gradient spikes, step-time drift)."""
    drills: DrillsSpec = Field(default_factory=DrillsSpec)
    """Whether failure drills may be run against this job."""
    preflight: PreflightSpec = Field(default_factory=PreflightSpec)
    """A restore drill before the real run (off by default)."""
    managed_by: str | None = Field(default=None, max_length=63, pattern=MANAGED_BY_PATTERN)
    """The controller that runs this job, as in Kubernetes' Job and JobSet: unset or
    `phalanx.dev/trainingjob-controller`, Phalanx; any other domain-prefixed path (e.g.
    `kueue.x-k8s.io/multikueue`, which runs the job on a worker cluster), that controller alone: Phalanx then
    creates no pod, writes no status and adds no finalizer. Immutable."""

    @property
    def effective_min_replicas(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def effective_max_replicas(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def heartbeat_reporting(self) -> Literal["leases", "hub"]:
        """How the heartbeats travel: `heartbeat.reporting`, with `auto` resolved by the group's size."""
        chosen = self.heartbeat.reporting
        if chosen != "auto":
            return chosen
        return "hub" if self.effective_max_replicas + self.spares >= HUB_FROM_PODS else "leases"

    @property
    def rendezvous_protocol(self) -> Literal["c10d", "rounds"]:
        """The protocol the launchers use: `rendezvous.protocol`, with `auto` resolved by the group's size."""
        chosen = self.rendezvous.protocol
        if chosen != "auto":
            return chosen
        return "rounds" if self.effective_max_replicas + self.spares >= ROUNDS_FROM_PODS else "c10d"


# -------------------------------------------------------------------------------------------- status


class Condition(ApiModel):
    """A condition following the Kubernetes API conventions."""

    type: str
    """Condition type, e.g. `GangScheduled`, `Running`, `Succeeded`, `Failed`, `Suspended`."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = ""
    """One CamelCase word saying why."""
    message: str = ""
    """A sentence for humans."""
    last_transition_time: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When `status` last changed."""
    observed_generation: int | None = None
    """The `metadata.generation` this condition was computed from."""


class ReplicaCounts(ApiModel):
    """Worker pod counts."""

    desired: int = 0
    """Active workers asked for (the last accepted `spec.replicas`)."""
    active: int = 0
    """Worker pods (not spares) that exist and are not terminating."""
    ready: int = 0
    """Active workers that are running."""
    spares: int = 0
    """Spare pods that are running."""


class RestartCounts(ApiModel):
    """Job-wide restart counts, never reset by a re-rendezvous."""

    total: int = 0
    """All restarts over the job's life."""
    by_cause: dict[str, int] = Field(default_factory=dict)
    """Restarts per failure cause (e.g. `ExitCode`, `Killed`, `PodDeleted`, `NodeLost`, `HeartbeatTimeout`)."""
    counted: int = 0
    """Restarts that spent the job-wide `failurePolicy.maxRestarts` (user failures, or rules that say so)."""
    by_rule: dict[str, int] = Field(default_factory=dict)
    """Restarts per failure-policy rule name (for the rules' own `maxRestarts`)."""
    uncounted_times: list[str] | None = None
    """When the restarts of the last hour that did not spend `maxRestarts` happened (oldest first; no more than
    the operator's hourly cap and one): the operator paces the pods that replace them by these."""


class WorkerStatus(ApiModel):
    """Where one worker pod runs."""

    name: str
    """Pod name."""
    node: str | None = None
    """Node the pod is bound to."""
    zone: str | None = None
    """Value of the topology key (`spec.topology.key`, else `topology.kubernetes.io/zone`) on that node."""
    rank: int | None = None
    """Node rank from the worker's heartbeat, when known."""
    role: str = "worker"
    """`worker` or `spare`."""
    phase: str | None = None
    """Pod phase."""


class GangStatus(ApiModel):
    """Progress of all-or-nothing scheduling."""

    attempts: int = 0
    """Gang attempts that timed out."""
    retry_after: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """No new attempt starts before this time (backoff after a timeout)."""
    scheduled_time: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When every pod of the gang was first scheduled."""


class Incident(ApiModel):
    """A failure the operator handled."""

    cause: str
    """Failure class, e.g. `ExitCode`."""
    worker: str | None = None
    """Pod name of the failed worker."""
    pod_uid: str | None = None
    """Uid of the failed pod (each pod's failure is handled once)."""
    node: str | None = None
    """Node the failed worker ran on."""
    action: str | None = None
    """Action taken."""
    rule: str | None = None
    """Name of the failure-policy rule that matched, if any."""
    message: str | None = None
    """What happened."""
    occurred_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the failure happened, as closely as the operator can tell: the end of the second of the
    container's `finishedAt` (exits, kills), the Lease's last renewal (heartbeat timeout), the last sign of
    life of the node or the pod (node lost), else the detection time (deletions, stragglers, hangs)."""
    detected_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator noticed the failure."""
    resumed_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When training resumed: the end of the first step of the worker group formed after the failure (its
    heartbeat's `resumed-at`), else the reconcile that saw a heartbeat pass `resumeStep`."""
    seconds_to_recover: float | None = None
    """Seconds from the failure (`occurredAt`, else `detectedAt`) to resumed training."""
    steps_lost: int | None = None
    """Training steps done again after the recovery: `detectedStep` minus `restoredStep` (else minus the
    lowest step the heartbeats showed after the failure)."""
    detected_step: int | None = None
    """The highest step any worker had reached: the job's step when the failure was detected, raised by
    heartbeats of the failed group that arrive late (up to `resumeStep`)."""
    resumed_from_step: int | None = None
    """Lowest step the active workers' heartbeats showed after the failure: where training resumed."""
    resume_step: int | None = None
    """Training counts as resumed once a heartbeat passes this step: the step at detection plus the steps
    one heartbeat interval may not have reported yet (used when the heartbeats do not tell `resumed-at`)."""
    restored_step: int | None = None
    """Step the worker group formed after the failure restored (its heartbeat's `restored-step`)."""
    restored_from: str | None = None
    """Where that group restored its state from (its heartbeat's `restore-source`)."""


class WorkerTrack(ApiModel):
    """What the operator remembers of one worker pod between reconciles (so a restart loses nothing)."""

    pod: str
    """Pod name."""
    uid: str | None = None
    """Pod uid (a recreated pod of the same name is a new worker)."""
    node: str | None = None
    """Node the pod was bound to."""
    step: int | None = None
    """Last step its heartbeat showed."""
    since: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When that step was first seen while training (the no-progress clock starts here); unset while the
    worker does not train or publishes no step (the clock is off)."""
    slow: int = 0
    """Consecutive new steps seen with a step time (the worker's own compute time when it reports it)
    above `stragglerFactor` x the job's median."""
    restarts: int = 0
    """Container restarts of the trainer seen so far."""
    done: bool = False
    """The operator is done with this pod: its failure was handled, or the operator deleted it on purpose."""
    kept: bool = False
    """Its failure was ignored by a rule: the pod is left as it is."""


class TrackedPods(ApiModel):
    """The trainer pods the operator remembers without a `tracking` entry, as index ranges (e.g. `["0-511", "514"]`):
    their memory follows from the pod and its heartbeat, so a status stays small whatever the gang's size."""

    known: list[str] = Field(default_factory=list)
    """Indices of the pods the operator has seen and still tracks."""
    done: list[str] = Field(default_factory=list)
    """Indices of those the operator is done with (`WorkerTrack.done`)."""
    kept: list[str] = Field(default_factory=list)
    """Indices of those whose failure a rule ignored (`WorkerTrack.kept`)."""
    clocks_since: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When every worker's no-progress clock last started over (after an incident): a clock rebuilt from a
    heartbeat's `step-at` never starts before it."""


class RendezvousTrack(ApiModel):
    """What the operator remembers of the job's rendezvous pod (so its loss is noticed, even across an
    operator restart)."""

    pod: str
    """Pod name."""
    uid: str | None = None
    """Uid of the rendezvous pod last seen running."""
    node: str | None = None
    """Node it runs on."""
    restarts: int = 0
    """Restarts of its container seen so far (a restart empties the store)."""


class RegroupRequest(ApiModel):
    """The operator's request to the workers' launchers: worker groups started before `before` include a
    worker that failed or is being removed, so re-form them now rather than wait for collective timeouts.
    A group started after `before` already re-formed without that worker and is left alone."""

    before: str = Field(json_schema_extra=DATE_TIME)
    """Groups started before this moment re-form: when the failure happened, as closely as the operator can
    tell (the latest of them when one reconcile handles several), plus a quarter second for the difference
    between machines' clocks; in microseconds."""
    epoch: int = Field(ge=1)
    """Number of the request, one more than the previous one: a launcher acts on each epoch once."""
    reason: str = ""
    """Why, e.g. `HeartbeatTimeout of tj-worker-2`."""
    departed: list[str] = Field(default_factory=list)
    """The failed or removed pods: launchers drop their nodes from the rendezvous at once instead of
    waiting for their keep-alives to expire."""
    departed_uids: list[str] = Field(default_factory=list)
    """Their UIDs: a launcher publishes its rendezvous node under its pod's UID, which, unlike a pod name, no
    replacement pod reuses; so a departed node is dropped whatever it sent last (a frozen pod thawed to be
    killed may still send one keep-alive)."""


class HealthSignal(ApiModel):
    """A training-health signal that is on."""

    reason: str
    """The signal: `LossDiverging`, `NonFiniteLoss`, `LossStagnating`, `GradNormSpike` or `StepTimeDrift`."""
    message: str = ""
    """The numbers that started it."""
    since: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator saw it start."""
    since_step: int | None = None
    """The first step of the window that shows it."""
    action: str | None = None
    """The action taken when it started (`Pause` or `Rollback`; `Pause` also when a `Rollback`'s budget
    was spent), if any."""


class HealthRollback(ApiModel):
    """A rollback the operator asked for after a training-health signal (`action: Rollback`)."""

    epoch: int = Field(ge=1)
    """Number of the rollback (`status.rollback.epoch`)."""
    signal: str
    """The signal that started it, e.g. `NonFiniteLoss`."""
    message: str = ""
    """The signal's numbers."""
    requested_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator asked for it."""
    from_step: int | None = None
    """The step the job had reached then (the abandoned run's)."""
    at_or_before_step: int = Field(ge=0)
    """The workers restore the newest checkpoint at or before this step: the step before the last one the
    heartbeats showed normal ahead of the signal's `sinceStep` (heartbeats sample steps, and that step's
    own update was not judged yet)."""
    restored_step: int | None = None
    """The step the restarted workers restored (their heartbeat's `restored-step`); 0 with `restoredFrom:
    none` when no checkpoint at or before `atOrBeforeStep` existed anywhere and training started again from
    scratch. Unset until they report it."""
    restored_from: str | None = None
    """Where that state came from, as the heartbeats say (`restore-source`): `memory`, `peer`, `durable` or
    `none` (from scratch)."""
    resumed_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the restarted workers reported the restore."""


class RollbackRequest(ApiModel):
    """The operator's request to the workers' launchers: restart every worker group from the newest
    checkpoint at or before `atOrBeforeStep` (a training-health signal's `Rollback`). Every launcher passes
    it to the training processes it starts (`PHALANX_ROLLBACK`), which carry it out once."""

    epoch: int = Field(ge=1)
    """Number of the request, one more than the previous one: each is carried out once."""
    at_or_before_step: int = Field(ge=0)
    """The newest checkpoint (in memory, at a peer or on disk) whose step is at most this is restored; with
    none, training starts from scratch."""
    skip_batches: int | Literal["all"] = 0
    """Global batches to skip after the restored step (`all`: those the abandoned run trained on after it,
    up to `fromStep`)."""
    from_step: int | None = None
    """The step the job had reached when the rollback was decided."""
    reason: str = ""
    """Why, e.g. `NonFiniteLoss: loss nan at step 30`."""
    requested_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator asked for it (heartbeats of worker groups started before it are of the abandoned
    run)."""


class HealthStatus(ApiModel):
    """Training health as the operator last judged it."""

    signals: list[HealthSignal] = Field(default_factory=list)
    """The signals on now."""
    baseline_step_seconds: float | None = None
    """The run's baseline step time: the median over `baselineSteps` steps after the warm-up. Kept here so an
    operator restart does not lose it."""
    baseline_steps: str | None = None
    """The steps the baseline was measured over, e.g. `21-120`."""
    paused: str | None = None
    """Why the operator suspended the job (a signal with action `Pause`); cleared when the job resumes."""
    rollbacks: int | None = None
    """Rollbacks the operator asked for over the job's life (against `spec.health.rollback.maxRollbacks`);
    kept when the job resumes. Unset before the first."""
    last_rollback: HealthRollback | None = None
    """The latest rollback: what started it, from and to which step, and when."""


MAX_SKIPPED_CHECKPOINTS = 10
"""Checkpoints passed over that `status.checkpoint.skipped` names at most (the newest steps)."""


class SkippedCheckpoint(ApiModel):
    """A checkpoint a worker's restore passed over, newer than the state it restored (the worker's heartbeat
    `phalanx.dev/checkpoint-skipped`)."""

    step: int
    """The checkpoint's step."""
    tier: str
    """Where it was: `durable` (the durable tier, or `checkpoint.path` when it is the only tier), `fast` (the
    shared fast tier) or `local` (a node's own tier, `localTier`)."""
    reason: str
    """`Torn` (no manifest: a save or copy cut short), `Corrupt` (an unreadable manifest, or files that
    disagree with it: size, sha256, missing), `OtherFormat` (another manifest format, or sharded state where
    replicated is restored, or the reverse) or `OtherJob` (another job wrote it, and `checkpoint.acceptOtherJobs`
    is off)."""
    message: str = ""
    """The detail, as the worker found it (at most 160 characters)."""
    pod: str | None = None
    """The pod whose restore passed it over first (the one that read that location)."""
    seen_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator first saw it reported."""


class CheckpointStatus(ApiModel):
    """The durable-checkpoint interval in force and what it was chosen from (`spec.checkpoint.intervalSteps`),
    and the checkpoints restores passed over. The interval is written only when it changes (by more than a
    fifth, `auto`), so its figures are those of the last change, not live readings."""

    mode: CheckpointMode
    """`fixed` (the spec's number) or `auto` (chosen by the operator; the launchers pass it to the trainers)."""
    interval_steps: int = Field(ge=1)
    """Training steps between durable checkpoints."""
    save_seconds: float | None = None
    """What a durable save blocks training for, as the workers measured it (`phalanx.dev/checkpoint-save-seconds`:
    the slowest worker's median of its recent saves)."""
    step_seconds: float | None = None
    """Seconds per training step (median of the recent steps the heartbeats reported)."""
    mtbf_seconds: float | None = None
    """Mean time between failures: the prior (`autoInterval`) combined with the failures seen over the job's
    running time and, with `autoInterval.clusterHistory`, those of the cluster's other jobs."""
    failures_seen: int | None = None
    """Failures the job had when the interval was chosen (`restarts.total`)."""
    cluster_failures_seen: int | None = None
    """Infrastructure failures of the cluster's other TrainingJobs counted in the MTBF (`autoInterval.clusterHistory`)."""
    cluster_worker_hours: float | None = None
    """The running time of those jobs' workers (worker-hours) over which they saw those failures."""
    reason: str = ""
    """How the interval was reached, e.g. the Young/Daly figures, a bound, or the bootstrap before the first
    save cost was measured."""
    skipped: list[SkippedCheckpoint] | None = Field(default=None, max_length=MAX_SKIPPED_CHECKPOINTS)
    """Checkpoints the workers' restores passed over (torn, corrupt, of another format), each named once
    however many workers and restores reported it: the newest 10 steps. Each new one is also named in a
    `CheckpointSkipped` Warning Event."""


PreflightState = Literal["Running", "Passed", "Failed"]


class PreflightStatus(ApiModel):
    """How the job's preflight went (`spec.preflight`)."""

    state: PreflightState
    """Running until a worker's heartbeat tells the outcome, then Passed or Failed."""
    reason: str = Field(min_length=1)
    """`PreflightRunning`, `Passed`, or what failed: `CheckpointStorageUnusable`, `RendezvousUnreachable`,
    `RestoreFailed`, `ResumeMismatch`."""
    message: str = Field(min_length=1)
    """What the preflight does, did or found (from the pod that told)."""
    pod: str | None = None
    """The pod whose heartbeat told the outcome."""
    finished_at: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator learned the outcome."""


class QueueStatus(ApiModel):
    """The job's place in Kueue (a job labelled `kueue.x-k8s.io/queue-name`)."""

    workload: str = Field(min_length=1)
    """The job's Workload, in the job's namespace."""
    cluster_queue: str | None = None
    """The ClusterQueue that admitted it, while admitted."""
    admitted_workers: int | None = None
    """The most active workers the admission covers (its `workers` pod set less the spares), while admitted."""


STATUS_TEXT_LIMIT = 1024
"""Characters of any one string in a job's status, the CRD's `maxLength` on each: workers' words reach the status
(a checkpoint's reason, a preflight's message, a failure's), and no number of them may push the object past
etcd's limit or get a status write refused."""


def cut_text(value: Any, limit: int = STATUS_TEXT_LIMIT) -> Any:
    """`value` with every string in it (in lists and mappings too) cut to `limit` characters, ending in `...`."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[: limit - 3] + "..."
    if isinstance(value, list):
        return [cut_text(item, limit) for item in value]
    if isinstance(value, dict):
        return {key: cut_text(item, limit) for key, item in value.items()}
    return value


class TrainingJobStatus(ApiModel):
    """Observed state of a TrainingJob, written once per reconcile by the operator."""

    def to_wire(self) -> dict[str, Any]:
        """As the API server stores it, every string cut to `STATUS_TEXT_LIMIT` (the schema's `maxLength`)."""
        wire: dict[str, Any] = cut_text(super().to_wire())
        return wire

    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Conditions keyed by type: `GangScheduled`, `Running`, `Succeeded`, `Failed`, `Suspended`, `SpecValid`,
    `Recovering`, `Degraded`, `Healthy`, `PreflightPassed`, and `Admitted` for a job Kueue queues."""
    observed_generation: int | None = None
    """The `metadata.generation` the status was computed from."""
    state: JobState | None = None
    """A readable word: Pending, Scheduling, Unschedulable (held: the cluster cannot hold the gang), Backoff,
    Running, Finishing, Succeeded, Failed, Suspended, Queued (waiting for Kueue's admission) or Invalid."""
    replicas: ReplicaCounts = Field(default_factory=ReplicaCounts)
    """Worker counts (`active` feeds the scale subresource)."""
    ready_workers: str | None = None
    """Ready over desired active workers, e.g. `2/2`."""
    selector: str | None = None
    """Label selector of the active workers (for the scale subresource)."""
    start_time: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the operator first created the job's pods."""
    completion_time: str | None = Field(default=None, json_schema_extra=DATE_TIME)
    """When the job succeeded or failed."""
    step: int | None = None
    """Latest training step reported by the workers' heartbeats."""
    progress: Literal["Reported", "Unknown"] | None = None
    """`Reported` once a worker's heartbeat carried a step (the Step column and the no-progress check
    follow it); `Unknown` while the workers train but publish no step (a script that does not use Phalanx's
    StatusPublisher): the operator cannot tell progress from a stall then, so it never calls one a hang and
    judges the workers by their heartbeats and exits alone."""
    restarts: RestartCounts = Field(default_factory=RestartCounts)
    """Restarts over the job's life, by cause."""
    workers: list[WorkerStatus] = Field(default_factory=list)
    """Worker and spare pods, their nodes, domains and ranks: at most 64, those not running first, then the
    spares, then the lowest indices (every pod's detail is on the pod)."""
    unlisted_workers: int | None = None
    """Worker and spare pods `workers` leaves out (unset: none)."""
    gang: GangStatus = Field(default_factory=GangStatus)
    """All-or-nothing scheduling progress."""
    incidents: list[Incident] = Field(default_factory=list)
    """The most recent failures handled (newest last)."""
    tracking: list[WorkerTrack] = Field(default_factory=list)
    """Per-worker heartbeat memory (steps, no-progress clocks, straggler streaks, restarts) of the pods whose
    memory their pod and heartbeat cannot tell again: at most 256, whatever the gang's size (`tracked`)."""
    tracked: TrackedPods | None = None
    """The other pods the operator tracks, as index ranges."""
    rendezvous: RendezvousTrack | None = None
    """The rendezvous pod last seen running."""
    regroup: RegroupRequest | None = None
    """The latest request to the launchers to re-form worker groups that include a failed worker."""
    rollback: RollbackRequest | None = None
    """The latest request to the launchers to restart from a checkpoint before a training-health anomaly."""
    goodput: float | None = None
    """Productive training time over wall time since the job started (recovery time is the loss)."""
    recovery_seconds: float = 0.0
    """Seconds spent recovering from incidents over the job's life (not capped like `incidents`)."""
    health: HealthStatus | None = None
    """Training-health signals on now and the step-time baseline (`spec.health`)."""
    checkpoint: CheckpointStatus | None = None
    """The durable-checkpoint interval in force and its inputs, and the checkpoints restores passed over."""
    preflight: PreflightStatus | None = None
    """The preflight's progress and outcome (`spec.preflight`)."""
    queue: QueueStatus | None = None
    """Kueue's admission of the job (`kueue.x-k8s.io/queue-name`): its Workload and where it runs."""


class TrainingJob(ApiModel):
    """A distributed PyTorch training run kept alive by Phalanx."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingJobSpec
    status: TrainingJobStatus = Field(default_factory=TrainingJobStatus)


def all_cel_rules() -> list[CelRule]:
    """Every model's CEL rules (the CRD's `x-kubernetes-validations`)."""
    models = [
        value for value in globals().values() if isinstance(value, type) and issubclass(value, ApiModel)
    ]
    return [rule for model in models for rule in model.__dict__.get("cel_rules", ())]


def managed_here(spec: Mapping[str, Any] | None) -> bool:
    """Whether Phalanx runs the job with this (raw) spec: `spec.managedBy` unset or Phalanx's own."""
    return (spec or {}).get("managedBy") in (None, "", CONTROLLER_NAME)
