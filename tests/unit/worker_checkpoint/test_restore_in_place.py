"""Restores copy each tensor once, straight into the training state's own tensors, and the snapshot slots are
ready before the first save needs them, prepared off the training thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import advance_to, build_state, fingerprint

from phalanx.worker import Checkpointer, TrainState
from phalanx.worker.checkpoint import payload, shm_store


def _packed(state: Any) -> torch.Tensor:
    packed = payload.plan(state)
    buffer = torch.zeros(packed.total_bytes, dtype=torch.uint8)
    payload.write_into(buffer, packed)
    return buffer


def test_read_live_copies_into_the_live_tensors_and_nothing_aliases_the_buffer() -> None:
    saved = {
        "weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "grown": torch.ones(5),
        "new": torch.full((2,), 7, dtype=torch.int64),
        "table": np.arange(4, dtype=np.int32),
        "plain": [1, "two"],
    }
    buffer = _packed(saved)
    live = {"weight": torch.zeros(3, 4), "grown": torch.zeros(4), "table": np.zeros(4, dtype=np.int32)}
    weight = live["weight"]

    restored = payload.read_live(buffer, live)

    assert restored["weight"] is weight and torch.equal(weight, saved["weight"])
    assert torch.equal(restored["grown"], saved["grown"]) and restored["grown"] is not live["grown"]
    assert torch.equal(restored["new"], saved["new"])
    assert isinstance(restored["table"], np.ndarray) and restored["table"].tolist() == [0, 1, 2, 3]
    assert restored["plain"] == [1, "two"]
    buffer.zero_()  # the slot is reused by a later save: nothing restored may change with it
    assert torch.equal(weight, saved["weight"]) and torch.equal(restored["new"], saved["new"])
    assert restored["table"].tolist() == [0, 1, 2, 3]


def test_read_live_puts_a_tensor_without_counterpart_where_the_placer_says() -> None:
    saved = {"optimizer": {"state": {0: {"exp_avg": torch.ones(2, 3), "step": torch.tensor(4.0)}}}}
    asked: list[tuple[Any, ...]] = []

    def place(path: payload.StatePath, ref: payload.TensorRef) -> torch.Tensor | None:
        asked.append(path)
        return torch.empty(ref.shape, dtype=payload.dtype_from_name(ref.dtype), device="meta")

    restored = payload.read_live(_packed(saved), {"optimizer": {"state": {}}}, place)

    assert asked == [("optimizer", "state", 0, "exp_avg"), ("optimizer", "state", 0, "step")]
    assert restored["optimizer"]["state"][0]["exp_avg"].device.type == "meta"


def test_an_optimizers_missing_state_is_placed_beside_its_parameter() -> None:
    model = torch.nn.Linear(4, 3, device="meta")
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters()))
    placed = state.placement(("optimizer", "state", 0, "exp_avg"), (3, 4), torch.float32)
    assert placed is not None and placed.device.type == "meta" and tuple(placed.shape) == (3, 4)
    assert state.placement(("optimizer", "state", 1, "exp_avg_sq"), (3,), torch.float32) is not None
    # torch keeps `step` on the host; a shape not the parameter's, an unknown index or part: not placed.
    assert state.placement(("optimizer", "state", 0, "step"), (), torch.float32) is None
    assert state.placement(("optimizer", "state", 0, "exp_avg"), (4, 3), torch.float32) is None
    assert state.placement(("optimizer", "state", 2, "exp_avg"), (3,), torch.float32) is None
    assert state.placement(("model", "state", 0, "exp_avg"), (3, 4), torch.float32) is None
    host = torch.nn.Linear(4, 3)
    on_host = TrainState(model=host, optimizer=torch.optim.Adam(host.parameters()))
    assert on_host.placement(("optimizer", "state", 0, "exp_avg"), (3, 4), torch.float32) is None


def _adam_state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    return TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))


def _train(state: TrainState, steps: int) -> None:
    assert state.optimizer is not None
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = state.model(torch.randn(8, 32)).square().mean()  # type: ignore[operator]
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()  # type: ignore[call-arg]


def _tensors(state: TrainState) -> dict[str, torch.Tensor]:
    assert state.optimizer is not None
    found = {f"model.{name}": tensor for name, tensor in state.model.state_dict().items()}
    for index, per_parameter in state.optimizer.state_dict()["state"].items():
        found.update({f"optimizer.{index}.{key}": tensor for key, tensor in per_parameter.items()})
    return found


@pytest.mark.parametrize("optimizer_started", [True, False], ids=["warm", "fresh-optimizer"])
def test_a_restore_from_memory_fills_the_states_own_tensors_once(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, optimizer_started: bool
) -> None:
    saved = _adam_state(seed=1)
    _train(saved, 3)
    writer = Checkpointer(saved, workdir / "ckpt", interval_steps=0)
    writer.save(3)
    writer.close()

    restored = _adam_state(seed=2)
    if optimizer_started:
        _train(restored, 1)
    before = {name: tensor.data_ptr() for name, tensor in _tensors(restored).items()}

    def no_private_copy(*_: Any) -> torch.Tensor:
        raise AssertionError("the snapshot was copied into a buffer of its own")

    monkeypatch.setattr(shm_store.SnapshotStore, "read", no_private_copy)
    reader = Checkpointer(restored, workdir / "ckpt", interval_steps=0)
    assert reader.load() == 3 and reader.last_restore is not None
    assert reader.last_restore.source == "memory"

    expected, got = _tensors(saved), _tensors(restored)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    # Loaded in place: the model's and the (started) optimizer's tensors are the ones they had before.
    assert {name: got[name].data_ptr() for name in before} == before
    _train(saved, 2)
    _train(restored, 2)
    assert all(torch.equal(_tensors(restored)[name], tensor) for name, tensor in _tensors(saved).items())
    reader.close()


def test_slots_are_ready_before_the_first_save_and_prepared_off_the_training_thread(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = build_state(width=64)
    advance_to(state, 1)  # a restored state: its optimizer's state exists already
    mapped_on: list[str] = []
    mapping = shm_store._Mapping.__init__

    def recording(self: Any, path: Path, size: int, pin: bool) -> None:
        mapped_on.append(threading.current_thread().name)
        mapping(self, path, size, pin)

    monkeypatch.setattr(shm_store._Mapping, "__init__", recording)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    assert ckpt.load() == 0
    ckpt.store.wait_prepared()
    assert mapped_on == ["phalanx-slot-prepare"] * shm_store.SLOT_COUNT
    for step in range(1, shm_store.SLOT_COUNT + 2):
        advance_to(state, step)
        ckpt.save(step)
    assert mapped_on == ["phalanx-slot-prepare"] * shm_store.SLOT_COUNT, "a save mapped a slot itself"

    # A state that grows past the slots: the save that meets it grows its own slot, a helper the others.
    state.extra["table"] = torch.nn.Linear(1024, 1024)  # 4 MiB more than the slots hold
    ckpt.save(10)
    ckpt.store.wait_prepared()
    assert mapped_on[shm_store.SLOT_COUNT :].count("MainThread") == 1
    assert mapped_on[shm_store.SLOT_COUNT :].count("phalanx-slot-prepare") == shm_store.SLOT_COUNT - 1
    assert ckpt.store.prepared_bytes() >= ckpt.stats["last_snapshot_bytes"]
    ckpt.close()


def test_with_two_slots_a_snapshot_waits_out_the_save_in_flight(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shm_store.SLOTS_ENV, "2")
    state = build_state()
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    assert len(ckpt.store.slot_paths) == 2
    for step in (1, 2):
        advance_to(state, step)
        ckpt.save(step)
    older = ckpt.store.newest(lambda info: info.step == 1)
    assert older is not None
    ckpt._pinned = {older.path}  # what the saver holds while it writes step 1
    advance_to(state, 3)
    ckpt.save(3)
    assert ckpt.stats["snapshots_skipped_total"] == 1 and ckpt.stats["last_snapshot_step"] == 2
    newest = ckpt.store.newest()
    assert newest is not None and newest.step == 2
    ckpt._pinned = set()  # the saver is done
    ckpt.save(3)
    assert ckpt.stats["last_snapshot_step"] == 3
    ckpt.close()

    reader_state = build_state()
    reader = Checkpointer(reader_state, workdir / "ckpt", interval_steps=0)
    assert reader.load() == 3 and fingerprint(reader_state) == fingerprint(state)
    reader.close()


def test_only_two_or_three_slots_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shm_store.SLOTS_ENV, raising=False)
    assert shm_store.slot_count_from_env() == 3
    for value in ("1", "4", "two", "-2"):
        monkeypatch.setenv(shm_store.SLOTS_ENV, value)
        with pytest.raises(ValueError, match="PHALANX_SNAPSHOT_SLOTS must be 2 or 3"):
            shm_store.slot_count_from_env()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: pinned slots, device tensors")
@pytest.mark.parametrize("optimizer_started", [True, False], ids=["warm", "fresh-optimizer"])
def test_on_a_gpu_a_restore_lands_in_the_device_tensors(workdir: Path, optimizer_started: bool) -> None:
    def on_gpu(seed: int) -> TrainState:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)).cuda()
        return TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))

    def train(state: TrainState, steps: int) -> None:
        assert state.optimizer is not None
        for step in range(steps):
            torch.manual_seed(100 + step)
            state.optimizer.zero_grad()
            state.model(torch.randn(8, 32, device="cuda")).square().mean().backward()  # type: ignore[operator]
            state.optimizer.step()  # type: ignore[call-arg]

    saved = on_gpu(1)
    train(saved, 3)
    writer = Checkpointer(saved, workdir / "ckpt", interval_steps=0)
    writer.save(3)
    writer.close()
    restored = on_gpu(2)
    if optimizer_started:
        train(restored, 1)
    before = {name: tensor.data_ptr() for name, tensor in _tensors(restored).items()}
    reader = Checkpointer(restored, workdir / "ckpt", interval_steps=0)
    assert reader.load() == 3
    got = _tensors(restored)
    assert all(torch.equal(got[name], tensor) for name, tensor in _tensors(saved).items())
    assert {name: got[name].data_ptr() for name in before} == before
    moments = [tensor for name, tensor in got.items() if name.endswith(("exp_avg", "exp_avg_sq"))]
    assert moments and all(tensor.is_cuda for tensor in moments)
    reader.close()
