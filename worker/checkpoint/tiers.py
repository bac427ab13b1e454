"""The durable tier: where checkpoints of the fast tier are copied in the background, and found again.

Checkpoints are committed to the fast tier (`PHALANX_CHECKPOINT_DIR`: a node-local disk, or the shared
volume) at every interval; every `every`-th one (and every forced one) is then copied, by the saver process,
to the durable tier: a directory on a shared volume, or any fsspec URL (`s3://bucket/prefix` on an
S3-compatible store). A copy writes the data files first and the manifest last; the manifest is what makes a
checkpoint exist, so a copy cut short is never loaded (object stores have no rename, but one PUT is atomic).
A restore fetches the newest durable checkpoint into the fast tier when no tier nearer to the trainer holds
a newer one, and checks every file against the manifest's sha256 before committing it there.

Torch-free: the saver process imports this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.worker.checkpoint import durable, layout, ownership, skipped

log = logging.getLogger(__name__)

URL_ENV = "PHALANX_CHECKPOINT_DURABLE_URL"
"""The durable tier: a directory or an fsspec URL; unset: the fast tier is the only one."""
EVERY_ENV = "PHALANX_CHECKPOINT_DURABLE_EVERY"
"""Every that many checkpoints of the fast tier is also copied to the durable tier (forced ones always)."""
KEEP_ENV = "PHALANX_CHECKPOINT_DURABLE_KEEP"
"""Checkpoints kept on the durable tier."""
OPTIONS_ENV = "PHALANX_CHECKPOINT_STORAGE_OPTIONS"
"""A JSON object of fsspec storage options for the durable tier's URL (e.g. the S3 endpoint)."""
CREDENTIALS_ENV = "PHALANX_CHECKPOINT_CREDENTIALS_DIR"
"""A folder of the store's credentials, one file per storage option (the Secret `objectStore.secretName`)."""
S3_CREDENTIAL_NAMES = {
    "AWS_ACCESS_KEY_ID": "key",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_SESSION_TOKEN": "token",
}
"""S3's usual names for its credentials, and the storage options (s3fs) they are."""
_OPTION_NAME = re.compile(r"[a-z][a-z0-9_]*")
LOCAL_ENV = "PHALANX_CHECKPOINT_LOCAL_TIER"
"""`1` when the fast tier is node-local: every rank then looks in its own copy at restore."""

MANIFEST_META_KEYS = ("format", "step", "kind", "files")


@dataclass(frozen=True)
class DurableTier:
    """Where durable copies go (see the module docstring)."""

    url: str
    every: int = 1
    keep: int = 3
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("the durable tier needs a directory or URL")
        if self.every < 1:
            raise ValueError(f"durable tier: every must be >= 1, got {self.every}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DurableTier | None:
        env = os.environ if env is None else env
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        raw_options = env.get(OPTIONS_ENV, "").strip()
        options = json.loads(raw_options) if raw_options else {}
        if not isinstance(options, dict):
            raise ValueError(f"{OPTIONS_ENV} must be a JSON object, got {raw_options!r}")
        folder = env.get(CREDENTIALS_ENV, "").strip()
        if folder:
            options.update(credential_options(Path(folder)))
        return cls(url, int(env.get(EVERY_ENV) or 1), int(env.get(KEEP_ENV) or 3), options)

    def as_job(self) -> dict[str, Any]:
        """What the saver process is handed (JSON)."""
        return {"url": self.url, "every": self.every, "keep": self.keep, "options": dict(self.options)}

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> DurableTier:
        return cls(str(job["url"]), int(job["every"]), int(job["keep"]), dict(job.get("options") or {}))

    @property
    def is_directory(self) -> bool:
        """A plain path (or file:// URL): written with the fast tier's commit protocol (fsync, rename)."""
        return "://" not in self.url or self.url.startswith("file://")

    @property
    def directory(self) -> Path:
        return Path(self.url.removeprefix("file://"))

    def filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem and root path of an URL tier."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.url, **dict(self.options))
        return fs, root.rstrip("/")


def credential_options(folder: Path) -> dict[str, str]:
    """The storage options a folder of credential files gives: each file is one option named after it (S3's
    usual names are understood as s3fs's options). Other names are left out, and said so."""
    options: dict[str, str] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError as error:
        log.warning("the object store's credentials at %s cannot be read: %s", folder, error)
        return options
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue  # the secret volume's own bookkeeping (..data)
        name = S3_CREDENTIAL_NAMES.get(entry.name, entry.name)
        if not _OPTION_NAME.fullmatch(name):
            log.warning("credential file %s names no storage option; left out", entry.name)
            continue
        options[name] = entry.read_text().strip()
    return options


def manifest_extra(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What a manifest records besides its own bookkeeping (world size, rollback epoch, creation time)."""
    return {key: value for key, value in manifest.items() if key not in MANIFEST_META_KEYS}


def _manifest_files(manifest: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    return {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in manifest["files"].items()}


# ---------------------------------------------------------------------------------------------- writing
def copy_checkpoint(tier: DurableTier, folder: Path, step: int) -> dict[str, Any]:
    """Copy the committed fast-tier checkpoint `folder` (of `step`) to `tier`, then purge it to `keep`."""
    started = time.perf_counter()
    manifest, problem = durable.read_manifest(folder, step)
    if manifest is None:
        raise ValueError(f"{folder} cannot be copied: {problem}")
    files = _manifest_files(manifest)
    if tier.is_directory:
        _copy_to_directory(tier.directory, folder, step, manifest, files)
        durable.purge(tier.directory, tier.keep)
    else:
        _copy_to_url(tier, folder, step, manifest, files)
        purge_url(tier)
    return {
        "durable_step": step,
        "durable_bytes": sum(size for size, _ in files.values()),
        "durable_seconds": time.perf_counter() - started,
    }


def _copy_to_directory(
    directory: Path,
    folder: Path,
    step: int,
    manifest: Mapping[str, Any],
    files: Mapping[str, tuple[int, str]],
) -> None:
    if step in durable.complete_steps(directory):
        return
    tmp = durable.new_tmp_dir(directory, step)
    try:
        for name in files:
            shutil.copyfile(folder / name, tmp / name)
            durable.fsync_path(tmp / name)
        durable.commit(tmp, step, str(manifest["kind"]), files, manifest_extra(manifest))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _copy_to_url(
    tier: DurableTier,
    folder: Path,
    step: int,
    manifest: Mapping[str, Any],
    files: Mapping[str, tuple[int, str]],
) -> None:
    fs, root = tier.filesystem()
    target = f"{root}/{layout.step_dir_name(step)}"
    if fs.exists(f"{target}/{layout.MANIFEST_NAME}"):
        return
    for name in files:
        fs.put_file(str(folder / name), f"{target}/{name}")
    # Last: the manifest makes the copy count.
    fs.pipe_file(f"{target}/{layout.MANIFEST_NAME}", json.dumps(manifest, indent=1).encode())


def _url_steps(fs: Any, root: str) -> list[int]:
    """Step folders under `root`, newest first (complete or not)."""
    try:
        entries = fs.ls(root, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return layout.steps_newest_first(str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries)


def complete_steps(tier: DurableTier) -> list[int]:
    """Steps of the durable tier's complete copies (with a manifest), newest first (not verified)."""
    if tier.is_directory:
        return durable.complete_steps(tier.directory)
    fs, root = tier.filesystem()
    return _url_complete(fs, root, _url_steps(fs, root))


def _url_complete(fs: Any, root: str, steps: list[int]) -> list[int]:
    return [
        step for step in steps if fs.exists(f"{root}/{layout.step_dir_name(step)}/{layout.MANIFEST_NAME}")
    ]


def purge_url(tier: DurableTier) -> list[int]:
    """Remove the durable copies beyond the newest `keep`, and copies cut short that are older than the
    newest complete one (a newer one without its manifest may still be being written)."""
    fs, root = tier.filesystem()
    steps = _url_steps(fs, root)
    complete = _url_complete(fs, root, steps)
    newest = complete[0] if complete else -1
    doomed = set(layout.steps_to_purge(complete, tier.keep))
    doomed |= {step for step in steps if step < newest and step not in complete}
    for step in sorted(doomed):
        with contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root}/{layout.step_dir_name(step)}", recursive=True)
    return sorted(doomed)


def set_aside(tier: DurableTier, condemned: Callable[[int, dict[str, Any]], bool], label: str) -> list[int]:
    """Move the durable copies `condemned(step, manifest)` picks to `rolled-back/<label>/`, out of the
    restore's and the purge's sight (as `durable.set_aside` does on a directory); returns their steps."""
    if tier.is_directory:
        return durable.set_aside(tier.directory, condemned, label)
    fs, root = tier.filesystem()
    moved: list[int] = []
    for step in _url_steps(fs, root):
        folder = f"{root}/{layout.step_dir_name(step)}"
        try:
            raw = fs.cat_file(f"{folder}/{layout.MANIFEST_NAME}")
            manifest = json.loads(raw)
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or not condemned(step, manifest):
            continue
        # The manifest goes first: from then on the copy no longer exists for a restore, whatever happens next.
        fs.rm_file(f"{folder}/{layout.MANIFEST_NAME}")
        target = f"{root}/{durable.SET_ASIDE_DIR}/{label}/{layout.step_dir_name(step)}"
        for name in manifest.get("files") or {}:
            with contextlib.suppress(FileNotFoundError):
                fs.mv(f"{folder}/{name}", f"{target}/{name}")
        fs.pipe_file(f"{target}/{layout.MANIFEST_NAME}", raw)
        moved.append(step)
    return sorted(moved)


def probe(tier: DurableTier, payload_bytes: int = 1 << 16) -> str | None:
    """Write, read back and remove an object (a file) on the durable tier; None when all of it worked, else
    what failed."""
    if tier.is_directory:
        return durable.probe_directory(tier.directory, payload_bytes)
    content = os.urandom(payload_bytes)
    step = "reach it"
    try:
        fs, root = tier.filesystem()
        target = f"{root}/.preflight-probe-{os.uname().nodename}-{os.getpid()}"
        step = "write"
        fs.pipe_file(target, content)
        step = "read back"
        if fs.cat_file(target) != content:
            return f"durable tier {tier.url}: an object written there read back different"
        step = "remove"
        fs.rm_file(target)
    except Exception as error:
        return f"durable tier {tier.url}: cannot {step}: {type(error).__name__}: {error}"
    return None


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class DurableCopy:
    """A complete checkpoint on the durable tier (its manifest read, its files not yet checked)."""

    step: int
    manifest: dict[str, Any]


def newest(
    tier: DurableTier,
    newer_than: int = -1,
    accept: Callable[[int, dict[str, Any]], bool] | None = None,
    kind: str | None = None,
    report: skipped.Reporter | None = None,
) -> DurableCopy | None:
    """The newest durable checkpoint after `newer_than` whose manifest is sound, that holds `kind` state (None:
    either) and that `accept` takes; each newer copy passed over for another reason is told to `report`."""
    if tier.is_directory:
        found = durable.newest_loadable(
            tier.directory, newer_than=newer_than, checksums=False, accept=accept, kind=kind, report=report
        )
        return DurableCopy(found.step, found.manifest) if found else None
    fs, root = tier.filesystem()
    for step in _url_steps(fs, root):
        if step <= newer_than:
            break
        try:
            manifest = json.loads(fs.cat_file(f"{root}/{layout.step_dir_name(step)}/{layout.MANIFEST_NAME}"))
        except FileNotFoundError:
            # A copy cut short, or one being written now: either way none a restore can take.
            problem: skipped.Problem | None = skipped.Problem(skipped.TORN, "no manifest (incomplete copy)")
            manifest = None
        except (OSError, ValueError) as error:
            problem, manifest = skipped.Problem(skipped.CORRUPT, f"unreadable manifest: {error}"), None
        else:
            problem = durable.manifest_problem(manifest, step)
            if problem is None and accept is not None and not accept(step, manifest):
                continue
            problem = problem or durable.kind_problem(manifest, kind) or ownership.other_job_problem(manifest)
        if problem is None and manifest is not None:
            return DurableCopy(step, manifest)
        assert problem is not None
        log.warning("durable copy of step %d rejected (%s): %s", step, problem.reason, problem)
        if report is not None:
            report(step, problem)
    return None


def fetch(
    tier: DurableTier, copy: DurableCopy, directory: Path, report: skipped.Reporter | None = None
) -> Path | None:
    """Bring durable `copy` into the fast tier `directory` as a committed checkpoint; None (logged, and told to
    `report`) when a file is missing or does not match the manifest."""
    if copy.step in durable.complete_steps(directory):
        return directory / layout.step_dir_name(copy.step)
    files = _manifest_files(copy.manifest)
    tmp = durable.new_tmp_dir(directory, copy.step)
    try:
        for name in files:
            if tier.is_directory:
                shutil.copyfile(tier.directory / layout.step_dir_name(copy.step) / name, tmp / name)
            else:
                fs, root = tier.filesystem()
                fs.get_file(f"{root}/{layout.step_dir_name(copy.step)}/{name}", str(tmp / name))
            got = durable.hash_file(tmp / name)
            if got != files[name]:
                raise ValueError(f"{name}: {got[0]} bytes / sha256 {got[1][:12]} do not match the manifest")
            durable.fsync_path(tmp / name)
        return durable.commit(
            tmp, copy.step, str(copy.manifest["kind"]), files, manifest_extra(copy.manifest)
        )
    except (OSError, ValueError) as error:
        log.warning("durable copy of step %d not usable: %s", copy.step, error)
        shutil.rmtree(tmp, ignore_errors=True)
        if report is not None:
            report(copy.step, skipped.Problem(skipped.CORRUPT, str(error)))
        return None


def fetch_newest(
    tier: DurableTier,
    directory: Path,
    newer_than: int = -1,
    accept: Callable[[int, dict[str, Any]], bool] | None = None,
    kind: str | None = None,
    report: skipped.Reporter | None = None,
) -> int | None:
    """Fetch the newest usable durable checkpoint after `newer_than` into `directory` (a copy failing its
    check gives way to the one before it); returns its step, None when there is none. Each copy passed over
    is told to `report`."""
    rejected: set[int] = set()

    def usable(step: int, manifest: dict[str, Any]) -> bool:
        return step not in rejected and (accept is None or accept(step, manifest))

    while (copy := newest(tier, newer_than, usable, kind, report)) is not None:
        if fetch(tier, copy, directory, report) is not None:
            return copy.step
        rejected.add(copy.step)
    return None
