from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localjob import LocalJob, running_job


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalJob]:
    """A rendezvous store process, and launcher nodes the test starts; everything is killed afterwards. A test
    parametrized indirectly names the rendezvous protocol its nodes use; the others use c10d, or the protocol
    that PHALANX_TEST_RDZV_PROTOCOL names (to run them all under another)."""
    protocol = getattr(request, "param", os.environ.get("PHALANX_TEST_RDZV_PROTOCOL", "c10d"))
    with running_job(tmp_path, request.node.name, protocol=protocol) as local_job:
        yield local_job
