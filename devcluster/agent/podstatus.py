"""Pod status as a kubelet reports it, built from the agent's record of the pod's containers (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> datetime:
    return datetime.now(UTC)


def image_id(image: str) -> str:
    """Images are never pulled: a name maps to the agent's local Python environment."""
    return f"phalanx-local://{image}"


@dataclass
class Terminated:
    exit_code: int
    reason: str
    started_at: datetime | None
    finished_at: datetime
    message: str = ""
    signal: int = 0
    container_id: str = ""

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "finishedAt": rfc3339(self.finished_at),
        }
        if self.started_at:
            out["startedAt"] = rfc3339(self.started_at)
        if self.message:
            out["message"] = self.message
        if self.signal:
            out["signal"] = self.signal
        if self.container_id:
            out["containerID"] = self.container_id
        return out


@dataclass
class ContainerRecord:
    """What the agent knows of one container (init or regular)."""

    name: str
    image: str
    restart_count: int = 0
    running_since: datetime | None = None
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    container_id: str = ""

    @property
    def running(self) -> bool:
        return self.running_since is not None and self.terminated is None

    def to_api(self, ready: bool) -> dict[str, Any]:
        if self.running:
            state: dict[str, Any] = {"running": {"startedAt": rfc3339(self.running_since)}}  # type: ignore[arg-type]
        elif self.terminated is not None:
            state = {"terminated": self.terminated.to_api()}
        else:
            state = {
                "waiting": {
                    "reason": self.waiting_reason,
                    **({"message": self.waiting_message} if self.waiting_message else {}),
                }
            }
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": image_id(self.image) if self.container_id else "",
            "ready": ready,
            "restartCount": self.restart_count,
            "started": self.running,
            "state": state,
            "lastState": {"terminated": self.last_terminated.to_api()} if self.last_terminated else {},
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


@dataclass
class PodRecord:
    """What the agent knows of one pod; the status is derived from it."""

    restart_policy: str
    init_containers: list[ContainerRecord] = field(default_factory=list)
    containers: list[ContainerRecord] = field(default_factory=list)
    pod_ip: str = ""
    host_ip: str = ""
    start_time: datetime | None = None
    failure_reason: str = ""
    """Set when the pod can never run (invalid spec): the pod is Failed with this reason and message."""
    failure_message: str = ""
    pending_message: str = ""
    """Why the pod is still Pending (e.g. a missing Secret), shown in the Ready condition."""


def exit_reason(exit_code: int, oom: bool = False) -> str:
    if oom:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


def init_done(record: PodRecord) -> bool:
    return all(c.terminated is not None and c.terminated.exit_code == 0 for c in record.init_containers)


def phase(record: PodRecord) -> str:
    """The kubelet's `getPhase`, for process containers."""
    if record.failure_reason:
        return "Failed"
    if not init_done(record):
        failed_init = any(
            c.terminated is not None and c.terminated.exit_code != 0 for c in record.init_containers
        )
        return "Failed" if failed_init and record.restart_policy == "Never" else "Pending"
    containers = record.containers
    if not containers:
        return "Pending"
    running = sum(1 for c in containers if c.running)
    exit_codes = [c.terminated.exit_code for c in containers if c.terminated is not None]
    waiting = len(containers) - running - len(exit_codes)
    succeeded = exit_codes.count(0)
    failed = len(exit_codes) - succeeded
    # A container waiting to restart after having run counts as running for the phase.
    restarting = sum(
        1 for c in containers if c.terminated is None and not c.running and c.last_terminated is not None
    )
    waiting -= restarting
    running += restarting
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if record.restart_policy == "Always":
        return "Running"
    if failed > 0 and record.restart_policy == "Never":
        return "Failed"
    if failed > 0:  # OnFailure: the failed ones will be restarted
        return "Running"
    return "Succeeded"


def _condition(
    kind: str,
    ok: bool,
    existing: Mapping[str, Mapping[str, Any]],
    moment: datetime,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    status = "True" if ok else "False"
    previous = existing.get(kind)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    out: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or rfc3339(moment),
    }
    if reason and not ok:
        out["reason"] = reason
    if message and not ok:
        out["message"] = message
    return out


def build_status(pod: Mapping[str, Any], record: PodRecord, moment: datetime) -> dict[str, Any]:
    """The full `status` the agent writes for the pod (with a merge patch: lists are replaced whole)."""
    current_phase = phase(record)
    existing = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    initialized = init_done(record)
    all_ready = bool(record.containers) and all(c.running for c in record.containers)
    not_ready = [c.name for c in record.containers if not c.running]
    terminal = current_phase in ("Succeeded", "Failed")
    ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
    ready_message = (
        "" if terminal else record.pending_message or f"containers with unready status: {not_ready}"
    )
    init_message = f"containers with incomplete status: {[c.name for c in record.init_containers]}"
    conditions = [
        _condition("Initialized", initialized, existing, moment, "ContainersNotInitialized", init_message),
        _condition("Ready", all_ready, existing, moment, ready_reason, ready_message),
        _condition("ContainersReady", all_ready, existing, moment, ready_reason, ready_message),
        _condition("PodScheduled", True, existing, moment),
    ]
    if terminal and initialized:
        conditions[0]["reason"] = "PodCompleted"
    status: dict[str, Any] = {
        "phase": current_phase,
        "conditions": conditions,
        "hostIP": record.host_ip or None,
        "podIP": record.pod_ip or None,
        "podIPs": [{"ip": record.pod_ip}] if record.pod_ip else None,
        "startTime": rfc3339(record.start_time) if record.start_time else None,
        "containerStatuses": [c.to_api(c.running) for c in record.containers],
        "reason": record.failure_reason or None,
        "message": record.failure_message or None,
    }
    if record.init_containers:
        status["initContainerStatuses"] = [
            c.to_api(c.terminated is not None and c.terminated.exit_code == 0) for c in record.init_containers
        ]
    return status


def records_from_spec(containers: Sequence[Mapping[str, Any]]) -> list[ContainerRecord]:
    return [ContainerRecord(name=c["name"], image=c.get("image", "")) for c in containers]
