"""Shared pieces of the checkpoint tests: a tiny deterministic training state and process launching."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

WORKER = Path(__file__).with_name("worker_main.py")


class Cursor:
    """A data cursor like the sampler's: a position that must survive restarts."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def build_state(width: int = 16) -> Any:
    from phalanx.worker import TrainState

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return TrainState(model=model, optimizer=optimizer, lr_scheduler=scheduler, data_cursor=Cursor())


def advance_to(state: Any, step: int) -> None:
    """Put ``state`` in the exact state it has after ``step`` (a pure function of the step)."""
    with torch.no_grad():
        for index, parameter in enumerate(state.model.parameters()):
            values = torch.arange(parameter.numel(), dtype=parameter.dtype).reshape(parameter.shape)
            parameter.copy_(values * 0.001 + step + index)
    for parameter in state.model.parameters():
        parameter.grad = torch.full_like(parameter, float(step))
    state.optimizer.state.clear()
    state.optimizer.step()
    state.data_cursor.position = step * 8
    state.step = step


def fingerprint(state: Any) -> dict[str, Any]:
    """Plain lists of everything saved, to compare across processes."""
    model = {name: tensor.tolist() for name, tensor in state.model.state_dict().items()}
    momentum = [
        state.optimizer.state[parameter]["momentum_buffer"].tolist()
        for parameter in state.model.parameters()
        if parameter in state.optimizer.state
    ]
    return {
        "model": model,
        "momentum": momentum,
        "cursor": state.data_cursor.position,
        "scheduler": state.lr_scheduler.state_dict()["last_epoch"],
    }


def expected_fingerprint(step: int) -> dict[str, Any]:
    state = build_state()
    advance_to(state, step)
    return fingerprint(state)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    scenario: str,
    world_size: int,
    workdir: Path,
    env_per_rank: list[dict[str, str]] | None = None,
    extra: dict[str, Any] | None = None,
    timeout: float = 120.0,
) -> list[dict[str, Any]]:
    """Run ``world_size`` real processes of ``worker_main.py`` in one gloo group; their JSON results."""
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # DCP's background saving process (sharded saves) joins its gloo group through the group's own store
            # under a prefix. Its default is a port that rank 0 finds free and that the background process binds
            # seconds later, once its interpreter has started: on this host, shared with the other test process
            # and its connections, that port was once taken in between (EADDRINUSE), and rank 1 waited forever.
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "DCP_USE_PREFIX_STORE": "1",
        }
        env.update((env_per_rank or [{}] * world_size)[rank])
        out = workdir / f"result-{scenario}-{rank}.json"
        out.unlink(missing_ok=True)
        args = [
            sys.executable,
            str(WORKER),
            scenario,
            str(rank),
            str(world_size),
            str(port),
            str(workdir),
            json.dumps(extra or {}),
        ]
        processes.append(
            (
                subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                out,
            )
        )
    results = []
    failures = []
    for rank, (process, out) in enumerate(processes):
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                other.kill()
            raise
        if process.returncode != 0:
            failures.append(f"rank {rank} exited {process.returncode}:\n{output[-4000:]}")
        else:
            results.append(json.loads(out.read_text()))
    assert not failures, "\n".join(failures)
    return results
