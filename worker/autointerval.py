"""The automatic durable-checkpoint interval on the worker side (`PHALANX_CHECKPOINT_INTERVAL=auto`).

The operator chooses the interval (Young/Daly, operator/checkpointing.py) and writes it into the TrainingJob's
`status.checkpoint` (`mode: auto`, `intervalSteps`). Where it travels from there:

1. every launcher follows its TrainingJob (worker/jobwatch.py); its `IntervalFollower` writes the interval
   into a small file in the status folder it prepared for its training processes
   (`PHALANX_CHECKPOINT_INTERVAL_FILE`), replaced atomically;
2. a `Checkpointer` built with `interval_steps="auto"` decides the next durable step only where its ranks
   already meet: at a durable save and at a restore, rank 0 reads the file and broadcasts its value, and
   the next durable save is at that step plus the interval. Every rank switches at the same step, so the
   collective save never splits, whatever each pod's file says at the moment.

Before the operator's word arrives (or without a launcher) the interval is `BOOTSTRAP_STEPS`: the first
durable saves measure what a save costs, which is what the operator needs to choose.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

from phalanx.worker.jobwatch import JobObject, Ticker

logger = logging.getLogger("phalanx.launch")

AUTO: Final = "auto"
BOOTSTRAP_STEPS = 10
"""Steps between durable saves under `auto` until the operator has chosen (the operator's bootstrap too)."""
INTERVAL_FILE_ENV = "PHALANX_CHECKPOINT_INTERVAL_FILE"
"""Set by the launcher for its training processes: the file holding the operator's interval (steps)."""
INTERVAL_FILE_NAME = "checkpoint-interval"

Interval = int | Literal["auto"]


def parse_interval(value: object) -> Interval:
    """`auto`, or a number of steps (0 or more: 0 means forced saves only); ValueError otherwise."""
    if isinstance(value, str):
        text = value.strip()
        if text == AUTO:
            return AUTO
        if not text.isdigit():
            raise ValueError(f"checkpoint interval must be a number of steps or {AUTO!r}, got {value!r}")
        return int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"checkpoint interval must be a number of steps or {AUTO!r}, got {value!r}")
    return value


def interval_from_job(job: JobObject | None) -> int | None:
    """The interval the operator chose for the job (`status.checkpoint`, mode `auto`); None when none is."""
    checkpoint = ((job or {}).get("status") or {}).get("checkpoint") or {}
    steps = checkpoint.get("intervalSteps")
    if checkpoint.get("mode") != AUTO or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        return None
    return steps


def interval_file(status_dir: Path) -> Path:
    """Where a launcher keeps the interval for its training processes."""
    return status_dir / INTERVAL_FILE_NAME


def write_interval(path: Path, steps: int) -> None:
    """Replace the file atomically, so a trainer never reads half a number."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(f"{steps}\n")
    os.replace(temporary, path)


def read_interval(path: Path) -> int | None:
    """The interval in the file; None when it is absent or not a positive number."""
    with contextlib.suppress(OSError, ValueError):
        steps = int(path.read_text().strip())
        return steps if steps >= 1 else None
    return None


def file_source(env: Mapping[str, str] | None = None) -> Callable[[], int | None]:
    """What a Checkpointer asks for the operator's interval: the launcher's file, or nothing without one."""
    name = (os.environ if env is None else env).get(INTERVAL_FILE_ENV, "")
    if not name:
        return lambda: None
    path = Path(name)
    return lambda: read_interval(path)


class IntervalFollower(Ticker):
    """Launcher side: keeps the interval file equal to the TrainingJob's `status.checkpoint` (mode `auto`)."""

    thread_name = "phalanx-checkpoint-interval"
    failure = "checkpoint interval not passed on"

    def __init__(self, current_job: Callable[[], JobObject | None], path: Path, interval: float) -> None:
        super().__init__(interval)
        self.current_job = current_job
        self.path = path
        self.written: int | None = None

    def tick(self) -> Any:
        steps = interval_from_job(self.current_job())
        if steps is None or steps == self.written:
            return self.written
        write_interval(self.path, steps)
        logger.info(
            "checkpoint interval %d steps (the operator's choice; the trainers take it at their next durable save)",
            steps,
        )
        self.written = steps
        self._clear_problem()
        return self.written
