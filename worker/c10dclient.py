"""The `c10d` rendezvous protocol: torch's dynamic rendezvous over the job's store (worker/rdzvclient.py).

torch keeps the whole group in one pickled state that every member reads and rewrites; a node that stops
sending keep-alives is dropped after `keepaliveTimeoutSeconds`. Phalanx adds to it: a faster poll, the
operator's word dropping departed nodes at once, the holder of the newest state getting its place first, and a
spare that never takes a worker's slot (worker/rendezvous.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from phalanx.worker import rendezvous, scaling, torch_elastic
from phalanx.worker.checkpoint import shm_store
from phalanx.worker.env import LaunchSettings
from phalanx.worker.rdzvclient import STORE_ERRORS, StoreConnections
from phalanx.worker.torch_elastic import (
    CheckedBackend,
    DynamicRendezvousHandler,
    RendezvousGracefulExitError,
    RendezvousTimeout,
)

logger = logging.getLogger("phalanx.launch")


class RendezvousClient(StoreConnections):
    """torch's c10d rendezvous handler on the launcher's connections to the job's store."""

    handler: DynamicRendezvousHandler

    def __init__(self, settings: LaunchSettings) -> None:
        super().__init__(settings)
        poll = rendezvous.sync_poll_interval(settings.max_nodes)
        if not rendezvous.install_sync_poll(poll):
            logger.warning(
                "this torch's rendezvous cannot be told to poll faster: regroups wait 1 s per read"
            )
        # With the job's secret, the training processes' store is hosted by the launchers behind the gate too.
        handler_class = (
            torch_elastic.LauncherStoreHandler if self.gates_training_store else DynamicRendezvousHandler
        )
        self.handler = handler_class.from_backend(
            run_id=settings.run_id,
            # The round's connection: apart from the keep-alives, so that a wait for a peer that died right
            # after the round formed holds them up no longer than the keep-alive timeout, after which torch drops
            # the peer. On the shared connection that wait held up the keep-alives too, until torch dropped this
            # node: the survivor holding the newest state lost its place to new pods holding none.
            store=self.round_store,
            backend=CheckedBackend(self.store, settings.run_id),
            min_nodes=settings.min_nodes,
            max_nodes=settings.max_nodes,
            local_addr=settings.local_addr,
            timeout=RendezvousTimeout(
                join=timedelta(seconds=settings.join_timeout),
                last_call=timedelta(seconds=settings.last_call_timeout),
                close=timedelta(seconds=max(settings.join_timeout / 4, 5)),
                heartbeat=timedelta(seconds=settings.keepalive_timeout),
            ),
            keep_alive_interval=settings.keepalive_interval,  # type: ignore[arg-type]
            keep_alive_max_attempt=settings.keepalive_max_attempts,
        )
        # torch's state holder serves a cached copy for a second after each read, so a waiting node would
        # see a change a second late however often it polls: each poll must read the store.
        torch_elastic.set_state_cache(self.handler, poll)
        # Every decision of the rendezvous about "full" reads the store's count, not the start-up one.
        scaling.install_live_settings(self.handler, self.max_nodes.current)
        self.publish_node(self.store)
        self.new_store_hooks.append(self.publish_node)
        # The node holding the newest state gets a place in the group before nodes holding older state.
        self.freshness = rendezvous.FreshnessGuard(
            lambda: self.store,
            rendezvous.node_key(torch_elastic.node_of(self.handler)),
            patience=settings.keepalive_timeout,
        )
        torch_elastic.guard_joins(self.handler, self.freshness.must_wait)

    @property
    def node_addr(self) -> str:
        return str(torch_elastic.node_of(self.handler).addr)

    def publish_node(self, store: dist.TCPStore) -> None:
        """Name this pod's rendezvous node in the store, so that the operator's word can drop it at once."""
        with contextlib.suppress(*STORE_ERRORS, RuntimeError):
            key = self.settings.pod_uid or self.settings.pod_name
            rendezvous.publish_node(store, key, torch_elastic.node_of(self.handler))

    def offer_held_state(self) -> None:
        """Before a rendezvous: claim, for the round this node joins, the newest snapshot its pod holds (see
        `rendezvous.FreshnessGuard`). The store's trouble is the rendezvous's to handle."""
        held = shm_store.newest_held_step()
        with contextlib.suppress(*STORE_ERRORS, RuntimeError):
            self.handler.num_nodes_waiting()  # reads the state afresh, under the handler's lock
            state = torch_elastic.round_state(self.handler)
            claim = self.freshness.offer(held, state.round, state.complete)
            if claim is not None and held >= 0 and claim.node != self.freshness.node:
                logger.info("this node holds step %d; %s/%s holds step %d", held, *claim.node[:2], claim.step)

    def forget_departed(self, pod_keys: tuple[str, ...]) -> list[str]:
        """Expire the departed pods' nodes in the rendezvous state (see `rendezvous.forget_departed`)."""
        backend = torch_elastic.state_backend(self.handler)
        return rendezvous.forget_departed(self.store, backend, pod_keys)

    def leave_alone(self) -> None:
        # Out of the group at once: the others re-form now instead of after this node's keep-alive lapses.
        torch_elastic.stop_keep_alives(self.handler)
        self.forget_departed((self.settings.pod_uid or self.settings.pod_name,))

    def _prepare_connections(self, store: dist.TCPStore) -> Any:
        return CheckedBackend(store, self.settings.run_id)

    def _use_connections(self, store: dist.TCPStore, round_store: dist.TCPStore, prepared: Any) -> None:
        # A restarted store has lost the rendezvous state; the handler's next sync reads the fresh one
        # (or the surviving one after a network blip) and its next join works against it.
        torch_elastic.swap_store(self.handler, round_store, prepared)

    def in_standby(self) -> bool:
        """Whether this node stands by: in torch's redundancy list, or outside a group that is full (queued, or
        a spare on its way into the redundancy list). Read from the local copy of the state. A node that is
        not standing by while it rendezvous is joining a round with room for it: the operator counts its loss
        as a worker's."""
        with contextlib.suppress(Exception):
            state = torch_elastic.round_state(self.handler)
            node = torch_elastic.node_of(self.handler)
            if node in state.redundancy_list:
                return True
            return node not in state.participants and not rendezvous.has_room(
                state.complete, len(state.participants), self.max_nodes.current()
            )
        return False

    def waiting_with_room(self) -> int:
        """Nodes queued for the next round that the group has room for (0 when it is full).

        torch leaves a node in the wait list when the round it waited for filled up without it (three
        launchers racing for two slots after a store loss); re-forming for it would only reshuffle who is
        in, again and again. It gets in when a slot frees: a member lost, or the group grown.
        """
        waiting = self.handler.num_nodes_waiting()
        if waiting == 0:
            return 0
        state = torch_elastic.round_state(self.handler)
        return (
            waiting
            if rendezvous.has_room(state.complete, len(state.participants), self.max_nodes.current())
            else 0
        )

    def dropped(self) -> bool:
        """Whether the group re-formed without this node: it is no participant of the rendezvous (its
        keep-alive lapsed while it stalled). Reads the local copy, synced by `waiting_with_room`."""
        state = torch_elastic.round_state(self.handler)
        return torch_elastic.node_of(self.handler) not in state.participants

    def wait_for_formed_group(self) -> None:
        """Keep a spare out of the rendezvous until joining cannot take a worker's slot.

        See `rendezvous.spare_may_join`: it waits while the first round forms or runs short with workers
        still to come (up to the join timeout), and joins at once when the group is full or re-formed
        short of a node.
        """
        holder = torch_elastic.state_holder(self.handler)
        deadline = time.monotonic() + self.settings.join_timeout
        while True:
            holder.sync()
            state = holder.state
            if state.closed:
                raise RendezvousGracefulExitError("the rendezvous is closed: the job has ended")
            view = rendezvous.RoundView(
                round=state.round,
                complete=state.complete,
                participants=len(state.participants),
                waiting=len(state.wait_list),
            )
            reason = rendezvous.spare_may_join(view, self.max_nodes.current(), time.monotonic() >= deadline)
            if reason is not None:
                logger.info("spare joins the rendezvous: %s (%s)", reason, view)
                return
            time.sleep(0.5)

    def round_members(self) -> frozenset[rendezvous.Node] | None:
        """The rendezvous nodes of the round that formed last."""
        with contextlib.suppress(Exception):
            participants = torch_elastic.round_state(self.handler).participants
            return frozenset(rendezvous.node_key(node) for node in participants)
        return None

    def group_includes(
        self, members: frozenset[rendezvous.Node] | None, pod_keys: tuple[str, ...]
    ) -> bool | None:
        return rendezvous.group_includes(self.store, members, pod_keys)
