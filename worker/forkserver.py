"""A fork server for warm training processes: torch imported once per pod, every warm interpreter a fork.

A warm interpreter (worker/warmstart.py) saves a recovery the seconds a new Python process spends importing
torch, but started as a new process it pays them itself: seconds of CPU and some 600 MB per local rank,
again after every recovery that used one, on the node's busiest moments. The launcher has already imported
torch. So before it starts any thread it forks once: the fork (the server) imports what a training script
needs beyond the launcher's own imports and then only forks on request. Each fork is a warm interpreter,
ready in milliseconds, its memory shared with the server until written.

The server's children are its own: it reaps them and reports each exit code to the launcher over a
SOCK_SEQPACKET pair, next to the replies to fork requests, which carry the write end of the new
interpreter's order pipe (SCM_RIGHTS). A `ForkedProcess` gives torch's agent what it uses of a `Popen`:
`pid`, `poll`, `wait`, `send_signal`, `kill`, `stdin`. Each warm interpreter leads its own session, as torch
starts its training processes, so torch's `killpg` reaches it and whatever it starts.

Messages, one per datagram: the launcher sends `fork`; the server answers `spawned <pid>` (with the fd) and,
whenever a child ends, `exited <pid> <code>` (`code` as `Popen.returncode`: negative for a signal). The server
ends when the launcher's end of the pair closes, the launcher's death included.

`python -m phalanx.worker.forkserver --fd N` serves on an inherited socket from a new interpreter instead: for
a caller that cannot fork safely (threads already running), such as the tests.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import IO, Any, NoReturn

from phalanx.worker.trainerwatch import process_state

logger = logging.getLogger("phalanx.launch")

FORK = b"fork"
SPAWNED = "spawned"
EXITED = "exited"
REPLY_TIMEOUT_SECONDS = 10.0
"""How long the launcher waits for the server to answer a fork request before it starts cold instead."""
MESSAGE_BYTES = 256
SERVER_TITLE = "phalanx-warmstart fork server"
WAITING_TITLE = "phalanx-warmstart waiting interpreter"
UNKNOWN_EXIT = 1
"""The exit code given to a warm interpreter that ended after its server died (its real code is lost)."""


class ForkServerGone(RuntimeError):
    """The server ended: no more warm interpreters from it."""


# ----------------------------------------------------------------------------------------- launcher side


class ForkServer:
    """The launcher's end: asks for warm interpreters and learns when they end."""

    def __init__(
        self, channel: socket.socket, server_pid: int, process: subprocess.Popen[bytes] | None
    ) -> None:
        self._channel = channel
        self.server_pid = server_pid
        self._process = process
        self._lock = threading.Lock()
        self._exit_codes: dict[int, int] = {}
        self._spawned: list[tuple[int, int]] = []
        self._gone = False

    @classmethod
    def fork(cls, preload: Sequence[str]) -> ForkServer:
        """Fork the server from this process: call it before this process starts any thread (a thread
        holding a lock at the fork would leave it held forever in the server and its children)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else what they hold would be written once more by every fork's exit
        pid = os.fork()
        if pid == 0:
            ours.close()
            serve(theirs, preload)
        theirs.close()
        return cls(ours, pid, None)

    @classmethod
    def spawn(cls, preload: Sequence[str], title_room: int = 0) -> ForkServer:
        """Start the server as a new interpreter (for a caller that may already run threads). `title_room`:
        characters of command line to reserve for the titles of the training processes."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        room = [f"--title-room={'_' * title_room}"] if title_room else []
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phalanx.worker.forkserver",
                "--fd",
                str(theirs.fileno()),
                *room,
                *preload,
            ],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        return cls(ours, process.pid, process)

    @property
    def alive(self) -> bool:
        return not self._gone

    def start_interpreter(self) -> ForkedProcess:
        """A new warm interpreter waiting for its order; ForkServerGone when the server cannot give one."""
        with self._lock:
            if self._gone:
                raise ForkServerGone("the fork server has ended")
            try:
                self._channel.send(FORK)
            except OSError as error:
                self._gone = True
                raise ForkServerGone(f"the fork server has ended: {error}") from error
            deadline = time.monotonic() + REPLY_TIMEOUT_SECONDS
            while not self._spawned:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._receive(remaining):
                    raise ForkServerGone("the fork server did not answer")
            pid, order_fd = self._spawned.pop(0)
        return ForkedProcess(self, pid, os.fdopen(order_fd, "wb"))

    def exit_code(self, pid: int, timeout: float = 0.0) -> int | None:
        """The exit code of the server's child `pid` once it ended (waiting up to `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                while self._receive(0):
                    pass
                if pid in self._exit_codes:
                    return self._exit_codes[pid]
                if self._gone:
                    return _exit_code_without_server(pid)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._receive(remaining)

    def _receive(self, timeout: float) -> bool:
        """Take in one message if one comes within `timeout` seconds (0: only one already there). Call
        with the lock held. False when none came or the server is gone."""
        if self._gone:
            return False
        ready, _, _ = select.select([self._channel], [], [], max(timeout, 0))
        if not ready:
            return False
        try:
            message, fds, _flags, _address = socket.recv_fds(self._channel, MESSAGE_BYTES, 1)
        except OSError:
            message, fds = b"", []
        if not message:
            self._gone = True
            return False
        kind, *fields = message.decode().split()
        if kind == SPAWNED and fds:
            self._spawned.append((int(fields[0]), fds[0]))
        elif kind == EXITED:
            self._exit_codes[int(fields[0])] = int(fields[1])
        else:
            for fd in fds:
                os.close(fd)
        return True

    def close(self) -> None:
        """Let the server go: it ends once its end of the pair reads the close."""
        with self._lock:
            self._gone = True
            for _pid, fd in self._spawned:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._spawned.clear()
            self._channel.close()
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
                return
            self._process.kill()
        else:
            _reap(self.server_pid, timeout=5)


def _exit_code_without_server(pid: int) -> int | None:
    """After the server's death its children belong to the nearest reaper: this process when it is one (the
    container's PID 1, say), which then learns the real code; otherwise only whether one still runs can be
    told."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    else:
        return os.waitstatus_to_exitcode(status) if done else None
    state = process_state(pid)
    return UNKNOWN_EXIT if state is None or state in ("Z", "X") else None


def _reap(pid: int, timeout: float) -> None:
    """Wait for this process's child `pid` to end (killing it after `timeout` seconds) and reap it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class ForkedProcess:
    """A warm interpreter the server forked, as torch's agent and the warm pool use a `Popen`."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[bytes]) -> None:
        self.server = server
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        """The order pipe: one JSON line, then closed (closed without a line, the interpreter ends)."""
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            step = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if step <= 0:
                raise subprocess.TimeoutExpired(f"warm interpreter {self.pid}", timeout or 0.0)
            self.returncode = self.server.exit_code(self.pid, timeout=step)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ------------------------------------------------------------------------------------------- server side


def serve(channel: socket.socket, preload: Sequence[str]) -> NoReturn:
    """The server's life: never returns (its exit skips the launcher's teardown it inherited by the fork)."""
    try:
        _become_server(preload)
        _serve_requests(channel)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    os._exit(0)


def _become_server(preload: Sequence[str]) -> None:
    # Nothing the launcher set up before the fork is the server's to run at its exit.
    atexit._clear()
    # A stop signal to the pod's process group (Ctrl-C, a runtime's SIGTERM) is the launcher's to handle: the
    # server must outlive the training processes' shutdown, whose exit codes only it can learn. It ends when
    # the launcher's end of the pair closes, which any end of the launcher does.
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    set_title(SERVER_TITLE)
    for name in preload:
        with contextlib.suppress(ImportError):
            __import__(name)


def set_title(title: str) -> None:
    """What a process list shows for this process. Only the command line's own room is used (SPT_NOENV): the
    environment stays readable in /proc, where the node's runtime tells containers apart."""
    os.environ["SPT_NOENV"] = "1"
    import setproctitle

    setproctitle.setproctitle(title)


def _serve_requests(channel: socket.socket) -> None:
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    # A Python handler (doing nothing) so that a child's end writes to the wake-up pipe.
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    inherited = (channel.fileno(), wake_read, wake_write)
    while True:
        ready, _, _ = select.select([channel.fileno(), wake_read], [], [])
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_read, 512):
                    pass
        _report_exits(channel)
        if channel.fileno() in ready:
            request = channel.recv(MESSAGE_BYTES)
            if not request:
                return
            if request == FORK:
                _fork_interpreter(channel, inherited)


def _report_exits(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel.send(f"{EXITED} {pid} {os.waitstatus_to_exitcode(status)}".encode())


def _fork_interpreter(channel: socket.socket, inherited: tuple[int, ...]) -> None:
    order_read, order_write = os.pipe()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd in (*inherited, order_write, ready_read):
                os.close(fd)
            code = _interpreter(order_read, ready_write)
        finally:
            os._exit(code)
    os.close(order_read)
    os.close(ready_write)
    try:
        # Answer once it leads its session: from then on a signal to its group (torch's way) reaches it.
        os.read(ready_read, 1)
        socket.send_fds(channel, [f"{SPAWNED} {pid}".encode()], [order_write])
    finally:
        os.close(ready_read)
        os.close(order_write)


def _interpreter(order_read: int, ready_write: int) -> int:
    """A warm interpreter's life: wait for the order, run it as `python` would, end as `python` would."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()  # as torch starts its training processes: its killpg reaches this one and its children
    os.write(ready_write, b"r")
    os.close(ready_write)
    set_title(WAITING_TITLE)
    _fresh_random_state()
    with os.fdopen(order_read, "rb") as orders:
        line = orders.readline()
    if not line.strip():
        return 0  # let go unused
    from phalanx.worker import warmstart

    return run_as_main(lambda: warmstart.take_over(json.loads(line)))


def _fresh_random_state() -> None:
    """Every fork would otherwise draw the same numbers from numpy's global generator (seeded once, at the
    server's import): a new process seeds it anew. Python's `random` reseeds itself after a fork."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        with contextlib.suppress(Exception):
            numpy_random.seed()


def run_as_main(run: Callable[[], Any]) -> int:
    """Run a program's `__main__` in this forked interpreter and end it as the interpreter would end: the
    exit code of `sys.exit` (or 1 after an uncaught exception, with its traceback), non-daemon threads joined,
    `atexit` functions run, standard streams flushed."""
    code = 0
    try:
        run()
    except SystemExit as stop:
        code = _system_exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as python ends on an uncaught Ctrl-C: by the signal
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish()
    return code


def _system_exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as at interpreter exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.worker.forkserver", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--fd", type=int, required=True, help="the inherited SOCK_SEQPACKET socket to serve on"
    )
    parser.add_argument("--title-room", default="", help="room kept on the command line for titles")
    parser.add_argument("preload", nargs="*", help="modules to import before serving")
    args = parser.parse_args(argv)
    serve(socket.socket(fileno=args.fd), args.preload)


if __name__ == "__main__":
    sys.exit(main())
