"""Detached daemons tracked by pid files: start, identify, stop (with every descendant)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class PidRecord:
    """A pid plus the process's start time, so a recycled pid is never mistaken for ours."""

    pid: int
    create_time: float

    def process(self) -> psutil.Process | None:
        try:
            process = psutil.Process(self.pid)
            if (
                abs(process.create_time() - self.create_time) > 0.5
                or process.status() == psutil.STATUS_ZOMBIE
            ):
                return None
            return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def alive(self) -> bool:
        return self.process() is not None


def read_pid_file(path: Path) -> PidRecord | None:
    try:
        data = json.loads(path.read_text())
        return PidRecord(pid=int(data["pid"]), create_time=float(data["create_time"]))
    except (OSError, ValueError, KeyError):
        return None


def start_daemon(
    argv: Sequence[str], *, pid_file: Path, log_file: Path, env: Mapping[str, str] | None = None
) -> PidRecord:
    """Starts `argv` in its own session (so its whole process group can be signalled) with output to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    record = PidRecord(pid=process.pid, create_time=psutil.Process(process.pid).create_time())
    pid_file.write_text(
        json.dumps({"pid": record.pid, "create_time": record.create_time, "argv": list(argv)})
    )
    return record


def descendants(record: PidRecord) -> list[psutil.Process]:
    process = record.process()
    if process is None:
        return []
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_group(process: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(process.pid), sig)
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(sig)


def stop_processes(processes: Sequence[psutil.Process], grace_seconds: float) -> None:
    """SIGTERM to each process (and its group), then SIGKILL whatever outlives the grace period."""
    living = [p for p in processes if p.is_running()]
    for process in living:
        _signal_group(process, signal.SIGTERM)
    _, still_alive = psutil.wait_procs(living, timeout=grace_seconds)
    for process in still_alive:
        _signal_group(process, signal.SIGKILL)
    psutil.wait_procs(still_alive, timeout=5)
