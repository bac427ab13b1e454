"""Serialising a nested state (dicts, lists, tensors, plain objects) into one flat byte buffer.

Layout: ``magic | skeleton length | pickled skeleton | padding | tensor bytes``. The skeleton is the
state with every tensor replaced by a :class:`TensorRef` (dtype, shape, offset), so the bulk of the
state is copied with plain memory copies into a preallocated buffer (a slot in /dev/shm, pinned when a
GPU is present) and read back as views of one buffer, without pickling tensor data. NumPy arrays of the
dtypes torch shares travel the same way.

The skeleton is read back through an allow-list (`phalanx.worker.safepickle.CHECKPOINT`): a payload comes
from a slot, a peer or a file that someone else may have written. A state holding anything beyond plain values
is checked against that list when it is packed, so a state that could not be restored is refused at its save.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import pickle
import struct
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from phalanx.worker import safepickle

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
    numpy: bool = False
    """Read back as a NumPy array (it was one)."""


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


_CONTAINERS = (torch.Tensor, np.ndarray, dict, list, tuple)
_PLAIN = (int, float, bool, str, bytes, type(None))
"""Leaf types a pickle writes without naming any global (exact types: a subclass names its class)."""


_NUMPY_INTEGERS = (np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64)
_NUMPY_DTYPES = {
    np.dtype(kind) for kind in (*_NUMPY_INTEGERS, np.float16, np.float32, np.float64, np.complex64)
}
"""NumPy dtypes that torch shares, so an array of one travels as tensor bytes."""


def _plain_tree(node: Any) -> bool:
    """Whether `node` is plain values in dicts, lists and tuples (a module's `_metadata`, for one)."""
    if isinstance(node, dict) and type(node) in (dict, OrderedDict):
        return all(type(key) in _PLAIN and _plain_tree(value) for key, value in node.items())
    if type(node) in (list, tuple):
        return all(_plain_tree(item) for item in node)
    return type(node) in _PLAIN


def _align(value: int) -> int:
    return (value + ALIGN - 1) // ALIGN * ALIGN


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in snapshot")
    return dtype


def plan(state: Any) -> PackPlan:
    """Split ``state`` into skeleton and tensors; nothing is copied yet."""
    tensors: list[torch.Tensor] = []
    refs: list[TensorRef] = []
    cursor = 0

    foreign = False  # a leaf that pickle writes by naming a global: checked against the allow-list

    def reference(tensor: torch.Tensor, numpy: bool) -> TensorRef:
        nonlocal cursor
        nbytes = tensor.numel() * tensor.element_size()
        ref = TensorRef(len(tensors), str(tensor.dtype), tuple(tensor.shape), cursor, nbytes, numpy)
        tensors.append(tensor)
        refs.append(ref)
        cursor = _align(cursor + nbytes)
        return ref

    def walk(node: Any) -> Any:
        nonlocal foreign
        if isinstance(node, torch.Tensor) and node.layout == torch.strided and not node.is_quantized:
            return reference(node.detach(), numpy=False)
        if type(node) is np.ndarray and node.dtype in _NUMPY_DTYPES:
            return reference(torch.from_numpy(np.ascontiguousarray(node)), numpy=True)
        if isinstance(node, dict):
            metadata = getattr(node, "_metadata", None)
            if not _plain_tree(metadata) or not all(type(key) in _PLAIN for key in node):
                foreign = True
            return _Mapping(
                isinstance(node, OrderedDict), [(key, walk(value)) for key, value in node.items()], metadata
            )
        if type(node) in (list, tuple) and all(type(item) in _PLAIN for item in node):
            return node  # e.g. the 625 integers of Python's RNG state: nothing to replace
        if type(node) is list:
            return [walk(item) for item in node]
        if type(node) is tuple:
            return tuple(walk(item) for item in node)
        if type(node) not in _PLAIN:
            foreign = True
        return node

    tree = walk(state)
    skeleton = pickle.dumps(tree, protocol=5)
    if foreign:
        safepickle.load_checkpoint_bytes(skeleton)
    data_start = _align(_PREFIX.size + len(skeleton))
    return PackPlan(skeleton, tensors, refs, data_start, data_start + cursor)


def write_into(
    target: torch.Tensor,
    packed: PackPlan,
    device_copies: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    on_device: Callable[[torch.Tensor], bool] | None = None,
) -> None:
    """Copy the planned state into ``target`` (a uint8 CPU tensor of at least ``total_bytes``): host tensors
    with `copy_host`, device tensors (those `on_device` takes; default: all not on the host) with torch's
    blocking device-to-host copy, or, given a ``device_copies`` list, left to the caller as (target, source)
    pairs appended there (a snapshot's copier overlaps them with training)."""
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
        if on_device(source) if on_device is not None else source.device.type != "cpu":
            if device_copies is not None:
                device_copies.append((target[start : start + ref.nbytes], source))
            else:
                target[start : start + ref.nbytes].copy_(source)
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


DIGEST_CHUNK_BYTES = 64 << 20
"""A payload's digest hashes chunks of this size on several threads (hashlib releases the GIL)."""
DIGEST_BYTES = 32


def digest(buffer: torch.Tensor) -> bytes:
    """The sha256 over the sha256 of each `DIGEST_CHUNK_BYTES` chunk of a payload and its length: what a donor
    sends with its snapshot and a receiver checks, hashed in parallel so that a large state costs a fraction
    of one thread's hashing time."""
    view = buffer.numpy().data
    size = len(view)
    starts = range(0, size, DIGEST_CHUNK_BYTES)

    def chunk(start: int) -> bytes:
        return hashlib.sha256(view[start : start + DIGEST_CHUNK_BYTES]).digest()

    if size < HOST_PARALLEL_FROM_BYTES:
        parts = [chunk(start) for start in starts]
    else:
        parts = list(_helper_pool().map(chunk, starts))
    return hashlib.sha256(struct.pack("<Q", size) + b"".join(parts)).digest()


def _skeleton(buffer: torch.Tensor) -> tuple[int, Any]:
    """Where a payload's tensor bytes start, and its skeleton (read through the allow-list)."""
    magic, skeleton_len = _PREFIX.unpack(bytes(buffer[: _PREFIX.size].numpy()))
    if magic != PAYLOAD_MAGIC:
        raise ValueError("not a Phalanx state payload")
    skeleton = bytes(buffer[_PREFIX.size : _PREFIX.size + skeleton_len].numpy())
    return _align(_PREFIX.size + skeleton_len), safepickle.load_checkpoint_bytes(skeleton)


def read_from(buffer: torch.Tensor) -> Any:
    """Rebuild the state from a payload; tensors are views of ``buffer`` (keep it private)."""
    data_start, tree = _skeleton(buffer)

    def build(node: Any) -> Any:
        if isinstance(node, TensorRef):
            dtype = dtype_from_name(node.dtype)
            start = data_start + node.offset
            if node.nbytes == 0:
                tensor = torch.empty(node.shape, dtype=dtype)
            else:
                tensor = buffer[start : start + node.nbytes].view(dtype).view(node.shape)
            return tensor.numpy().copy() if node.numpy else tensor
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


StatePath = tuple[Any, ...]
"""Where a node lies in a state: the keys and indexes from the root."""
Placer = Callable[[StatePath, TensorRef], "torch.Tensor | None"]


def read_live(buffer: torch.Tensor, live: Any, place: Placer | None = None) -> Any:
    """Rebuild the state of a payload, copying each tensor straight from ``buffer`` into where it will live.

    A tensor whose counterpart in ``live`` (a state of the same shape, e.g. the training state as it is now)
    is a contiguous tensor of the same dtype and shape is copied into that very tensor: loading the result
    with ``load_state_dict`` then copies nothing again (torch skips a copy onto itself). Any other tensor goes
    where ``place(path, ref)`` puts it (a new tensor on the device it will live on), else into a private host
    copy. Host destinations are filled with `copy_host`; device ones with non-blocking copies, which run at
    the link's speed when ``buffer`` is pinned memory: call `finish_device_copies` before ``buffer`` is
    reused. No tensor of the result is a view of ``buffer``."""
    data_start, tree = _skeleton(buffer)
    base = buffer.data_ptr()
    host_ranges: list[tuple[int, int, int]] = []

    def destination(path: StatePath, ref: TensorRef) -> torch.Tensor:
        dtype = dtype_from_name(ref.dtype)
        current = _lookup(live, path)
        if (
            isinstance(current, torch.Tensor)
            and current.dtype == dtype
            and tuple(current.shape) == ref.shape
            and current.is_contiguous()
            and not ref.numpy
        ):
            return current
        placed = place(path, ref) if place is not None and not ref.numpy else None
        if placed is not None and placed.dtype == dtype and tuple(placed.shape) == ref.shape:
            return placed
        return torch.empty(ref.shape, dtype=dtype)

    def build(node: Any, path: StatePath) -> Any:
        if isinstance(node, TensorRef):
            target = destination(path, node)
            if node.nbytes:
                start = data_start + node.offset
                if target.device.type == "cpu":
                    host_ranges.append((target.data_ptr(), base + start, node.nbytes))
                else:
                    source = buffer[start : start + node.nbytes].view(target.dtype).view(node.shape)
                    target.copy_(source, non_blocking=True)
            return target.numpy() if node.numpy else target
        if isinstance(node, _Mapping):
            built = (OrderedDict if node.ordered else dict)(
                (key, build(value, (*path, key))) for key, value in node.items
            )
            if node.metadata is not None:
                built._metadata = node.metadata  # type: ignore[attr-defined]
            return built
        if isinstance(node, list):
            return [build(item, (*path, index)) for index, item in enumerate(node)]
        if type(node) is tuple:
            return tuple(build(item, (*path, index)) for index, item in enumerate(node))
        return node

    with torch.no_grad():
        result = build(tree, ())
    copy_host(host_ranges)
    return result


def accelerators_of(tree: Any) -> set[torch.device]:
    """The devices other than the host that tensors of a nested state live on."""
    if isinstance(tree, torch.Tensor):
        return set() if tree.device.type == "cpu" else {tree.device}
    if isinstance(tree, dict):
        return set().union(*(accelerators_of(value) for value in tree.values()))
    if isinstance(tree, list | tuple):
        return set().union(*(accelerators_of(item) for item in tree))
    return set()


def finish_device_copies(state: Any) -> None:
    """Wait until the non-blocking copies `read_live` issued onto the devices of ``state`` are done."""
    for device in accelerators_of(state):
        accelerator = getattr(torch, device.type, None)
        stream = getattr(accelerator, "current_stream", None)
        if callable(stream):
            stream(device).synchronize()


def _lookup(tree: Any, path: StatePath) -> Any:
    node = tree
    for key in path:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list | tuple) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return None
        if node is None:
            return None
    return node


def to_bytes(state: Any) -> bytes:
    """`state` as one payload in a byte string (for a file or a message; tensors are copied to the host)."""
    packed = plan(state)
    buffer = torch.empty(packed.total_bytes, dtype=torch.uint8)
    write_into(buffer, packed)
    return buffer.numpy().tobytes()


def from_bytes(data: bytes) -> Any:
    """The state of a payload made by `to_bytes` (read through the allow-list as every payload is)."""
    return read_from(torch.frombuffer(bytearray(data), dtype=torch.uint8))
