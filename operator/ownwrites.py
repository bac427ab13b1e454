"""The pod changes this operator made that its pod index has not shown yet.

A reconcile plans from the pod index, which the watch fills a moment after each write. A reconcile that runs in
between would otherwise plan the same change again: create a pod of the gang again (AlreadyExists), relabel a
promoted spare (and announce its promotion twice), or lift a forming gang's scheduling gate from every pod a second
time (at a 12,500-pod gang, 12,500 more PATCHes to a busy API server). The changes are laid over the indexed pods
until the index shows them (Kubernetes' own controllers keep such "expectations" for the same reason). A created
pod the index never shows is laid over for `limit_seconds` at most: by then the pod watch is judged stalled
(`watchguard`) or the pod was deleted before its watch event came.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from phalanx.operator import gang, names
from phalanx.operator.status import pod_name


class PodChange(Protocol):
    adds: bool
    """The change is the pod itself (a creation): laid over as a pod the index does not show yet."""

    def shown(self, pod: dict[str, Any]) -> bool:
        """Whether `pod` (as indexed) already carries the change."""

    def laid_over(self, pod: dict[str, Any]) -> dict[str, Any]:
        """`pod` with the change (a copy: the index's object is never touched)."""


@dataclass(frozen=True)
class RoleLabel:
    """The pod's role label was written (a spare promoted, a worker demoted)."""

    role: str
    adds = False

    def shown(self, pod: dict[str, Any]) -> bool:
        return ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ROLE) == self.role

    def laid_over(self, pod: dict[str, Any]) -> dict[str, Any]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return {**pod, "metadata": {**pod["metadata"], "labels": {**labels, names.LABEL_ROLE: self.role}}}


@dataclass(frozen=True)
class GateLifted:
    """The gang's scheduling gate was lifted."""

    adds = False

    def shown(self, pod: dict[str, Any]) -> bool:
        return not gang.is_gated(pod)

    def laid_over(self, pod: dict[str, Any]) -> dict[str, Any]:
        return gang.ungated(pod)


@dataclass(frozen=True)
class Created:
    """The pod was created; `summary` is what the index will hold for it (`status.summarize_pod`)."""

    summary: dict[str, Any]
    adds = True

    def shown(self, pod: dict[str, Any]) -> bool:
        # The index shows a pod of that name (this one, or a later one: it knows better either way).
        return True

    def laid_over(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.summary


class OwnWrites:
    """Per job, per (pod, kind of change): the pod's uid when written, the change and when. Thread-safe."""

    def __init__(self, limit_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_seconds = limit_seconds
        self._clock = clock
        self._guard = threading.Lock()
        self._written: dict[tuple[str, str], dict[tuple[str, type], tuple[str | None, PodChange, float]]] = {}

    def wrote(self, namespace: str, job: str, pod: str, uid: str | None, change: PodChange) -> None:
        with self._guard:
            self._written.setdefault((namespace, job), {})[(pod, type(change))] = (uid, change, self._clock())

    def laid_over(self, namespace: str, job: str, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The job's indexed pods with the changes not shown yet. A change the index shows, or whose pod is
        gone or is another one now, is forgotten; so is a creation older than `limit_seconds`."""
        now = self._clock()
        with self._guard:
            written = self._written.get((namespace, job))
            if not written:
                return pods
            by_name = {pod_name(pod): position for position, pod in enumerate(pods)}
            result = list(pods)
            for key, (uid, change, when) in list(written.items()):
                position = by_name.get(key[0])
                pod = result[position] if position is not None else None
                if change.adds:
                    if pod is not None or now - when > self.limit_seconds:
                        del written[key]
                    else:
                        result.append(change.laid_over({}))
                    continue
                if position is None or pod is None or pod["metadata"].get("uid") != uid or change.shown(pod):
                    del written[key]
                    continue
                result[position] = change.laid_over(pod)
            if not written:
                del self._written[(namespace, job)]
            return result

    def pending(self, namespace: str, job: str) -> list[tuple[str, PodChange]]:
        """The job's changes remembered now: (pod, change)."""
        with self._guard:
            return [
                (pod, change) for (pod, _), (_, change, _) in self._written.get((namespace, job), {}).items()
            ]

    def forget(self, namespace: str, job: str) -> None:
        with self._guard:
            self._written.pop((namespace, job), None)

    def __len__(self) -> int:
        with self._guard:
            return sum(len(written) for written in self._written.values())
