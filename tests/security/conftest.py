"""The security suite's fixtures: a real rendezvous store process with launcher nodes (the worker runtime's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "worker_runtime"))

from localjob import LocalJob


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalJob]:
    """A rendezvous store process, and launcher nodes the test starts; everything is killed afterwards."""
    local_job = LocalJob(tmp_path, run_id=f"job-{request.node.name}"[:60])
    local_job.start_store()
    try:
        yield local_job
    finally:
        local_job.close()
