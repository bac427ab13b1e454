"""The snapshot's host copy: byte-exact in chunks shared between the caller and helper threads, and a
state packed and read back unchanged."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from phalanx.worker.checkpoint import payload


def test_a_large_copy_in_chunks_is_byte_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks and threshold: many chunks, shared out, with sizes that do not divide evenly.
    monkeypatch.setattr(payload, "HOST_CHUNK_BYTES", 1000)
    monkeypatch.setattr(payload, "HOST_PARALLEL_FROM_BYTES", 4096)
    sources = [torch.randint(0, 256, (size,), dtype=torch.uint8) for size in (12_345, 1, 99_999)]
    target = torch.zeros(sum(s.numel() for s in sources) + 7, dtype=torch.uint8)
    ranges, offset = [], 3
    for source in sources:
        ranges.append((target.data_ptr() + offset, source.data_ptr(), source.numel()))
        offset += source.numel()
    payload.copy_host(ranges)
    assert torch.equal(target[3:offset], torch.cat(sources))
    assert int(target[:3].sum()) == 0 and int(target[offset:].sum()) == 0


def test_a_state_is_packed_and_read_back_unchanged() -> None:
    state = {
        "model": OrderedDict(weight=torch.randn(300, 300), bias=torch.randn(300), step=torch.tensor(7)),
        "view": torch.arange(40.0).reshape(4, 10)[:, ::3],  # not contiguous
        "cursor": {"position": 12, "epoch": [1, 2]},
        "flags": torch.tensor([True, False, True]),
    }
    packed = payload.plan(state)
    target = torch.empty(packed.total_bytes + 64, dtype=torch.uint8)
    payload.write_into(target, packed)
    loaded = payload.read_from(target)
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    assert torch.equal(loaded["view"], state["view"]) and loaded["cursor"] == state["cursor"]
    assert torch.equal(loaded["flags"], state["flags"])
    assert list(loaded["model"]) == ["weight", "bias", "step"]


def test_a_target_too_small_is_refused_before_anything_is_written() -> None:
    packed = payload.plan({"weight": torch.randn(1000)})
    target = torch.zeros(packed.total_bytes - 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="at least"):
        payload.write_into(target, packed)
    assert int(target.sum()) == 0
