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
- Liveness: a re-form's decider waits until every member it does not know to be gone has checked in to the
  round. The operator's regroup request names the dead at once (the launcher passes them on); a member that
  died unnamed is left out after `grace` seconds (the time torch gives a silent rendezvous peer), and told
  so if it comes back (`Dropped`: it joins again as a spare). A launcher that leaves alone says so (`leave`).
- A restarted store holds no rounds: each member notices the store's incarnation changed and joins afresh.

So a re-form after one death moves O(N) bytes in all (each member reads a plan of constant size), and every
wait is the store's own blocking `wait`, not polling. Values are JSON, never pickle: the store is reachable
by every pod of the job and nothing read from it is trusted beyond its parse.

This module is the protocol alone, over any `torch.distributed.Store`; the bench's emulated launchers
measure it beside torch's path (`phalanx.bench.emulated_launchers --protocol rounds`).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from phalanx.worker import storeevents

PREFIX = "phalanx/rounds"
WORKERS_LINE = "workers"
"""The line of workers waiting for a place: late to a full first round, or left out of a round."""
SPARES_LINE = "spares"
"""The line of hot spares: seated after the waiting workers, so a spare never takes a worker's place."""
LINES = (WORKERS_LINE, SPARES_LINE)
CURRENT_KEY = f"{PREFIX}/current"
CLOSED_KEY = f"{PREFIX}/closed"
INCARNATION_KEY = f"{PREFIX}/incarnation"
LEFT_PUSHED = f"{PREFIX}/left/pushed"
FIRST_ROUND = 1
MAX_MEMBERS = 100_000
"""The largest group a plan may name: a bound on what a plan read from the store can make a member believe."""
WAIT_SLICE = 30.0
"""Seconds one blocking wait on the store lasts before the caller's deadline is looked at again."""
SPARE_SLICE = 1.0
"""Seconds a waiting spare waits for its seat before it looks whether the rendezvous closed."""
CHECKIN_POLL = 0.01
"""Seconds between two looks of a round's decider at the members checked in."""
TAKEOVER_MARGIN = 5.0
"""Seconds past the grace that members wait for their round's decider to write its plan before one of them
decides instead."""
ABSENT = "\x00absent"
"""What `_get_or_none` asks the store to compare a key with: never a value of the protocol's, so the store
answers with the key's value, or with this when there is none."""


class RendezvousFailed(RuntimeError):
    """The round could not be completed in time, or its plan is not one this protocol writes."""


class Departed(RuntimeError):
    """The round's plan names this member among the departed: it has no seat in the group any more."""


class Dropped(RuntimeError):
    """The round went on without this member (it had not checked in within the grace, or the group shrank past
    its rank): it has no seat, and may join again as a spare."""


class Closed(RuntimeError):
    """The job's rendezvous is closed: the group has ended."""


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
    dropped: tuple[str, ...] = ()
    """UIDs of members left out at this round though not known to be gone: silent past the grace, or past
    a lowered maximum. They may come back as spares."""
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
                "dropped": list(self.dropped),
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
                dropped=tuple(str(uid) for uid in data.get("dropped") or ()),
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
    dropped: dict[str, int] | None = None,
) -> tuple[Plan, list[str], list[int]]:
    """The plan of the round after a group of `size` lost the `departed` members (UID -> rank) and left out the
    `dropped` ones, with `spares` waiting in the order they queued; returns it, the spares it leaves waiting, and
    the survivors' ranks it leaves out because the group is above `max_nodes` (the caller names them dropped).

    The group keeps ranks 0..size-1 dense. Its new size is what the survivors and spares make, at most
    `max_nodes`. Holes below it are filled first by the survivors whose ranks lie past it (the highest ranks
    move down), then by spares in the order they came; waiting spares then grow the group at the end."""
    gone = {**(dropped or {}), **departed}
    holes_left = {rank for rank in gone.values() if 0 <= rank < size}
    survivors = [rank for rank in range(size) if rank not in holes_left]
    new_size = min(max(1, max_nodes), len(survivors) + len(spares))
    holes = [rank for rank in range(new_size) if rank in holes_left or rank >= size]
    above = [rank for rank in survivors if rank >= new_size]
    moves: dict[int, int] = {}
    while holes and above:
        moves[above.pop(0)] = holes.pop(0)
    waiting = list(spares)
    seats: dict[str, int] = {}
    while holes and waiting:
        seats[waiting.pop(0)] = holes.pop(0)
    new_size -= len(holes)  # only when no member is left to fill them (a group of none)
    plan = Plan(
        round_number,
        new_size,
        departed=tuple(sorted(departed)),
        dropped=tuple(sorted(set(dropped or {}) - set(departed))),
        seats=seats,
        moves=moves,
    )
    return plan, waiting, above


class StoreRounds:
    """One member's side of the protocol, over the job's store: one thread at a time (a store client's
    blocking wait holds its connection), but `leave` and the `current_round`-style reads may come from another
    thread on a connection of their own."""

    def __init__(
        self,
        store: Any,
        uid: str,
        min_nodes: int,
        max_nodes: int | Callable[[], int],
        last_call: float = 30.0,
        timeout: float = 600.0,
        grace: float = 30.0,
    ) -> None:
        self.store = store
        self.uid = uid
        self.min_nodes = min_nodes
        self._max_nodes = max_nodes
        self.last_call, self.timeout, self.grace = last_call, timeout, grace
        self.seat: Seat | None = None
        self.incarnation: str | None = None
        """The store's incarnation this member's seat belongs to (a restarted store has another)."""
        self.standing_by = False
        """In a line, waiting for a seat."""
        self._noted: set[str] = set()
        self._noted_lock = threading.Lock()
        self._joined_at = time.monotonic()

    @property
    def max_nodes(self) -> int:
        """The most members a round seats: the value in force (the job's `phalanx/max-nodes`) when live."""
        return self._max_nodes() if callable(self._max_nodes) else self._max_nodes

    # Formation and spares.

    def join(self, line: str | None = None) -> Seat:
        """Enter the group: a seat in the first round, or, once that is full (or right away when a `line` is
        named), one given to this member from the line of waiting workers or of spares at a later round (blocks
        until then)."""
        self._joined_at = time.monotonic()
        deadline = self._joined_at + self.timeout
        self.seat = None
        self.incarnation = self.store.compare_set(INCARNATION_KEY, "", uuid.uuid4().hex).decode()
        if line is not None:
            return self._wait_in_line(line, deadline)
        ticket = int(self.store.add(f"{PREFIX}/{FIRST_ROUND}/tickets", 1))
        plan_key = _plan_key(FIRST_ROUND)
        max_nodes = self.max_nodes
        if ticket == max_nodes:
            self._write_plan(Plan(FIRST_ROUND, max_nodes))
        elif ticket <= max_nodes and not self._exists(plan_key):
            self._last_call(ticket, max_nodes)
        plan = self._read_plan(FIRST_ROUND, deadline)
        if ticket <= plan.size:
            return self._seated(Seat(FIRST_ROUND, ticket - 1, plan.size))
        return self._wait_in_line(WORKERS_LINE, deadline)

    def _last_call(self, ticket: int, max_nodes: int) -> None:
        """Below `max_nodes`: wait for the group to fill until the last call, then close it with the members
        there are, if they are enough."""
        if self._wait_until(_plan_key(FIRST_ROUND), time.monotonic() + self.last_call):
            return
        joined = min(int(self.store.add(f"{PREFIX}/{FIRST_ROUND}/tickets", 0)), max_nodes)
        if joined >= self.min_nodes:
            self._write_plan(Plan(FIRST_ROUND, joined))

    def _wait_in_line(self, line: str, deadline: float) -> Seat:
        """Wait for a seat for as long as it takes (a hot spare may stand by for the whole job), until the
        rendezvous closes; `deadline` bounds what follows the seat."""
        # A line kept by two counters, not the store's own queue: torch's `queue_len` keeps the interpreter's
        # lock while it waits for the answer, and the gate's forwarder (worker/storegate.py) is a thread of this
        # same interpreter, so behind the gate the call never returns. The n-th member to arrive in a line is
        # `<line>/<n>`, and the deciders take them in that order, the workers' line first.
        self.standing_by = True
        try:
            key = _seat_key(self.uid)
            # A seat of this member's from before (it was seated, then left out) is not for this wait.
            self.store.delete_key(key)
            queued_at = self.current_round()
            place = int(self.store.add(_pushed_key(line), 1))
            self.store.set(_place_key(line, place), self.uid)
            storeevents.announce(self.store)  # a group below its maximum grows by this member
            begun: dict[int, tuple[float, int]] = {}
            while True:
                if self._wait_for(key, SPARE_SLICE) and (raw := self._get_or_none(key)) is not None:
                    round_number, rank = _parse_seat(raw)
                    if round_number > queued_at:
                        break
                    self.store.delete_key(key)  # left by the decider that left this member out, late
                if self.closed():
                    raise Closed("the rendezvous closed while this member waited for a seat")
                self._take_over(begun)
            deadline = max(deadline, time.monotonic() + self.timeout)
            plan = self._read_plan(round_number, deadline)
            seat = self._seated(Seat(round_number, rank, plan.size))
        finally:
            self.standing_by = False
        # Rounds decided since this member's (it was seated in one, then the group moved on at once).
        return self._catch_up(seat, deadline)

    # Re-forms.

    def reform(self, departed: Iterable[str] = ()) -> Seat:
        """The next round after the `departed` members (UIDs) left, or, with none named, after spares came
        to grow the group: a survivor keeps its rank unless the group shrank past it. Each survivor checks in;
        the first to arrive decides the round, once every member it does not know to be gone has checked in
        (`note_departed` names departures learnt meanwhile) or the grace has passed. Raises `Departed`
        when the plan names this member gone, `Dropped` when it left this member out."""
        if self.seat is None:
            raise RendezvousFailed("reform() before join()")
        deadline = time.monotonic() + self.timeout
        seat = self.seat
        next_round = seat.round + 1
        self.store.set(_checkin_key(next_round, seat.rank), self.uid)
        if int(self.store.add(_checkins_key(next_round), 1)) == 1:
            storeevents.announce(self.store)  # the other members' launchers look now, not at their next poll
            self._decide(seat, next_round, set(departed), attempt=1)
        # No look for later rounds: one could be decided only without this member's check-in (it was dropped
        # or named departed), and then `reform_begun` says so at the member's next look, which follows it.
        return self._follow(self._await_plan(seat, next_round, deadline))

    def _await_plan(self, seat: Seat, next_round: int, deadline: float) -> Plan:
        """The plan of the round this member checked in to. A decider that writes none within the grace and
        `TAKEOVER_MARGIN` (it died, or stands still) is replaced: the first member to claim the next attempt
        decides instead, leaving the earlier claimants out (they may come back in line)."""
        key = _plan_key(next_round)
        attempt = 1
        while not self._wait_until(key, min(deadline, time.monotonic() + self.grace + TAKEOVER_MARGIN)):
            if time.monotonic() >= deadline:
                raise RendezvousFailed(f"round {next_round} was not decided within {self.timeout:.0f} s")
            attempt += 1
            if int(self.store.add(_claim_key(next_round, attempt), 1)) == 1:
                self._decide(seat, next_round, set(), attempt)
        return self._plan_of(next_round)

    def _wait_until(self, key: str, until: float) -> bool:
        """Wait for `key` until the monotonic time `until`, in slices; False when it did not come."""
        while not self._wait_for(key, min(WAIT_SLICE, max(0.01, until - time.monotonic()))):
            if time.monotonic() >= until:
                return False
        return True

    def _catch_up(self, seat: Seat, deadline: float) -> Seat:
        # Rounds decided since (a second departure while this member was away): each plan is a change.
        while self.current_round() > seat.round:
            seat = self._follow(self._read_plan(seat.round + 1, deadline))
        return seat

    def _follow(self, plan: Plan) -> Seat:
        """Take this member's seat in `plan`, the round after its own."""
        assert self.seat is not None
        if self.uid in plan.departed or self.uid in plan.dropped:
            self.seat = None
            if self.uid in plan.departed:
                raise Departed(f"{self.uid} was named departed at round {plan.round}")
            raise Dropped(f"round {plan.round} went on without {self.uid}")
        rank = plan.rank_after(self.seat.rank)
        return self._seated(Seat(plan.round, rank, plan.size), moved=rank != self.seat.rank)

    def _decide(self, previous: Seat, next_round: int, departed: set[str], attempt: int) -> None:
        """Decide the round as its `attempt`-th claimant: wait for the check-ins, then write the plan. Only the
        claimant whose plan lands (compare-and-set) moves the lines and gives the seats."""
        size = previous.world_size
        self.store.set(_claimant_key(next_round, attempt), self.uid)
        # Earlier claimants wrote no plan in time: they are left out, though they may only have stood still.
        earlier = [_claimant_key(next_round, number) for number in range(1, attempt)]
        claimants = {bytes(raw).decode() for raw in self.store.multi_get(earlier)} if earlier else set()
        stale = self._seated_ranks(claimants - {self.uid})
        grace_ends = time.monotonic() + self.grace
        silent: dict[str, int] = dict(stale)
        while True:
            named = departed | self._known_gone()
            ranks = self._seated_ranks(named)
            gone = set(ranks.values()) | set(stale.values())
            expected = [rank for rank in range(size) if rank not in gone]
            if int(self.store.add(_checkins_key(next_round), 0)) >= len(expected) and (
                not expected or self.store.check([_checkin_key(next_round, rank) for rank in expected])
            ):
                break
            if time.monotonic() >= grace_ends:
                silent.update(self._silent(next_round, expected))
                break
            time.sleep(CHECKIN_POLL)
        silent = {uid: rank for uid, rank in silent.items() if uid not in ranks}
        max_nodes = self.max_nodes
        holes, growth = len(ranks) + len(silent), max(0, max_nodes - size)
        lines = {WORKERS_LINE: self._waiting_in(WORKERS_LINE, holes + growth)}
        # Spares fill the places of members lost; they grow the group only once workers had their chance.
        room = holes + (growth if self.spares_may_grow(previous) else 0) - len(lines[WORKERS_LINE][1])
        lines[SPARES_LINE] = self._waiting_in(SPARES_LINE, max(0, room))
        spares = [uid for line in LINES for uid in lines[line][1]]
        plan, _, benched = decide(next_round, size, ranks, spares, max_nodes, silent)
        if benched:
            plan = replace(plan, dropped=tuple(sorted({*plan.dropped, *self._occupants(benched)})))
        if not self._write_plan(plan):
            return  # another claimant's plan landed first: it moves the lines
        # Only this round's decider moves the lines on: the members it seats leave them (a prefix of each, the
        # workers' line first), the others keep their places.
        seated_count = len(plan.seats)
        for line in LINES:
            taken, waiting = lines[line]
            leaving = min(seated_count, len(waiting))
            seated_count -= leaving
            if leaving:
                self.store.add(_taken_key(line), leaving)
                for place in range(taken + 1, taken + 1 + leaving):
                    self.store.delete_key(_place_key(line, place))
        if plan.seats:
            self.store.multi_set(
                [_seat_key(uid) for uid in plan.seats],
                [f"{next_round}:{rank}" for rank in plan.seats.values()],
            )
        for uid in (*plan.departed, *plan.dropped):
            self.store.delete_key(_rank_key(uid))
            self.store.delete_key(_seat_key(uid))
        self.store.set(CURRENT_KEY, str(next_round))

    def _waiting_in(self, line: str, most: int) -> tuple[int, list[str]]:
        """How many members the line has given seats so far, and up to `most` of those waiting, in order."""
        taken = int(self.store.add(_taken_key(line), 0))
        count = min(most, int(self.store.add(_pushed_key(line), 0)) - taken)
        waiting: list[str] = []
        for place in range(taken + 1, taken + 1 + count):
            # A member counts itself in, then names itself: one not named yet waits for the next round.
            if (raw := self._get_or_none(_place_key(line, place))) is None:
                break
            waiting.append(raw.decode())
        return taken, waiting

    def _silent(self, next_round: int, expected: Sequence[int]) -> dict[str, int]:
        """The members of `expected` ranks that have not checked in to the round (UID -> rank)."""
        missing = [rank for rank in expected if not self._exists(_checkin_key(next_round, rank))]
        return {uid: rank for uid, rank in zip(self._occupants(missing), missing, strict=True)}

    def _occupants(self, ranks: Sequence[int]) -> list[str]:
        """The UIDs seated at `ranks` (each seated member names itself under its rank)."""
        return [bytes(raw).decode() for raw in self.store.multi_get([_member_key(rank) for rank in ranks])]

    # Departures, leaving, closing, a lost store.

    def note_departed(self, uids: Iterable[str]) -> None:
        """Pods the operator named failed or removed (any thread): every later round leaves them out at once.
        Kept (a UID is never reused, and one already gone costs a decider one read)."""
        with self._noted_lock:
            self._noted.update(uids)

    def stand_aside(self) -> None:
        """For a member named departed while it still runs (the operator replaces it): hold no place and wait
        in no line, standing by until the rendezvous closes (then `Closed`); the operator deletes the pod
        meanwhile. A place in a line would be given away again at once: every decider counts it gone."""
        self.seat = None
        self.standing_by = True
        while not self._wait_for(CLOSED_KEY, WAIT_SLICE):
            pass
        raise Closed("the rendezvous closed while this member stood aside")

    def _known_gone(self) -> set[str]:
        """Members known to be gone: named by the operator, or said they left."""
        with self._noted_lock:
            noted = set(self._noted)
        return noted | self._left()

    def _seated_ranks(self, uids: Iterable[str]) -> dict[str, int]:
        """The ranks of those of `uids` that hold a seat (a pod that never had one has no rank to give up)."""
        return {uid: _as_int(raw) for uid in uids if (raw := self._get_or_none(_rank_key(uid))) is not None}

    def _take_over(self, begun: dict[int, tuple[float, int]]) -> None:
        """A member waiting in line begins the next round itself when a member of the current one is known to be
        gone: with every member gone (the operator named them all, or they left), no survivor would. It decides
        the round unless a survivor began it first; survivors still alive check in as for any re-form. A decider
        that writes no plan in time is replaced, as among survivors (`_await_plan`). `begun`: the rounds this
        member began, with when it last looked and the attempt in force."""
        current = self.current_round()
        if current < FIRST_ROUND:
            return
        next_round = current + 1
        if current not in begun:
            if not self._seated_ranks(self._known_gone()):
                return
            begun[current] = (time.monotonic(), 1)
            if int(self.store.add(_checkins_key(next_round), 1)) != 1:
                return
            storeevents.announce(self.store)
            attempt = 1
        else:
            since, attempt = begun[current]
            if time.monotonic() - since < self.grace + TAKEOVER_MARGIN or self._exists(_plan_key(next_round)):
                return
            attempt += 1
            begun[current] = (time.monotonic(), attempt)
            if int(self.store.add(_claim_key(next_round, attempt), 1)) != 1:
                return
        size = self._plan_of(current).size
        self._decide(Seat(current, -1, size), next_round, set(), attempt)

    def leave(self) -> None:
        """Say that this member leaves the group for good: the next round's decider counts it gone at once."""
        leave(self.store, self.uid)

    def _left(self) -> set[str]:
        """Members that said they left (few: pods that gave up alone over the job's life)."""
        count = int(self.store.add(LEFT_PUSHED, 0))
        keys = [f"{PREFIX}/left/{place}" for place in range(1, count + 1)]
        return {bytes(raw).decode() for raw in self.store.multi_get(keys)} if keys else set()

    def closed(self) -> bool:
        return bool(self.store.check([CLOSED_KEY]))

    def close(self) -> None:
        self.store.set(CLOSED_KEY, "1")

    def store_was_reset(self) -> bool:
        """Whether the store is not the one this member's seat was given in (it restarted, empty)."""
        return (
            self.incarnation is not None and self._get_or_none(INCARNATION_KEY) != self.incarnation.encode()
        )

    # The store.

    def _seated(self, seat: Seat, moved: bool = True) -> Seat:
        """Record the seat: only a member whose rank changed writes (its rank, and itself under the rank)."""
        if moved:
            self.store.multi_set([_rank_key(self.uid), _member_key(seat.rank)], [str(seat.rank), self.uid])
        self.seat = seat
        return seat

    def waiting_spares(self) -> int:
        """Members waiting in line for a seat (workers and spares)."""
        return sum(self._in_line(line) for line in LINES)

    def waiting_to_grow(self) -> int:
        """Members waiting in line that a re-form would seat to grow the group (0 when it is full)."""
        seat = self.seat
        if seat is None or seat.world_size >= self.max_nodes:
            return 0
        waiting = self._in_line(WORKERS_LINE)
        return waiting if waiting or not self.spares_may_grow(seat) else self._in_line(SPARES_LINE)

    def spares_may_grow(self, seat: Seat) -> bool:
        """Whether spares may grow a group below its maximum, not only fill the places of members lost: once it
        has re-formed (it runs short of a member lost), or once the workers missing from the first round had
        the join timeout to come. Until then a spare would take a late worker's place."""
        return seat.round > FIRST_ROUND or time.monotonic() - self._joined_at >= self.timeout

    def _in_line(self, line: str) -> int:
        return int(self.store.add(_pushed_key(line), 0)) - int(self.store.add(_taken_key(line), 0))

    def reform_begun(self) -> bool:
        """Whether a member checked in to the round after this member's own: the group is re-forming."""
        return self.seat is not None and int(self.store.add(_checkins_key(self.seat.round + 1), 0)) > 0

    def current_round(self) -> int:
        """The newest round decided (0: none yet): above a member's own, the group moved on without it."""
        return int(self.store.add(CURRENT_KEY, 0))  # one round trip; an absent key reads 0

    def _write_plan(self, plan: Plan) -> bool:
        """Write the round's plan unless one is written already; True when this one landed."""
        mine = plan.encode()
        landed = bytes(self.store.compare_set(_plan_key(plan.round), "", mine)).decode() == mine
        if plan.round == FIRST_ROUND:
            # `current_round` may have made the key, at 0.
            self.store.add(CURRENT_KEY, 0)
            self.store.compare_set(CURRENT_KEY, "0", str(FIRST_ROUND))
        return landed

    def _read_plan(self, round_number: int, deadline: float) -> Plan:
        if not self._wait_until(_plan_key(round_number), deadline):
            raise RendezvousFailed(f"round {round_number} was not decided within {self.timeout:.0f} s")
        return self._plan_of(round_number)

    def _plan_of(self, round_number: int) -> Plan:
        """The round's plan, written already."""
        raw = self._get_or_none(_plan_key(round_number))
        if raw is None:
            raise RendezvousFailed(f"round {round_number}'s plan is gone from the store")
        plan = Plan.parse(raw)
        if plan.round != round_number or not 0 < plan.size <= MAX_MEMBERS:
            raise RendezvousFailed(f"round {round_number}'s plan does not fit the group: {plan}")
        return plan

    def _wait_for(self, key: str, seconds: float) -> bool:
        return storeevents.wait_for_key(self.store, key, seconds)

    def _exists(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def _get_or_none(self, key: str) -> bytes | None:
        """The key's value, None when it has none: one round trip, where `check` then `get` take three (the
        store client's `get` waits for the key first)."""
        raw = bytes(self.store.compare_set(key, ABSENT, ABSENT))
        return None if raw == ABSENT.encode() else raw


def leave(store: Any, uid: str) -> None:
    """Say in `store` that the member `uid` leaves the group for good (any connection to the job's store)."""
    place = int(store.add(LEFT_PUSHED, 1))
    store.set(f"{PREFIX}/left/{place}", uid)


def seated(store: Any, uids: Iterable[str]) -> list[str]:
    """Those of `uids` that hold a seat in the group (any connection to the job's store)."""
    return [uid for uid in uids if store.check([_rank_key(uid)])]


def _plan_key(round_number: int) -> str:
    return f"{PREFIX}/{round_number}/plan"


def group_prefix(round_number: int) -> str:
    """Where a round's group keeps its own keys in the store (torchelastic's, the workers' bootstrap)."""
    return f"{PREFIX}/{round_number}/group"


def _claim_key(round_number: int, attempt: int) -> str:
    """Counted by the members that would take over the round's decision at `attempt` (the first count wins)."""
    return f"{PREFIX}/{round_number}/claim/{attempt}"


def _claimant_key(round_number: int, attempt: int) -> str:
    """The UID of the round's `attempt`-th decider."""
    return f"{PREFIX}/{round_number}/claimant/{attempt}"


def _checkins_key(round_number: int) -> str:
    return f"{PREFIX}/{round_number}/in"


def _checkin_key(round_number: int, rank: int) -> str:
    """A survivor's check-in to a re-form, under its rank in the round before."""
    return f"{PREFIX}/{round_number}/in/{rank}"


def _member_key(rank: int) -> str:
    """Who holds `rank` (its UID), for the decider that must name a silent member."""
    return f"{PREFIX}/member/{rank}"


def _seat_key(uid: str) -> str:
    return f"{PREFIX}/seat/{uid}"


def _pushed_key(line: str) -> str:
    """How many members have ever queued in `line`."""
    return f"{PREFIX}/line/{line}/pushed"


def _taken_key(line: str) -> str:
    """How many members of `line` have been given seats."""
    return f"{PREFIX}/line/{line}/taken"


def _place_key(line: str, place: int) -> str:
    return f"{PREFIX}/line/{line}/{place}"


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
