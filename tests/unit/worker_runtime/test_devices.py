"""The device of a collective comes from the backends the group has, never from the backend's name."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from phalanx.worker.devices import collective_device


@pytest.fixture
def gloo_group() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    dist.init_process_group("cpu:gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_gloo_group_and_torch_s_default_group_use_the_host(gloo_group: None) -> None:
    assert collective_device() == torch.device("cpu")
    assert dist.get_backend() == "cpu:gloo"  # a name no rule on "nccl" or "gloo" would have matched


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["cpu", "cuda"], torch.device("cpu")),  # "cpu:gloo,cuda:nccl", and torch's default group on a GPU
        (["cuda"], torch.device("cuda", 3)),  # NCCL alone: this process's current GPU
        ([], torch.device("cpu")),  # no backend made yet: torch makes gloo for host tensors
    ],
)
def test_the_group_s_device_types_decide(
    monkeypatch: pytest.MonkeyPatch, kinds: list[str], expected: torch.device
) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    group = SimpleNamespace(_device_types=[torch.device(kind) for kind in kinds])
    assert collective_device(group) == expected  # type: ignore[arg-type]
