"""Node objects of the agent (pure builders) and their registration and heartbeats (Lease + Ready condition)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from phalanx.devcluster.agent.config import AgentConfig
from phalanx.devcluster.agent.envresolve import parse_quantity
from phalanx.devcluster.agent.kube import ApiError, KubeClient

log = logging.getLogger(__name__)

SIMULATED_LABEL = "phalanx.dev/simulated"
RACK_LABEL = "phalanx.dev/rack"
ZONE_LABEL = "topology.kubernetes.io/zone"
AGENT_LABEL = "phalanx.dev/agent"
CRASH_ANNOTATION = "phalanx.dev/crash"
HOST_IP = "127.0.0.1"
LEASE_SECONDS = 40
REAL_POD_MEMORY = 768 * 2**20
"""What a real node's pod is taken to need, whatever it requests: a trainer pod is the launcher and a torch
process, about 350 MB each."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    simulated: bool
    zone: str
    rack: str


def zone_name(index: int) -> str:
    return "zone-" + chr(ord("a") + index) if index < 26 else f"zone-{index}"


def plan_nodes(count: int, prefix: str, simulated: bool, zones: int, nodes_per_rack: int) -> list[NodeSpec]:
    """Nodes in contiguous zone blocks, each zone split into racks of `nodes_per_rack`; rack names are unique."""
    per_zone = max(1, -(-count // zones))
    specs = []
    rack_offset = 0
    for zone in range(zones):
        members = list(range(zone * per_zone, min(count, (zone + 1) * per_zone)))
        for position, index in enumerate(members):
            rack = f"{prefix}rack-{rack_offset + position // nodes_per_rack}"
            specs.append(NodeSpec(f"{prefix}-{index}", simulated, zone_name(zone), rack))
        rack_offset += -(-len(members) // nodes_per_rack)
    return specs


def all_nodes(config: AgentConfig) -> list[NodeSpec]:
    real = plan_nodes(config.nodes, "node", False, config.zones, config.nodes_per_rack)
    simulated = plan_nodes(config.simulated_nodes, "sim", True, config.zones, config.nodes_per_rack)
    # rack names: "noderack-0" reads badly; keep "rack-N" for real nodes and "sim-rack-N" for simulated ones
    real = [NodeSpec(n.name, n.simulated, n.zone, n.rack.replace("noderack", "rack")) for n in real]
    simulated = [
        NodeSpec(n.name, n.simulated, n.zone, n.rack.replace("simrack", "sim-rack")) for n in simulated
    ]
    return real + simulated


def node_labels(spec: NodeSpec) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        ZONE_LABEL: spec.zone,
        "failure-domain.beta.kubernetes.io/zone": spec.zone,
        RACK_LABEL: spec.rack,
        AGENT_LABEL: "true",
    }
    if spec.simulated:
        labels[SIMULATED_LABEL] = "true"
    return labels


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine (None where the platform does not tell)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def node_memory(spec: NodeSpec, config: AgentConfig) -> str:
    """A node's memory capacity: `nodeMemory`, but for a real node at most its share of the machine (its pods
    are processes here), so pods that request memory stay Pending rather than exhaust the machine."""
    if spec.simulated or not config.machine_memory or not config.nodes:
        return config.node_memory
    share = config.machine_memory // config.nodes
    if parse_quantity(config.node_memory) <= share:
        return config.node_memory
    return f"{share // 2**20}Mi"


def node_pods(spec: NodeSpec, config: AgentConfig) -> str:
    """A node's pod capacity: 110 as a kubelet's default (simulated: 250); a real node at most as many pods
    as its share of the machine's memory holds at `REAL_POD_MEMORY` each. Pods that request little or no
    memory still run as processes of real size, so the pod count is what bounds the machine's memory."""
    if spec.simulated:
        return "250"
    if not config.machine_memory or not config.nodes:
        return "110"
    share = config.machine_memory // config.nodes
    return str(max(1, min(110, share // REAL_POD_MEMORY)))


def capacity(spec: NodeSpec, config: AgentConfig) -> dict[str, str]:
    resources = {
        "cpu": config.node_cpu,
        "memory": node_memory(spec, config),
        "pods": node_pods(spec, config),
        "ephemeral-storage": "100Gi",
    }
    if config.gpus_per_node:
        resources["nvidia.com/gpu"] = str(config.gpus_per_node)
    return resources


def micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seconds_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_conditions(moment: datetime, existing: list[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The kubelet's node conditions: Ready plus the pressure conditions, all healthy."""
    previous = {c["type"]: c for c in existing or []}
    table = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "phalanx node agent is posting ready status"),
    ]
    out = []
    for kind, status, reason, message in table:
        before = previous.get(kind)
        since = (
            before["lastTransitionTime"]
            if before and before.get("status") == status
            else seconds_time(moment)
        )
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": seconds_time(moment),
                "lastTransitionTime": since,
            }
        )
    return out


def node_status(
    spec: NodeSpec,
    config: AgentConfig,
    kubelet_port: int,
    moment: datetime,
    existing: list[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    resources = capacity(spec, config)
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": ready_conditions(moment, existing),
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": spec.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": spec.name,
            "systemUUID": spec.name,
            "bootID": spec.name,
            "kernelVersion": "phalanx-local",
            "osImage": "phalanx local node agent",
            "containerRuntimeVersion": "phalanx-process://0.1",
            "kubeletVersion": config.kubelet_version,
            "kubeProxyVersion": config.kubelet_version,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_taints(spec: NodeSpec) -> list[dict[str, str]]:
    """Simulated nodes run nothing: only pods that tolerate this taint (scale tests) may land there."""
    if spec.simulated:
        return [{"key": SIMULATED_LABEL, "value": "true", "effect": "NoSchedule"}]
    return []


def node_object(spec: NodeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": node_labels(spec)},
        "spec": {"taints": node_taints(spec)},
    }


def lease_object(name: str, node_uid: str, moment: datetime) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": micro_time(moment),
        },
    }


HEARTBEAT_THREADS = 8
"""Node heartbeats in flight at once."""


class NodeHeartbeats:
    """Registers the nodes, then renews their Leases and Ready condition, except for crashed nodes."""

    def __init__(
        self,
        kube: KubeClient,
        config: AgentConfig,
        specs: list[NodeSpec],
        kubelet_port: int,
        stop: threading.Event,
    ) -> None:
        self.kube = kube
        self.config = config
        self.specs = specs
        self.kubelet_port = kubelet_port
        self.stop = stop
        self.crashed: set[str] = set()
        self._uids: dict[str, str] = {}
        self._status_due: dict[str, float] = {}
        self._lock = threading.Lock()

    def register(self) -> None:
        for spec in self.specs:
            self._register_one(spec)
        log.info("registered %d nodes", len(self.specs))

    def register_again(self, spec: NodeSpec) -> None:
        """Register the node anew (its object was deleted): as a machine booting under that name would."""
        self._register_one(spec)

    def _register_one(self, spec: NodeSpec) -> None:
        body = node_object(spec)
        try:
            node = self.kube.create("/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:
                raise
            node = self.kube.merge_patch(
                f"/api/v1/nodes/{spec.name}",
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": {"taints": node_taints(spec)}},
            )
        self._uids[spec.name] = node["metadata"]["uid"]
        self._post_status(spec, (node.get("status") or {}).get("conditions"))
        self._renew_lease(spec.name)

    def _post_status(self, spec: NodeSpec, existing: list[Mapping[str, Any]] | None) -> None:
        status = node_status(spec, self.config, self.kubelet_port, datetime.now(UTC), existing)
        self.kube.merge_patch(f"/api/v1/nodes/{spec.name}/status", {"status": status})

    def _renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        moment = datetime.now(UTC)
        try:
            self.kube.merge_patch(
                path,
                {
                    "spec": {
                        "holderIdentity": name,
                        "renewTime": micro_time(moment),
                        "leaseDurationSeconds": LEASE_SECONDS,
                    }
                },
            )
        except ApiError as error:
            if error.status != 404:
                raise
            self.kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                lease_object(name, self._uids.get(name, ""), moment),
            )

    def set_crashed(self, name: str, crashed: bool) -> bool:
        """Returns True when the state changed."""
        with self._lock:
            if crashed == (name in self.crashed):
                return False
            if crashed:
                self.crashed.add(name)
            else:
                self.crashed.discard(name)
                self._status_due[name] = 0.0  # heartbeat at once on recovery
            return True

    def is_crashed(self, name: str) -> bool:
        with self._lock:
            return name in self.crashed

    def run(self) -> None:
        """Every node's heartbeat once per interval, spread over it, on a few threads: a round of thousands of
        nodes one after another takes longer than the node controller's grace period on a loaded machine, and
        every node would go NotReady though none failed."""
        import time
        from concurrent.futures import ThreadPoolExecutor

        interval = self.config.lease_interval
        with ThreadPoolExecutor(max_workers=HEARTBEAT_THREADS, thread_name_prefix="node-heartbeat") as pool:
            round_start = time.monotonic()
            while not self.stop.wait(max(0.0, round_start + interval - time.monotonic())):
                round_start = time.monotonic()
                for position, spec in enumerate(self.specs):
                    due = round_start + interval * position / len(self.specs)
                    if self.stop.wait(max(0.0, due - time.monotonic())):
                        return
                    pool.submit(self._beat_one, spec)

    def _beat_one(self, spec: NodeSpec) -> None:
        import time

        if self.stop.is_set() or self.is_crashed(spec.name):
            return
        try:
            self._renew_lease(spec.name)
            if time.monotonic() >= self._status_due.get(spec.name, 0.0):
                node = self.kube.get_or_none(f"/api/v1/nodes/{spec.name}")
                if node is None:  # deleted by someone: register again
                    self._register_one(spec)
                else:
                    self._post_status(spec, (node.get("status") or {}).get("conditions"))
                self._status_due[spec.name] = time.monotonic() + self.config.status_interval
        except Exception as error:
            log.warning("heartbeat of %s failed: %s", spec.name, error)
