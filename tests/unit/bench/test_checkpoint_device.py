"""The accelerator's checkpoint benchmark runs its steps on the host (its GPU figures need a GPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from phalanx.bench import checkpoint_device
from phalanx.worker.checkpoint import shm_store


def test_the_steps_run_on_the_host_and_every_restore_is_checked_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_SNAPSHOT_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    report = checkpoint_device.measure_all("cpu", quick=True, workdir=tmp_path, sizes=(8 << 20,))
    (row,) = report["sizes"]
    assert row["size_bytes"] == 8 << 20 and row["slots"] in (2, 3)
    for key in ("d2h_s", "h2d_s", "first_save_s", "persist_s", "restore_memory_s", "restore_disk_s"):
        assert row[key] > 0, key
    assert len(row["warm_saves_s"]) == checkpoint_device.WARM_SAVES
    assert row["stall_over_d2h"] > 0 and row["restore_over_h2d"] > 0
    table = checkpoint_device.markdown(report)
    assert "| 8 MiB |" in table and "host CPU" in table
    names = [metric.name for metric in checkpoint_device.to_metrics(report)]
    assert names == [
        "8 MiB: stall / D2H copy",
        "8 MiB: restore from memory / H2D copy",
        "8 MiB: first save / warm save",
    ]
    assert shm_store.SLOTS_ENV not in os.environ


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for those without"
)
def test_asking_for_cuda_without_a_gpu_says_so(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        checkpoint_device.measure_all("cuda", quick=True, workdir=tmp_path)
