"""Live regroup: training processes that outlive their worker group.

When a worker dies, the survivors' training processes are healthy: only their process group is broken. With
live regroup the launcher keeps them and hands them the next group instead of killing them and starting new
ones, which saves the interpreter start, the imports and the set-up of every survivor (what torchft and
NVIDIA's in-process restart do too). The training script opts in by running its per-group part through
:func:`run_groups`:

    def train_in_group() -> Summary:        # builds DDP, restores the state, trains until done
        ...
        for step in ...:
            ...
            livegroup.check()                # at each step boundary: leave when the launcher asks

    summary = livegroup.run_groups(train_in_group)

`run_groups` joins the group (from the launcher's environment the first time), runs the body, and when the
body fails because a peer left (a collective's connection closed) or the launcher asked it to leave, tears
the process group down, tells the launcher, waits for the next group's ranks and runs the body again. Any
other error ends the process as before. The body restores its state at the start of every group (from this
process's in-memory snapshot, a peer's, or the disk), so nothing is lost between groups.

The launcher and its training processes talk through files in the status folder (`PHALANX_STATUS_DIR`):

- `live-joined-<local rank>.json` {attempt, pid}: the process runs in the launcher's group `attempt` and can
  be regrouped live (without it, or for another attempt, the launcher kills and restarts as before);
- `live-leave.json` {attempt}: the launcher asks the processes of group `attempt` to leave at their next step
  boundary (the group must re-form: a node joins, the operator's regroup request);
- `live-left-<local rank>.json` {attempt, reason}: the process has left group `attempt` and waits;
- `live-assign-<local rank>.json` {attempt, env}: the next group: its attempt and the torchrun variables
  (RANK, WORLD_SIZE, MASTER_ADDR, ...) the process sets before it joins.

Every file is replaced atomically. Live regroup is on when the launcher sets `PHALANX_LIVE_REGROUP=1` (its
default); outside the launcher `run_groups` joins once from the environment (or runs without a group) and
never waits.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from phalanx.worker.heartbeat import GROUP_ATTEMPT_ENV, STATUS_DIR_ENV

LIVE_ENV = "PHALANX_LIVE_REGROUP"
"""`1`: the launcher hands live processes their next group (set by the launcher for its training processes)."""
ASSIGN_WAIT_ENV = "PHALANX_LIVE_ASSIGN_TIMEOUT"
"""Seconds a process that left its group waits for the next one before it gives up (default: twice the
rendezvous join timeout)."""
POLL_SECONDS = 0.01

PEER_LOST_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Socket closed",
)
"""What a collective's error says when another member of the group went away (gloo, NCCL)."""

T = TypeVar("T")


class LeaveGroup(Exception):
    """The launcher asked this process to leave its group at a step boundary (raised by :func:`check`)."""


# --------------------------------------------------------------------------------------- the files


def joined_file(directory: Path, local_rank: int) -> Path:
    return directory / f"live-joined-{local_rank}.json"


def left_file(directory: Path, local_rank: int) -> Path:
    return directory / f"live-left-{local_rank}.json"


def assign_file(directory: Path, local_rank: int) -> Path:
    return directory / f"live-assign-{local_rank}.json"


def leave_file(directory: Path) -> Path:
    return directory / "live-leave.json"


def _write(path: Path, content: Mapping[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(dict(content)))
    os.replace(temporary, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def _attempt_in(path: Path) -> int | None:
    content = _read(path)
    attempt = content.get("attempt") if content else None
    return attempt if isinstance(attempt, int) else None


# ------------------------------------------------------------------------------- the launcher's side


def joined_attempt(directory: Path, local_rank: int) -> int | None:
    """The group attempt the process of `local_rank` last joined live (None: it never did)."""
    return _attempt_in(joined_file(directory, local_rank))


def left_attempt(directory: Path, local_rank: int) -> int | None:
    """The group attempt the process of `local_rank` last left (None: it never left one)."""
    return _attempt_in(left_file(directory, local_rank))


def any_left(directory: Path, attempt: int) -> bool:
    """Whether some training process has left group `attempt`: the group is over, whoever has noticed yet."""
    return any(_attempt_in(path) == attempt for path in directory.glob("live-left-*.json"))


def left_reason(directory: Path, local_rank: int) -> str:
    content = _read(left_file(directory, local_rank)) or {}
    return str(content.get("reason") or "")


def request_leave(directory: Path, attempt: int) -> None:
    """Ask the processes of group `attempt` to leave it at their next step boundary."""
    _write(leave_file(directory), {"attempt": attempt, "at": time.time()})


def assign(directory: Path, local_rank: int, attempt: int, env: Mapping[str, str]) -> None:
    """Hand the process of `local_rank` its next group."""
    _write(assign_file(directory, local_rank), {"attempt": attempt, "env": dict(env)})


def clear(directory: Path) -> None:
    """Forget every process's files (new processes start): stale ones must not speak for them."""
    for path in directory.glob("live-*.json"):
        with contextlib.suppress(OSError):
            path.unlink()


# -------------------------------------------------------------------------- the training process's side


def peer_lost(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another member of the group went away."""
    text = str(error)
    return any(sign in text for sign in PEER_LOST_SIGNS)


@dataclass
class LiveGroup:
    """This process's membership: which group it is in, and the folder it talks to the launcher through."""

    directory: Path | None
    """The status folder (None: not under a launcher that regroups live)."""
    local_rank: int
    attempt: int | None = None
    """The launcher's group attempt this process is in (None: not in one)."""
    assign_timeout: float = 600.0
    group_timeout: timedelta | None = None
    """The timeout the process groups are created with (how long a failed one's threads may still wait)."""
    _leave_mtime: float = 0.0
    _releaser: Releaser | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LiveGroup:
        env = os.environ if env is None else env
        directory = env.get(STATUS_DIR_ENV) if env.get(LIVE_ENV) == "1" else None
        join_timeout = float(env.get("PHALANX_RDZV_JOIN_TIMEOUT") or 300)
        return cls(
            Path(directory) if directory else None,
            int(env.get("LOCAL_RANK", "0")),
            assign_timeout=float(env.get(ASSIGN_WAIT_ENV) or 2 * join_timeout),
        )

    @property
    def live(self) -> bool:
        return self.directory is not None

    def next_assignment(self) -> dict[str, str]:
        """The environment of the group to join: the process's own the first time, then what the launcher
        assigns for a later attempt (waits for it)."""
        if self.attempt is None or self.directory is None:
            return {}
        path = assign_file(self.directory, self.local_rank)
        deadline = time.monotonic() + self.assign_timeout
        while True:
            content = _read(path)
            if content and isinstance(content.get("attempt"), int) and content["attempt"] > self.attempt:
                return {str(key): str(value) for key, value in dict(content.get("env") or {}).items()}
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no new worker group within {self.assign_timeout:g}s after leaving group {self.attempt}"
                )
            time.sleep(POLL_SECONDS)

    def join(self, backend: str | None = None, timeout: timedelta | None = None) -> None:
        """Join the next group: set its variables and initialise the default process group (if the
        environment names one)."""
        import torch.distributed as dist

        self.group_timeout = timeout
        os.environ.update(self.next_assignment())
        attempt_text = os.environ.get(GROUP_ATTEMPT_ENV, "")
        self.attempt = int(attempt_text) if attempt_text.isdigit() else 0
        if "MASTER_ADDR" in os.environ and not dist.is_initialized():
            chosen = backend or default_backend()
            device = eager_device(chosen, self.local_rank)
            # With the device named, NCCL's communicator is made now, while the group forms, not at the first
            # collective of the first step.
            dist.init_process_group(backend=chosen, timeout=timeout, device_id=device)
        if self.directory is not None:
            self._leave_mtime = _mtime(leave_file(self.directory))
            _write(
                joined_file(self.directory, self.local_rank), {"attempt": self.attempt, "pid": os.getpid()}
            )
            joined = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
            if joined is not None and releases_by_abort(joined):
                self._releaser = Releaser(self.directory, self.attempt, joined)
                self._releaser.start()

    def leave_requested(self) -> bool:
        """The launcher asked the processes of this group to leave (cheap enough for every step)."""
        if self.directory is None or self.attempt is None:
            return False
        path = leave_file(self.directory)
        mtime = _mtime(path)
        if mtime == self._leave_mtime:
            return False
        self._leave_mtime = mtime
        requested = _attempt_in(path)
        return requested is not None and requested >= self.attempt

    def leave(self, reason: str) -> None:
        """Tell the launcher this process waits for the next group, then tear the old group down: the launcher
        forms the next group meanwhile, so the teardown (an NCCL abort takes about a second) is not waited for
        on its own."""
        import torch.distributed as dist

        releaser, self._releaser = self._releaser, None
        if releaser is not None:
            releaser.stop()
        if self.directory is not None and self.attempt is not None:
            _write(
                left_file(self.directory, self.local_rank),
                {"attempt": self.attempt, "reason": reason[:500], "at": time.time()},
            )
        if dist.is_initialized():
            old = dist.distributed_c10d._get_default_group()
            # Abort first: work still queued in the old group would otherwise wait for the lost peer until the
            # group's timeout. A group whose peer is gone may fail to shut down cleanly: what matters is that
            # it is gone.
            if releaser is None or not releaser.aborted:
                with contextlib.suppress(Exception):
                    old.abort()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            _retire(old, self.group_timeout)


def default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def eager_device(backend: str, local_rank: int) -> Any:
    """The accelerator a group of `backend` binds at once (`device_id`): this process's GPU by torchrun's
    convention (LOCAL_RANK), when the backend takes CUDA tensors; else None (gloo makes no communicator)."""
    import torch

    takes_cuda = backend == "nccl" or "cuda:" in backend
    if not takes_cuda or not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
        return None
    return torch.device("cuda", local_rank)


def releases_by_abort(process_group: Any) -> bool:
    """Whether a collective of `process_group` stuck on a lost peer is released only by an abort: NCCL notices
    no lost peer and waits until the collective's timeout; gloo's connection closes with the peer."""
    from phalanx.worker.devices import device_types

    return "cuda" in device_types(process_group)


RELEASE_POLL_SECONDS = 0.05


class Releaser(threading.Thread):
    """While a process trains in a group whose stuck collectives only an abort releases: as soon as the
    launcher asks the group to leave, abort it from this thread. A training thread stuck in a collective with a
    lost peer is then released at once, instead of at the collective's timeout (minutes); one in a healthy step
    leaves at the error instead of at its step boundary, which costs at most that step, restored from the
    snapshot like any other."""

    def __init__(self, directory: Path, attempt: int, process_group: Any) -> None:
        super().__init__(name="phalanx-live-release", daemon=True)
        self.directory = directory
        self.attempt = attempt
        self.process_group = process_group
        self.aborted = False
        self._stopped = threading.Event()

    def run(self) -> None:
        path = leave_file(self.directory)
        while not self._stopped.wait(RELEASE_POLL_SECONDS):
            requested = _attempt_in(path)
            if requested is None or requested < self.attempt:
                continue
            self.aborted = True
            with contextlib.suppress(Exception):
                self.process_group.abort()
            return

    def stop(self) -> None:
        """The training thread leaves by itself: stop watching (an abort under way finishes first)."""
        self._stopped.set()
        self.join()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


_current: LiveGroup | None = None


def current() -> LiveGroup | None:
    """The membership of this process while :func:`run_groups` runs (None outside it)."""
    return _current


def check() -> None:
    """At a step boundary: leave the group now if the launcher asked (raises :class:`LeaveGroup`)."""
    group = _current
    if group is not None and group.leave_requested():
        raise LeaveGroup(f"the launcher re-forms group {group.attempt}")


def run_groups(
    body: Callable[[], T],
    backend: str | None = None,
    timeout: timedelta | None = None,
    membership: LiveGroup | None = None,
) -> T:
    """Run `body` in one worker group after another until it returns (see the module's docstring)."""
    global _current
    group = membership or LiveGroup.from_env()
    _current = group
    try:
        while True:
            group.join(backend, timeout)
            try:
                return body()
            except Exception as error:
                if not group.live or not (isinstance(error, LeaveGroup) or peer_lost(error)):
                    raise
                reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                group.leave(reason)
            # The failed group's wrappers (a DDP reducer's gradient hooks on the parameters) must be gone before
            # the next group's are built; reference cycles would keep them until some later collection.
            gc.collect()
    finally:
        _current = None


RETIRED_DEFAULT_SECONDS = 1800.0
"""How long a failed process group is kept when its timeout is not known (torch's default timeout)."""
_retired: list[tuple[float, Any]] = []


def _retire(process_group: Any, timeout: timedelta | None) -> None:
    """Keep the failed process group alive until its own timeout has passed.

    Work of the old group may still wait on the lost peer in gloo's threads; the last reference to the group
    going away (with the DDP wrapper that holds it, when the failed step's frames are freed) would join them,
    in C++ teardown that holds the interpreter, until that timeout. After it those threads have given up and
    the group goes quietly. The wrapper itself must go at once: its gradient hooks on the parameters would
    fire in the next group too. Only the group's own small state is kept."""
    now = time.monotonic()
    keep = timeout.total_seconds() if timeout is not None else RETIRED_DEFAULT_SECONDS
    _retired[:] = [(since, kept) for since, kept in _retired if now - since < keep]
    _retired.append((now, process_group))
