"""Rendezvous rounds decided in the job's store, with a cost per re-form that grows with the change, not the group.

torch's dynamic rendezvous keeps the whole group in one pickled state that every member reads and rewrites
(compare-and-set, retried on conflict), so a re-form of N members moves O(N^2) bytes through the store and
takes minutes at a few hundred members (`phalanx bench --only rendezvous-scale`). Here:

- Formation: each member takes a ticket with one `add`; ticket t is rank t-1. The member whose ticket fills
  the group (`max_nodes`), or any member once the last call has passed with at least `min_nodes` tickets,
  writes the round's plan, once (`compare_set`). Members past the plan's size queue as hot spares.
- Re-form: the survivors of a departure keep their ranks. One of them, the first to count itself in
  (`add`), is the round's decider: it looks up the departed members' ranks, takes waiting spares in the
  order they came, gives each spare a departed member's rank (then, below `max_nodes`, new ranks at the end),
  and when spares run short closes the holes by moving the highest ranks down. The plan it writes names only
  the change: the departed, the spares' seats and the moves. Each survivor reads that plan once.
- A spare waits on its own seat key, which the decider writes.

So a re-form after one death moves O(N) bytes in all (each member reads a plan of constant size), and every
wait is the store's own blocking `wait`, not polling. Values are JSON, never pickle: the store is reachable
by every pod of the job and nothing read from it is trusted beyond its parse.

This module is the protocol alone, over any `torch.distributed.Store`; the bench's emulated launchers
measure it beside torch's path (`phalanx.bench.emulated_launchers --protocol rounds`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

PREFIX = "phalanx/rounds"
SPARES_PUSHED = f"{PREFIX}/spares/pushed"
SPARES_TAKEN = f"{PREFIX}/spares/taken"
CURRENT_KEY = f"{PREFIX}/current"
FIRST_ROUND = 1
WAIT_SLICE = 30.0
"""Seconds one blocking wait on the store lasts before the caller's deadline is looked at again."""


class RendezvousFailed(RuntimeError):
    """The round could not be completed in time, or its plan is not one this protocol writes."""


class Departed(RuntimeError):
    """The round's plan names this member among the departed: it has no seat in the group any more."""


@dataclass(frozen=True)
class Seat:
    """A member's place in one round of the group."""

    round: int
    rank: int
    world_size: int


@dataclass(frozen=True)
class Plan:
    """A round's decision: the group's size and only what changed since the round before."""

    round: int
    size: int
    departed: tuple[str, ...] = ()
    """UIDs of the members that left the group at this round."""
    seats: dict[str, int] = field(default_factory=dict)
    """Spares seated at this round, by UID: the rank each takes."""
    moves: dict[int, int] = field(default_factory=dict)
    """Survivors' ranks that change (old -> new), closing the holes no spare filled."""

    def encode(self) -> str:
        return json.dumps(
            {
                "round": self.round,
                "size": self.size,
                "departed": list(self.departed),
                "seats": self.seats,
                "moves": {str(old): new for old, new in self.moves.items()},
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, raw: bytes | str) -> Plan:
        try:
            data = json.loads(raw)
            return cls(
                round=int(data["round"]),
                size=int(data["size"]),
                departed=tuple(str(uid) for uid in data.get("departed") or ()),
                seats={str(uid): int(rank) for uid, rank in (data.get("seats") or {}).items()},
                moves={int(old): int(new) for old, new in (data.get("moves") or {}).items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise RendezvousFailed(f"the round's plan is not readable: {error}") from None

    def rank_after(self, rank: int) -> int:
        """A survivor's rank in this round, given its rank in the round before."""
        return self.moves.get(rank, rank)


def decide(
    round_number: int,
    size: int,
    departed: dict[str, int],
    spares: Sequence[str],
    max_nodes: int,
) -> tuple[Plan, list[str]]:
    """The plan of the round after a group of `size` lost the `departed` members (UID -> rank), with `spares`
    waiting in the order they queued; returns it and the spares it leaves waiting.

    Spares take the departed ranks first (lowest first), then new ranks at the end up to `max_nodes`; holes
    no spare fills are closed by moving the highest surviving ranks into them, so ranks stay 0..size-1."""
    holes = sorted({rank for rank in departed.values() if 0 <= rank < size})
    waiting = list(spares)
    seats: dict[str, int] = {}
    while holes and waiting:
        seats[waiting.pop(0)] = holes.pop(0)
    new_size = size - len(holes)
    while waiting and new_size < max_nodes:
        seats[waiting.pop(0)] = new_size
        new_size += 1
    # Holes left: the group shrinks, and the survivors above its new size move down into them.
    movers = sorted(rank for rank in range(new_size, size) if rank not in holes)
    moves = dict(zip(movers, (hole for hole in holes if hole < new_size), strict=True))
    plan = Plan(round_number, new_size, tuple(sorted(departed)), seats, moves)
    return plan, waiting


class StoreRounds:
    """One member's side of the protocol, over the job's store: one thread at a time (a store client's
    blocking wait holds its connection)."""

    def __init__(
        self,
        store: Any,
        uid: str,
        min_nodes: int,
        max_nodes: int,
        last_call: float = 30.0,
        timeout: float = 600.0,
    ) -> None:
        self.store = store
        self.uid = uid
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.last_call, self.timeout = last_call, timeout
        self.seat: Seat | None = None

    # Formation and spares.

    def join(self) -> Seat:
        """Enter the group: a seat in the first round, or, once that is full, one given to this member as a
        hot spare at a later round (blocks until then)."""
        deadline = time.monotonic() + self.timeout
        ticket = int(self.store.add(f"{PREFIX}/{FIRST_ROUND}/tickets", 1))
        plan_key = _plan_key(FIRST_ROUND)
        if ticket == self.max_nodes:
            self._write_plan(Plan(FIRST_ROUND, self.max_nodes))
        elif ticket <= self.max_nodes and not self._exists(plan_key):
            self._last_call(ticket)
        plan = self._read_plan(FIRST_ROUND, deadline)
        if ticket <= plan.size:
            return self._seated(Seat(FIRST_ROUND, ticket - 1, plan.size))
        return self._wait_as_spare(deadline)

    def _last_call(self, ticket: int) -> None:
        """Below `max_nodes`: wait for the group to fill until the last call, then close it with the members
        there are, if they are enough."""
        key = _plan_key(FIRST_ROUND)
        closes_at = time.monotonic() + self.last_call
        while time.monotonic() < closes_at:
            if self._wait_for(key, min(WAIT_SLICE, max(0.01, closes_at - time.monotonic()))):
                return
        joined = min(int(self.store.add(f"{PREFIX}/{FIRST_ROUND}/tickets", 0)), self.max_nodes)
        if joined >= self.min_nodes:
            self._write_plan(Plan(FIRST_ROUND, joined))

    def _wait_as_spare(self, deadline: float) -> Seat:
        # A line of spares kept by two counters, not the store's own queue: torch's `queue_len` keeps the
        # interpreter's lock while it waits for the answer, and the gate's forwarder (worker/storegate.py) is a
        # thread of this same interpreter, so behind the gate the call never returns. The n-th spare to arrive
        # is `spares/<n>`, and the deciders take them in that order.
        place = int(self.store.add(SPARES_PUSHED, 1))
        self.store.set(_spare_key(place), self.uid)
        key = _seat_key(self.uid)
        while not self._wait_for(key, min(WAIT_SLICE, max(0.01, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise RendezvousFailed(f"{self.uid}: no seat given within {self.timeout:.0f} s")
        round_number, rank = _parse_seat(self.store.get(key))
        plan = self._read_plan(round_number, deadline)
        return self._seated(Seat(round_number, rank, plan.size))

    # Re-forms.

    def reform(self, departed: Iterable[str] = ()) -> Seat:
        """The next round after the `departed` members (UIDs) left, or, with none named, after spares came
        to grow the group: a survivor keeps its rank unless the group shrank past it. Every survivor calls
        this with the same departures (the operator's regroup request names them); the first to arrive
        decides the round. Raises `Departed` when the plan names this member."""
        if self.seat is None:
            raise RendezvousFailed("reform() before join()")
        deadline = time.monotonic() + self.timeout
        next_round = self.seat.round + 1
        if int(self.store.add(f"{PREFIX}/{next_round}/deciders", 1)) == 1:
            self._decide(self.seat, next_round, sorted(set(departed)))
        seat = self._follow(self._read_plan(next_round, deadline))
        # Rounds decided since (a second departure while this member was away): each plan is a change.
        while self.current_round() > seat.round:
            seat = self._follow(self._read_plan(seat.round + 1, deadline))
        return seat

    def _follow(self, plan: Plan) -> Seat:
        """Take this member's seat in `plan`, the round after its own."""
        assert self.seat is not None
        if self.uid in plan.departed:
            self.seat = None
            raise Departed(f"{self.uid} was named departed at round {plan.round}")
        rank = plan.rank_after(self.seat.rank)
        return self._seated(Seat(plan.round, rank, plan.size), moved=rank != self.seat.rank)

    def _decide(self, previous: Seat, next_round: int, departed: list[str]) -> None:
        # A departed pod that never took a seat (a spare that died waiting) has no rank to give up.
        ranks = {
            uid: _as_int(raw) for uid in departed if (raw := self._get_or_none(_rank_key(uid))) is not None
        }
        taken = int(self.store.add(SPARES_TAKEN, 0))
        waiting = int(self.store.add(SPARES_PUSHED, 0)) - taken
        wanted = min(waiting, len(ranks) + max(0, self.max_nodes - previous.world_size))
        spares: list[str] = []
        for place in range(taken + 1, taken + 1 + wanted):
            # A spare counts itself in, then names itself: one not named yet waits for the next round.
            if (raw := self._get_or_none(_spare_key(place))) is None:
                break
            spares.append(raw.decode())
        places = range(taken + 1, taken + 1 + len(spares))
        plan, _ = decide(next_round, previous.world_size, ranks, spares, self.max_nodes)
        # Only this round's decider moves the line on: the spares it seats leave it, the others keep their place.
        self.store.add(SPARES_TAKEN, len(plan.seats))
        for place in places[: len(plan.seats)]:
            self.store.delete_key(_spare_key(place))
        self._write_plan(plan)
        if plan.seats:
            self.store.multi_set(
                [_seat_key(uid) for uid in plan.seats],
                [f"{next_round}:{rank}" for rank in plan.seats.values()],
            )
        for uid in plan.departed:
            self.store.delete_key(_rank_key(uid))
            self.store.delete_key(_seat_key(uid))
        self.store.set(CURRENT_KEY, str(next_round))

    # The store.

    def _seated(self, seat: Seat, moved: bool = True) -> Seat:
        """Record the seat: only a member whose rank changed writes."""
        if moved:
            self.store.set(_rank_key(self.uid), str(seat.rank))
        self.seat = seat
        return seat

    def waiting_spares(self) -> int:
        """Spares queued for a seat."""
        return int(self.store.add(SPARES_PUSHED, 0)) - int(self.store.add(SPARES_TAKEN, 0))

    def current_round(self) -> int:
        """The newest round decided (0: none yet): above a member's own, the group moved on without it."""
        return _as_int(self._get_or_none(CURRENT_KEY))

    def _write_plan(self, plan: Plan) -> None:
        self.store.compare_set(_plan_key(plan.round), "", plan.encode())
        if plan.round == FIRST_ROUND:
            self.store.compare_set(CURRENT_KEY, "", str(FIRST_ROUND))

    def _read_plan(self, round_number: int, deadline: float) -> Plan:
        key = _plan_key(round_number)
        while not self._wait_for(key, min(WAIT_SLICE, max(0.01, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise RendezvousFailed(f"round {round_number} was not decided within {self.timeout:.0f} s")
        plan = Plan.parse(self.store.get(key))
        if plan.round != round_number or not 0 < plan.size <= self.max_nodes:
            raise RendezvousFailed(f"round {round_number}'s plan does not fit the group: {plan}")
        return plan

    def _wait_for(self, key: str, seconds: float) -> bool:
        try:
            self.store.wait([key], timedelta(seconds=seconds))
        except Exception as error:  # DistStoreError on a timeout; anything else is not ours to hide
            if "timeout" in str(error).lower() or "timed out" in str(error).lower():
                return False
            raise
        return True

    def _exists(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def _get_or_none(self, key: str) -> bytes | None:
        return bytes(self.store.get(key)) if self._exists(key) else None


def _plan_key(round_number: int) -> str:
    return f"{PREFIX}/{round_number}/plan"


def group_prefix(round_number: int) -> str:
    """Where a round's group keeps its own keys in the store (torchelastic's, the workers' bootstrap)."""
    return f"{PREFIX}/{round_number}/group"


def _seat_key(uid: str) -> str:
    return f"{PREFIX}/seat/{uid}"


def _spare_key(place: int) -> str:
    return f"{PREFIX}/spares/{place}"


def _rank_key(uid: str) -> str:
    return f"{PREFIX}/rank/{uid}"


def _parse_seat(raw: bytes) -> tuple[int, int]:
    try:
        round_number, rank = bytes(raw).decode().split(":")
        return int(round_number), int(rank)
    except ValueError:
        raise RendezvousFailed(f"a seat that is not readable: {raw[:64]!r}") from None


def _as_int(raw: bytes | None) -> int:
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0
