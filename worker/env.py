"""Launcher settings: read from the operator's environment contract, overridden by command-line flags.

See docs/ARCHITECTURE.md ("Operator -> worker contract") for the variables. Everything here is pure:
`settings_from(env, overrides)` turns a mapping into a validated `LaunchSettings`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Environment variable -> LaunchSettings field.
ENV_FIELDS: dict[str, str] = {
    "PHALANX_RDZV_ENDPOINT": "rdzv_endpoint",
    "PHALANX_RDZV_PROTOCOL": "rdzv_protocol",
    "PHALANX_JOB_UID": "run_id",
    "PHALANX_JOB_NAME": "job_name",
    "PHALANX_MIN_NODES": "min_nodes",
    "PHALANX_MAX_NODES": "max_nodes",
    "PHALANX_MAX_NODES_FILE": "max_nodes_file",
    "PHALANX_JOB_FILE": "job_file",
    "PHALANX_NPROC_PER_NODE": "nproc_per_node",
    "PHALANX_ROLE": "role",
    "PHALANX_MAX_RESTARTS": "max_restarts",
    "PHALANX_RDZV_JOIN_TIMEOUT": "join_timeout",
    "PHALANX_RDZV_LAST_CALL_TIMEOUT": "last_call_timeout",
    "PHALANX_RDZV_KEEPALIVE_INTERVAL": "keepalive_interval",
    "PHALANX_RDZV_KEEPALIVE_TIMEOUT": "keepalive_timeout",
    "PHALANX_HEARTBEAT_INTERVAL": "heartbeat_interval",
    "PHALANX_HEARTBEAT_TIMEOUT": "heartbeat_timeout",
    "PHALANX_HEARTBEAT_REPORTING": "heartbeat_reporting",
    "PHALANX_HANG_FACTOR": "hang_factor",
    "PHALANX_HANG_FLOOR": "hang_floor",
    "PHALANX_METRICS_PORT": "metrics_port",
    "PHALANX_COLLECTIVE_TIMEOUT": "collective_timeout",
    "PHALANX_WARM_START": "warm_start",
    "PHALANX_LIVE_REGROUP": "live_regroup",
    "PHALANX_LIVE_LEAVE_TIMEOUT": "live_leave_timeout",
    "PHALANX_FINISHED_GRACE": "finished_grace",
    "PHALANX_STORE_SECRET_FILE": "store_secret_file",
    "POD_NAME": "pod_name",
    "POD_UID": "pod_uid",
    "POD_NAMESPACE": "pod_namespace",
    "POD_IP": "local_addr",
}

# The key in the rendezvous store that the operator bumps (an integer counter, `TCPStore.add`) to make
# every launcher restart its worker group and re-rendezvous at once.
RESTART_EPOCH_KEY = "phalanx/restart-epoch"

# The key in the rendezvous store holding the number of active nodes in force (`max_nodes` of every round).
# The first launcher seeds it with its `PHALANX_MAX_NODES`; a launcher that learns a new desired count
# replaces it with compare-and-set. The value is the integer, optionally followed by a space and the
# writer's identity (so concurrent writers can tell who won).
MAX_NODES_KEY = "phalanx/max-nodes"

# The key in the rendezvous store holding the newest regroup request handled (`status.regroup.epoch` of
# the TrainingJob, worker/regroup.py): `"<epoch>"` as seeded, `"<epoch> <writer>"` once a launcher claimed
# the request with compare-and-set. The one launcher whose compare-and-set wins bumps the restart epoch.
REGROUP_EPOCH_KEY = "phalanx/regroup-epoch"

# The key in the rendezvous store naming the node that holds the newest state of those re-forming the group
# (worker/rendezvous.py, `FreshestClaim`): `"<step> <round> <addr> <pid> <local id>"`. A launcher holding an
# in-memory snapshot claims it before each rendezvous; a node holding older state leaves that node the last
# place in the round.
FRESHEST_KEY = "phalanx/freshest"

# The key in the rendezvous store holding the newest rollback request handled (`status.rollback.epoch`,
# worker/rollback.py), claimed like the regroup epoch: the one winner restarts every launcher's group.
ROLLBACK_EPOCH_KEY = "phalanx/rollback-epoch"

# The key in the rendezvous store saying how the group ended, written by the launcher that closes the
# rendezvous (worker/rendezvous.py, `GroupOutcome`): JSON `{"code": <launcher exit code>, "message": ...}`.
# A launcher that finds the rendezvous closed leaves with that code: a spare released by a group that failed
# must not report success.
OUTCOME_KEY = "phalanx/outcome"


class LaunchSettings(BaseModel):
    """Everything the launcher needs; defaults favour fast recovery over torch's conservative ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rdzv_endpoint: str = Field(min_length=1)
    """`host:port` of the job's rendezvous store (never hosted by a worker)."""
    rdzv_protocol: Literal["c10d", "rounds"] = "c10d"
    """How the group forms and re-forms: `c10d`, torch's dynamic rendezvous (one shared state, keep-alives);
    `rounds`, rounds decided in the store, whose cost per re-form grows with the change (worker/storerounds.py)."""
    run_id: str = Field(default="phalanx-local", min_length=1)
    """Rendezvous id: the TrainingJob uid, so two jobs never share a rendezvous."""
    job_name: str = ""
    """TrainingJob name: the launcher watches this TrainingJob (in `pod_namespace`)."""
    min_nodes: int = Field(default=1, ge=1)
    """Fewest launchers (pods) the group trains with."""
    max_nodes: int = Field(default=1, ge=1)
    """Most launchers in the group at start; a launcher arriving beyond it waits as a standby. While the job
    runs the value in force is the store's `phalanx/max-nodes` (worker/scaling.py), seeded with this one."""
    max_nodes_file: str = ""
    """A file holding the desired number of active nodes, read every heartbeat interval instead of the
    TrainingJob (for running without Kubernetes); empty: follow the TrainingJob when Kubernetes is reachable."""
    job_file: str = ""
    """A file holding the TrainingJob as JSON, read whenever it changes, instead of watching the TrainingJob
    in Kubernetes (for running without Kubernetes, and tests): its desired replicas and regroup requests."""
    nproc_per_node: int = Field(default=1, ge=1)
    """Training processes per launcher."""
    role: Literal["worker", "spare"] = "worker"
    """`spare` joins only once the group is formed, so it waits as a standby instead of taking a slot."""
    max_restarts: int = Field(default=1000, ge=0)
    """Worker-group restarts after failures before giving up; big because the operator owns the real budget.
    Membership changes and operator-requested restarts never spend it."""
    max_failures_without_progress: int = Field(default=3, ge=1)
    """Consecutive failed attempts that completed no training step before the command counts as broken (exit 1)."""
    join_timeout: float = Field(default=120.0, gt=0)
    """Seconds to wait for a rendezvous round to form (torch default: 600)."""
    last_call_timeout: float = Field(default=1.0, gt=0)
    """Seconds to wait for more nodes once `min_nodes` have joined (torch default: 30)."""
    keepalive_interval: float = Field(default=1.0, gt=0)
    """Seconds between rendezvous keep-alives (torch default: 5)."""
    keepalive_timeout: float = Field(default=5.0, gt=0)
    """Seconds without keep-alive after which a node is dropped from the rendezvous (torch default: 15)."""
    store_timeout: float = Field(default=15.0, gt=0)
    """Seconds one rendezvous-store operation may take before it counts as a connection failure."""
    monitor_interval: float = Field(default=0.2, gt=0)
    """Seconds between checks of the training processes, the restart epoch and waiting nodes."""
    shutdown_grace: float = Field(default=30.0, ge=0)
    """Seconds training processes get to save after SIGTERM before they are killed."""
    local_addr: str = "127.0.0.1"
    """Address this launcher advertises and binds to (the pod IP)."""
    store_secret_file: str = ""
    """The file holding the job's store secret, which the rendezvous store's gate requires (worker/storegate.py);
    empty: the store is reached without one (a store that no operator set up)."""
    pod_name: str = ""
    """Pod name: names the heartbeat Lease."""
    pod_uid: str = ""
    """Pod UID: tells this pod apart from an earlier one of the same name (a hang drill names its target so)."""
    pod_namespace: str = ""
    """Pod namespace: holds the heartbeat Lease."""
    heartbeat_interval: float = Field(default=5.0, gt=0)
    """Seconds between Lease renewals."""
    heartbeat_timeout: float = Field(default=30.0, gt=0)
    """Seconds of silence after which the operator calls the pod dead (written into the Lease)."""
    heartbeat_reporting: Literal["leases", "hub"] = "leases"
    """`leases`: the pod's own Lease carries every heartbeat. `hub`: the job's heartbeat hub does, through the
    rendezvous store (worker/beathub.py), and the own Lease only until the hub answers and while it does not."""
    hang_factor: float = Field(default=5.0, ge=0)
    """A training rank that reaches no step for longer than this multiple of the p99 of its recent step
    times counts as hung (worker/trainerwatch.py); 0 leaves hangs to the operator's progress timeout."""
    hang_floor: float = Field(default=1.0, gt=0)
    """The least number of seconds without a step that counts as a hang, whatever the step times."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus port of this pod; 0 turns the endpoint off."""
    collective_timeout: float = Field(default=300.0, gt=0)
    """Seconds a training process may sit in one collective before its watchdog ends it."""
    warm_start: bool = True
    """Keep one interpreter per local rank with torch imported, waiting to become the next training process
    (worker/warmstart.py): a restart then skips the import. Off: every training process starts cold."""
    live_regroup: bool = True
    """Training processes that run their groups through `phalanx.worker.livegroup.run_groups` outlive a
    regroup: the launcher hands them the next group instead of killing them (worker/livegroup.py). Off: every
    regroup restarts the training processes."""
    live_leave_timeout: float = Field(default=2.0, gt=0)
    """Seconds live training processes get to leave their group at a step boundary when the group must
    re-form (a node joins, the operator's regroup request); past it they are killed and started anew."""
    finished_grace: float = Field(default=30.0, gt=0)
    """Seconds training processes that all published `finished` (after their last save) may take to exit; past
    it the launcher ends them and the group counts as finished: a teardown that hangs (a collective library's,
    the interpreter's exit) must not keep the pod, and the job, from ending. Keep it below the other nodes'
    exit barrier (the join timeout, at least 60 s), so that this node still meets them there."""
    command: tuple[str, ...] = Field(min_length=1)
    """The user's training command."""

    @model_validator(mode="after")
    def _check_bounds(self) -> LaunchSettings:
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) is below min_nodes ({self.min_nodes})")
        if self.keepalive_timeout < self.keepalive_interval:
            raise ValueError("keepalive_timeout must be at least keepalive_interval")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"rdzv_endpoint must be host:port, got {self.rdzv_endpoint!r}")
        return self

    @property
    def rdzv_host(self) -> str:
        return self.rdzv_endpoint.rpartition(":")[0]

    @property
    def rdzv_port(self) -> int:
        return int(self.rdzv_endpoint.rpartition(":")[2])

    @property
    def keepalive_max_attempts(self) -> int:
        """Missed keep-alives that make a node dead, as torch counts it."""
        return max(1, math.ceil(self.keepalive_timeout / self.keepalive_interval))


class SettingsError(ValueError):
    """The launcher's configuration is invalid (exit code 2)."""


def settings_from(env: Mapping[str, str], overrides: Mapping[str, Any]) -> LaunchSettings:
    """Build settings from the environment, then flags (`overrides`, None meaning "not given")."""
    values: dict[str, Any] = {}
    for variable, field in ENV_FIELDS.items():
        raw = env.get(variable, "").strip()
        if raw:
            values[field] = raw
    values.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return LaunchSettings.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'settings'}: {item['msg']}"
            for item in error.errors()
        )
        raise SettingsError(problems) from None


def parse_nnodes(text: str) -> tuple[int, int]:
    """`"2"` -> (2, 2); `"1:4"` -> (1, 4)."""
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise SettingsError(f"--nnodes must be N or MIN:MAX, got {text!r}") from None
