"""Factories for TrainingJob objects and observed pods, shared by the operator's unit tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _job(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 2,
        "spares": 1,
        "template": {
            "metadata": {"labels": {"team": "ml"}},
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "phalanx:dev",
                        "command": ["python", "-m", "phalanx.worker.examples.tinygpt"],
                        "args": ["--steps", "50"],
                        "env": [
                            {"name": "USER_VAR", "value": "1"},
                            {"name": "PHALANX_ROLE", "value": "bogus"},
                        ],
                    }
                ]
            },
        },
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": "demo",
            "namespace": "ml",
            "uid": "uid-123",
            "generation": 1,
            "resourceVersion": "7",
        },
        "spec": spec,
    }


def _pod(
    name: str,
    *,
    role: str = "worker",
    index: int | None = None,
    node: str | None = "node-a",
    phase: str = "Running",
    exit_code: int | None = None,
    created: str = "2026-01-01T11:59:00Z",
    uid: str | None = None,
    terminating: bool = False,
    component: str | None = None,
    container: str = "trainer",
    owner: str | None = "uid-123",
) -> dict[str, Any]:
    """A pod as the operator's pod index holds it (`status.summarize_pod`); `owner`: the uid its controller
    ownerReference names (the job `make_job` builds, by default)."""
    if index is None and role != "rendezvous":
        index = int(name.rsplit("-", 1)[-1])
    labels = {
        "phalanx.dev/job-name": "demo",
        "phalanx.dev/role": role,
        "phalanx.dev/component": component or ("rendezvous" if role == "rendezvous" else "trainer"),
    }
    if index is not None:
        labels["phalanx.dev/index"] = str(index)
    containers = []
    if exit_code is not None:
        containers.append({"name": container, "ready": False, "terminated": {"exitCode": exit_code}})
    metadata: dict[str, Any] = {
        "name": name,
        "uid": uid or f"uid-{name}",
        "labels": labels,
        "creationTimestamp": created,
        "controllerUid": owner,
    }
    if owner is not None:
        owned = {
            "apiVersion": "phalanx.dev/v1alpha1",
            "kind": "TrainingJob",
            "uid": owner,
            "controller": True,
        }
        metadata["ownerReferences"] = [owned]
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": [], "containerStatuses": containers},
    }


@pytest.fixture
def make_job() -> Callable[..., dict[str, Any]]:
    return lambda **overrides: copy.deepcopy(_job(**overrides))


@pytest.fixture
def make_pod() -> Callable[..., dict[str, Any]]:
    return _pod


@pytest.fixture
def now() -> datetime:
    return NOW


RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What breaks Pod Security's `restricted` level (its checks as of Kubernetes 1.37, Linux pods) in `pod`."""
    spec = pod["spec"]
    pod_context = spec.get("securityContext") or {}
    containers = [*(spec.get("initContainers") or []), *spec["containers"]]
    found = [f"host namespace {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    if pod_context.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        capabilities = context.get("capabilities") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities not dropping ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added {capabilities['add']}")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot not true")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        profile = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if profile not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {profile}")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{name}: hostPort")
    return found


@pytest.fixture
def restricted_violations() -> Callable[[dict[str, Any]], list[str]]:
    """What breaks Pod Security `restricted` in a pod (or a pod template: anything with a pod `spec`)."""
    return _restricted_violations
