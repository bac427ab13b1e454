"""Container processes: start (in their own session, logs pumped with timestamps), signal, pid files.

A container is its process group plus every process carrying its `CONTAINER_MARKER` in the environment: a
real runtime puts a container in a cgroup, which no child can leave; here a child that starts its own
session (torchrun's trainers do) leaves the group but keeps the marker, so signals, freezes and the final
kill still reach it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONTAINER_MARKER = "PHALANX_CONTAINER_ID"
"""Environment variable naming the container a process belongs to (its container ID)."""
UNSHARE = ["unshare", "-m", "-u", "--propagation", "private", "--"]


def probe_namespaces() -> bool:
    """Whether `unshare` may create mount + UTS namespaces here (needs root or user namespaces)."""
    try:
        result = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def exit_code_of(returncode: int) -> int:
    """Shell convention: killed by signal N -> 128 + N (what a container runtime reports)."""
    return 128 - returncode if returncode < 0 else returncode


def process_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def processes_with_environment(wanted: dict[str, str], proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes whose environment (as they were started) holds every `wanted` variable."""
    entries = {f"{name}={value}".encode() for name, value in wanted.items()}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue  # gone, or not ours to read
        if entries <= environ:
            found.append(int(entry.name))
    return found


def marked_processes(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes whose environment names `container_id` under `CONTAINER_MARKER`."""
    return processes_with_environment({CONTAINER_MARKER: container_id}, proc)


WHOLE_CONTAINER_SIGNALS = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT})
"""What a runtime applies to a container's whole cgroup (kill, freeze, thaw); a SIGTERM stays with the group."""


def signal_container(pid: int, container_id: str | None, sig: int) -> None:
    """Signal the container's process group; a kill, freeze or thaw also every process that left the group
    but still carries the container's marker."""
    signal_group(pid, sig)
    if container_id and sig in WHOLE_CONTAINER_SIGNALS:
        signal_marked(container_id, sig)


def signal_marked(container_id: str, sig: int) -> None:
    """Signal every process that carries the container's marker, in its group or not."""
    for member in marked_processes(container_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, sig)


def kill_at_once(processes: list[ContainerProcess]) -> None:
    """SIGKILL every container in `processes` together, as a node's power loss stops them: every process group
    first (a signal each), then each container's processes that left its group (a scan of /proc each), so that
    none of them outlives another by more than moments."""
    for process in processes:
        if process.popen.poll() is None:
            signal_group(process.pid, signal.SIGKILL)
    for process in processes:
        # Whether or not the group's leader is gone by now: what left the group outlives it.
        if process.container_id:
            signal_marked(process.container_id, signal.SIGKILL)


class ContainerProcess:
    """One run of one container: the sandboxed process and the thread copying its output into the log."""

    def __init__(
        self,
        spec: dict[str, Any],
        run_dir: Path,
        log_path: Path,
        namespaced: bool,
        on_exit: Callable[[], None],
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        name = spec["container"]
        self.container_id: str | None = spec["env"].get(CONTAINER_MARKER)
        spec_path = run_dir / f"{name}.json"
        spec_path.write_text(json.dumps(spec))
        self.log_path = log_path
        self.log_closed = threading.Event()
        self._on_exit = on_exit
        launcher = [sys.executable, "-m", "phalanx.devcluster.agent.sandbox", str(spec_path)]
        argv = [*UNSHARE, *launcher] if namespaced else launcher
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self.popen.pid
        self.pid_file = run_dir / f"{name}.pid"
        self.pid_file.write_text(
            f"{self.pid} {process_start_time(self.pid) or ''} {self.container_id or ''}\n"
        )
        self._pump = threading.Thread(target=self._copy_output, name=f"log-{name}", daemon=True)
        self._pump.start()

    def _copy_output(self) -> None:
        assert self.popen.stdout is not None
        try:
            with open(self.log_path, "ab", buffering=0) as sink:
                for line in iter(self.popen.stdout.readline, b""):
                    if not line.endswith(b"\n"):
                        line += b"\n"
                    sink.write(timestamp().encode() + b" " + line)
        except Exception:
            log.exception("log pump of %s failed", self.log_path)
        finally:
            self.popen.stdout.close()
            self.log_closed.set()
            self._on_exit()

    def poll(self) -> int | None:
        """The exit code once the main process has exited (then the rest of its group is killed)."""
        code = self.popen.poll()
        if code is None:
            return None
        # Like a container: when its main process ends, all of it ends.
        signal_container(self.pid, self.container_id, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return exit_code_of(code)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            signal_container(self.pid, self.container_id, sig)

    def wait(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def kill_orphans(state_dir: Path) -> int:
    """Kill the process groups of a previous agent (pid files whose process still has the recorded start time)."""
    killed = 0
    for pid_file in state_dir.glob("pods/*/run/*.pid"):
        try:
            pid_text, _, rest = pid_file.read_text().strip().partition(" ")
            started, _, container_id = rest.partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            pid_file.unlink(missing_ok=True)
            continue
        if started and process_start_time(pid) == started:
            signal_group(pid, signal.SIGKILL)
            killed += 1
        if container_id:  # its processes that left the group outlive the group's leader
            # Counted apart from the group just killed (whose members may not have died yet).
            killed += sum(1 for member in marked_processes(container_id) if _process_group(member) != pid)
            signal_container(pid, container_id, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    return killed
