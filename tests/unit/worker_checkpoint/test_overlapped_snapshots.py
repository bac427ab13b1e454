"""A snapshot's device copies overlap the next step: the parameters' and the optimizer's copies run on a side
stream that the optimizer's step waits for, a module's buffers are copied on the training's own stream, and the
snapshot commits once every copy is done. Proven on the host with a runtime whose side-stream copies wait
until something waits for them, as a GPU's would run late."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx.worker import Checkpointer, TrainState
from phalanx.worker.checkpoint import devicecopy, payload, slots


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = 0
        """How many of the queued copies have run."""


class FakeEvent:
    stream: FakeStream | None = None
    upto = 0


class FakeRuntime:
    """A device on the host. The training's own stream runs each copy at once, as the host's compute is
    immediate; a side stream's copies wait in its queue until the training's stream waits for them (`wait`) or
    the test lets them run (`run_side_copies`). The copies read their source when they run: a tensor changed
    before then is copied changed, as on a GPU."""

    def __init__(self) -> None:
        self.current = FakeStream("current")
        self.sides: list[FakeStream] = []
        self._ran = threading.Condition()

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    def new_stream(self, device: torch.device) -> FakeStream:
        self.sides.append(FakeStream("side"))
        return self.sides[-1]

    def new_event(self, device: torch.device) -> FakeEvent:
        return FakeEvent()

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        event.stream, event.upto = stream, len(stream.queue)

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        if stream is self.current and event.stream is not None:
            self._run(event.stream)

    def synchronize(self, event: FakeEvent) -> None:
        assert event.stream is not None
        with self._ran:
            ran = self._ran.wait_for(lambda: event.stream is not None and event.stream.done >= event.upto, 30)
        assert ran, "nothing let the side stream's copies run"

    def copy(self, target: torch.Tensor, source: torch.Tensor, stream: FakeStream) -> None:
        if stream is self.current:
            target.copy_(source)
        else:
            stream.queue.append((target, source))

    def run_side_copies(self) -> None:
        for stream in self.sides:
            self._run(stream)

    def in_flight(self) -> int:
        return sum(len(stream.queue) - stream.done for stream in self.sides)

    def _run(self, stream: FakeStream) -> None:
        with self._ran:
            for target, source in stream.queue[stream.done :]:
                target.copy_(source)
            stream.done = len(stream.queue)
            self._ran.notify_all()


class HostAsDevice(devicecopy.DeviceCopier):
    """Every tensor goes through the copier, as an accelerator's would."""

    def takes(self, tensor: torch.Tensor) -> bool:
        return True


def _state() -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    return TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05))


def _forward_backward(state: TrainState, seed: int) -> None:
    assert state.optimizer is not None
    torch.manual_seed(seed)
    state.optimizer.zero_grad()
    state.model(torch.randn(8, 16)).square().mean().backward()  # type: ignore[operator]


def _step(state: TrainState, seed: int) -> None:
    _forward_backward(state, seed)
    assert state.optimizer is not None
    state.optimizer.step()  # type: ignore[call-arg]


def _saved_tensors(state_dict: dict[str, Any]) -> dict[str, torch.Tensor]:
    found = {f"model.{name}": tensor.clone() for name, tensor in state_dict["model"].items()}
    for index, per_parameter in state_dict["optimizer"]["state"].items():
        found.update({f"optimizer.{index}.{key}": tensor.clone() for key, tensor in per_parameter.items()})
    return found


def _snapshot_of(ckpt: Checkpointer, step: int) -> dict[str, torch.Tensor]:
    info = ckpt.store.newest()
    assert info is not None and info.step == step
    return _saved_tensors(payload.read_from(ckpt.store.read(info))["state"])


def _differing(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> list[str]:
    assert expected.keys() == got.keys()
    return [name for name, tensor in expected.items() if not torch.equal(got[name], tensor)]


@pytest.fixture
def overlapped(workdir: Path) -> tuple[TrainState, Checkpointer, FakeRuntime]:
    state = _state()
    for seed in (1, 2):
        _step(state, seed)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    runtime = FakeRuntime()
    ckpt.store.copier = HostAsDevice(runtime)
    return state, ckpt, runtime


def test_the_next_forward_and_backward_overlap_the_copy_and_the_snapshot_is_the_saved_steps(
    overlapped: tuple[TrainState, Checkpointer, FakeRuntime],
) -> None:
    state, ckpt, runtime = overlapped
    ckpt.save(1)
    runtime.run_side_copies()
    ckpt.store.settle()
    ckpt.save(2)
    expected = _saved_tensors(state.state_dict())
    assert runtime.in_flight() > 0, "the save waited for its copies"
    committed = {path: slots.read_header(path) for path in ckpt.store.slot_paths}
    # Until its copies are done the new snapshot is not committed: a crash now restores step 1.
    assert sorted(h["step"] for h in committed.values() if slots.is_committed(h)) == [1]

    _forward_backward(state, seed=3)  # changes the BatchNorm's running statistics, not the parameters
    assert runtime.in_flight() > 0, "the forward and backward waited for the copies"
    assert state.optimizer is not None
    state.optimizer.step()  # type: ignore[call-arg]  # its pre-hook holds the step behind the copies
    assert runtime.in_flight() == 0

    assert _differing(expected, _snapshot_of(ckpt, 2)) == []
    assert _differing(expected, _saved_tensors(state.state_dict())), "the step changed nothing"
    ckpt.close()


def test_an_optimizer_step_not_held_behind_the_copies_would_tear_the_snapshot(
    overlapped: tuple[TrainState, Checkpointer, FakeRuntime],
) -> None:
    # The test above fails if the hold is lost: without the optimizer's pre-hook the step lands first.
    state, ckpt, runtime = overlapped
    assert ckpt._optimizer_hook is not None
    ckpt._optimizer_hook.remove()
    ckpt.save(2)
    expected = _saved_tensors(state.state_dict())
    _step(state, seed=3)
    runtime.run_side_copies()
    torn = _differing(expected, _snapshot_of(ckpt, 2))
    assert torn and all(not name.startswith("model.1.running") for name in torn), torn
    ckpt.close()


def test_without_an_optimizer_every_copy_stays_on_the_trainings_stream(workdir: Path) -> None:
    model = torch.nn.Linear(4, 4)
    ckpt = Checkpointer(TrainState(model=model), workdir / "ckpt", interval_steps=0)
    runtime = FakeRuntime()
    ckpt.store.copier = HostAsDevice(runtime)
    ckpt.save(1)
    assert runtime.in_flight() == 0
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    info = ckpt.store.newest()
    assert info is not None
    restored = payload.read_from(ckpt.store.read(info))["state"]["model"]
    assert all(torch.equal(restored[name], tensor) for name, tensor in expected.items())
    ckpt.close()


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: real streams and events"
)


@needs_cuda
def test_on_a_gpu_the_snapshot_is_the_saved_steps_bitwise(workdir: Path) -> None:
    state = _state()
    state.model.cuda()
    assert state.optimizer is not None
    state.optimizer = torch.optim.Adam(state.model.parameters(), lr=0.05)

    def step(seed: int) -> None:
        torch.manual_seed(seed)
        assert state.optimizer is not None
        state.optimizer.zero_grad()
        state.model(torch.randn(8, 16, device="cuda")).square().mean().backward()  # type: ignore[operator]
        state.optimizer.step()  # type: ignore[call-arg]

    step(1)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    for number in range(2, 6):
        step(number)
        ckpt.save(number)
        expected = {name: tensor.cpu() for name, tensor in _saved_tensors(state.state_dict()).items()}
        step(100 + number)  # the next step's compute and update race the copies
        assert _differing(expected, _snapshot_of(ckpt, number)) == []
    ckpt.close()


class WrappedOptimizer(torch.optim.Optimizer):
    """Like Accelerate's AcceleratedOptimizer (Hugging Face's Trainer): an Optimizer that never ran
    Optimizer.__init__ and passes `step` and its state to the optimizer it wraps."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    def state_dict(self) -> Any:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.optimizer.step(closure)


def test_a_wrapped_optimizer_holds_its_step_behind_the_copies_too(workdir: Path) -> None:
    state = _state()
    assert state.optimizer is not None
    state.optimizer = WrappedOptimizer(state.optimizer)  # type: ignore[arg-type]
    for seed in (1, 2):
        _step(state, seed)
    ckpt = Checkpointer(state, workdir / "ckpt", interval_steps=0)
    runtime = FakeRuntime()
    ckpt.store.copier = HostAsDevice(runtime)
    ckpt.save(2)
    expected = _saved_tensors(state.state_dict())
    assert runtime.in_flight() > 0
    _step(state, seed=3)
    assert runtime.in_flight() == 0
    assert _differing(expected, _snapshot_of(ckpt, 2)) == []
    ckpt.close()
