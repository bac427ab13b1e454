"""The one door to torch's elastic internals: everything the launcher takes from torchrun's machinery.

The launcher (worker/launch.py and its helpers) subclasses torchrun's agent and reaches into the c10d
rendezvous: the handler's state holder, node, store and settings, the op executor's settings, the
executor's one-second poll delay, and the agent's subprocess factory. None of that is public API and any
torch release may move it, so it is imported or reached from this module only (a unit test keeps other
worker modules from importing `torch.distributed.elastic`), and importing this module first checks the
torch version: outside the supported range (worker/torch_support.py) it raises `UnsupportedTorchError`,
which the launcher reports in one line with its bad-setup exit code, instead of failing later somewhere
inside torch. tests/unit/worker_runtime/test_torch_elastic.py pins each internal on the installed torch.

Public torch API (`torch.distributed`, its TCPStore) is used where it is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from phalanx.worker import safepickle
from phalanx.worker.torch_support import require_supported

# Before any internal is imported: on an unsupported torch, the imports below may fail in ways that say
# nothing about the cause.
require_supported(torch.__version__)

# The imports below follow the version check on purpose.
# ruff: noqa: E402
from torch.distributed import Store
from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing import api as _multiprocessing_api
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import (
    SubprocessHandler,
)
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    dynamic_rendezvous,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousSettings,
    RendezvousTimeout,
)

__all__ = [
    "AGENT_HOOKS",
    "LOGGER_NAME",
    "C10dRendezvousBackend",
    "CheckedBackend",
    "DefaultLogsSpecs",
    "DynamicRendezvousHandler",
    "LauncherStoreHandler",
    "LocalElasticAgent",
    "RendezvousBackend",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousSettings",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
    "RunResult",
    "SignalException",
    "SubprocessHandler",
    "WorkerSpec",
    "WorkerState",
    "guard_joins",
    "handler_settings",
    "node_of",
    "replace_handler_settings",
    "round_state",
    "set_state_cache",
    "set_subprocess_handler_factory",
    "set_sync_delay",
    "state_backend",
    "state_holder",
    "stop_keep_alives",
    "subprocess_handler_factory",
    "swap_store",
    "sync_delay",
]

LOGGER_NAME = "torch.distributed.elastic"
"""The logger torchrun's agent and rendezvous log through (quiet unless the launcher runs verbose)."""

AGENT_HOOKS = (
    "_invoke_run",
    "_rendezvous",
    "_start_workers",
    "_stop_workers",
    "_initialize_workers",
    "_monitor_workers",
    "_exit_barrier",
)
"""The agent's protected methods the launcher's agent overrides or calls (with the attributes `_pcontext`,
`_worker_group` and `_remaining_restarts` that torch's agent sets): how torch means its agent to be extended,
but not public API either."""


# ------------------------------------------------------------------------- the rendezvous handler


class CheckedBackend(C10dRendezvousBackend):
    """torch's c10d rendezvous backend, with every state it reads checked before torch unpickles it.

    torch keeps the rendezvous state in the store as a pickle and unpickles whatever it reads there. Here
    that state must name nothing but what torch's state is made of (`safepickle.RENDEZVOUS_STATE`), so
    whoever can write to the store cannot run code in the launchers: a state naming anything else raises
    `safepickle.RefusedPickle`, which the launcher reports and exits on."""

    def get_state(self) -> tuple[bytes, Any] | None:
        current = super().get_state()
        if current is not None:
            safepickle.loads(current[0], safepickle.RENDEZVOUS_STATE)
        return current

    def set_state(self, state: bytes, token: Any | None = None) -> tuple[bytes, Any, bool] | None:
        result = super().set_state(state, token)
        if result is not None and not result[2]:  # another's state came back instead of ours
            safepickle.loads(result[0], safepickle.RENDEZVOUS_STATE)
        return result


class LauncherStoreHandler(DynamicRendezvousHandler):
    """torch's rendezvous handler, telling the training processes that their store is hosted for them
    (TORCHELASTIC_USE_AGENT_STORE=True: every rank connects as a client; none hosts one of its own).

    torch ties that word to sharing the rendezvous store itself; here the launcher of node rank 0 hosts a
    fresh store per attempt behind the job's gate (worker/attemptstore.py), and torch's own sharing stays
    off (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)."""

    @property
    def use_agent_store(self) -> bool:
        return True


def node_of(handler: DynamicRendezvousHandler) -> Any:
    """This launcher's node in the rendezvous (torch's `_NodeDesc`: addr, pid, local_id)."""
    return handler._this_node


def stop_keep_alives(handler: DynamicRendezvousHandler) -> None:
    """Stop the handler's keep-alive thread (torch's `_stop_heartbeats`): a node leaving the group must not
    refresh its place in it after it was expired."""
    handler._stop_heartbeats()


def state_holder(handler: DynamicRendezvousHandler) -> Any:
    """What keeps the handler's copy of the shared rendezvous state (`sync()` re-reads it, `state` is it)."""
    return handler._state_holder


def round_state(handler: DynamicRendezvousHandler) -> Any:
    """The handler's local copy of the rendezvous state (round, complete, participants, wait list, ...)."""
    return state_holder(handler).state


def state_backend(handler: DynamicRendezvousHandler) -> RendezvousBackend:
    """The backend the handler reads and writes the shared state through."""
    backend: RendezvousBackend = state_holder(handler)._backend
    return backend


def swap_store(handler: DynamicRendezvousHandler, store: Store, backend: RendezvousBackend) -> None:
    """Point the handler at a new store connection; its next sync reads the state afresh from `backend`."""
    handler._store = store
    holder = state_holder(handler)
    holder._backend = backend
    holder._token = None  # the old connection's token means nothing to the new one


def set_state_cache(handler: DynamicRendezvousHandler, seconds: float) -> None:
    """How long the handler's state holder serves its cached copy of the shared state instead of reading it
    again (torch: one second, whatever the executor's poll delay)."""
    state_holder(handler)._cache_duration = seconds


def handler_settings(handler: DynamicRendezvousHandler) -> RendezvousSettings:
    return handler._settings


def replace_handler_settings(handler: DynamicRendezvousHandler, settings: Any) -> None:
    """Give the handler and the parts that keep their own reference to its settings (the op executor and the
    state holder) `settings` instead."""
    handler._settings = settings
    handler._op_executor._settings = settings  # type: ignore[attr-defined]  # the base class lacks it
    state_holder(handler)._settings = settings


def guard_joins(handler: DynamicRendezvousHandler, must_wait: Callable[[Any, int], bool]) -> None:
    """Have the handler ask `must_wait(state, max_nodes)` each time its join would add this node to the
    participants of a round being formed: while it answers True the node waits instead (it keeps its keep-alive
    and reads the state again after the poll delay), and the join goes on as torch decides once it answers
    False. Everything else the join does (the wait and redundancy lists, completing a round, timeouts) stays
    torch's."""
    executor = handler._op_executor
    run = executor.run
    join_op = dynamic_rendezvous._RendezvousJoinOp
    action = dynamic_rendezvous._Action
    keep_alive_due = dynamic_rendezvous._should_keep_alive

    def guarded_run(state_handler: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if isinstance(state_handler, join_op):
            join = state_handler

            def state_handler(ctx: Any, deadline: float) -> Any:
                decided = join(ctx, deadline)
                if decided == action.ADD_TO_PARTICIPANTS and must_wait(ctx.state, ctx.settings.max_nodes):
                    return action.KEEP_ALIVE if keep_alive_due(ctx) else action.SYNC
                return decided

        run(state_handler, *args, **kwargs)

    executor.run = guarded_run  # type: ignore[method-assign]


# ---------------------------------------------------------------------- the rendezvous poll delay


def sync_delay() -> Callable[..., None] | None:
    """The module-level pause torch's rendezvous executor calls between state reads (`_delay(seconds=1)`);
    None on a torch without it."""
    return getattr(dynamic_rendezvous, "_delay", None)


def set_sync_delay(delay: Callable[..., None]) -> None:
    dynamic_rendezvous._delay = delay


# ---------------------------------------------------------------- the agent's subprocess factory


def subprocess_handler_factory() -> Callable[..., SubprocessHandler]:
    """What torch's agent calls to start each training process (keyword arguments only)."""
    return _multiprocessing_api.get_subprocess_handler


def set_subprocess_handler_factory(factory: Callable[..., SubprocessHandler]) -> None:
    _multiprocessing_api.get_subprocess_handler = factory
