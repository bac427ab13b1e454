"""A node queued for a round that filled up without it: no restart for it, and it counts as standing by.

After a store loss three launchers (a survivor, the promoted spare, the new spare) race for two slots; torch
leaves the loser in the wait list of a full round, and restarting the group for it only reshuffled who was
in, again and again (and once left the only worker with state out).
"""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _Action,
    _NodeDesc,
    _RendezvousContext,
    _RendezvousJoinOp,
    _RendezvousState,
)

from phalanx.worker import rendezvous
from phalanx.worker.launch import RendezvousClient

A, B, C = (_NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(3))


def full_round_with_a_waiter() -> _RendezvousState:
    state = _RendezvousState()
    state.round = 4
    state.complete = True
    state.participants = {A: 0, B: 1}
    state.wait_list = {C}
    return state


def settings(max_nodes: int) -> RendezvousSettings:
    return RendezvousSettings(
        run_id="job",
        min_nodes=1,
        max_nodes=max_nodes,
        timeout=RendezvousTimeout(),
        keep_alive_interval=timedelta(seconds=1),
        keep_alive_max_attempt=3,
    )


def test_torch_keeps_a_waiter_of_a_full_round_in_the_wait_list() -> None:
    # What the launcher's check relies on: torch neither admits nor moves it; it only keeps alive or syncs.
    context = _RendezvousContext(C, full_round_with_a_waiter(), settings(2))
    action = _RendezvousJoinOp()(context, time.monotonic() + 60)
    assert action in (_Action.KEEP_ALIVE, _Action.SYNC)


def test_room_is_an_open_round_or_fewer_participants_than_wanted() -> None:
    assert not rendezvous.has_room(complete=True, participants=2, max_nodes=2)
    assert rendezvous.has_room(complete=True, participants=1, max_nodes=2)  # a member was lost
    assert rendezvous.has_room(complete=True, participants=2, max_nodes=3)  # the job grew
    assert rendezvous.has_room(complete=False, participants=2, max_nodes=2)  # others are re-forming


def client_for(state: _RendezvousState, node: _NodeDesc, max_nodes: int) -> Any:
    client = object.__new__(RendezvousClient)
    client.handler = SimpleNamespace(  # type: ignore[assignment]
        _state_holder=SimpleNamespace(state=state),
        _this_node=node,
        num_nodes_waiting=lambda: len(state.wait_list),
    )
    client.max_nodes = SimpleNamespace(current=lambda: max_nodes)  # type: ignore[assignment]
    return client


def test_a_full_group_does_not_re_form_for_a_waiter_and_the_waiter_stands_by() -> None:
    state = full_round_with_a_waiter()
    assert client_for(state, A, 2).waiting_with_room() == 0
    assert client_for(state, C, 2).in_standby()
    assert not client_for(state, A, 2).in_standby()


def test_a_lost_member_or_a_larger_group_lets_the_waiter_in() -> None:
    state = full_round_with_a_waiter()
    assert client_for(state, A, 3).waiting_with_room() == 1
    assert not client_for(state, C, 3).in_standby()
    del state.participants[B]
    assert client_for(state, A, 2).waiting_with_room() == 1


def test_a_node_outside_a_full_round_stands_by_before_torch_lists_it() -> None:
    # A spare that saw the group full and is joining: torch has yet to put it in the redundancy list, but it
    # stands by all the same (the operator must not take its loss for a promoted spare's).
    state = full_round_with_a_waiter()
    state.wait_list = set()
    assert client_for(state, C, 2).in_standby()
    # With room for it, it is joining the group (being promoted), not standing by.
    assert not client_for(state, C, 3).in_standby()
    state.complete = False
    assert not client_for(state, C, 2).in_standby()


def test_the_first_outcome_said_stands_and_only_its_own_form_is_read() -> None:
    server = rendezvous.serve("127.0.0.1", 0)
    store = rendezvous.connect("127.0.0.1", server.port, timeout=5)
    assert rendezvous.read_outcome(store) is None
    failed = rendezvous.GroupOutcome(1, "a: the training command failed")
    rendezvous.publish_outcome(store, failed)
    rendezvous.publish_outcome(store, rendezvous.GroupOutcome(0, "spare: finished"))
    assert rendezvous.read_outcome(store) == failed and failed.failed
    for raw in ("not json", "[1]", '{"code": "1"}', '{"code": true}', '{"code": 999}'):
        assert rendezvous.GroupOutcome.parse(raw) is None, raw
    assert rendezvous.GroupOutcome.parse('{"code": 0}') == rendezvous.GroupOutcome(0, "")
