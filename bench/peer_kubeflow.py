"""`peer-kubeflow`: see `phalanx.bench.peer_operators` (the shared trials, manifests and metrics)."""

from __future__ import annotations

from typing import Any

from phalanx.bench import peer_operators
from phalanx.bench.core import BenchResult

NAME = peer_operators.KUBEFLOW.name
TITLE = peer_operators.KUBEFLOW.title


def run(context: Any, quick: bool) -> BenchResult:
    return peer_operators.run_peer(peer_operators.KUBEFLOW, context, quick)
