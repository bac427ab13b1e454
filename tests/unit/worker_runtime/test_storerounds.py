"""Rendezvous rounds decided in the store (worker/storerounds.py): the plan's arithmetic, and whole groups of
members on threads against a real TCPStore server."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from phalanx.worker import rendezvous, storerounds
from phalanx.worker.storerounds import (
    SPARES_LINE,
    Closed,
    Departed,
    Dropped,
    Plan,
    RendezvousFailed,
    Seat,
    StoreRounds,
    decide,
)


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    store = rendezvous.serve("127.0.0.1", 0)
    yield store


def member(server: dist.TCPStore, uid: str, **options: Any) -> StoreRounds:
    client = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=20)
    )
    settings = {"min_nodes": 4, "max_nodes": 4, "last_call": 5.0, "timeout": 20.0, **options}
    return StoreRounds(client, uid, **settings)


def together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads at once; their results (or the exceptions they raised), in order."""
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def formed(server: dist.TCPStore, size: int, **options: Any) -> list[StoreRounds]:
    members = [
        member(server, f"m{index}", min_nodes=size, max_nodes=size, **options) for index in range(size)
    ]
    seats = together([m.join for m in members])
    assert sorted(seat.rank for seat in seats) == list(range(size)), seats
    assert {seat.world_size for seat in seats} == {size}
    return members


def standing_by(
    spare: StoreRounds, seen_by: StoreRounds, waiting: int = 1
) -> tuple[threading.Thread, list[Any]]:
    """The spare joins on a thread of its own; returns once `seen_by` (a member: the spare's own connection
    is busy waiting) sees it queued."""
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(spare.join()))
    thread.start()
    while seen_by.waiting_spares() < waiting:
        thread.join(0.01)
    return thread, outcome


def test_a_spare_takes_the_departed_rank_and_ranks_stay_dense_when_spares_run_short() -> None:
    plan, left, benched = decide(2, 8, {"dead": 3}, ["s1", "s2"], max_nodes=8)
    assert (plan.size, plan.seats, plan.moves, left, benched) == (8, {"s1": 3}, {}, ["s2"], [])
    # Two deaths, one spare: rank 7, past the new size, moves into the lower hole; the spare fills the other.
    plan, left, _ = decide(2, 8, {"a": 5, "b": 2}, ["s1"], max_nodes=8)
    assert (plan.size, plan.seats, plan.moves, left) == (7, {"s1": 5}, {7: 2}, [])
    # No spare: the highest ranks move down; a hole above the new size needs no mover.
    plan, _, _ = decide(2, 8, {"a": 7, "b": 1, "c": 4}, [], max_nodes=8)
    assert (plan.size, plan.moves) == (5, {5: 1, 6: 4})
    # No death: waiting spares grow the group up to its maximum, at the end.
    plan, left, _ = decide(3, 5, {}, ["s1", "s2", "s3"], max_nodes=6)
    assert (plan.size, plan.seats, left) == (6, {"s1": 5}, ["s2", "s3"])


def test_a_lowered_maximum_leaves_out_the_highest_ranks_and_a_silent_member_is_dropped_not_departed() -> None:
    plan, left, benched = decide(2, 6, {}, ["s1"], max_nodes=4)
    assert (plan.size, plan.seats, plan.moves, left, benched) == (4, {}, {}, ["s1"], [4, 5])
    # A silent member's rank is a hole like a departed one's, but the plan says it may come back.
    plan, _, benched = decide(2, 4, {"gone": 1}, [], max_nodes=4, dropped={"quiet": 2})
    assert (plan.size, plan.departed, plan.dropped, plan.moves, benched) == (
        2,
        ("gone",),
        ("quiet",),
        {3: 1},
        [],
    )


def test_the_plan_of_one_death_is_the_same_size_whatever_the_group() -> None:
    small, _, _ = decide(2, 8, {"uid-3": 3}, ["uid-spare"], max_nodes=8)
    large, _, _ = decide(2, 12_500, {"uid-3": 3}, ["uid-spare"], max_nodes=12_500)
    assert len(large.encode()) - len(small.encode()) <= 4  # only the size's digits differ
    assert Plan.parse(large.encode()) == large


@pytest.mark.parametrize("raw", [b"\x80\x04pickled", b"{}", b'{"round": "x", "size": 2}', b"[1, 2]"])
def test_a_plan_that_is_not_ours_is_refused(raw: bytes) -> None:
    with pytest.raises(RendezvousFailed):
        Plan.parse(raw)


def test_a_group_forms_with_dense_ranks_and_a_hot_spare_takes_a_dead_members_place(
    server: dist.TCPStore,
) -> None:
    members = formed(server, 4)
    spare_thread, spare_seat = standing_by(member(server, "spare"), members[0])
    before = {m.uid: m.seat for m in members}
    dead = next(m for m in members if m.seat.rank == 2)
    survivors = [m for m in members if m is not dead]
    seats = together([lambda m=m: m.reform([dead.uid]) for m in survivors])
    spare_thread.join(30)
    assert spare_seat == [Seat(2, 2, 4)]
    assert all(seat == Seat(2, before[m.uid].rank, 4) for m, seat in zip(survivors, seats, strict=True)), (
        seats
    )
    # The departed member learns it has no seat when it asks.
    with pytest.raises(Departed):
        dead.reform([dead.uid])


def test_without_a_spare_the_group_shrinks_and_only_the_ranks_past_its_end_move(
    server: dist.TCPStore,
) -> None:
    members = formed(server, 6)
    by_rank = {m.seat.rank: m for m in members}
    dead = [by_rank[1], by_rank[4]]
    survivors = [m for m in members if m not in dead]
    together([lambda m=m: m.reform([d.uid for d in dead]) for m in survivors])
    ranks = {m.uid: m.seat.rank for m in survivors}
    assert sorted(ranks.values()) == [0, 1, 2, 3]
    assert {m.seat.world_size for m in survivors} == {4}
    assert ranks[by_rank[0].uid] == 0 and ranks[by_rank[2].uid] == 2 and ranks[by_rank[3].uid] == 3
    assert ranks[by_rank[5].uid] == 1  # rank 5 moved into the lower hole


def test_a_round_waits_for_a_survivor_that_checks_in_late_within_the_grace(server: dist.TCPStore) -> None:
    members = formed(server, 4, grace=10.0)
    by_rank = {m.seat.rank: m for m in members}
    laggard = by_rank[3]
    first, second = by_rank[1], by_rank[0]
    # The decider of round 2 waits for the laggard, which checks in late but within the grace.
    early = threading.Thread(
        target=lambda: together([lambda m=m: m.reform([first.uid]) for m in (by_rank[0], by_rank[2])])
    )
    early.start()
    threading.Event().wait(0.5)
    observer = member(server, "observer")  # a connection of its own: the others' wait on theirs
    assert observer.current_round() == 1, "the round was decided without the laggard"
    laggard.reform([first.uid])
    early.join(30)
    assert laggard.seat.round == 2 and laggard.seat.world_size == 3
    # Nobody has begun round 3 yet; after a second death both survivors re-form into it.
    assert laggard.reform_begun() is False
    third = by_rank[2]
    both = together([lambda: third.reform([second.uid]), lambda: laggard.reform([second.uid])])
    assert {seat.round for seat in both} == {3} and sorted(seat.rank for seat in both) == [0, 1]


def test_a_silent_member_is_dropped_after_the_grace_and_may_come_back_as_a_spare(
    server: dist.TCPStore,
) -> None:
    members = formed(server, 3, grace=0.5)
    by_rank = {m.seat.rank: m for m in members}
    silent = by_rank[1]
    seats = together([lambda m=m: m.reform() for m in (by_rank[0], by_rank[2])])
    assert sorted(seat.rank for seat in seats) == [0, 1] and {seat.world_size for seat in seats} == {2}
    with pytest.raises(Dropped):
        silent.reform()
    # Back as a spare, it is seated when the group grows again (the maximum is 3).
    thread, outcome = standing_by(silent, by_rank[0])
    assert by_rank[0].seat is not None
    together([lambda m=m: m.reform() for m in (by_rank[0], by_rank[2])])
    thread.join(30)
    assert outcome == [Seat(3, 2, 3)]


def test_a_member_that_left_is_not_waited_for(server: dist.TCPStore) -> None:
    members = formed(server, 3, grace=30.0)
    leaver = next(m for m in members if m.seat.rank == 0)
    leaver.leave()
    started = time.monotonic()
    seats = together([lambda m=m: m.reform() for m in members if m is not leaver])
    assert time.monotonic() - started < 10 and sorted(seat.rank for seat in seats) == [0, 1]


def test_new_members_form_the_next_round_when_the_whole_group_is_gone(server: dist.TCPStore) -> None:
    """Nobody of the group is left to re-form it: the members it left waiting begin the round themselves once
    they know the group's members are gone (they left, or the operator named them)."""
    members = formed(server, 2, grace=30.0)
    members[0].leave()
    newcomers = [member(server, f"new{index}", min_nodes=2, max_nodes=2) for index in range(2)]
    for newcomer in newcomers:  # the operator's regroup request reaches every launcher
        newcomer.note_departed([members[1].uid])
    started = time.monotonic()
    seats = together([m.join for m in newcomers])
    assert time.monotonic() - started < 10
    assert sorted(seat.rank for seat in seats) == [0, 1] and {(s.round, s.world_size) for s in seats} == {
        (2, 2)
    }


def test_a_decider_that_dies_before_its_plan_is_replaced(
    server: dist.TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storerounds, "TAKEOVER_MARGIN", 0.5)
    members = formed(server, 3, grace=0.5)
    by_rank = {m.seat.rank: m for m in members}
    doomed = by_rank[1]
    # It checks in first, so it is the round's decider, and dies before it writes the plan.
    doomed.store.set(f"phalanx/rounds/2/in/{doomed.seat.rank}", doomed.uid)
    assert doomed.store.add("phalanx/rounds/2/in", 1) == 1
    doomed.store.set("phalanx/rounds/2/claimant/1", doomed.uid)
    seats = together([lambda m=m: m.reform() for m in (by_rank[0], by_rank[2])])
    assert [(seat.round, seat.rank, seat.world_size) for seat in seats] == [(2, 0, 2), (2, 1, 2)]
    # It was only left out: if it comes back, it hears so and may wait in line.
    with pytest.raises(Dropped):
        doomed.reform()


def test_a_restarted_store_is_noticed_and_the_group_forms_afresh(server: dist.TCPStore) -> None:
    members = formed(server, 2)
    assert not any(m.store_was_reset() for m in members)
    for key in ("phalanx/rounds/incarnation",):
        members[0].store.delete_key(key)
    assert all(m.store_was_reset() for m in members)


def test_below_its_maximum_the_group_closes_at_the_last_call(server: dist.TCPStore) -> None:
    members = [member(server, f"m{index}", min_nodes=2, max_nodes=4, last_call=0.5) for index in range(3)]
    seats = together([m.join for m in members])
    assert sorted(seat.rank for seat in seats) == [0, 1, 2] and {seat.world_size for seat in seats} == {3}
    # A fourth arrives after the close: a spare, which a growth round seats at the end.
    late = member(server, "late", min_nodes=2, max_nodes=4)
    thread, outcome = standing_by(late, members[0])
    together([lambda m=m: m.reform() for m in members])
    thread.join(30)
    assert outcome == [Seat(2, 3, 4)] and {m.seat.world_size for m in members} == {4}


def test_a_late_worker_is_seated_before_a_spare_that_came_first(server: dist.TCPStore) -> None:
    first = member(server, "first", min_nodes=1, max_nodes=2, last_call=0.3)
    first.join()
    spare = member(server, "spare", min_nodes=1, max_nodes=2)
    spare_outcome: list[Any] = []
    spare_thread = threading.Thread(
        target=lambda: spare_outcome.extend(together([lambda: spare.join(SPARES_LINE)]))
    )
    spare_thread.start()
    while first.waiting_spares() == 0:
        spare_thread.join(0.01)
    # Below its maximum in its first round, the group does not grow with a spare: a worker may still come.
    assert first.waiting_to_grow() == 0
    late = member(server, "late", min_nodes=1, max_nodes=2)
    thread, outcome = standing_by(late, first, waiting=2)
    assert first.waiting_to_grow() == 1
    first.reform()
    thread.join(30)
    assert outcome == [Seat(2, 1, 2)] and spare.seat is None
    # The spare stands by until the rendezvous closes, then hears so.
    first.close()
    spare_thread.join(30)
    assert [type(error) for error in spare_outcome] == [Closed]


def test_a_dead_members_place_goes_to_a_waiting_worker_before_a_spare(server: dist.TCPStore) -> None:
    members = formed(server, 2)
    spare = member(server, "spare", min_nodes=2, max_nodes=2)
    spare_outcome: list[Any] = []
    spare_thread = threading.Thread(
        target=lambda: spare_outcome.extend(together([lambda: spare.join(SPARES_LINE)]))
    )
    spare_thread.start()
    while members[0].waiting_spares() == 0:
        spare_thread.join(0.01)
    late = member(server, "late", min_nodes=2, max_nodes=2)
    thread, outcome = standing_by(late, members[0], waiting=2)
    dead, survivor = sorted(members, key=lambda m: m.seat.rank)
    survivor.reform([dead.uid])
    thread.join(30)
    assert outcome == [Seat(2, 0, 2)] and spare.seat is None
    survivor.close()
    spare_thread.join(30)


def test_too_few_members_by_the_last_call_is_a_failure_in_time(server: dist.TCPStore) -> None:
    alone = member(server, "alone", min_nodes=2, max_nodes=4, last_call=0.2, timeout=1.0)
    with pytest.raises(RendezvousFailed, match="not decided"):
        alone.join()


def test_a_departed_pod_that_never_had_a_seat_does_not_hold_up_the_round(server: dist.TCPStore) -> None:
    members = formed(server, 4, timeout=10.0)
    dead = next(m for m in members if m.seat.rank == 1)
    survivors = [m for m in members if m is not dead]
    seats = together([lambda m=m: m.reform([dead.uid, "a-spare-that-died-waiting"]) for m in survivors])
    assert {seat.world_size for seat in seats} == {3} and sorted(seat.rank for seat in seats) == [0, 1, 2]


def test_torchruns_handler_gives_each_round_its_own_store_and_bootstrap_and_says_when_to_re_form(
    server: dist.TCPStore,
) -> None:
    from phalanx.worker.roundshandler import StoreRoundsHandler
    from phalanx.worker.torch_elastic import RendezvousClosedError, RendezvousGracefulExitError

    handlers = [
        StoreRoundsHandler(member(server, f"m{index}", min_nodes=3, max_nodes=3), "job", f"10.0.0.{index}")
        for index in range(3)
    ]
    infos = together([handler.next_rendezvous for handler in handlers])
    assert sorted(info.rank for info in infos) == [0, 1, 2] and {info.world_size for info in infos} == {3}
    first = next(info for info in infos if info.rank == 0)
    addresses = {
        (info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) for info in infos
    }
    assert addresses == {(first.bootstrap_store_info.master_addr, first.bootstrap_store_info.master_port)}
    assert all(handler.num_nodes_waiting() == 0 for handler in handlers)

    by_rank = {info.rank: handler for info, handler in zip(infos, handlers, strict=True)}
    dead, mover, laggard = by_rank[1], by_rank[2], by_rank[0]
    mover.note_departed([dead.rounds.uid])

    def follow() -> Any:
        # The laggard's agent learns from its monitor that the group moved on, and follows.
        while laggard.num_nodes_waiting() == 0:
            threading.Event().wait(0.01)
        return laggard.next_rendezvous()

    moved, followed = together([mover.next_rendezvous, follow])
    assert (moved.rank, followed.rank, moved.world_size) == (1, 0, 2)
    # Each round's keys live apart: the first round's bootstrap is not the second's.
    followed.store.set("probe", "round 2")
    assert not first.store.check(["probe"])
    # The member named departed while it runs stands by, in no line, until the job ends; then it leaves.
    aside: list[Any] = []
    thread = threading.Thread(target=lambda: aside.extend(together([dead.next_rendezvous])))
    thread.start()
    while not dead.rounds.standing_by:
        thread.join(0.01)
    assert laggard.rounds.waiting_spares() == 0 and thread.is_alive()
    laggard.set_closed()
    thread.join(60)
    assert [type(error) for error in aside] == [RendezvousGracefulExitError]
    with pytest.raises(RendezvousClosedError):
        mover.next_rendezvous()


def test_torchs_elastic_agents_form_a_gloo_group_through_the_handler(
    server: dist.TCPStore, tmp_path: Path
) -> None:
    """Two nodes, each torch's own LocalElasticAgent with the handler: their workers find each other at the
    round's bootstrap address and all-reduce."""
    agent = Path(__file__).with_name("rounds_agent.py")
    nodes = [
        subprocess.Popen([sys.executable, str(agent), str(server.port), f"node-{index}", "2", str(tmp_path)])
        for index in range(2)
    ]
    assert [node.wait(120) for node in nodes] == [0, 0]
    outcomes = {path.name: path.read_text().split() for path in tmp_path.glob("rank-*")}
    assert sorted(outcomes) == ["rank-0", "rank-1"]
    # World of 2, the all-reduce of 1 + 2, one bootstrap address for both.
    assert {tuple(words[:2]) for words in outcomes.values()} == {("2", "3")}
    assert len({words[2] for words in outcomes.values()}) == 1
