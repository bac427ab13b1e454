"""Node objects: names, topology labels, capacity, status, leases."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from phalanx.devcluster.agent.config import AgentConfig, parse_config
from phalanx.devcluster.agent.nodes import all_nodes, lease_object, node_labels, node_status, ready_conditions
from phalanx.devcluster.binaries import KUBERNETES_VERSION

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def config(**overrides: object) -> AgentConfig:
    return AgentConfig(kubeconfig=Path("kc"), state_dir=Path("s"), **overrides)


def test_nodes_spread_over_zones_in_blocks_with_racks_inside_zones() -> None:
    specs = all_nodes(config(nodes=8, simulated_nodes=4, zones=2, nodes_per_rack=2))
    real = [s for s in specs if not s.simulated]
    assert [s.name for s in real] == [f"node-{i}" for i in range(8)]
    assert [s.zone for s in real] == ["zone-a"] * 4 + ["zone-b"] * 4
    assert [s.rack for s in real] == [
        "rack-0",
        "rack-0",
        "rack-1",
        "rack-1",
        "rack-2",
        "rack-2",
        "rack-3",
        "rack-3",
    ]
    simulated = [s for s in specs if s.simulated]
    assert [s.name for s in simulated] == ["sim-0", "sim-1", "sim-2", "sim-3"]
    assert Counter(s.zone for s in simulated) == {"zone-a": 2, "zone-b": 2}
    assert not {s.rack for s in simulated} & {s.rack for s in real}


def test_labels_of_real_and_simulated_nodes() -> None:
    real, simulated = all_nodes(config(nodes=1, simulated_nodes=1))
    labels = node_labels(real)
    assert labels["kubernetes.io/hostname"] == "node-0"
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["topology.kubernetes.io/zone"] == "zone-a"
    assert labels["phalanx.dev/rack"] == "rack-0"
    assert "phalanx.dev/simulated" not in labels
    assert node_labels(simulated)["phalanx.dev/simulated"] == "true"


def test_status_advertises_capacity_address_kubelet_port_and_version() -> None:
    real, simulated = all_nodes(config(nodes=1, simulated_nodes=1, gpus_per_node=2))
    status = node_status(real, config(gpus_per_node=2), 10250, T0)
    assert status["capacity"] == {
        "cpu": "8",
        "memory": "16Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "nvidia.com/gpu": "2",
    }
    assert status["allocatable"] == status["capacity"]
    assert status["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    assert status["nodeInfo"]["kubeletVersion"] == f"v{KUBERNETES_VERSION}"
    newer = node_status(
        real, parse_config(["--kubeconfig=kc", "--state-dir=s", "--kubelet-version=v1.20.2"]), 1, T0
    )
    assert newer["nodeInfo"]["kubeletVersion"] == newer["nodeInfo"]["kubeProxyVersion"] == "v1.20.2"
    assert node_status(simulated, config(), 1, T0)["capacity"]["pods"] == "250"
    assert "nvidia.com/gpu" not in node_status(real, config(), 1, T0)["capacity"]


def test_ready_condition_keeps_its_transition_time_and_refreshes_heartbeat() -> None:
    earlier = [{"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    ready = next(c for c in ready_conditions(T0, earlier) if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ready["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert ready["lastHeartbeatTime"] == "2026-01-01T00:00:00Z"
    unknown = [{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    ready = next(c for c in ready_conditions(T0, unknown) if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_lease_is_owned_by_its_node() -> None:
    lease = lease_object("node-3", "uid-3", T0)
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-3"
    assert lease["spec"]["holderIdentity"] == "node-3"
    assert lease["spec"]["renewTime"] == "2026-01-01T00:00:00.000000Z"


def test_command_line_matches_the_documented_invocation() -> None:
    parsed = parse_config(
        [
            "--kubeconfig",
            "KC",
            "--state-dir",
            "D",
            "--nodes",
            "3",
            "--simulated-nodes",
            "2",
            "--cluster-octet",
            "9",
            "--api-port",
            "7443",
        ]
    )
    assert (parsed.nodes, parsed.simulated_nodes, parsed.cluster_octet, parsed.api_port) == (3, 2, 9, 7443)
    assert parsed.use_namespaces is None
    assert parse_config(["--kubeconfig", "K", "--state-dir", "D", "--no-namespaces"]).use_namespaces is False
