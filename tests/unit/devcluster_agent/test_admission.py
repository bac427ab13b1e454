"""The node agent admits pods as a kubelet does: never beyond a node's pods or memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.admission import (
    Ledger,
    available_memory,
    machine_refusal,
    refusal,
    requests_of,
)
from phalanx.devcluster.agent.config import AgentConfig
from phalanx.devcluster.agent.nodes import all_nodes, capacity

ALLOCATABLE = {"pods": "3", "memory": "1Gi", "cpu": "2"}


def _spec(memory: str | None = None, cpu: str | None = None) -> dict[str, Any]:
    requests = {key: value for key, value in (("memory", memory), ("cpu", cpu)) if value}
    return {"containers": [{"name": "main", "resources": {"requests": requests}}]}


def test_a_node_admits_up_to_its_pod_count_then_refuses_with_the_kubelet_reason() -> None:
    ledger = Ledger()
    assert [ledger.admit("n", f"uid-{i}", ALLOCATABLE, _spec()) for i in range(3)] == [None, None, None]
    refused = ledger.admit("n", "uid-3", ALLOCATABLE, _spec())
    assert refused is not None and refused.reason == "OutOfpods"
    assert "pods, requested: 1, used: 3, capacity: 3" in refused.message
    # Seen again (another watch event of an admitted pod): still admitted, nothing counted twice.
    assert ledger.admit("n", "uid-0", ALLOCATABLE, _spec()) is None and ledger.count("n") == 3
    ledger.release("n", "uid-0")
    assert ledger.admit("n", "uid-3", ALLOCATABLE, _spec()) is None
    # Another node keeps its own count.
    assert ledger.admit("m", "uid-9", ALLOCATABLE, _spec()) is None


def test_memory_and_cpu_requests_are_held_against_allocatable() -> None:
    admitted = [requests_of(_spec(memory="768Mi"))]
    refused = refusal(ALLOCATABLE, admitted, requests_of(_spec(memory="512Mi")))
    assert refused is not None and refused.reason == "OutOfmemory"
    assert refusal(ALLOCATABLE, admitted, requests_of(_spec(memory="256Mi"))) is None
    assert refusal(ALLOCATABLE, [], requests_of(_spec(cpu="2500m"))).reason == "OutOfcpu"  # type: ignore[union-attr]
    # A pod that requests no memory is held to the pod count only.
    assert refusal(ALLOCATABLE, admitted, requests_of(_spec())) is None


def test_real_nodes_advertise_at_most_their_share_of_the_machine_in_memory_and_pods() -> None:
    config = AgentConfig(
        kubeconfig=Path("kc"), state_dir=Path("s"), nodes=4, simulated_nodes=1, machine_memory=24 * 2**30
    )
    real, *_, simulated = all_nodes(config)
    assert capacity(real, config)["memory"] == "6144Mi"
    # Its pods are processes of a few hundred MB whatever they request: the pod count bounds the machine.
    assert capacity(real, config)["pods"] == "8"
    # Simulated nodes run no process: they keep the configured memory (and their 250 pods).
    assert capacity(simulated, config)["memory"] == "16Gi" and capacity(simulated, config)["pods"] == "250"
    roomy = config.model_copy(update={"machine_memory": 256 * 2**30})
    assert capacity(real, roomy)["memory"] == "16Gi" and capacity(real, roomy)["pods"] == "85"
    assert capacity(real, config.model_copy(update={"machine_memory": None}))["pods"] == "110"


def test_a_real_pod_is_refused_while_the_machine_runs_low_on_memory() -> None:
    total = 24 * 2**30
    refused = machine_refusal((512 * 2**20, total))
    assert refused is not None and refused.reason == "OutOfmemory" and "512Mi available" in refused.message
    assert "1228Mi kept free" in refused.message  # 5% of 24 GiB is more than 1 GiB
    assert machine_refusal((2 * 2**30, total)) is None
    assert machine_refusal(None) is None
    reading = available_memory()
    assert reading is None or 0 < reading[0] <= reading[1]
