"""Durable checkpoints on a (shared) filesystem: atomic commit, verification, keep-K purge.

Torch-free on purpose: the saver process imports this module, and must start fast and stay small.
Commit protocol: files are written into a temporary folder and fsynced, the folder is renamed to
``step-<N>``, then ``manifest.json`` (per-file size and sha256) is written atomically. A folder without
a manifest is never loaded, and a folder whose files disagree with its manifest is skipped; the restore
names each folder it passed over, and why (worker/checkpoint/skipped.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from phalanx.worker.checkpoint import layout, ownership, skipped
from phalanx.worker.checkpoint.skipped import Problem

log = logging.getLogger(__name__)

FILE_MODE = 0o640
"""Checkpoint files: the job's user reads and writes them, its group (the pod's fsGroup) reads, nobody else."""
DIR_MODE = 0o750
"""Checkpoint folders, likewise."""
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""A file is always created, never opened: a name planted ahead of the writer (a symlink to elsewhere, say)
fails the write instead of redirecting it."""

HASH_CHUNK_BYTES = 8 << 20
STALE_TMP_SECONDS = 3600.0
"""A temporary folder older than this belongs to a writer that died; it is removed by the purge."""


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory fsync makes renames and new names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_file(path: Path) -> BinaryIO:
    """A new file at `path` (which must not exist, not even as a symlink), open for writing, mode `FILE_MODE`."""
    return os.fdopen(os.open(path, _NEW_FILE_FLAGS, FILE_MODE), "wb")


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name, fsynced, so readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with create_file(tmp) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_file_from_chunks(path: Path, chunks: Iterable[bytes | memoryview]) -> tuple[int, str]:
    """Write ``chunks`` to a new file, fsync it, and return its size and sha256."""
    digest = hashlib.sha256()
    size = 0
    with create_file(path) as handle:
        for chunk in chunks:
            digest.update(chunk)
            handle.write(chunk)
            size += len(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    return size, digest.hexdigest()


def hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(HASH_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(view):
            digest.update(view[:count])
            size += count
    return size, digest.hexdigest()


def new_tmp_dir(directory: Path, step: int) -> Path:
    """Create the temporary folder a writer fills before :func:`commit`."""
    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    unique = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = directory / layout.tmp_dir_name(step, unique)
    tmp.mkdir(mode=DIR_MODE)
    return tmp


def commit(
    tmp: Path,
    step: int,
    kind: str,
    hashes: Mapping[str, tuple[int, str]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Make the filled temporary folder ``tmp`` the complete checkpoint ``step-<step>``.

    ``hashes`` gives size and sha256 of files the writer hashed while writing (and fsynced); any other
    file in the folder is hashed and fsynced here. If a complete checkpoint of that step already exists
    it wins and ``tmp`` is discarded.

    The manifest is written into ``tmp`` before the rename, so a step folder appears with its manifest or
    not at all: two writers of one step (a trainer's emergency save on SIGTERM beside its persister's save of
    the same step) each took the other's folder, renamed in and not yet given its manifest, for a dead
    writer's and removed it under the other's manifest write.
    """
    known = dict(hashes or {})
    files: dict[str, tuple[int, str]] = {}
    for entry in sorted(tmp.iterdir()):
        if entry.is_symlink() or not entry.is_file():
            raise ValueError(f"checkpoint folder {tmp} holds a non-file entry {entry.name}")
        # Files other writers made (torch's shards, copies) get the checkpoint's mode as well.
        os.chmod(entry, FILE_MODE)
        if entry.name in known:
            files[entry.name] = known[entry.name]
        else:
            fsync_path(entry)
            files[entry.name] = hash_file(entry)
    manifest = layout.build_manifest(step, files, kind, {"created_unix": time.time(), **(extra or {})})
    write_file_atomic(tmp / layout.MANIFEST_NAME, json.dumps(manifest, indent=1).encode())
    os.chmod(tmp, DIR_MODE)
    fsync_path(tmp)
    final = tmp.parent / layout.step_dir_name(step)
    if final.exists() and not (final / layout.MANIFEST_NAME).exists():
        # A folder without its manifest: left by a writer of an older release that died between its rename and
        # its manifest (this one renames a complete folder).
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        # Another writer's complete folder of this step came first (a folder is renamed only onto nothing).
        if not (final / layout.MANIFEST_NAME).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return final
    fsync_path(final.parent)
    return final


def read_manifest(path: Path, step: int) -> tuple[dict[str, Any] | None, Problem | None]:
    """The manifest of checkpoint folder ``path`` or the reason it has none usable."""
    try:
        manifest = json.loads((path / layout.MANIFEST_NAME).read_bytes())
    except FileNotFoundError:
        return None, Problem(skipped.TORN, "no manifest (incomplete)")
    except (OSError, ValueError) as error:
        return None, Problem(skipped.CORRUPT, f"unreadable manifest: {error}")
    problem = manifest_problem(manifest, step)
    return (None, problem) if problem else (manifest, None)


def manifest_problem(manifest: Any, step: int) -> Problem | None:
    """Why a parsed manifest cannot describe checkpoint ``step``, with its reason word (None when it can)."""
    if not isinstance(manifest, dict):
        return Problem(skipped.CORRUPT, "manifest is not an object")
    if manifest.get("format") != layout.MANIFEST_FORMAT:
        return Problem(skipped.OTHER_FORMAT, f"unknown manifest format {manifest.get('format')!r}")
    problem = layout.manifest_problem(manifest, step)
    return Problem(skipped.CORRUPT, problem) if problem else None


def kind_problem(manifest: dict[str, Any], kind: str | None) -> Problem | None:
    """Why a restore of ``kind`` state (replicated or sharded; None: any) cannot use this checkpoint."""
    found = manifest.get("kind")
    if kind is None or found in (None, kind):
        return None
    return Problem(skipped.OTHER_FORMAT, f"a {found} checkpoint; this restore takes {kind} ones")


def verify(path: Path, step: int, checksums: bool = True) -> tuple[dict[str, Any] | None, Problem | None]:
    """Check folder ``path`` against its manifest: sizes always, sha256 when ``checksums``."""
    manifest, problem = read_manifest(path, step)
    if manifest is None:
        return None, problem
    for name, entry in manifest["files"].items():
        file_path = path / name
        try:
            size = file_path.stat().st_size
        except OSError as error:
            return None, Problem(skipped.CORRUPT, f"{name}: {error.strerror or error}")
        if size != entry["bytes"]:
            return None, Problem(skipped.CORRUPT, f"{name}: size {size} != manifest {entry['bytes']}")
        if checksums:
            try:
                _, digest = hash_file(file_path)
            except OSError as error:
                return None, Problem(skipped.CORRUPT, f"{name}: unreadable: {error.strerror or error}")
            if digest != entry["sha256"]:
                return None, Problem(skipped.CORRUPT, f"{name}: sha256 mismatch (file corrupt)")
    return manifest, None


def step_folders(directory: Path) -> list[int]:
    """Steps of the final-named folders in ``directory``, complete or not, newest first."""
    try:
        return layout.steps_newest_first(entry.name for entry in directory.iterdir())
    except FileNotFoundError:
        return []


def complete_steps(directory: Path) -> list[int]:
    """Steps whose folder has a manifest, newest first (not verified)."""
    return [
        step
        for step in step_folders(directory)
        if (directory / layout.step_dir_name(step) / layout.MANIFEST_NAME).exists()
    ]


@dataclass(frozen=True)
class LoadableCheckpoint:
    step: int
    path: Path
    manifest: dict[str, Any]


def newest_loadable(
    directory: Path,
    newer_than: int = -1,
    checksums: bool = True,
    accept: Callable[[int, dict[str, Any]], bool] | None = None,
    kind: str | None = None,
    report: skipped.Reporter | None = None,
) -> LoadableCheckpoint | None:
    """The newest checkpoint that passes verification, holds ``kind`` state (replicated or sharded; None:
    either) and that `accept(step, manifest)` takes, when given (a rollback's bound, which passes over
    checkpoints silently). Every other step folder newer than the one found (torn, corrupt, of another
    format) is logged with the reason and told to `report(step, problem)`."""
    rejected: list[str] = []
    for step in step_folders(directory):
        if step <= newer_than:
            break
        path = directory / layout.step_dir_name(step)
        # Cheap first: the manifest alone says whether the step may be restored at all.
        listed, problem = read_manifest(path, step)
        if listed is not None and accept is not None and not accept(step, listed):
            continue
        if listed is not None:
            problem = kind_problem(listed, kind) or ownership.other_job_problem(listed)
        manifest = None
        if problem is None:
            manifest, problem = verify(path, step, checksums)
        if manifest is not None and problem is None:
            if rejected:
                log.warning(
                    "checkpoint fallback: loading %s after rejecting %s", path.name, "; ".join(rejected)
                )
            return LoadableCheckpoint(step, path, manifest)
        assert problem is not None
        if report is not None:
            report(step, problem)
        rejected.append(f"{path.name} ({problem.reason}: {problem})")
        log.warning("checkpoint %s rejected (%s): %s; trying the previous one", path, problem.reason, problem)
    if rejected:
        log.warning("no loadable checkpoint in %s; rejected: %s", directory, "; ".join(rejected))
    return None


def purge(directory: Path, keep: int, now: float | None = None) -> list[Path]:
    """Remove complete checkpoints beyond the newest ``keep`` and leftovers of dead writers.

    Only one writer per job calls this. Leftovers are temporary folders of steps older than the newest
    complete checkpoint (or older than an hour) and final-named folders without a manifest older than
    the newest complete checkpoint.
    """
    now = time.time() if now is None else now
    complete = complete_steps(directory)
    newest = complete[0] if complete else -1
    removed: list[Path] = []
    for step in layout.steps_to_purge(complete, keep):
        removed.append(directory / layout.step_dir_name(step))
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            tmp_step = layout.parse_tmp_dir(entry.name)
            final_step = layout.parse_step_dir(entry.name)
            if tmp_step is not None:
                with contextlib.suppress(OSError):
                    if tmp_step < newest or now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                        removed.append(entry)
            elif final_step is not None and final_step < newest and final_step not in complete:
                removed.append(entry)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


SET_ASIDE_DIR = "rolled-back"
"""Where checkpoints of a run abandoned by a rollback go (`<directory>/rolled-back/<label>/step-<N>`): never
loaded nor purged, kept for inspection."""


def set_aside(directory: Path, condemned: Callable[[int, dict[str, Any]], bool], label: str) -> list[int]:
    """Move the complete checkpoints `condemned(step, manifest)` picks out of the loader's and the purge's
    sight (a rollback abandoned their run); returns their steps. Only one writer per job calls this."""
    moved: list[int] = []
    for step in complete_steps(directory):
        path = directory / layout.step_dir_name(step)
        manifest, _ = read_manifest(path, step)
        if manifest is None or not condemned(step, manifest):
            continue
        target = directory / SET_ASIDE_DIR / label
        target.mkdir(parents=True, exist_ok=True)
        destination = target / path.name
        if destination.exists():
            shutil.rmtree(destination, ignore_errors=True)
        os.rename(path, destination)
        moved.append(step)
    if moved:
        fsync_path(directory)
    return sorted(moved)


def probe_directory(directory: str | os.PathLike[str], payload_bytes: int = 1 << 16) -> str | None:
    """Write, fsync, read back and remove a file in `directory` (created if needed); None when all of it
    worked, else what failed."""
    path = Path(directory)
    probe = path / f".preflight-probe-{socket.gethostname()}-{os.getpid()}"
    content = os.urandom(payload_bytes)
    step = "create the directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        step = "write"
        with open(probe, "wb") as handle:
            handle.write(content)
            handle.flush()
            step = "fsync"
            os.fsync(handle.fileno())
        step = "read back"
        if probe.read_bytes() != content:
            return f"checkpoint location {path}: a file written there read back different"
        step = "remove"
        probe.unlink()
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink()
        problem = f"checkpoint location {path}: cannot {step}: {error.strerror or error}"
        if isinstance(error, PermissionError):
            problem += permission_hint(path)
        return problem
    return None


def permission_hint(path: Path) -> str:
    """Who this process is and who owns the nearest existing folder: what a permission problem comes down to."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        info = existing.stat()
    except OSError:
        return ""
    return (
        f" (this process runs as uid {os.getuid()} gid {os.getgid()}, groups {sorted(os.getgroups())}; "
        f"{existing} belongs to uid {info.st_uid} gid {info.st_gid} with mode {info.st_mode & 0o7777:o}: "
        "set the pod's securityContext.fsGroup for volumes that support it, or make the volume writable "
        "for this user)"
    )
