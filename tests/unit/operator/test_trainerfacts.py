"""A trainer's facts, read once per reconcile, say what the `status` accessors say of the same pod."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phalanx.operator import status as observe
from phalanx.operator import trainerfacts

MakePod = Callable[..., dict[str, Any]]

POD_SHAPES: list[dict[str, Any]] = [
    {},
    {"role": "spare"},
    {"terminating": True},
    {"phase": "Pending", "node": None},
    {"phase": "Succeeded", "exit_code": 0},
    {"phase": "Failed", "exit_code": 1, "role": "spare"},
]
LEASES: list[dict[str, Any] | None] = [
    None,
    {"phase": "training", "step": "4"},
    {"phase": "standby"},
    {"phase": "rendezvous"},
    {"phase": "finished"},
    {"step": "3"},
]


@pytest.mark.parametrize("shape", POD_SHAPES)
@pytest.mark.parametrize("lease", LEASES)
def test_the_facts_agree_with_the_accessors(make_pod: MakePod, shape: dict[str, Any], lease: Any) -> None:
    pod = make_pod("demo-worker-3", **shape)
    facts = trainerfacts.read(pod, lease)
    assert facts.pod is pod and facts.lease is lease
    assert facts.key == (observe.pod_name(pod), pod["metadata"]["uid"])
    assert facts.index == observe.index(pod) == 3
    assert facts.node == (pod.get("spec") or {}).get("nodeName")
    assert facts.phase == observe.phase(pod)
    assert facts.terminating == observe.is_terminating(pod)
    assert facts.lease_phase == (lease or {}).get("phase")
    assert facts.role == observe.observed_role(pod, lease)
    assert facts.standing_by == observe.standing_by(pod, lease)
    assert facts.running == observe.is_running(pod)
    assert facts.exists_unfinished == observe.is_live(pod)
