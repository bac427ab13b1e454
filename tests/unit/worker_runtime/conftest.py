from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localjob import LocalJob, running_job


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalJob]:
    """A rendezvous store process, and launcher nodes the test starts; everything is killed afterwards."""
    with running_job(tmp_path, request.node.name) as local_job:
        yield local_job
