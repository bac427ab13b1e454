"""The heartbeat-hub benchmark, small and fast: emulated launchers beat through the job's gated store, the hub in
its own process summarises them, and the report says how many API writes that is and when a silence showed."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.bench import heartbeat_hub


class Scratch:
    def __init__(self, root: Path) -> None:
        self.root = root

    def scratch(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def test_eight_launchers_cost_one_write_per_interval_and_a_silence_shows_within_an_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeat_hub, "INTERVAL", 0.5)
    monkeypatch.setattr(heartbeat_hub, "TIMEOUT", 1.5)
    monkeypatch.setattr(heartbeat_hub, "WARM_INTERVALS", 2)
    monkeypatch.setattr(heartbeat_hub, "MEASURED_INTERVALS", 10)
    monkeypatch.setattr(heartbeat_hub, "QUICK_SIZES", (8,))
    result = heartbeat_hub.run(Scratch(tmp_path), quick=True)
    assert result.error is None
    writes = result.metric("API writes/s for heartbeats, N=8")
    # One summary Lease per interval, against one Lease per worker per interval.
    assert 1.0 / 1.5 <= writes.samples[0] <= 1.5 / 0.5
    assert writes.baseline is not None and writes.baseline.value == 8 / 0.5
    seen = result.metric("silence seen past the timeout, N=8").samples[0]
    assert -0.1 <= seen <= 0.5 + 2.0, seen  # within an interval and a loaded machine's slack
    summaries = result.details["8"]["hub"]["summaries"]  # type: ignore[index]
    assert max(record["members"] for record in summaries) == 8
