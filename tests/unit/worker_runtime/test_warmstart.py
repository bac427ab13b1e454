"""Warm training processes: which commands a waiting interpreter can take over, and that it runs them as
`python` would (arguments, environment, log files, exit code), also when torch's agent starts them; each
whether the interpreter is a new process or a fork server's child."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.worker.forkserver import ForkServer
from phalanx.worker.warmstart import PRELOAD, Target, WarmPool, warm_target

PATH = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
PYTHON = os.path.basename(sys.executable)


def test_only_commands_of_this_interpreter_are_taken_over() -> None:
    assert warm_target([PYTHON, "-m", "pkg.train", "--lr", "1"], PATH) == Target(
        "pkg.train", None, ("--lr", "1")
    )
    assert warm_target([sys.executable, "-u", "train.py", "-x"], None) == Target(
        None, "train.py", ("-x",), unbuffered=True
    )
    assert warm_target([PYTHON, "-O", "train.py"], PATH) is None  # an option a running interpreter lacks
    assert warm_target([PYTHON, "-c", "print(1)"], PATH) is None
    assert warm_target([PYTHON], PATH) is None
    assert warm_target(["/bin/sh", "train.sh"], PATH) is None
    assert warm_target(["no-such-python", "-m", "x"], PATH) is None


TITLE_ROOM = 400


@pytest.fixture(params=["new process", "fork server"])
def server(request: pytest.FixtureRequest) -> Iterator[ForkServer | None]:
    """Where the pool's interpreters come from. The launcher forks its server from itself; a test process runs
    threads, so here the server is a new interpreter serving the same way."""
    if request.param == "new process":
        yield None
        return
    started = ForkServer.spawn(PRELOAD, title_room=TITLE_ROOM)
    try:
        yield started
    finally:
        started.close()


def wait_exit(process: object, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (code := process.poll()) is None and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert code is not None, "the warm interpreter did not finish"
    return code


def test_a_waiting_interpreter_becomes_the_script_with_its_environment_and_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: ForkServer | None
) -> None:
    monkeypatch.setenv("WARM_MARKER", "1")  # in the environment it started with: /proc keeps showing it
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "import torch\n"  # already imported: the point of waiting
        "print('rank', os.environ['RANK'], sys.argv[1:], __name__, os.path.dirname(sys.path[0]) != '')\n"
        "print('to stderr', file=sys.stderr)\n"
        "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode(), file=sys.stderr)\n"
        "print(b'WARM_MARKER=1' in open('/proc/self/environ', 'rb').read().split(b'\\0'), file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    if server is not None:
        # The server started before the marker was set: its interpreters show the environment it started with.
        server.close()
        server = ForkServer.spawn(PRELOAD, title_room=TITLE_ROOM)
    pool = WarmPool(ranks=1, refill_delay=0.5, title_room=len(f"{PYTHON} {script} --steps 5"), server=server)
    pool.fill()
    try:
        order = {
            "argv": [PYTHON, str(script), "--steps", "5"],
            "module": None,
            "script": str(script),
            "args": ["--steps", "5"],
            "env": {**os.environ, "RANK": "7"},
            "stdout": str(tmp_path / "out.log"),
            "stderr": str(tmp_path / "err.log"),
        }
        process = pool.take(0, order)
        assert process is not None
        assert pool.take(0, order) is None  # taken once: the next start would be cold until the refill
        assert wait_exit(process) == 3
        assert (tmp_path / "out.log").read_text() == "rank 7 ['--steps', '5'] __main__ True\n"
        # What `ps` shows is the training command, as for a process started cold.
        # What `ps` shows is the training command, as for a process started cold, and the environment it
        # started with stays readable (the node's runtime tells containers apart by it).
        assert (tmp_path / "err.log").read_text() == f"to stderr\n{PYTHON} {script} --steps 5\nTrue\n"
        # A replacement waits shortly after.
        deadline = time.monotonic() + 10
        while not pool._waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0 in pool._waiting
    finally:
        pool.close()
        if server is not None:
            server.close()
    assert not pool._waiting


def test_a_module_runs_as_with_python_dash_m(tmp_path: Path, server: ForkServer | None) -> None:
    pool = WarmPool(ranks=1, server=server)
    pool.fill()
    try:
        order = {
            "module": "platform",
            "script": None,
            "args": [],
            "env": dict(os.environ),
            "stdout": str(tmp_path / "out"),
        }
        process = pool.take(0, order)
        assert process is not None and wait_exit(process) == 0
        assert "Linux" in (tmp_path / "out").read_text()
    finally:
        pool.close()


@pytest.mark.parametrize("start", ["cold", "warm", "forked"])
def test_torch_agents_processes_start_warm_and_report_as_before(tmp_path: Path, start: str) -> None:
    warm = start != "cold"
    server = ForkServer.spawn(PRELOAD) if start == "forked" else None
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes

    script = tmp_path / "worker.py"
    # Rank 1 fails only once rank 0 has exited 0: torch's agent stops the other ranks of a failed group, so a
    # rank 0 still running then (a loaded machine) would end by its SIGTERM and count as failed too.
    script.write_text(
        "import os, sys, time\n"
        f"marker = {str(tmp_path / 'rank0.pid')!r}\n"
        "rank = int(os.environ['LOCAL_RANK'])\n"
        "print('local rank', rank)\n"
        "if rank == 0:\n"
        "    open(marker + '.tmp', 'w').write(str(os.getpid())); os.rename(marker + '.tmp', marker)\n"
        "    sys.exit(0)\n"
        "def rank0_gone():\n"
        "    try:\n"
        "        pid = open(marker).read()\n"
        "    except FileNotFoundError:\n"
        "        return False\n"
        "    try:\n"
        "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] in 'ZX'\n"
        "    except FileNotFoundError:\n"
        "        return True\n"
        "deadline = time.monotonic() + 30\n"
        "while not rank0_gone() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "sys.exit(rank)\n"
    )
    pool = WarmPool(ranks=2, server=server).start() if warm else None
    try:
        context = start_processes(
            name="trainer",
            entrypoint=sys.executable,
            args={0: (str(script),), 1: (str(script),)},
            envs={0: {"LOCAL_RANK": "0"}, 1: {"LOCAL_RANK": "1"}},
            logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs"), redirects=Std.ALL),
        )
        taken = [] if pool is None else [rank for rank in (0, 1) if rank not in pool._waiting]
        deadline = time.monotonic() + 60
        while (result := context.wait(timeout=1)) is None and time.monotonic() < deadline:
            pass
        assert result is not None and result.is_failed()
        assert set(result.failures) == {1}  # rank 1 exited 1, rank 0 succeeded
        assert result.failures[1].exitcode == 1
        stdouts = sorted((tmp_path / "logs").rglob("stdout.log"))
        assert [path.read_text() for path in stdouts] == ["local rank 0\n", "local rank 1\n"]
        assert taken == ([0, 1] if warm else [])
        context.close()
    finally:
        if pool is not None:
            pool.close()
        if server is not None:
            server.close()


def test_the_preload_leaves_a_training_script_nothing_heavy_to_import() -> None:
    # torch's optimizers import torch._dynamo (about a second) when the first one is built: a warm
    # interpreter pays that before it is needed. Building a model, its optimizer and DDP adds no torch module.
    import ast
    import subprocess

    from phalanx.worker.warmstart import PRELOAD

    probe = (
        "import sys\n"
        f"for name in {PRELOAD!r}: __import__(name)\n"
        "before = {m for m in sys.modules if m.startswith('torch')}\n"
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "model = torch.nn.Linear(4, 4)\n"
        "torch.optim.AdamW(model.parameters()); torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "print(sorted({m for m in sys.modules if m.startswith('torch')} - before))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    imported = ast.literal_eval(out.stdout.strip())
    assert not [name for name in imported if name.startswith("torch._dynamo")], imported
