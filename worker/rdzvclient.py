"""The launcher's side of the job's rendezvous: its connections to the store, and what the launcher asks of a
rendezvous protocol, whichever it is.

Two protocols stand behind this interface (`spec.rendezvous.protocol`, `PHALANX_RDZV_PROTOCOL`):
- `c10d` (worker/c10dclient.py): torch's dynamic rendezvous over the job's store, one pickled state that every
  member reads and rewrites, nodes dropped when their keep-alives lapse;
- `rounds` (worker/roundsclient.py): rounds decided in the store (worker/storerounds.py), whose cost per re-form
  grows with the change rather than with the group.

Both keep two connections to the store: `store` for the launcher's own keys (restart epoch, max nodes, regroup
claims) and `round_store` for what the members of a round wait on each other for, so that a wait held up by a
peer that died never holds up the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from phalanx.worker import rendezvous, scaling, storeevents, storegate
from phalanx.worker.env import LaunchSettings
from phalanx.worker.torch_elastic import RendezvousConnectionError, RendezvousHandler

# Errors that mean "the rendezvous store is not answering" wherever they surface.
STORE_ERRORS: tuple[type[BaseException], ...] = (RendezvousConnectionError, dist.DistError)

ROUND_WAIT_FLOOR = 2.0
"""The shortest wait of the members of a new round for each other's first words (see `StoreConnections`)."""


class StoreUnreachableError(Exception):
    """The rendezvous store did not come back within the join timeout."""


class StoreConnections:
    """The launcher's connections to the job's store, and the rendezvous protocol's interface to the launcher:
    each protocol's client subclasses it and sets `handler` (torchrun's handler for the agent)."""

    handler: RendezvousHandler

    def __init__(self, settings: LaunchSettings) -> None:
        self.settings = settings
        self._secret = (
            storegate.read_secret(settings.store_secret_file) if settings.store_secret_file else None
        )
        self.new_store_hooks: list[Callable[[dist.TCPStore], None]] = []
        """Called with each new store connection after a reconnect, before anyone uses it."""
        deadline = time.monotonic() + settings.join_timeout
        self.store = self._connect_until(deadline)
        # The round's own connection: one peer that died right after a round formed leaves the others waiting a
        # full timeout for its first words there, and on the shared connection that wait would hold up every
        # other use of the store (torch's keep-alives, the launcher's own keys) too.
        self.round_store = self._connect_until(deadline, timeout=self.round_wait)
        self.max_nodes = scaling.StoreMaxNodes(lambda: self.store, settings.max_nodes)
        self.events = storeevents.StoreEvents(
            self._watch_connection,
            storeevents.idle_look_interval(settings.max_nodes, settings.monitor_interval),
        )
        """When the running group should look at the store (`watch_events` starts it)."""

    @property
    def secret(self) -> bytes | None:
        """The job's store secret (None: the job's stores are not gated)."""
        return self._secret

    @property
    def gates_training_store(self) -> bool:
        """Whether the training processes' store stands behind the gate too (worker/attemptstore.py).

        Not on a torch built without libuv (USE_LIBUV=0): there torch's training processes cannot be clients
        of a store hosted for them (the client that torch's env:// makes then asks for libuv and fails), so
        training rank 0 hosts it as under torchrun, and the job's NetworkPolicy is its only boundary."""
        return self._secret is not None and rendezvous.libuv_transport()

    @property
    def round_wait(self) -> float:
        """Seconds the members of a new round wait for each other's first words (at least 2)."""
        return max(self.settings.keepalive_timeout, ROUND_WAIT_FLOOR)

    @property
    def node_addr(self) -> str:
        """The address this launcher is known by in the group (where it hosts what it hosts for it)."""
        return self.settings.local_addr

    # -- connections ------------------------------------------------------------------------------

    def watch_events(self) -> None:
        """Start watching the store's announced events (once a group of this node's runs)."""
        if not self.events.started:
            self.events.start()

    def _watch_connection(self) -> dist.TCPStore:
        # The watcher's own: its wait for the next event holds the connection it waits on.
        return rendezvous.connect(
            self.settings.rdzv_host, self.settings.rdzv_port, self.settings.store_timeout, self._secret
        )

    def _connect_until(self, deadline: float, timeout: float | None = None) -> dist.TCPStore:
        wanted = self.settings.store_timeout if timeout is None else timeout
        while True:
            try:
                return rendezvous.connect(
                    self.settings.rdzv_host,
                    self.settings.rdzv_port,
                    min(wanted, max(deadline - time.monotonic(), 1.0)),
                    self._secret,
                )
            except (RuntimeError, dist.DistError) as error:
                if time.monotonic() >= deadline:
                    raise StoreUnreachableError(
                        f"rendezvous store {self.settings.rdzv_endpoint} unreachable for "
                        f"{self.settings.join_timeout:g}s: {error}"
                    ) from None
                time.sleep(1.0)

    def try_reconnect(self) -> bool:
        """One quick attempt to reach the store again; on success every later call uses the new client."""
        host, port = self.settings.rdzv_host, self.settings.rdzv_port
        try:
            store = rendezvous.connect(host, port, 2.0, self._secret)
            round_store = rendezvous.connect(host, port, self.round_wait, self._secret)
            prepared = self._prepare_connections(store)
        except (RuntimeError, dist.DistError, RendezvousConnectionError):
            return False
        for hook in self.new_store_hooks:
            with contextlib.suppress(*STORE_ERRORS, RuntimeError):
                hook(store)
        self.store, self.round_store = store, round_store
        self._use_connections(store, round_store, prepared)
        return True

    def reconnect_until(self, deadline: float) -> None:
        while not self.try_reconnect():
            if time.monotonic() >= deadline:
                raise StoreUnreachableError(
                    f"rendezvous store {self.settings.rdzv_endpoint} unreachable for "
                    f"{self.settings.join_timeout:g}s"
                )
            time.sleep(1.0)

    def _prepare_connections(self, store: dist.TCPStore) -> Any:
        """What the protocol needs of a new connection before it is used (may raise the store's errors)."""
        return None

    def _use_connections(self, store: dist.TCPStore, round_store: dist.TCPStore, prepared: Any) -> None:
        """Point the protocol at new connections (a restarted store has lost the rendezvous: the protocol's
        next rendezvous finds that out and forms afresh)."""

    def restart_epoch(self) -> int:
        return rendezvous.read_restart_epoch(self.store)

    # -- what the launcher asks of the protocol ----------------------------------------------------

    def offer_held_state(self) -> None:
        """Before a rendezvous: say what state this pod holds, where the protocol prefers its holder."""

    def forget_departed(self, pod_keys: tuple[str, ...]) -> list[str]:
        """The operator named these pods (UIDs, or names) failed or removed: the next round leaves them out at
        once instead of waiting for them. Returns what it dropped, for the log."""
        raise NotImplementedError

    def leave_alone(self) -> None:
        """This launcher gives up while the group goes on: say so, so that the next round does not wait for it."""
        raise NotImplementedError

    def stopping(self) -> None:
        """The pod is being stopped (a signal): let the others know where the protocol would otherwise wait for
        this node."""

    def in_standby(self) -> bool:
        """Whether this node stands by as a spare (the operator counts the loss of one that does not as a
        worker's)."""
        raise NotImplementedError

    def waiting_with_room(self) -> int:
        """Above zero when the running group must re-form: nodes wait that it has room for, or the group is
        re-forming already."""
        raise NotImplementedError

    def dropped(self) -> bool:
        """Whether the group re-formed without this node while it ran."""
        raise NotImplementedError

    def wait_for_formed_group(self) -> None:
        """A spare's wait before its first rendezvous, until joining cannot take a worker's place."""

    def round_members(self) -> frozenset[Any] | None:
        """The members of the round that just formed, as `group_includes` compares them (None: not known)."""
        return None

    def group_includes(self, members: frozenset[Any] | None, pod_keys: tuple[str, ...]) -> bool | None:
        """Whether the group of `members` (this launcher's running group) includes any of the pods named
        (None: not known, and the regroup falls back on the clocks)."""
        raise NotImplementedError
