"""The security suite's fixtures: a real rendezvous store process with launcher nodes (the worker runtime's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "worker_runtime"))

from localjob import LocalJob, running_job


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalJob]:
    """A rendezvous store process, and launcher nodes the test starts; everything is killed afterwards."""
    with running_job(tmp_path, request.node.name) as local_job:
        yield local_job
