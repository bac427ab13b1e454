"""Sharded (DCP) checkpoints: saved by 4 ranks, resumed by 3 and by 5 with identical full tensors.

The model's parameters are DTensors sharded by rows over a CPU mesh (gloo); FSDP itself needs a GPU
backend for its collectives, DTensor state is what it saves, so DCP sees the same kind of state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_ranks


def pods(workdir: Path, world: int, tag: str) -> list[dict[str, str]]:
    return [
        {"PHALANX_SNAPSHOT_DIR": str(workdir / f"{tag}-{rank}"), "LOCAL_RANK": "0"} for rank in range(world)
    ]


@pytest.fixture(scope="module")
def saved_at_four(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("sharded")
    results = run_ranks("sharded", 4, workdir, pods(workdir, 4, "save"), extra={"phase": "save", "steps": 3})
    assert all(result["full"] == results[0]["full"] for result in results)
    assert (workdir / "ckpt" / "step-3" / "manifest.json").exists()
    return workdir, results[0]["full"]


@pytest.mark.parametrize("world", [3, 5])
def test_sharded_checkpoint_reshards_to_another_world_size(
    saved_at_four: tuple[Path, dict], world: int
) -> None:
    workdir, expected = saved_at_four
    results = run_ranks(
        "sharded", world, workdir, pods(workdir, world, f"load{world}"), extra={"phase": "load"}
    )
    for result in results:
        assert (result["step"], result["source"]) == (3, "disk")
        assert result["full"] == expected


def test_a_sharded_checkpoint_restores_from_the_durable_tier_at_another_world_size(tmp_path: Path) -> None:
    save = {"phase": "save", "steps": 3, "tier": "durable", "fast": "claim-a"}
    saved = run_ranks("sharded", 2, tmp_path, pods(tmp_path, 2, "save"), extra=save)
    assert (tmp_path / "durable" / "step-3" / "manifest.json").exists()
    # The shared fast tier is gone (a new claim): the copy on the durable tier is fetched into it.
    load = {**save, "phase": "load", "fast": "claim-b"}
    results = run_ranks("sharded", 3, tmp_path, pods(tmp_path, 3, "load"), extra=load)
    for result in results:
        assert (result["step"], result["source"]) == (3, "disk")
        assert result["full"] == saved[0]["full"]
    assert (tmp_path / "claim-b" / "step-3" / "manifest.json").exists()
