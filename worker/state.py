"""What a training process must save to resume exactly: model, optimizer, schedules, data cursor, RNG.

:class:`TrainState` gathers the parts a training loop already has and turns them into one nested
state dict (and back). RNG states (Python, NumPy, torch CPU and CUDA when present) are kept apart
from the rest because they are per process, while the rest is identical on every data-parallel rank.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class Stateful(Protocol):
    """Anything that saves and restores itself like a torch module."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


def capture_rng() -> dict[str, Any]:
    """The RNG states of this process: Python, NumPy, torch CPU and every CUDA device in use."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].clone())
    if "cuda" in state and torch.cuda.is_available():
        devices = state["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([tensor.clone() for tensor in devices])


def _as_python_state(state: Any) -> tuple[Any, ...]:
    # random.setstate insists on tuples; a round trip through some containers yields lists.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


class TrainState:
    """The resumable state of a training process.

    ``data_cursor`` is any object with ``state_dict()``/``load_state_dict()`` (the data sampler); it is
    treated like the model: the same on every rank. ``extra`` holds any further such objects a run must
    resume with (EMA weights, a loss-scale tracker, a curriculum), saved and restored under their names.
    ``step`` is the last finished step.
    """

    PARTS = ("model", "optimizer", "lr_scheduler", "grad_scaler", "data_cursor")

    def __init__(
        self,
        model: Stateful,
        optimizer: Stateful | None = None,
        lr_scheduler: Stateful | None = None,
        grad_scaler: Stateful | None = None,
        data_cursor: Stateful | None = None,
        extra: Mapping[str, Stateful] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_scaler = grad_scaler
        self.data_cursor = data_cursor
        self.extra = dict(extra or {})
        taken = [name for name in self.extra if name in self.PARTS or name == "step"]
        if taken:
            raise ValueError(f"extra state names {', '.join(taken)} are taken by TrainState's own parts")
        self.step = 0

    def parts(self) -> dict[str, Stateful]:
        """Every part that is saved, by name: the given ones of PARTS, then the extra ones."""
        own = {name: part for name in self.PARTS if (part := getattr(self, name)) is not None}
        return {**own, **self.extra}

    def state_dict(self) -> dict[str, Any]:
        """Everything but the RNG: references to live tensors (copy before training goes on)."""
        return {"step": self.step, **{name: part.state_dict() for name, part in self.parts().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in self.parts() if name not in state]
        if missing:
            raise KeyError(f"saved state lacks {', '.join(missing)}")
        for name, part in self.parts().items():
            part.load_state_dict(state[name])
        self.step = int(state["step"])

    def placement(
        self, path: tuple[Any, ...], shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor | None:
        """Where a restored tensor of `state_dict()` at `path` that has no counterpart yet will live: an
        optimizer's per-parameter state (Adam's moments, SGD's momentum) before its first step, beside its
        parameter on the accelerator, so a restore copies it there at once and never through a host buffer.
        None for everything else (a host tensor) and for `step`, which torch keeps on the host."""
        if len(path) != 4 or path[1] != "state" or path[3] == "step" or not isinstance(path[2], int):
            return None
        optimizer = self.parts().get(path[0])
        if not isinstance(optimizer, torch.optim.Optimizer):
            return None
        parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        if not 0 <= path[2] < len(parameters):
            return None
        parameter = parameters[path[2]]
        if parameter.device.type == "cpu" or tuple(parameter.shape) != shape:
            return None
        return torch.empty(shape, dtype=dtype, device=parameter.device)

    capture_rng = staticmethod(capture_rng)
    restore_rng = staticmethod(restore_rng)
