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
) -> dict[str, Any]:
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
    }
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
