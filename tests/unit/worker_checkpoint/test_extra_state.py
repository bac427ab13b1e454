"""Extra parts of a TrainState (EMA weights, a tracker): saved and restored under their names, from memory
and from disk, and in the sharded layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import Cursor, advance_to, build_state

from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots
from phalanx.worker.checkpoint import sharded


class Average:
    """An exponential moving average of a few values: state a run must resume with besides the model."""

    def __init__(self) -> None:
        self.values = torch.zeros(3)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"values": self.values}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.values = state["values"].clone()


def with_average(average: Average) -> TrainState:
    base = build_state()
    return TrainState(
        model=base.model,
        optimizer=base.optimizer,
        lr_scheduler=base.lr_scheduler,
        data_cursor=base.data_cursor,
        extra={"average": average},
    )


@pytest.mark.parametrize("from_disk", [False, True], ids=["memory", "disk"])
def test_extra_parts_are_restored(workdir: Path, from_disk: bool) -> None:
    average = Average()
    state = with_average(average)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=2)
    for step in (1, 2):
        advance_to(state, step)
        average.values = torch.full((3,), float(step))
        ckpt.save(step)
    ckpt.wait()
    ckpt.close()
    if from_disk:
        cleanup_snapshots(directory=workdir / "ckpt")

    restored = Average()
    fresh = with_average(restored)
    loader = Checkpointer(fresh, workdir / "ckpt", interval_steps=2)
    assert loader.load() == 2
    assert loader.last_restore is not None
    assert loader.last_restore.source == ("disk" if from_disk else "memory")
    loader.close()
    assert torch.equal(restored.values, torch.full((3,), 2.0))


def test_extra_parts_may_not_take_the_own_parts_names() -> None:
    with pytest.raises(ValueError, match="data_cursor, step"):
        TrainState(model=torch.nn.Linear(2, 2), extra={"data_cursor": Cursor(), "step": Cursor()})


def test_a_saved_state_without_an_extra_part_is_refused() -> None:
    saved = TrainState(model=torch.nn.Linear(2, 2)).state_dict()
    with pytest.raises(KeyError, match="average"):
        TrainState(model=torch.nn.Linear(2, 2), extra={"average": Average()}).load_state_dict(saved)


def test_the_sharded_layout_carries_extra_parts() -> None:
    average = Average()
    state = with_average(average)
    average.values = torch.tensor([1.0, 2.0, 3.0])
    saved = sharded.dcp_state(state)
    assert torch.equal(saved["average"]["values"], average.values)
    assert {"model", "optimizer", "lr_scheduler", "data_cursor", "step"} <= set(saved)

    restored = Average()
    sharded.apply_dcp_state(with_average(restored), saved)
    assert torch.equal(restored.values, average.values)
