"""torchrun's rendezvous handler over the store-decided rounds of worker/storerounds.py.

torch's elastic agent asks its handler for the next group (`next_rendezvous`) when it starts and after each
restart of its workers, and polls `num_nodes_waiting` in its monitor loop to learn that the group should
re-form. Here the first call joins (a seat in the first round, or a hot spare's wait for one), and each
later call is a re-form after the departures the launcher has noted from the operator's regroup requests
(`note_departed`). A member whose group moved on without it (another survivor decided the next round)
sees it in `num_nodes_waiting`, so its agent restarts its workers into that round.

Each round's group gets its own prefix in the job's store: torchelastic's keys and the workers' bootstrap
address (rank 0 publishes it afresh each round, as `RendezvousStoreInfo.build` does) never mix rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch.distributed as dist

from phalanx.worker.storerounds import (
    SPARES_LINE,
    WORKERS_LINE,
    Closed,
    Departed,
    Dropped,
    RendezvousFailed,
    Seat,
    StoreRounds,
    group_prefix,
)
from phalanx.worker.torch_elastic import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

BACKEND = "phalanx-rounds"


class StoreRoundsHandler(RendezvousHandler):
    """One launcher's rendezvous: `rounds` is its member of the job's rounds (its own store connection)."""

    def __init__(
        self,
        rounds: StoreRounds,
        run_id: str,
        local_addr: str | None,
        spare: bool = False,
        agent_store: bool = False,
        poll: float = 0.0,
    ) -> None:
        self.rounds = rounds
        self.run_id = run_id
        self.local_addr = local_addr
        self.spare = spare
        """A hot spare: it joins the line of spares, never the first round (a worker's place)."""
        self._agent_store = agent_store
        self.poll = poll
        """The least seconds between two looks at the store by `num_nodes_waiting` (torch's agent asks every
        monitor interval; at thousands of members those looks are most of the store's load)."""
        self._looked_at = -float("inf")

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # True: the launchers host the workers' store behind the job's gate (worker/attemptstore.py). False: the
        # workers make their own at the round's bootstrap address. Never the job's store: it is not theirs.
        return self._agent_store

    def get_run_id(self) -> str:
        return self.run_id

    def note_departed(self, uids: Iterable[str]) -> None:
        """Pods the operator named as failed or removed: the next re-form leaves them out. Kept for later rounds
        too (a UID is never reused, and one already gone costs its decider one read)."""
        self.rounds.note_departed(uids)

    def next_rendezvous(self) -> RendezvousInfo:
        if self.is_closed():
            raise RendezvousClosedError(f"the rendezvous of {self.run_id} is closed")
        if self.rounds.seat is not None and self.rounds.store_was_reset():
            self.rounds.seat = None  # a restarted store: every member joins its first round afresh
        try:
            seat = self._next_seat()
        except Closed as error:
            raise RendezvousGracefulExitError(str(error)) from None
        except RendezvousFailed as error:
            raise RendezvousTimeoutError(str(error)) from None
        store = dist.PrefixStore(group_prefix(seat.round), self.rounds.store)
        bootstrap = RendezvousStoreInfo.build(seat.rank, store, self.local_addr)
        return RendezvousInfo(store, seat.rank, seat.world_size, bootstrap)

    def _next_seat(self) -> Seat:
        line = SPARES_LINE if self.spare else None
        while True:
            try:
                return self.rounds.join(line) if self.rounds.seat is None else self.rounds.reform()
            except Departed:
                # Named departed while it runs: its pod is being replaced. It stands by, as a member that c10d
                # dropped does, until the operator deletes it or the job ends.
                self.rounds.stand_aside()
            except Dropped:
                # The group went on without this member (it was silent, or past a lowered maximum): it waits in
                # line for the next free place, like any pod that comes late.
                line = SPARES_LINE if self.spare else WORKERS_LINE

    def num_nodes_waiting(self) -> int:
        """Above zero when the group should re-form: another member began the next round (it checked in: a
        peer died, or the operator asked), or members wait in line that would grow a group below its maximum
        (see `StoreRounds.waiting_to_grow`). Hot spares beside a full group wait unseen."""
        seat = self.rounds.seat
        now = time.monotonic()
        if seat is None or now - self._looked_at < self.poll:
            return 0
        self._looked_at = now
        return 1 if self.rounds.reform_begun() else self.rounds.waiting_to_grow()

    def is_closed(self) -> bool:
        return self.rounds.closed()

    def set_closed(self) -> None:
        self.rounds.close()

    def shutdown(self) -> bool:
        """The group has ended (the launcher calls this once it said how): close the rendezvous, so that every
        other launcher, waiting spares too, leaves."""
        self.rounds.close()
        return True
