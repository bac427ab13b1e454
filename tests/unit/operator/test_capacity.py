"""A gang is judged against the nodes it may use, before any of its pods exists."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from phalanx.operator.capacity import ClusterView, gang_fit, pod_requests

SIMULATED_TAINT = {"key": "phalanx.dev/simulated", "value": "true", "effect": "NoSchedule"}


def _node(pods: int = 110, cpu: str = "8", memory: str = "16Gi", **extra: Any) -> dict[str, Any]:
    return {
        "labels": {"kubernetes.io/hostname": "n"},
        "ready": "True",
        "unschedulable": False,
        "taints": [],
        "allocatable": {"pods": str(pods), "cpu": cpu, "memory": memory},
        **extra,
    }


def _pod(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {key: value for key, value in (("cpu", cpu), ("memory", memory)) if value}
    container = {"name": "trainer", "resources": {"requests": requests}} if requests else {"name": "trainer"}
    return {"containers": [container], **extra}


def _cluster(count: int, **node: Any) -> dict[str, dict[str, Any]]:
    return {f"node-{i}": _node(**node) for i in range(count)}


def test_a_gang_within_the_pod_slots_fits() -> None:
    fit = gang_fit(ClusterView(_cluster(4)), _pod(), 440)
    assert fit.fits and fit.room == 440


def test_a_gang_beyond_the_pod_slots_is_short_of_pods() -> None:
    fit = gang_fit(ClusterView(_cluster(4)), _pod(), 100000)
    assert not fit.fits and fit.room == 440
    assert "needs 100000 pods" in fit.message and "holds 440" in fit.message
    assert "4 usable nodes" in fit.message and "short of pods: room for 440" in fit.message


def test_the_requests_name_the_resource_that_is_short() -> None:
    fit = gang_fit(ClusterView(_cluster(4)), _pod(cpu="5", memory="1Gi"), 5)
    assert not fit.fits and fit.room == 4
    assert "cpu: room for 4 at 5 cpu each" in fit.message
    assert "memory" not in fit.message and "pods:" not in fit.message
    assert gang_fit(ClusterView(_cluster(4)), _pod(cpu="5"), 4).fits


def test_nodes_the_pods_may_not_use_hold_nothing() -> None:
    nodes = {
        "sim-0": _node(pods=250, taints=[SIMULATED_TAINT]),
        "cordoned": _node(unschedulable=True),
        "down": _node(ready="Unknown"),
        "gpu": _node(labels={"accelerator": "h100"}),
        "node-0": _node(),
    }
    fit = gang_fit(ClusterView(nodes), _pod(), 300)
    assert not fit.fits and fit.room == 220
    assert "2 usable nodes (1 cordoned, 1 not ready, 1 tainted)" in fit.message
    # Tolerating the taint and selecting by label are honoured.
    tolerating = _pod(tolerations=[{"key": "phalanx.dev/simulated", "operator": "Exists"}])
    assert gang_fit(ClusterView(nodes), tolerating, 470).fits
    selected = gang_fit(ClusterView(nodes), _pod(nodeSelector={"accelerator": "h100"}), 111)
    assert selected.room == 110 and "1 usable node (" in selected.message
    assert "2 not matching the nodeSelector" in selected.message  # the tainted one among them


def test_other_jobs_pods_bound_to_a_node_hold_their_share() -> None:
    bound = {"node-0": [{"pods": "1", "cpu": "6"}], "node-1": [{"pods": "1", "cpu": "2"}]}
    view = ClusterView(_cluster(2), bound)
    # node-0 has 2 CPUs left (no 5-CPU pod), node-1 has 6 (one).
    assert gang_fit(view, _pod(cpu="5"), 1).fits
    fit = gang_fit(view, _pod(cpu="5"), 2)
    assert not fit.fits and fit.room == 1
    # Without those pods both nodes would hold one: the job's own pods are never in `bound`.
    assert gang_fit(ClusterView(_cluster(2)), _pod(cpu="5"), 2).fits


def test_no_node_observed_is_no_judgement() -> None:
    assert gang_fit(ClusterView({}), _pod(), 100000).fits


def test_pod_requests_count_limits_and_init_containers_as_the_scheduler_does() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m"}}},
            {"resources": {"limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
    }
    assert pod_requests(spec) == {
        "cpu": Decimal(2),
        "memory": Decimal(1024**3),
        "nvidia.com/gpu": Decimal(1),
        "pods": Decimal(1),
    }


def test_jobs_that_arrive_together_are_admitted_one_by_one_in_rank_order() -> None:
    """Room for two gangs of 3 one-CPU pods (3 nodes of 2 CPUs): the third job waits, whichever reconcile
    runs first."""
    from phalanx.operator.capacity import Gang

    nodes = _cluster(3, cpu="2")
    shape = _pod(cpu="1")
    first, second = Gang("ml/a", shape, 3), Gang("ml/b", shape, 3)
    assert gang_fit(ClusterView(nodes), shape, 3).fits  # the first-ranked job: nothing ahead of it
    assert gang_fit(ClusterView(nodes, earlier=[first]), shape, 3).fits
    held = gang_fit(ClusterView(nodes, earlier=[first, second]), shape, 3)
    assert not held.fits
    assert "the gangs of ml/a, ml/b, ahead of this job" in held.message


def test_pods_created_but_not_bound_yet_are_room_already_promised() -> None:
    nodes = _cluster(3, cpu="2")
    shape = _pod(cpu="1")
    pending = [{"cpu": "1"}] * 6
    fit = gang_fit(ClusterView(nodes, pending=pending), shape, 3)
    assert not fit.fits and "6 pods of other jobs not yet bound" in fit.message
    assert gang_fit(ClusterView(nodes, pending=pending[:3]), shape, 3).fits


def test_an_earlier_job_that_cannot_fit_holds_no_room() -> None:
    from phalanx.operator.capacity import Gang

    nodes = _cluster(3, cpu="2")
    too_large = Gang("ml/huge", _pod(cpu="1"), 100)
    assert gang_fit(ClusterView(nodes, earlier=[too_large]), _pod(cpu="1"), 3).fits


def test_rank_puts_priority_before_age() -> None:
    from phalanx.operator.capacity import rank

    old_low = rank(0, "2026-01-01T00:00:00Z", "ml", "old")
    new_high = rank(100, "2026-01-02T00:00:00Z", "ml", "new")
    new_low = rank(0, "2026-01-02T00:00:00Z", "ml", "another")
    assert sorted([new_low, old_low, new_high]) == [new_high, old_low, new_low]
