"""In-memory snapshots of one pod-local process, kept in shared memory so they outlive the process.

The store of a training process lives at ``<root>/phalanx-snap-<namespace>/local-<LOCAL_RANK>/`` with
a few slot files (see :mod:`slots`). When torchrun restarts the training processes of a pod they get
new PIDs and possibly new ranks, but the same namespace and LOCAL_RANK, so they find the newest
snapshot of that pod without touching disk. Writes go to a slot that is neither the newest one nor
pinned by the saver process, so a crash mid-write leaves the previous snapshot intact.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from phalanx.worker.checkpoint import devicecopy, payload, slots

log = logging.getLogger(__name__)

SLOT_COUNT = 3
"""Two slots for double buffering plus one the saver process may hold while it persists."""
SLOTS_ENV = "PHALANX_SNAPSHOT_SLOTS"
"""The number of slots, 2 or 3 (the TrainingJob's `spec.sharedMemory.snapshotSlots`): with 2, a snapshot is
skipped while the saver process still holds the slot it persists."""
SLOT_COUNT_RANGE = (2, 3)
_GROW_QUANTUM = 1 << 20
STATE_DROPPED = "dropped"
"""Header state of a snapshot a rollback abandoned (not committed: never restored)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_DIGEST_CHARS = 12
_DIGEST = re.compile(r"[0-9a-f]{12}")


class NoFreeSlot(RuntimeError):
    """Every slot is the newest snapshot or held by the saver process (2 slots while a save is written)."""


class SnapshotSpaceError(OSError):
    """The in-memory snapshot does not fit where snapshots live (a full or too small /dev/shm)."""


def slot_count_from_env() -> int:
    """The slots a store keeps: `PHALANX_SNAPSHOT_SLOTS` (2 or 3), else `SLOT_COUNT`."""
    configured = os.environ.get(SLOTS_ENV, "").strip()
    if not configured:
        return SLOT_COUNT
    low, high = SLOT_COUNT_RANGE
    if not configured.isdigit() or not low <= int(configured) <= high:
        raise ValueError(f"{SLOTS_ENV} must be {low} or {high}, not {configured!r}")
    return int(configured)


def reserve(fd: int, path: Path, start: int, size: int, slot_count: int = SLOT_COUNT) -> None:
    """Claim the memory of a slot's new bytes now: on a full tmpfs a write into the mapping would kill the
    process with SIGBUS, while this fails with ENOSPC, which is turned into a message saying what to change."""
    if size <= start:
        return
    try:
        os.posix_fallocate(fd, start, size - start)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EFBIG):
            raise
        usage = shutil.disk_usage(path.parent)
        raise SnapshotSpaceError(
            error.errno,
            f"the in-memory snapshot does not fit in {path.parent}: a slot needs {size / 2**20:.0f} MiB and "
            f"{usage.free / 2**20:.0f} MiB of {usage.total / 2**20:.0f} MiB are free ({slot_count} slots of "
            "the state's size are kept). Give the pod more shared memory: the TrainingJob's "
            "spec.sharedMemory.sizeLimit (or the pod's memory limit, which the memory-backed volume counts "
            "toward), or keep 2 slots instead of 3 (spec.sharedMemory.snapshotSlots); a container runtime's "
            "default /dev/shm is only 64 MiB",
        ) from error


def snapshot_root() -> Path:
    """Where stores live: ``PHALANX_SNAPSHOT_DIR``, else /dev/shm, else the temporary directory."""
    configured = os.environ.get("PHALANX_SNAPSHOT_DIR")
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def job_prefix() -> str:
    """What every namespace of this job's snapshots starts with (the job id from the environment)."""
    job = os.environ.get("PHALANX_JOB_UID") or os.environ.get("TORCHELASTIC_RUN_ID") or ""
    if job in ("", "none"):
        job = "local"
    return _UNSAFE.sub("_", f"{job}-")


def job_namespace(directory: str | os.PathLike[str] | None) -> str:
    """The key of this job's snapshots: the job id from the environment plus a hash of the directory.

    ``PHALANX_JOB_UID`` (set by the operator) or ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``)
    names the job; the checkpoint directory tells apart two checkpointers of one job.
    """
    where = os.path.abspath(os.fspath(directory)) if directory is not None else ""
    digest = hashlib.sha256(where.encode()).hexdigest()[:_DIGEST_CHARS]
    return job_prefix() + digest


def held_snapshots(root: Path | None = None) -> Iterator[SlotInfo]:
    """Every committed snapshot of this job that this pod holds (any checkpointer, any local rank), read
    from the slot headers alone."""
    prefix = f"phalanx-snap-{job_prefix()}"
    with contextlib.suppress(OSError):
        for folder in (root or snapshot_root()).glob(f"{prefix}*"):
            if not _DIGEST.fullmatch(folder.name[len(prefix) :]):
                continue  # another job whose id starts with this one's
            for slot in folder.glob("local-*/slot-*"):
                header = slots.read_header(slot)
                if slots.is_committed(header) and isinstance(header.get("step"), int):
                    yield SlotInfo(slot, header)


def newest_held_step(root: Path | None = None) -> int:
    """The newest step of which this pod holds a committed snapshot of this job; -1 when it holds none. The
    launcher offers it when a group forms (worker/rendezvous.py): the pod holding the newest state must get a
    place in the group."""
    return max((info.step for info in held_snapshots(root)), default=-1)


def store_dir(namespace: str, local_rank: int, root: Path | None = None) -> Path:
    return (root or snapshot_root()) / f"phalanx-snap-{namespace}" / f"local-{local_rank}"


def cleanup_snapshots(namespace: str | None = None, directory: str | os.PathLike[str] | None = None) -> int:
    """Remove every in-memory snapshot of a job (call when the job ends). Returns folders removed."""
    ns = namespace or job_namespace(directory)
    target = snapshot_root() / f"phalanx-snap-{ns}"
    if not target.exists():
        return 0
    shutil.rmtree(target, ignore_errors=True)
    return 1


@dataclass(frozen=True)
class SlotInfo:
    """A committed snapshot: its slot file and header (``step``, ``seq``, ``rank``, ``world_size``...)."""

    path: Path
    header: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.header["step"])

    @property
    def seq(self) -> int:
        return int(self.header["seq"])


class _Mapping:
    """A writable mapping of one slot file, optionally registered as pinned memory for GPU copies."""

    def __init__(self, path: Path, size: int, pin: bool) -> None:
        self.size = size
        self.tensor = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        self.pinned = False
        if pin:
            self.pinned = _register_pinned(self.tensor)

    def release(self) -> None:
        if self.pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
        self.pinned = False
        del self.tensor


def _register_pinned(tensor: torch.Tensor) -> bool:
    """Page-lock a shared mapping so device-to-host copies run at full speed (False if refused)."""
    try:
        result = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel(), 0)
    except Exception as error:
        log.info("pinning the snapshot buffer failed (%s); copying unpinned", error)
        return False
    code = getattr(result, "value", result)
    return code in (0, None) or str(code).endswith("Success")


class SnapshotStore:
    """The snapshot slots of one process of a pod, at ``path``."""

    def __init__(self, path: Path, slot_count: int | None = None) -> None:
        self.path = path
        self.slot_count = slot_count_from_env() if slot_count is None else slot_count
        self.slot_paths = [path / f"slot-{index}" for index in range(self.slot_count)]
        self._fds: dict[Path, int] = {}
        self._maps: dict[Path, _Mapping] = {}
        # Slots are prepared on a helper thread (`prepare`) while training runs: a lock per slot orders the
        # helper and the training thread's use of its file and mapping, so a save never waits for another slot.
        # Reentrant: the SIGTERM save runs in a signal handler on the training thread, which may have been
        # interrupted while it held one; a plain lock would wait for itself forever. So every state a holder
        # leaves between two statements is one a reentrant caller can use (`_mapping`), and the interrupted
        # holder never resumes (the handler ends the process).
        self._lock = threading.RLock()
        self._slot_locks = {slot: threading.RLock() for slot in self.slot_paths}
        self._preparing: threading.Thread | None = None
        self.copier = devicecopy.DeviceCopier()
        """Issues device-to-host copies so that training overlaps them (worker/checkpoint/devicecopy.py)."""
        # A snapshot with device copies in flight is committed by this thread once they are done; every reader
        # of the store's headers waits for it first (`settle`).
        self._committer: ThreadPoolExecutor | None = None
        self._commit: Future[None] | None = None
        # This process is the only writer of its store: after one read, headers are tracked in memory
        # so a save does not reread every slot file.
        self._known: dict[Path, dict[str, Any] | None] | None = None

    def headers(self) -> dict[Path, dict[str, Any] | None]:
        self.settle()
        return {slot: slots.read_header(slot) for slot in self.slot_paths}

    def settle(self) -> None:
        """Wait until the snapshot whose copies were in flight is committed (raises what its commit raised)."""
        commit, self._commit = self._commit, None
        if commit is not None:
            commit.result()

    def newest(self, accept: Callable[[SlotInfo], bool] | None = None) -> SlotInfo | None:
        """The newest committed snapshot (of those `accept` takes, when given)."""
        committed = [
            SlotInfo(slot, header) for slot, header in self.headers().items() if slots.is_committed(header)
        ]
        committed = [info for info in committed if accept is None or accept(info)]
        if not committed:
            return None
        return max(committed, key=lambda info: (info.step, info.seq))

    def drop(self, condemned: Callable[[SlotInfo], bool]) -> list[int]:
        """Uncommit the snapshots `condemned` picks (a rollback abandoned their run): they are never read
        again and their slots are the first reused. Returns their steps."""
        dropped: list[int] = []
        known = self._tracked_headers()
        for slot, header in self.headers().items():
            if not slots.is_committed(header) or not condemned(SlotInfo(slot, header)):
                continue
            assert header is not None
            invalid = {"state": STATE_DROPPED, "seq": int(header.get("seq", 0))}
            slots.write_header_fd(self._fd(slot), invalid)
            known[slot] = invalid
            dropped.append(int(header["step"]))
        return sorted(dropped)

    def _fd(self, slot: Path) -> int:
        with self._lock:
            if slot not in self._fds:
                self.path.mkdir(parents=True, exist_ok=True)
                self._fds[slot] = os.open(slot, os.O_RDWR | os.O_CREAT, 0o600)
            return self._fds[slot]

    def _mapping(self, slot: Path, needed: int, pin: bool) -> _Mapping:
        # The file first, under the store's lock alone: nothing waits for the store's lock while it holds a
        # slot's. Else the helper, holding a slot's lock, could wait for the store's lock that the training
        # thread held when SIGTERM interrupted it, and the handler's save would wait for that slot forever.
        fd = self._fd(slot)
        with self._slot_locks[slot]:
            current = self._maps.get(slot)
            if current is not None and current.size >= needed and (current.pinned or not pin):
                return current
            if current is not None:
                # Forgotten before it is released: a reentrant caller never finds a released mapping.
                del self._maps[slot]
                current.release()
            current_size = os.fstat(fd).st_size
            size = max(current_size, -(-needed // _GROW_QUANTUM) * _GROW_QUANTUM)
            reserve(fd, slot, current_size, size, self.slot_count)
            os.ftruncate(fd, size)
            self._maps[slot] = _Mapping(slot, size, pin)
            return self._maps[slot]

    def prepared_bytes(self) -> int:
        """The largest payload every slot of this store can take without growing (0 before `prepare`)."""
        mappings = [self._maps.get(slot) for slot in self.slot_paths]
        sizes = [mapping.size if mapping is not None else 0 for mapping in mappings]
        return max(0, min(sizes) - slots.HEADER_BYTES)

    def prepare(self, payload_bytes: int, pin: bool) -> None:
        """Allocate, map and (with `pin`) page-lock every slot for payloads of `payload_bytes` on a helper
        thread: the first save into a slot would otherwise pay for it, a stall of many warm saves on a large
        state. A slot that does not fit fails at its first save, as before."""
        # The helper thread must page-lock in the training thread's device's context, not device 0's.
        device = torch.cuda.current_device() if pin else None

        def work() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            for slot in self.slot_paths:
                try:
                    self._mapping(slot, slots.HEADER_BYTES + payload_bytes, pin)
                except (OSError, RuntimeError) as error:
                    # The save that needs the slot says it (SnapshotSpaceError included). RuntimeError: torch's
                    # mapping of a slot file that vanished meanwhile (the store's folder removed under it).
                    log.info("preparing snapshot slot %s failed: %s", slot, error)
                    return

        if self._preparing is not None and self._preparing.is_alive():
            # Never waited for on a save's path: the helper may wait for a slot lock that a save interrupted
            # by SIGTERM holds on this very thread. A save grows its own slot; the next one asks again.
            return
        self._preparing = threading.Thread(target=work, name="phalanx-slot-prepare", daemon=True)
        self._preparing.start()

    def wait_prepared(self) -> None:
        """Wait for a `prepare` running on the helper thread."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def _tracked_headers(self) -> dict[Path, dict[str, Any] | None]:
        self.settle()
        if self._known is None:
            self._known = self.headers()
        return self._known

    def choose_slot(self, pinned: set[Path]) -> Path:
        """A slot that is neither the newest snapshot nor pinned; the oldest such one."""
        headers = self._tracked_headers()
        committed = [SlotInfo(slot, header) for slot, header in headers.items() if slots.is_committed(header)]
        newest = max(committed, key=lambda info: (info.step, info.seq)) if committed else None
        candidates = [
            slot for slot in self.slot_paths if slot not in pinned and (newest is None or slot != newest.path)
        ]
        if not candidates:
            raise NoFreeSlot("no free snapshot slot: the newest snapshot and the saver process hold them all")

        def age(slot: Path) -> tuple[int, int]:
            header = headers[slot]
            if not slots.is_committed(header):
                return (-1, -1)
            return (int(header["step"]), int(header["seq"]))

        return min(candidates, key=age)

    def _claim(self, pinned: set[Path] | None) -> tuple[Path, int]:
        """A free slot (see `choose_slot`), marked as being written under a new sequence number."""
        slot = self.choose_slot(pinned or set())
        known = self._tracked_headers()
        seq = 1 + max((int(header.get("seq", 0)) for header in known.values() if header), default=0)
        writing = {"state": slots.STATE_WRITING, "seq": seq}
        slots.write_header_fd(self._fd(slot), writing)
        known[slot] = writing
        return slot, seq

    def write(
        self,
        packed: payload.PackPlan,
        meta: dict[str, Any],
        pinned: set[Path] | None = None,
        deferrable: Callable[[torch.Tensor], bool] | None = None,
    ) -> SlotInfo:
        """Copy a planned state into a free slot and commit it with ``meta`` (must hold ``step``). Host tensors
        are copied before this returns; device tensors are copied by `copier`, those `deferrable` takes on a
        side stream the next optimizer step waits for, and the snapshot is committed once they are done."""
        slot, seq = self._claim(pinned)
        fd = self._fd(slot)
        known = self._tracked_headers()
        pin = any(tensor.device.type != "cpu" for tensor in packed.tensors)
        mapping = self._mapping(slot, slots.HEADER_BYTES + packed.total_bytes, pin=pin)
        target = mapping.tensor[slots.HEADER_BYTES : slots.HEADER_BYTES + packed.total_bytes]
        device_copies: list[devicecopy.CopyPair] = []
        payload.write_into(target, packed, device_copies=device_copies, on_device=self.copier.takes)
        header = {
            **meta,
            "state": slots.STATE_COMMITTED,
            "seq": seq,
            "payload_bytes": packed.total_bytes,
        }
        if not device_copies:
            slots.write_header_fd(fd, header)
            known[slot] = header
            return SlotInfo(slot, header)
        in_flight = self.copier.start(device_copies, deferrable or (lambda _: False))

        def commit() -> None:
            self.copier.wait_done(in_flight)
            slots.write_header_fd(fd, header)
            known[slot] = header

        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="phalanx-snapshot-commit")
        self._commit = self._committer.submit(commit)
        return SlotInfo(slot, header)

    def read(self, info: SlotInfo) -> torch.Tensor:
        """A private copy of the snapshot's payload; raises SnapshotChanged if it was overwritten."""
        buffer = torch.empty(int(info.header["payload_bytes"]), dtype=torch.uint8)
        slots.read_payload_into(info.path, info.seq, buffer.numpy().data)
        return buffer

    def view(self, info: SlotInfo, pin: bool) -> torch.Tensor:
        """The snapshot's payload where it lies, in this store's (with `pin`, page-locked) mapping of its slot:
        read it without a copy, then call `check_unchanged`. Only this process writes its store, so nothing
        rewrites the slot meanwhile unless this process does."""
        if info.path not in self.slot_paths:
            raise ValueError(f"{info.path} is not a slot of {self.path}")
        size = int(info.header["payload_bytes"])
        mapping = self._mapping(info.path, slots.HEADER_BYTES + size, pin)
        self.check_unchanged(info)
        return mapping.tensor[slots.HEADER_BYTES : slots.HEADER_BYTES + size]

    def check_unchanged(self, info: SlotInfo) -> None:
        """SnapshotChanged unless the slot still holds the committed snapshot `info` names."""
        self.settle()
        if slots.read_header_fd(self._fd(info.path)) != info.header:
            raise slots.SnapshotChanged(f"slot {info.path} no longer holds the snapshot of step {info.step}")

    def scratch(self, payload_bytes: int, pin: bool, pinned: set[Path] | None = None) -> torch.Tensor:
        """Room for a payload of `payload_bytes` in a free slot (neither the newest snapshot nor `pinned`),
        marked as being written so that nothing takes it for a snapshot: where a state received from a peer or
        read from disk lands before it is loaded, instead of a buffer of its own."""
        slot, _ = self._claim(pinned)
        mapping = self._mapping(slot, slots.HEADER_BYTES + payload_bytes, pin)
        return mapping.tensor[slots.HEADER_BYTES : slots.HEADER_BYTES + payload_bytes]

    def close(self) -> None:
        self.wait_prepared()
        self.settle()
        if self._committer is not None:
            self._committer.shutdown()
            self._committer = None
        for mapping in self._maps.values():
            mapping.release()
        self._maps.clear()
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
