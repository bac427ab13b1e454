"""On-"disk" layout of one in-memory snapshot slot (a file in /dev/shm), torch-free.

A slot file is a 4 KiB header followed by the payload. The header is JSON behind a magic, a length and
a CRC32, so a header torn by a crash reads as invalid. Writers follow a sequence lock: the header is
first rewritten as ``writing`` with a new sequence number, then the payload is copied, then the header
is rewritten as ``committed``. A reader copies the payload and accepts it only if the header is still
the same committed one afterwards, so it can never take a payload that a writer touched meanwhile.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

HEADER_BYTES = 4096
SLOT_MAGIC = b"PHXSLOT1"
_PREFIX = struct.Struct("<8sII")
STATE_WRITING = "writing"
STATE_COMMITTED = "committed"
COPY_CHUNK_BYTES = 8 << 20


class SnapshotChanged(RuntimeError):
    """The slot was rewritten (or was never complete) while it was being read."""


def encode_header(meta: dict[str, Any]) -> bytes:
    body = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    encoded = _PREFIX.pack(SLOT_MAGIC, len(body), zlib.crc32(body)) + body
    if len(encoded) > HEADER_BYTES:
        raise ValueError(f"snapshot header of {len(encoded)} bytes exceeds {HEADER_BYTES}")
    return encoded


def decode_header(raw: bytes) -> dict[str, Any] | None:
    """The header's metadata, or None when the bytes are not a whole, valid header."""
    if len(raw) < _PREFIX.size:
        return None
    magic, length, crc = _PREFIX.unpack_from(raw)
    if magic != SLOT_MAGIC or _PREFIX.size + length > len(raw):
        return None
    body = raw[_PREFIX.size : _PREFIX.size + length]
    if zlib.crc32(body) != crc:
        return None
    try:
        meta = json.loads(body)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def read_header_fd(fd: int) -> dict[str, Any] | None:
    return decode_header(os.pread(fd, HEADER_BYTES, 0))


def write_header_fd(fd: int, meta: dict[str, Any]) -> None:
    encoded = encode_header(meta)
    os.pwrite(fd, encoded, 0)


def read_header(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return read_header_fd(fd)
    finally:
        os.close(fd)


def is_committed(meta: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return (
        meta is not None
        and meta.get("state") == STATE_COMMITTED
        and isinstance(meta.get("payload_bytes"), int)
    )


def read_payload_into(path: Path, expected_seq: int, target: memoryview) -> None:
    """Copy the committed payload of slot ``path`` into ``target``; SnapshotChanged if it was rewritten."""
    fd = os.open(path, os.O_RDONLY)
    try:
        before = read_header_fd(fd)
        if not is_committed(before) or before["seq"] != expected_seq:
            raise SnapshotChanged(f"slot {path} holds no committed snapshot with seq {expected_seq}")
        size = before["payload_bytes"]
        if len(target) < size:
            raise ValueError(f"target of {len(target)} bytes cannot hold a payload of {size}")
        position = 0
        while position < size:
            count = os.preadv(
                fd, [target[position : min(size, position + (1 << 30))]], HEADER_BYTES + position
            )
            if count <= 0:
                raise SnapshotChanged(f"slot {path} ended early")
            position += count
        if read_header_fd(fd) != before:
            raise SnapshotChanged(f"slot {path} was rewritten while being read")
    finally:
        os.close(fd)


def payload_chunks(path: Path, expected_seq: int | None = None) -> Iterator[memoryview]:
    """Yield the committed payload of slot ``path`` in chunks, then check it was not rewritten meanwhile.

    Raises :class:`SnapshotChanged` (after the last chunk, or at once) if the header is not the same
    committed header at the end. The chunks reuse one buffer: consume each before asking for the next.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        before = read_header_fd(fd)
        if not is_committed(before) or (expected_seq is not None and before["seq"] != expected_seq):
            raise SnapshotChanged(f"slot {path} holds no committed snapshot with seq {expected_seq}")
        remaining = before["payload_bytes"]
        offset = HEADER_BYTES
        buffer = bytearray(min(COPY_CHUNK_BYTES, max(remaining, 1)))
        view = memoryview(buffer)
        while remaining > 0:
            count = os.preadv(fd, [view[: min(len(view), remaining)]], offset)
            if count <= 0:
                raise SnapshotChanged(f"slot {path} ended early")
            yield view[:count]
            offset += count
            remaining -= count
        if read_header_fd(fd) != before:
            raise SnapshotChanged(f"slot {path} was rewritten while being read")
    finally:
        os.close(fd)
