"""The kubelet's admission check: a pod bound to a node runs only if the node's allocatable pods and memory
(and CPU) still hold it beside the pods already admitted there; otherwise it fails at once with the
kubelet's reasons (`OutOfpods`, `OutOfmemory`, `OutOfcpu`) and starts nothing.

The scheduler already keeps within these numbers; this catches what bypasses it (a pod bound by `nodeName`,
two schedulers racing), so nothing the API server accepts can start more processes than a node holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.envresolve import parse_quantity

CHECKED = ("pods", "memory", "cpu")
MIN_FREE_FRACTION = 0.05
MIN_FREE_BYTES = 1 << 30
"""A real pod starts only while the machine has this much memory available: its processes are the
machine's, and other clusters (or programs) may share it whatever the nodes advertise."""


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


def requests_of(pod_spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the pod holds on its node: its containers' requests (a limit stands for a missing request), or the
    largest init container's when that is more; `pods` is 1."""
    totals = {name: Decimal(0) for name in CHECKED}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in ("memory", "cpu"):
            if name in merged:
                totals[name] += parse_quantity(merged[name])
    for container in pod_spec.get("initContainers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in ("memory", "cpu"):
            if name in merged:
                totals[name] = max(totals[name], parse_quantity(merged[name]))
    totals["pods"] = Decimal(1)
    return totals


def refusal(
    allocatable: Mapping[str, str], admitted: Iterable[Mapping[str, Decimal]], requests: Mapping[str, Decimal]
) -> Refusal | None:
    """Why a pod asking `requests` does not fit beside the `admitted` ones (None: it fits)."""
    used = {name: Decimal(0) for name in CHECKED}
    for other in admitted:
        for name in CHECKED:
            used[name] += other.get(name, Decimal(0))
    for name in CHECKED:
        wanted = requests.get(name, Decimal(0))
        if not wanted or name not in allocatable:
            continue
        capacity = parse_quantity(allocatable[name])
        if used[name] + wanted > capacity:
            return Refusal(
                f"OutOf{name}",
                f"Node didn't have enough resource: {name}, requested: {wanted:f}, used: {used[name]:f}, "
                f"capacity: {capacity:f}",
            )
    return None


def available_memory() -> tuple[int, int] | None:
    """(available, total) bytes of the machine's memory from /proc/meminfo (None where there is none)."""
    try:
        text = Path("/proc/meminfo").read_text()
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024, int(fields["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def machine_refusal(memory: tuple[int, int] | None) -> Refusal | None:
    """The refusal of a real pod while the machine runs low on memory (None: enough is available)."""
    if memory is None:
        return None
    available, total = memory
    floor = max(MIN_FREE_BYTES, int(total * MIN_FREE_FRACTION))
    if available >= floor:
        return None
    return Refusal(
        "OutOfmemory",
        f"Node didn't have enough resource: memory, the machine has {available >> 20}Mi available, "
        f"below the {floor >> 20}Mi kept free",
    )


class Ledger:
    """The pods admitted on each node and what they hold (thread-safe)."""

    def __init__(self) -> None:
        self._admitted: dict[str, dict[str, dict[str, Decimal]]] = {}
        self._lock = threading.Lock()

    def admit(
        self, node: str, uid: str, allocatable: Mapping[str, str], pod_spec: Mapping[str, Any]
    ) -> Refusal | None:
        """Admit the pod (or find it admitted already); the refusal when the node cannot hold it."""
        with self._lock:
            on_node = self._admitted.setdefault(node, {})
            if uid in on_node:
                return None
            requests = requests_of(pod_spec)
            refused = refusal(allocatable, on_node.values(), requests)
            if refused is None:
                on_node[uid] = requests
            return refused

    def release(self, node: str, uid: str) -> None:
        """The pod ended or went away: its share is free."""
        with self._lock:
            self._admitted.get(node, {}).pop(uid, None)

    def count(self, node: str) -> int:
        with self._lock:
            return len(self._admitted.get(node, {}))
