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

import threading
from collections.abc import Iterable

import torch.distributed as dist

from phalanx.worker.storerounds import PREFIX, Departed, RendezvousFailed, StoreRounds, group_prefix
from phalanx.worker.torch_elastic import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

BACKEND = "phalanx-rounds"
CLOSED_KEY = f"{PREFIX}/closed"


class StoreRoundsHandler(RendezvousHandler):
    """One launcher's rendezvous: `rounds` is its member of the job's rounds (its own store connection)."""

    def __init__(self, rounds: StoreRounds, run_id: str, local_addr: str | None) -> None:
        self.rounds = rounds
        self.run_id = run_id
        self.local_addr = local_addr
        self._departed: set[str] = set()
        self._lock = threading.Lock()

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # The workers make their own store at the round's bootstrap address (the job's store is not theirs).
        return False

    def get_run_id(self) -> str:
        return self.run_id

    def note_departed(self, uids: Iterable[str]) -> None:
        """Pods the operator named as failed or removed: the next re-form leaves them out."""
        with self._lock:
            self._departed.update(uids)

    def next_rendezvous(self) -> RendezvousInfo:
        if self.is_closed():
            raise RendezvousClosedError(f"the rendezvous of {self.run_id} is closed")
        with self._lock:
            departed, self._departed = sorted(self._departed), set()
        try:
            seat = self.rounds.join() if self.rounds.seat is None else self.rounds.reform(departed)
        except Departed as error:
            # Named departed: this launcher's pod is being replaced; it leaves without a fault of its own.
            raise RendezvousGracefulExitError(str(error)) from None
        except RendezvousFailed as error:
            raise RendezvousTimeoutError(str(error)) from None
        store = dist.PrefixStore(group_prefix(seat.round), self.rounds.store)
        bootstrap = RendezvousStoreInfo.build(seat.rank, store, self.local_addr)
        return RendezvousInfo(store, seat.rank, seat.world_size, bootstrap)

    def num_nodes_waiting(self) -> int:
        """Above zero when the group should re-form: a round this member has not followed was decided, or spares
        wait while the group is below its maximum (they grow it). Hot spares beside a full group wait unseen."""
        seat = self.rounds.seat
        if seat is None:
            return 0
        if self.rounds.current_round() > seat.round:
            return 1
        return self.rounds.waiting_spares() if seat.world_size < self.rounds.max_nodes else 0

    def is_closed(self) -> bool:
        return bool(self.rounds.store.check([CLOSED_KEY]))

    def set_closed(self) -> None:
        self.rounds.store.set(CLOSED_KEY, "1")

    def shutdown(self) -> bool:
        # Leaving is the operator's word (a regroup names the pod), not the handler's: nothing to withdraw.
        return True
