"""Serialising a nested state (dicts, lists, tensors, plain objects) into one flat byte buffer.

Layout: ``magic | skeleton length | pickled skeleton | padding | tensor bytes``. The skeleton is the
state with every tensor replaced by a :class:`TensorRef` (dtype, shape, offset), so the bulk of the
state is copied with plain memory copies into a preallocated buffer (a slot in /dev/shm, pinned when a
GPU is present) and read back as views of one buffer, without pickling tensor data.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import pickle
import struct
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

PAYLOAD_MAGIC = b"PHXSTAT1"
_PREFIX = struct.Struct("<8sQ")
ALIGN = 64


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes lie in the data region of a payload."""

    index: int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Mapping:
    """A dict-like node; keeps OrderedDict and its ``_metadata`` (module versions in state dicts)."""

    ordered: bool
    items: list[tuple[Any, Any]]
    metadata: Any = None


@dataclass
class PackPlan:
    """A state split into its pickled skeleton and the tensors to copy, with the payload size."""

    skeleton: bytes
    tensors: list[torch.Tensor]
    refs: list[TensorRef]
    data_start: int
    total_bytes: int


_CONTAINERS = (torch.Tensor, dict, list, tuple)


def _align(value: int) -> int:
    return (value + ALIGN - 1) // ALIGN * ALIGN


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in snapshot")
    return dtype


def plan(state: Any) -> PackPlan:
    """Split ``state`` into skeleton and tensors; nothing is copied yet."""
    tensors: list[torch.Tensor] = []
    refs: list[TensorRef] = []
    cursor = 0

    def walk(node: Any) -> Any:
        nonlocal cursor
        if isinstance(node, torch.Tensor) and node.layout == torch.strided and not node.is_quantized:
            tensor = node.detach()
            nbytes = tensor.numel() * tensor.element_size()
            ref = TensorRef(len(tensors), str(tensor.dtype), tuple(tensor.shape), cursor, nbytes)
            tensors.append(tensor)
            refs.append(ref)
            cursor = _align(cursor + nbytes)
            return ref
        if isinstance(node, dict):
            return _Mapping(
                isinstance(node, OrderedDict),
                [(key, walk(value)) for key, value in node.items()],
                getattr(node, "_metadata", None),
            )
        if isinstance(node, list | tuple) and not any(isinstance(item, _CONTAINERS) for item in node):
            return node  # e.g. the 625 integers of Python's RNG state: nothing to replace
        if isinstance(node, list):
            return [walk(item) for item in node]
        if type(node) is tuple:
            return tuple(walk(item) for item in node)
        return node

    tree = walk(state)
    skeleton = pickle.dumps(tree, protocol=5)
    data_start = _align(_PREFIX.size + len(skeleton))
    return PackPlan(skeleton, tensors, refs, data_start, data_start + cursor)


def write_into(target: torch.Tensor, packed: PackPlan, non_blocking: bool = False) -> None:
    """Copy the planned state into ``target`` (a uint8 CPU tensor of at least ``total_bytes``): host tensors
    with `copy_host`, device tensors with torch's device-to-host copy (`non_blocking` into pinned memory)."""
    if target.device.type != "cpu" or not target.is_contiguous() or target.nbytes < packed.total_bytes:
        raise ValueError(
            f"the target must be a contiguous host buffer of at least {packed.total_bytes} bytes"
        )
    header = _PREFIX.pack(PAYLOAD_MAGIC, len(packed.skeleton)) + packed.skeleton
    base = target.data_ptr()
    ranges: list[tuple[int, int, int]] = [(base, _address_of(header), len(header))]
    sources: list[torch.Tensor] = []  # alive until the copy is done
    for tensor, ref in zip(packed.tensors, packed.refs, strict=True):
        if ref.nbytes == 0:
            continue
        start = packed.data_start + ref.offset
        source = tensor.reshape(-1).contiguous().view(torch.uint8)
        if source.device.type != "cpu":
            target[start : start + ref.nbytes].copy_(source, non_blocking=non_blocking)
            continue
        sources.append(source)
        ranges.append((base + start, source.data_ptr(), ref.nbytes))
    copy_host(ranges)


def _address_of(data: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


HOST_CHUNK_BYTES = 8 << 20
"""Host copies are cut into chunks of this size and shared out between the calling thread and the helpers."""
HOST_PARALLEL_FROM_BYTES = 32 << 20
"""Smaller copies run on the calling thread alone: waking a helper would cost more than it saves."""
HOST_HELPERS = max(1, min(3, (os.cpu_count() or 2) - 1))
"""Helper threads of a large host copy: memory bandwidth, not cores, bounds a copy beyond a few threads."""
_helpers: tuple[int, ThreadPoolExecutor] | None = None


def _helper_pool() -> ThreadPoolExecutor:
    """The helper threads of this process (a forked child makes its own)."""
    global _helpers
    if _helpers is None or _helpers[0] != os.getpid():
        _helpers = (os.getpid(), ThreadPoolExecutor(HOST_HELPERS, thread_name_prefix="phalanx-copy"))
    return _helpers[1]


def copy_host(ranges: list[tuple[int, int, int]]) -> None:
    """Copy `(destination address, source address, bytes)` ranges between host buffers with the C library's
    memmove, which releases the GIL.

    Not torch's `copy_`: its intra-op parallel copy waits for its slowest OpenMP thread, and a worker parked
    while the training loop slept can take a whole scheduler slice to wake (seen: a 1 MB snapshot taking 10 ms
    instead of 0.3). Here a large copy is cut into chunks that the calling thread and a few helper threads take
    in turn, the calling thread as well: a helper that is slow to wake delays the copy by one chunk at most.
    The caller keeps the buffers alive until it returns."""
    chunks = [
        (destination + offset, source + offset, min(HOST_CHUNK_BYTES, size - offset))
        for destination, source, size in ranges
        for offset in range(0, size, HOST_CHUNK_BYTES)
    ]
    total = sum(size for _, _, size in chunks)
    if total < HOST_PARALLEL_FROM_BYTES:
        for destination, source, size in chunks:
            ctypes.memmove(destination, source, size)
        return
    taken = itertools.count()

    def work() -> None:
        while (index := next(taken)) < len(chunks):
            ctypes.memmove(*chunks[index])

    pool = _helper_pool()
    helpers = [pool.submit(work) for _ in range(HOST_HELPERS)]
    work()
    for helper in helpers:
        helper.result()


def read_from(buffer: torch.Tensor) -> Any:
    """Rebuild the state from a payload; tensors are views of ``buffer`` (keep it private)."""
    magic, skeleton_len = _PREFIX.unpack(bytes(buffer[: _PREFIX.size].numpy()))
    if magic != PAYLOAD_MAGIC:
        raise ValueError("not a Phalanx state payload")
    skeleton = bytes(buffer[_PREFIX.size : _PREFIX.size + skeleton_len].numpy())
    data_start = _align(_PREFIX.size + skeleton_len)
    tree = pickle.loads(skeleton)

    def build(node: Any) -> Any:
        if isinstance(node, TensorRef):
            dtype = _dtype_from_name(node.dtype)
            start = data_start + node.offset
            if node.nbytes == 0:
                return torch.empty(node.shape, dtype=dtype)
            return buffer[start : start + node.nbytes].view(dtype).view(node.shape)
        if isinstance(node, _Mapping):
            built = (OrderedDict if node.ordered else dict)((key, build(value)) for key, value in node.items)
            if node.metadata is not None:
                built._metadata = node.metadata  # type: ignore[attr-defined]
            return built
        if isinstance(node, list):
            return [build(item) for item in node]
        if type(node) is tuple:
            return tuple(build(item) for item in node)
        return node

    return build(tree)
