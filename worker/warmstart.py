"""Warm training processes: interpreters that imported torch before they are needed.

Every recovery restarts the training processes of every pod in the group (torchrun's rule: a new group,
new processes), and a new Python process spends seconds importing torch before the user's script runs its
first line: on a busy node that was most of a recovery once the regroup itself took under two seconds.

So the launcher keeps, for each local rank, one interpreter that has already imported torch and waits on
its stdin (`python -m phalanx.worker.warmstart`). When torch's agent starts a training process for a
command this module can run (`python -m MODULE ...` or `python SCRIPT ...` with the launcher's own
interpreter), the launcher hands the waiting interpreter the process's arguments, environment and log files
as one JSON line instead of starting a new process; the interpreter takes them over and runs the module or
script as `__main__`, exactly as `python` would have. Anything else (another interpreter, interpreter
options other than `-u`, a binary) starts cold, as before. A used interpreter is replaced a few seconds
later, once the new group got going.

The launcher forks its waiting interpreters from a fork server (worker/forkserver.py) that it forked itself
after importing torch: a replacement then costs milliseconds and shares its memory with the launcher's
until written. Without a server (or once it is gone) each waiting interpreter is a new process that imports
torch itself, costing the CPU and memory of an idle `import torch`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import runpy
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from phalanx.worker.forkserver import ForkServer, ForkServerGone, set_title

logger = logging.getLogger("phalanx.launch")

PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo")
"""What a waiting interpreter imports: the seconds every training process would otherwise spend. torch's
optimizers import `torch._dynamo` when the first one is built (about 1 s of CPU, some 70 MB): paid here,
off the recovery's critical path, instead of in every new trainer."""
CLOSE_WAIT_SECONDS = 1.0
"""How long a waiting interpreter let go has to end before it is killed (it has nothing to save): the
launcher's own exit, and so every pod's shutdown, waits for it."""
REFILL_DELAY = 5.0
"""Seconds between handing out an interpreter and starting its replacement (not while the group starts)."""


# ---------------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Target:
    """What a training command runs: a module (`-m`) or a script, its arguments, and `-u`."""

    module: str | None
    script: str | None
    args: tuple[str, ...]
    unbuffered: bool = False


def same_interpreter(entrypoint: str, path: str | None) -> bool:
    """Whether `entrypoint` (as found on `path`) is the interpreter this process runs."""
    found = entrypoint if os.sep in entrypoint else shutil.which(entrypoint, path=path)
    if not found:
        return False
    with contextlib.suppress(OSError):
        return os.path.samefile(found, sys.executable)
    return False


def warm_target(argv: Sequence[str], path: str | None) -> Target | None:
    """The module or script a training command runs, when a warm interpreter can run it; else None."""
    if not argv or not same_interpreter(argv[0], path):
        return None
    rest, unbuffered = list(argv[1:]), False
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] != "-u":
            return None  # interpreter options a running interpreter cannot take on
        unbuffered = True
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return Target(rest[1], None, tuple(rest[2:]), unbuffered)
    if rest and rest[0] != "-" and not rest[0].startswith("-"):
        return Target(None, rest[0], tuple(rest[1:]), unbuffered)
    return None


# ------------------------------------------------------------------------------------ the waiting side


def _redirect(path: str | None, fd: int) -> None:
    if not path:
        return
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def take_over(order: Mapping[str, Any]) -> None:
    """Become the training process `order` describes (its command line as `ps` shows it, environment,
    logs, `sys.argv`) and run it."""
    if order.get("argv"):
        # What a process list shows must be the training command, not this module: operators (and tools
        # that find trainers by their command line) look for the former. The pool reserves the room for it.
        set_title(" ".join(order["argv"]))
    _redirect(order.get("stdout"), 1)
    _redirect(order.get("stderr"), 2)
    if order.get("unbuffered"):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(write_through=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(order["env"])
    module, script, args = order.get("module"), order.get("script"), list(order.get("args") or [])
    if module:
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()  # as `python -m`: the working directory first
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif script:
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script`: its folder first
        runpy.run_path(script, run_name="__main__")
    else:
        raise ValueError(f"the order names neither a module nor a script: {order.get('argv')}")


def main() -> int:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    line = sys.stdin.readline()
    if not line.strip():
        # Let go unused: nothing to clean up, and the interpreter's own teardown of torch takes seconds,
        # which every pod's shutdown would wait for.
        os._exit(0)
    take_over(json.loads(line))
    return 0


# ------------------------------------------------------------------------------------- the launcher side


class Waiting(Protocol):
    """A waiting interpreter as the pool and torch's agent use it: a `Popen`, or a fork server's child."""

    pid: int
    stdin: Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class WarmPool:
    """One waiting interpreter per local rank, handed out to torch's agent and replaced after use."""

    def __init__(
        self,
        ranks: int,
        refill_delay: float = REFILL_DELAY,
        title_room: int = 0,
        server: ForkServer | None = None,
    ) -> None:
        self.ranks = ranks
        self.refill_delay = refill_delay
        self.title_room = title_room
        """Characters of command line to reserve for the training command's title (`take_over`) in an
        interpreter started as a new process."""
        self.server = server
        """Where waiting interpreters are forked from; None (or once it is gone): each is a new process."""
        self._waiting: dict[int, Waiting] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._refill: threading.Timer | None = None
        self._undo: Callable[[], None] | None = None

    def start(self) -> WarmPool:
        """Start the waiting interpreters and make torch's agent use them."""
        self.fill()
        self._undo = install(self)
        return self

    def fill(self) -> None:
        """Start a waiting interpreter for every local rank that has none (the launcher's environment)."""
        with self._lock:
            if self._closed:
                return
            for rank in range(self.ranks):
                waiting = self._waiting.get(rank)
                if waiting is None or waiting.poll() is not None:
                    self._waiting[rank] = self._start_interpreter()

    def _start_interpreter(self) -> Waiting:
        if self.server is not None and self.server.alive:
            try:
                return self.server.start_interpreter()
            except ForkServerGone as error:
                logger.warning("warm interpreters start as new processes from now on: %s", error)
        room = [f"--title-room={'_' * self.title_room}"] if self.title_room else []
        return subprocess.Popen(
            [sys.executable, "-m", "phalanx.worker.warmstart", *room],
            stdin=subprocess.PIPE,
            start_new_session=True,  # as torch starts its training processes
            env={**os.environ, "SPT_NOENV": "1"},
        )

    def take(self, rank: int, order: Mapping[str, Any]) -> Waiting | None:
        """The waiting interpreter of `rank`, now running `order`; None when none waits (start cold)."""
        with self._lock:
            process = self._waiting.pop(rank, None)
        if process is None or process.poll() is not None or process.stdin is None:
            return None
        try:
            process.stdin.write((json.dumps(order) + "\n").encode())
            process.stdin.close()
        except OSError:
            process.kill()
            return None
        self._schedule_refill()
        return process

    def _schedule_refill(self) -> None:
        with self._lock:
            if self._closed or (self._refill is not None and self._refill.is_alive()):
                return
            self._refill = threading.Timer(self.refill_delay, self.fill)
            self._refill.daemon = True
            self._refill.start()

    def close(self) -> None:
        """Give torch's agent back its own process start and let every waiting interpreter go (an empty
        line ends it)."""
        if self._undo is not None:
            self._undo()
            self._undo = None
        with self._lock:
            self._closed = True
            if self._refill is not None:
                self._refill.cancel()
            waiting, self._waiting = list(self._waiting.values()), {}
        for process in waiting:
            with contextlib.suppress(OSError, ValueError):
                if process.stdin is not None:
                    process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=CLOSE_WAIT_SECONDS)
                continue
            process.kill()


def install(pool: WarmPool) -> Callable[[], None]:
    """Make torch's agent hand training commands to `pool` where it can (see the module docstring).
    Returns what undoes it."""
    from phalanx.worker import torch_elastic
    from phalanx.worker.torch_elastic import SubprocessHandler

    class WarmSubprocessHandler(SubprocessHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._stdout_path = kwargs.get("stdout")
            self._stderr_path = kwargs.get("stderr")
            super().__init__(*args, **kwargs)

        def _popen(self, args: tuple, env: dict[str, str]) -> Any:
            target = warm_target([str(arg) for arg in args], env.get("PATH"))
            if target is not None:
                order = {
                    "argv": [str(arg) for arg in args],
                    "module": target.module,
                    "script": target.script,
                    "args": list(target.args),
                    "unbuffered": target.unbuffered,
                    "env": env,
                    "stdout": self._stdout_path,
                    "stderr": self._stderr_path,
                }
                started = time.monotonic()
                process = pool.take(self.local_rank_id, order)
                if process is not None:
                    logger.info(
                        "local rank %d: a warm interpreter (pid %d) took over in %.3fs",
                        self.local_rank_id,
                        process.pid,
                        time.monotonic() - started,
                    )
                    return process
            return super()._popen(args, env)

    original = torch_elastic.subprocess_handler_factory()

    def get_subprocess_handler(**kwargs: Any) -> SubprocessHandler:
        return WarmSubprocessHandler(**kwargs)

    torch_elastic.set_subprocess_handler_factory(get_subprocess_handler)

    def undo() -> None:
        torch_elastic.set_subprocess_handler_factory(original)

    return undo


if __name__ == "__main__":
    sys.exit(main())
