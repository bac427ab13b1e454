from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh job: its own checkpoint directory and its own snapshot namespace, cleaned afterwards."""
    from phalanx.worker import cleanup_snapshots

    monkeypatch.delenv("PHALANX_JOB_UID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("PHALANX_SNAPSHOT_DIR", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    yield tmp_path
    cleanup_snapshots(directory=tmp_path / "ckpt")
