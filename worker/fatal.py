"""A training process that must stop for a reason no restart can fix: say why, then end at once.

The reason goes where the launcher reads it (a file beside this rank's status record, under
`PHALANX_STATUS_DIR`) and to stderr (`kubectl logs`); the exit code (worker/exitcodes.py, `TrainerExit`) tells
the launcher not to retry. The launcher then ends the pod with the reason as its termination message
(worker/termination.py), which is what the operator puts in the TrainingJob's condition and Event.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NoReturn

from phalanx.worker import heartbeat

FATAL_FILE_PREFIX = "fatal-rank-"
MAX_MESSAGE = 2048
"""Kubernetes keeps at most 4096 bytes of a termination message; the launcher adds its own words."""


def fatal_file(directory: Path, local_rank: int) -> Path:
    return directory / f"{FATAL_FILE_PREFIX}{local_rank}.txt"


def record(message: str, env: Mapping[str, str] | None = None) -> None:
    """Leaves `message` for the launcher (nothing outside a launcher). Never raises: the process is ending."""
    env = os.environ if env is None else env
    directory = env.get(heartbeat.STATUS_DIR_ENV)
    if not directory:
        return
    with contextlib.suppress(OSError):
        fatal_file(Path(directory), int(env.get("LOCAL_RANK", "0"))).write_text(message[:MAX_MESSAGE])


def read(directory: Path) -> list[str]:
    """The reasons the training processes of this pod left, rank by rank (read by the launcher)."""
    found = []
    for path in sorted(directory.glob(f"{FATAL_FILE_PREFIX}*.txt")):
        with contextlib.suppress(OSError):
            found.append(path.read_text().strip())
    return [message for message in found if message]


def clear(directory: Path) -> None:
    """Forgets the reasons of an earlier group (a new group starts clean)."""
    for path in directory.glob(f"{FATAL_FILE_PREFIX}*.txt"):
        path.unlink(missing_ok=True)


def exit_now(code: int, cleanups: Iterable[Callable[[], object]] = ()) -> NoReturn:
    """Runs `cleanups` (failures ignored), flushes the output and ends the process with `code` at once: the
    training script's own threads (a watchdog, a data loader) and torch's teardown at interpreter exit could
    otherwise hold it, and the launcher acts on the code."""
    for cleanup in cleanups:
        with contextlib.suppress(Exception):
            cleanup()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(int(code))


def stop(code: int, message: str, cleanups: Iterable[Callable[[], object]] = ()) -> NoReturn:
    """Says why on stderr and to the launcher, then `exit_now`."""
    print(f"phalanx: {message}", file=sys.stderr, flush=True)
    record(message)
    exit_now(code, cleanups)
