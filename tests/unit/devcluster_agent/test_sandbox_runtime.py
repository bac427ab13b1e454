"""Container processes: the sandbox (namespaces when permitted, the documented fallback otherwise), logs, exit
codes, signals and orphan cleanup. Real processes, no cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phalanx.devcluster.agent import runtime
from phalanx.devcluster.agent.runtime import (
    CONTAINER_MARKER,
    ContainerProcess,
    exit_code_of,
    kill_at_once,
    kill_orphans,
    marked_processes,
    probe_namespaces,
    process_start_time,
)

NAMESPACED = probe_namespaces()


def spec(tmp_path: Path, argv: list[str], **extra: object) -> dict:
    return {
        "container": "main",
        "argv": argv,
        "env": {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "GREETING": "hi"},
        "working_dir": str(tmp_path / "wd"),
        "hostname": "pod-host",
        "mounts": [],
        "hosts_file": None,
        "resolv_file": None,
        "namespaced": False,
        **extra,
    }


def run(tmp_path: Path, container_spec: dict, namespaced: bool, timeout: float = 20) -> tuple[int, str]:
    done = threading.Event()
    process = ContainerProcess(
        container_spec, tmp_path / "run", tmp_path / "logs" / "0.log", namespaced, done.set
    )
    assert process.wait(timeout)
    assert done.wait(timeout)
    code = process.poll()
    assert code is not None
    return code, (tmp_path / "logs" / "0.log").read_text()


def test_command_runs_with_env_and_working_dir_and_logs_are_timestamped(tmp_path: Path) -> None:
    code, log = run(tmp_path, spec(tmp_path, ["sh", "-c", 'echo "$GREETING from $(pwd)"; exit 4']), False)
    assert code == 4
    stamp, text = log.strip().split(" ", 1)
    assert stamp.endswith("Z") and stamp[:2] == "20"
    assert text == f"hi from {tmp_path / 'wd'}"


def test_missing_executable_exits_127_with_a_message(tmp_path: Path) -> None:
    code, log = run(tmp_path, spec(tmp_path, ["no-such-program-xyz"]), False)
    assert code == 127
    assert "executable file not found" in log


def test_without_namespaces_nothing_is_mounted_or_linked_on_the_machine(tmp_path: Path) -> None:
    """Pods then share the machine's filesystem: a link at the mount path would be every pod's. The command
    reaches its volume through the path the agent rewrote (sharedfs), and the mount path stays absent."""
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "f").write_text("data")
    target = tmp_path / "mnt" / "data"
    mounts = [{"source": str(volume), "target": str(target), "read_only": False}]
    code, log = run(tmp_path, spec(tmp_path, ["cat", str(volume / "f")], mounts=mounts), False)
    assert (code, log.split(" ", 1)[1]) == (0, "data\n")
    assert not target.exists() and not target.is_symlink()


def test_namespaces_give_hostname_bind_mounts_and_pod_etc_files(tmp_path: Path) -> None:
    """With unshare permitted (root), mounts and hostname are private to the pod; otherwise the fallback runs."""
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "f").write_text("data")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.8.0.2\tpod-host\n")
    target = tmp_path / "mnt" / "data"
    mounts = [{"source": str(volume), "target": str(target), "read_only": True}]
    script = f"hostname; cat {target}/f; echo; cat /etc/hosts; touch {target}/new 2>/dev/null && echo writable; true"
    code, log = run(
        tmp_path,
        spec(tmp_path, ["sh", "-c", script], mounts=mounts, hosts_file=str(hosts), namespaced=NAMESPACED),
        NAMESPACED,
    )
    lines = [line.split(" ", 1)[1] for line in log.splitlines()]
    assert code == 0
    if NAMESPACED:
        assert lines[:3] == ["pod-host", "data", "127.8.0.2\tpod-host"]
        assert "writable" not in lines
        assert not target.is_symlink() and not (target / "f").exists()  # the mount stayed inside the pod
        assert os.uname().nodename != "pod-host"
    else:
        assert not target.exists() and not target.is_symlink()


def test_signals_reach_the_whole_process_group(tmp_path: Path) -> None:
    container_spec = spec(tmp_path, ["sh", "-c", "sleep 300 & sleep 300; wait"])
    process = ContainerProcess(
        container_spec, tmp_path / "run", tmp_path / "logs" / "0.log", False, lambda: None
    )
    time.sleep(0.5)
    process.signal(signal.SIGKILL)
    assert process.wait(10)
    assert process.poll() == 137
    assert live_members(process.pid) == []


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def wait_until(condition: object, patience: float = 10.0) -> bool:
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def left_the_group(marker: str, leader: int) -> list[int]:
    """The container's processes in a session of their own (once `setsid` ran and exec'd `sleep`)."""
    found = []
    for pid in marked_processes(marker):
        try:
            # Only once `sleep` runs: in the middle of its exec its environment may read as empty.
            if (
                pid != leader
                and os.getsid(pid) == pid
                and Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
            ):
                found.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            continue
    return found


def test_a_child_in_its_own_session_is_frozen_and_killed_with_its_container(tmp_path: Path) -> None:
    """torchrun starts trainers in their own sessions: a process-group signal misses them, the container's
    marker does not (a stopped trainer outliving its pod was the leak)."""
    marker = f"phalanx://test-{os.getpid()}/main/0"
    container_spec = spec(tmp_path, ["sh", "-c", "setsid sleep 300 & wait"])
    container_spec["env"][CONTAINER_MARKER] = marker
    process = ContainerProcess(
        container_spec, tmp_path / "run", tmp_path / "logs" / "0.log", False, lambda: None
    )
    assert wait_until(lambda: left_the_group(marker, process.pid))
    (child,) = left_the_group(marker, process.pid)

    process.signal(signal.SIGSTOP)
    assert wait_until(lambda: process_state(child) == "T")
    process.signal(signal.SIGCONT)
    assert wait_until(lambda: process_state(child) == "S")

    process.signal(signal.SIGSTOP)
    process.signal(signal.SIGKILL)
    assert process.wait(10)
    assert process.poll() == 137
    assert wait_until(lambda: process_state(child) in (None, "Z"))


def test_a_node_s_crash_kills_every_container_s_group_before_it_hunts_strays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed node's pods die together: a pod that outlived its neighbour by a /proc scan could see the
    neighbour gone and report it (a spare seeing its node's rendezvous store vanish)."""
    containers = []
    for pod in ("rendezvous", "spare"):
        container_spec = spec(tmp_path / pod, ["sh", "-c", "setsid sleep 300 & wait"])
        marker = f"phalanx://crash-{os.getpid()}/{pod}/0"
        container_spec["env"][CONTAINER_MARKER] = marker
        process = ContainerProcess(
            container_spec, tmp_path / pod / "run", tmp_path / pod / "0.log", False, lambda: None
        )
        assert wait_until(lambda marker=marker, leader=process.pid: left_the_group(marker, leader))
        containers.append(process)
    scans: list[dict[int, bool]] = []
    scan = runtime.marked_processes

    def leaders_dead_then_scan(marker: str) -> list[int]:
        scans.append(
            {c.pid: wait_until(lambda c=c: process_state(c.pid) in (None, "Z"), 5) for c in containers}
        )
        return scan(marker)

    monkeypatch.setattr(runtime, "marked_processes", leaders_dead_then_scan)
    kill_at_once(containers)
    assert scans and all(all(dead.values()) for dead in scans), scans
    for process in containers:
        assert process.wait(10)
        assert process.poll() == 137
        marker = process.container_id
        assert wait_until(
            lambda marker=marker: all(process_state(pid) in (None, "Z") for pid in scan(marker))
        )


def describe_container(marker: str, leader: int, run_dir: Path) -> str:
    """What kill_orphans reads (pid files, the leader's start time, the marked processes), for a failure's message."""
    pid_files = {path.name: path.read_text().strip() for path in run_dir.glob("*.pid")}
    members = []
    for pid in marked_processes(marker):
        try:
            members.append(f"{pid} pgid={os.getpgid(pid)} sid={os.getsid(pid)} state={process_state(pid)}")
        except ProcessLookupError:
            members.append(f"{pid} gone")
    return f"pid files {pid_files}, leader {leader} started {process_start_time(leader)}, marked {members}"


def test_orphans_that_left_the_group_are_killed_by_marker(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run_dir = state / "pods" / "uid" / "run"
    marker = f"phalanx://orphan-{os.getpid()}/main/0"
    container_spec = spec(tmp_path, ["sh", "-c", "setsid sleep 300 & wait"])
    container_spec["env"][CONTAINER_MARKER] = marker
    process = ContainerProcess(container_spec, run_dir, tmp_path / "logs" / "0.log", False, lambda: None)
    assert wait_until(lambda: left_the_group(marker, process.pid))
    before = describe_container(marker, process.pid, run_dir)
    assert kill_orphans(state) == 2, (
        f"before: {before}; after: {describe_container(marker, process.pid, run_dir)}"
    )
    assert process.wait(10)
    assert wait_until(lambda: all(process_state(pid) in (None, "Z") for pid in marked_processes(marker)))


def live_members(group: int, patience: float = 5.0) -> list[int]:
    """Processes of the group that are not zombies (killed orphans may wait a moment to be reaped by init)."""
    deadline = time.monotonic() + patience
    while True:
        out = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True)
        alive = []
        for pid in map(int, out.stdout.split()):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_orphans_of_a_previous_agent_are_killed_by_pid_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run_dir = state / "pods" / "uid" / "run"
    container_spec = spec(tmp_path, ["sleep", "300"])
    process = ContainerProcess(container_spec, run_dir, tmp_path / "logs" / "0.log", False, lambda: None)
    (run_dir / "stale.pid").write_text("999999 123\n")
    assert kill_orphans(state) == 1
    assert process.wait(10)
    assert not list(run_dir.glob("*.pid"))


def test_exit_codes_of_signals() -> None:
    assert exit_code_of(-9) == 137
    assert exit_code_of(-15) == 143
    assert exit_code_of(3) == 3
