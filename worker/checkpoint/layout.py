"""Names and rules of the durable checkpoint directory (pure functions, no I/O).

A checkpoint directory holds one folder per step: ``step-<N>/``. A folder counts only once its
``manifest.json`` exists; folders being written carry a temporary name (``.tmp-step-<N>-<id>``) so a
crash never leaves a half-written folder under a final name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
STATE_FILE = "state.bin"
"""The replicated state (model, optimizer, cursor, RNG) of a non-sharded checkpoint."""

_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_RE = re.compile(r"^\.tmp-step-(\d+)-[A-Za-z0-9_.-]+$")


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def tmp_dir_name(step: int, unique: str) -> str:
    return f"{TMP_PREFIX}{step}-{unique}"


def parse_step_dir(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def parse_tmp_dir(name: str) -> int | None:
    match = _TMP_RE.match(name)
    return int(match.group(1)) if match else None


def steps_newest_first(names: Iterable[str]) -> list[int]:
    """Steps of the final-named folders among ``names``, newest first."""
    steps = {step for name in names if (step := parse_step_dir(name)) is not None}
    return sorted(steps, reverse=True)


def steps_to_purge(complete_steps: Iterable[int], keep: int) -> list[int]:
    """The complete checkpoints beyond the newest ``keep`` (``keep <= 0`` keeps everything)."""
    ordered = sorted(set(complete_steps), reverse=True)
    if keep <= 0:
        return []
    return ordered[keep:]


def build_manifest(
    step: int, files: Mapping[str, tuple[int, str]], kind: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest of a checkpoint: per-file size and sha256; ``kind`` is ``replicated`` or ``sharded``."""
    return {
        "format": MANIFEST_FORMAT,
        "step": step,
        "kind": kind,
        "files": {name: {"bytes": size, "sha256": digest} for name, (size, digest) in sorted(files.items())},
        **(dict(extra) if extra else {}),
    }


def manifest_problem(manifest: Mapping[str, Any], step: int) -> str | None:
    """Why a parsed manifest cannot describe checkpoint ``step`` (None when it can)."""
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"unknown manifest format {manifest.get('format')!r}"
    if manifest.get("step") != step:
        return f"manifest names step {manifest.get('step')!r}, folder names step {step}"
    files = manifest.get("files")
    if not isinstance(files, Mapping) or not files:
        return "manifest lists no files"
    for name, entry in files.items():
        if "/" in name or name in ("", ".", "..", MANIFEST_NAME):
            return f"manifest lists an invalid file name {name!r}"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("bytes"), int):
            return f"manifest entry for {name!r} has no size"
        if not isinstance(entry.get("sha256"), str):
            return f"manifest entry for {name!r} has no sha256"
    return None
