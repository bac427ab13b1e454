"""The fork server's warm interpreters end as `python` would (exit codes, signals, threads, atexit), lead their
own sessions, draw their own random numbers, and outlive nothing: the server ends with its launcher, and
the pool starts new processes once the server is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from phalanx.worker.forkserver import SERVER_TITLE, UNKNOWN_EXIT, ForkedProcess, ForkServer, ForkServerGone
from phalanx.worker.warmstart import WarmPool

PYTHON = os.path.basename(sys.executable)


@pytest.fixture
def server() -> Iterator[ForkServer]:
    # numpy.random itself (numpy imports it lazily): its global generator, made in the server, is what forks share.
    started = ForkServer.spawn(["numpy.random"], title_room=200)
    try:
        yield started
    finally:
        started.close()


def run_script(server: ForkServer, tmp_path: Path, source: str, name: str = "train") -> ForkedProcess:
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    process = server.start_interpreter()
    order: dict[str, Any] = {
        "argv": [PYTHON, str(script)],
        "script": str(script),
        "args": [],
        "env": dict(os.environ),
        "stdout": str(tmp_path / f"{name}.out"),
        "stderr": str(tmp_path / f"{name}.err"),
    }
    assert process.stdin is not None
    process.stdin.write((json.dumps(order) + "\n").encode())
    process.stdin.close()
    return process


@pytest.mark.parametrize(
    ("source", "code", "stderr"),
    [
        ("import sys; sys.exit(3)", 3, ""),
        ("print('done')", 0, ""),
        ("import sys; sys.exit('bad input')", 1, "bad input\n"),
        ("raise ValueError('broken')", 1, "ValueError: broken"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, ""),
    ],
)
def test_a_forked_interpreter_ends_with_the_code_python_would(
    server: ForkServer, tmp_path: Path, source: str, code: int, stderr: str
) -> None:
    process = run_script(server, tmp_path, source)
    assert process.wait(timeout=30) == code
    assert process.poll() == code
    assert stderr in (tmp_path / "train.err").read_text()


def test_threads_are_joined_and_atexit_runs_before_the_end(server: ForkServer, tmp_path: Path) -> None:
    process = run_script(
        server,
        tmp_path,
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread', flush=True))).start()\n"
        "print('main', flush=True)\n",
    )
    assert process.wait(timeout=30) == 0
    assert (tmp_path / "train.out").read_text() == "main\nthread\natexit\n"


def test_each_interpreter_leads_its_session_and_a_signal_to_its_group_ends_it(server: ForkServer) -> None:
    process = server.start_interpreter()
    assert os.getpgid(process.pid) == process.pid and os.getsid(process.pid) == process.pid
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    os.killpg(process.pid, signal.SIGTERM)  # what torch's agent does to stop a training process
    assert process.wait(timeout=10) == -signal.SIGTERM


def test_an_interpreter_let_go_unused_ends_at_once(server: ForkServer) -> None:
    process = server.start_interpreter()
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(timeout=10) == 0


def test_forks_draw_different_random_numbers(server: ForkServer, tmp_path: Path) -> None:
    draw = "import random, numpy\nprint(random.random(), numpy.random.random())\n"
    first = run_script(server, tmp_path, draw, "first")
    second = run_script(server, tmp_path, draw, "second")
    assert first.wait(timeout=30) == second.wait(timeout=30) == 0
    a, b = ((tmp_path / f"{name}.out").read_text().split() for name in ("first", "second"))
    assert a[0] != b[0] and a[1] != b[1], (a, b)


def test_once_the_server_is_gone_the_pool_starts_new_processes(server: ForkServer, tmp_path: Path) -> None:
    running = run_script(server, tmp_path, "import time; time.sleep(1)")
    os.kill(server.server_pid, signal.SIGKILL)
    with pytest.raises(ForkServerGone):
        for _ in range(50):  # the first requests may still find the socket open
            server.start_interpreter().kill()
            time.sleep(0.1)
    assert not server.alive
    # Its children went to init, which reaps them: only that it ended can be told.
    assert running.wait(timeout=30) == UNKNOWN_EXIT
    pool = WarmPool(ranks=1, server=server)
    pool.fill()
    try:
        assert isinstance(pool._waiting[0], subprocess.Popen)
    finally:
        pool.close()


def test_the_server_ends_with_its_launcher_and_only_then(tmp_path: Path) -> None:
    # A launcher as the real one starts it: by a fork of itself before any thread.
    driver = (
        "import sys, time\n"
        "from phalanx.worker.forkserver import ForkServer\n"
        "server = ForkServer.fork([])\n"
        "process = server.start_interpreter()\n"
        "print(server.server_pid, process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        server_pid, waiting_pid = map(int, launcher.stdout.readline().split())
        server = psutil.Process(server_pid)
        assert server.ppid() == launcher.pid and psutil.Process(waiting_pid).ppid() == server_pid
        deadline = time.monotonic() + 10
        while SERVER_TITLE not in " ".join(server.cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert SERVER_TITLE in " ".join(server.cmdline())
        # A stop to the pod's process group is the launcher's to handle: the server outlives it.
        server.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.status() != psutil.STATUS_ZOMBIE
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
    # SIGKILL leaves no cleanup to the launcher: its end of the pair closes with it, and the server follows.
    _, alive = psutil.wait_procs([server], timeout=10)
    assert not alive, alive
