"""The `rounds` rendezvous protocol: rounds decided in the job's store (worker/storerounds.py), through torchrun's
handler for them (worker/roundshandler.py), on the launcher's connections (worker/rdzvclient.py).

What the launcher asks of a protocol, here:
- the operator's word (a regroup request naming departed pods) is noted in the handler, and the next round's
  decider leaves those pods out at once; a member that died unnamed is left out after the grace
  (`keepaliveTimeoutSeconds`, the time torch gives a silent peer);
- a spare waits in the line of spares from the start, so it never takes a worker's place in the first round;
- the group re-forms when a member begins the next round (it checked in), or when spares wait and the group is
  below its maximum;
- survivors keep their ranks, so the holder of the newest state never loses its place to a new pod. After the
  store restarted (every member joins afresh), a pod that holds no snapshot lets those that do take their
  tickets first.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch.distributed as dist

from phalanx.worker import storerounds
from phalanx.worker.checkpoint import shm_store
from phalanx.worker.env import LaunchSettings
from phalanx.worker.rdzvclient import StoreConnections
from phalanx.worker.roundshandler import StoreRoundsHandler


class RoundsClient(StoreConnections):
    """The store-rounds handler on the launcher's connections to the job's store."""

    handler: StoreRoundsHandler

    def __init__(self, settings: LaunchSettings) -> None:
        super().__init__(settings)
        # The pod's UID names it in the operator's regroup requests; a name or an address where it has none.
        self.uid = settings.pod_uid or settings.pod_name or f"{settings.local_addr}-{os.getpid()}"
        self.rounds = storerounds.StoreRounds(
            self.round_store,
            self.uid,
            settings.min_nodes,
            self.max_nodes.current,
            last_call=settings.last_call_timeout,
            timeout=settings.join_timeout,
            grace=settings.keepalive_timeout,
        )
        self.handler = StoreRoundsHandler(
            self.rounds,
            settings.run_id,
            settings.local_addr,
            spare=settings.role == "spare",
            agent_store=self.gates_training_store,
            # No throttle of its own: the launcher looks when an event was announced (a member checked in to
            # the next round, a pod queued) or at its idle interval (worker/storeevents.py).
        )

    def _use_connections(self, store: dist.TCPStore, round_store: dist.TCPStore, prepared: Any) -> None:
        self.rounds.store = round_store

    def offer_held_state(self) -> None:
        """Before joining afresh (a restarted store): a pod holding no snapshot waits the last call, so that
        those holding one take the first round's places first."""
        rounds = self.rounds
        if rounds.seat is None or self.handler.spare or not rounds.store_was_reset():
            return
        if shm_store.newest_held_step() < 0:
            time.sleep(self.settings.last_call_timeout)

    def forget_departed(self, pod_keys: tuple[str, ...]) -> list[str]:
        # Read on the launcher's own connection: the round's may be held by a wait of the agent's thread.
        self.handler.note_departed(pod_keys)
        return storerounds.seated(self.store, pod_keys)

    def leave_alone(self) -> None:
        storerounds.leave(self.store, self.uid)

    def stopping(self) -> None:
        # Nothing drops a silent member but a round's grace: a pod that stops says it leaves, so a round formed
        # after it (its survivors', or new pods' when the whole group stopped) never waits for it.
        storerounds.leave(self.store, self.uid)

    def in_standby(self) -> bool:
        return self.rounds.standing_by

    def waiting_with_room(self) -> int:
        return self.handler.num_nodes_waiting()

    def dropped(self) -> bool:
        # A group that went on without this member begins its next round without it: `waiting_with_room` says
        # so first, and the re-form tells this member it was dropped (it joins again as a spare).
        return False

    def group_includes(self, members: frozenset[Any] | None, pod_keys: tuple[str, ...]) -> bool | None:
        # Each seated member holds its rank under its UID until a round leaves it out: the members of the
        # running group are those seated now (or about to leave it, in a round being formed).
        return bool(storerounds.seated(self.store, pod_keys))
