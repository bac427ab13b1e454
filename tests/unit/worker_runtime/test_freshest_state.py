"""The node holding the newest state gets a place in the group before nodes holding older state.

Two failures in a row (a worker, then the spare that took its place) leave one survivor holding the newest
in-memory snapshot and two new spares holding nothing. torch fills the re-formed round with whichever nodes add
themselves first: when the survivor is a moment late, the two new spares take both places, the group restores
an old durable checkpoint, and the survivor stands by with the newest state. The launchers' freshest-state claim
(worker/rendezvous.py) keeps the last place of a round for the holder.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from phalanx.worker import rendezvous, torch_elastic
from phalanx.worker.rendezvous import FreshestClaim, must_leave_last_place

W, S2, S3 = ("127.0.0.1", 101, 0), ("127.0.0.2", 102, 0), ("127.0.0.3", 103, 0)


@pytest.fixture(autouse=True)
def own_node_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch numbers the handlers of a process (a node's local id): these tests' handlers leave the count where
    it was for the tests that come after."""
    handler = torch_elastic.DynamicRendezvousHandler
    monkeypatch.setattr(handler, "_node_desc_generator", dynamic_rendezvous._NodeDescGenerator())


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    server = rendezvous.serve("127.0.0.1", 0)
    yield server
    del server


@pytest.fixture
def store(server: dist.TCPStore) -> dist.Store:
    return connect(server)


def connect(server: dist.TCPStore) -> dist.Store:
    """A client of its own, as each launcher has."""
    return rendezvous.connect("127.0.0.1", server.port, timeout=5)


# ------------------------------------------------------------------------------------ the claim


def test_a_claim_reads_back_as_written() -> None:
    claim = FreshestClaim(81, 4, W)
    assert FreshestClaim.parse(claim.encode()) == claim
    assert FreshestClaim.parse("81 4 127.0.0.1 101") is None
    assert FreshestClaim.parse("eighty 4 127.0.0.1 101 0") is None


@pytest.mark.parametrize(
    ("new", "current", "replaced"),
    [
        (FreshestClaim(82, 4, S2), FreshestClaim(81, 4, W), True),  # a newer step
        (FreshestClaim(80, 4, S2), FreshestClaim(81, 4, W), False),  # an older one
        (FreshestClaim(81, 4, S2), FreshestClaim(81, 4, W), False),  # the same, for the same round
        (FreshestClaim(81, 5, S2), FreshestClaim(81, 4, W), True),  # the same, re-forming later
        (FreshestClaim(10, 6, S2), FreshestClaim(81, 4, W), True),  # the claim in force is long stale
        (FreshestClaim(10, 5, S2), FreshestClaim(81, 4, W), False),  # of the previous round: still wanted
        (FreshestClaim(10, 5, W), FreshestClaim(81, 4, W), True),  # the node's own
    ],
)
def test_which_claim_is_in_force(new: FreshestClaim, current: FreshestClaim, replaced: bool) -> None:
    assert rendezvous.replaces(new, current) is replaced


def test_launchers_claiming_together_leave_the_freshest_named(store: dist.Store) -> None:
    assert rendezvous.read_claim(store) is None
    assert rendezvous.claim_freshest(store, FreshestClaim(40, 3, S2)) == FreshestClaim(40, 3, S2)
    assert rendezvous.claim_freshest(store, FreshestClaim(81, 3, W)) == FreshestClaim(81, 3, W)
    assert rendezvous.claim_freshest(store, FreshestClaim(60, 3, S3)) == FreshestClaim(81, 3, W)
    assert rendezvous.read_claim(store) == FreshestClaim(81, 3, W)


def test_the_round_a_rendezvous_joins() -> None:
    assert rendezvous.target_round(4, complete=True) == 5  # the group formed: the next round
    assert rendezvous.target_round(4, complete=False) == 4  # being formed: this one


# ------------------------------------------------------------------------------ the last place


def leaves(
    claim: FreshestClaim | None,
    *,
    me: tuple[str, int, int] = S3,
    held: int = -1,
    state_round: int = 5,
    participants: frozenset[tuple[str, int, int]] = frozenset({S2}),
    present: frozenset[tuple[str, int, int]] = frozenset(),
    places_left: int = 1,
) -> bool:
    members = set(participants)
    return must_leave_last_place(claim, me, held, state_round, members, members | present, places_left)


def test_a_node_without_state_leaves_the_last_place_to_the_holder_on_its_way() -> None:
    # The holder claimed for this round: it is between leaving the last round and joining this one.
    assert leaves(FreshestClaim(81, 5, W))
    # It claimed for the previous round and still waits in the rendezvous (a round filled up without it).
    assert leaves(FreshestClaim(81, 4, W), present=frozenset({W}))


def test_no_place_is_held_back_without_need() -> None:
    assert not leaves(None)
    assert not leaves(FreshestClaim(81, 5, W), places_left=2)  # room for both
    assert not leaves(FreshestClaim(81, 5, W), participants=frozenset({W}))  # the holder is in
    assert not leaves(FreshestClaim(81, 5, W), held=81)  # this node holds as new a state
    assert not leaves(FreshestClaim(81, 5, W), me=W)
    assert not leaves(FreshestClaim(81, 4, W))  # of the previous round and gone from the rendezvous
    assert not leaves(FreshestClaim(81, 3, W), present=frozenset({W}))  # stale


def test_the_wait_for_a_holder_that_never_comes_is_bounded(store: dist.Store) -> None:
    rendezvous.claim_freshest(store, FreshestClaim(81, 5, W))
    now = [100.0]
    guard = rendezvous.FreshnessGuard(lambda: store, S3, patience=3.0, clock=lambda: now[0])
    state = dynamic_rendezvous._RendezvousState()
    state.round = 5
    state.participants = {dynamic_rendezvous._NodeDesc(*S2): 0}
    assert guard.must_wait(state, max_nodes=2)
    now[0] += 2.9
    assert guard.must_wait(state, max_nodes=2)
    now[0] += 0.2
    assert not guard.must_wait(
        state, max_nodes=2
    )  # torch drops a holder that died once its keep-alive lapses
    assert not guard.must_wait(state, max_nodes=3)


def test_a_guard_asks_nothing_of_a_store_it_cannot_read() -> None:
    def gone() -> dist.Store:
        raise RuntimeError("store unreachable")

    guard = rendezvous.FreshnessGuard(gone, S3, patience=3.0)
    state = dynamic_rendezvous._RendezvousState()
    assert not guard.must_wait(state, max_nodes=2)


# ------------------------------------------------------------- torch's real rendezvous, raced


KEEPALIVE = 3.0


def handler_at(store: dist.Store, address: str) -> torch_elastic.DynamicRendezvousHandler:
    handler = torch_elastic.DynamicRendezvousHandler.from_backend(
        run_id="race",
        store=store,
        backend=torch_elastic.C10dRendezvousBackend(store, "race"),
        min_nodes=2,
        max_nodes=2,
        local_addr=address,
        timeout=torch_elastic.RendezvousTimeout(
            join=timedelta(seconds=12), last_call=timedelta(seconds=1), heartbeat=timedelta(seconds=KEEPALIVE)
        ),
        keep_alive_interval=1,  # type: ignore[arg-type]  # torch annotates it as int, uses it as seconds
        keep_alive_max_attempt=3,
    )
    torch_elastic.set_state_cache(handler, 0.02)
    return handler


def late_after_leaving(handler: torch_elastic.DynamicRendezvousHandler, seconds: float) -> None:
    """The node stalls (descheduled, busy) between leaving its round and joining the next."""
    executor = handler._op_executor
    run = executor.run

    def stalled(state_handler: Any, *args: Any, **kwargs: Any) -> None:
        run(state_handler, *args, **kwargs)
        if isinstance(state_handler, dynamic_rendezvous._RendezvousExitOp):
            time.sleep(seconds)

    executor.run = stalled  # type: ignore[method-assign]


def rendezvous_in_thread(
    handler: torch_elastic.DynamicRendezvousHandler, joined: dict[str, int]
) -> threading.Thread:
    def join() -> None:
        try:
            info = handler.next_rendezvous()
        except Exception:  # left out: the join times out
            return
        joined[torch_elastic.node_of(handler).addr] = info.rank

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    return thread


def race_after_two_failures(server: dist.TCPStore, guarded: bool) -> dict[str, int]:
    """Worker `127.0.0.1` (holding step 81) and the promoted spare `127.0.0.9` formed a round; the spare died;
    two new spares (`.2`, `.3`, no state) wait to join; the worker re-forms but is late joining again. Which
    nodes got the two places (address -> rank)."""
    addresses = ("127.0.0.1", "127.0.0.9", "127.0.0.2", "127.0.0.3")
    stores = {address: connect(server) for address in addresses}
    nodes = {address: handler_at(stores[address], address) for address in addresses}
    guards = {}
    if guarded:
        for address, handler in nodes.items():
            node = rendezvous.node_key(torch_elastic.node_of(handler))
            own = stores[address]
            guards[address] = rendezvous.FreshnessGuard(lambda own=own: own, node, patience=KEEPALIVE)
            torch_elastic.guard_joins(handler, guards[address].must_wait)
    first: dict[str, int] = {}
    threads = [rendezvous_in_thread(nodes[address], first) for address in ("127.0.0.1", "127.0.0.9")]
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(first) == ["127.0.0.1", "127.0.0.9"]
    # The promoted spare dies: its keep-alive stops, and the operator's word expires it at once.
    dead = nodes.pop("127.0.0.9")
    dead._stop_heartbeats()
    store = stores["127.0.0.9"]
    rendezvous.publish_node(store, "spare", torch_elastic.node_of(dead))
    assert rendezvous.forget_departed(store, torch_elastic.state_backend(dead), ["spare"])
    joined: dict[str, int] = {}
    waiters = [rendezvous_in_thread(nodes[address], joined) for address in ("127.0.0.2", "127.0.0.3")]
    time.sleep(1.0)  # both new spares queued in the wait list of the next round
    worker = nodes["127.0.0.1"]
    if guarded:
        worker.num_nodes_waiting()
        now = torch_elastic.round_state(worker)
        guards["127.0.0.1"].offer(81, now.round, now.complete)
    late_after_leaving(worker, 1.0)
    waiters.append(rendezvous_in_thread(worker, joined))
    deadline = time.monotonic() + 20
    while len(joined) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    # The job ends: the one left waiting sees the rendezvous closed and gives up.
    nodes["127.0.0.1"].shutdown()
    for thread in waiters:
        thread.join(timeout=10)
    for handler in nodes.values():
        handler._stop_heartbeats()
    return joined


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendezvous polls every 20 ms, as the launcher makes them (worker/rendezvous.py, sync_poll_interval), and
    no node hosts a store for its training processes (nor does the launcher: TORCH_DISABLE_SHARE_RDZV_TCP_STORE)."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    original = dynamic_rendezvous._delay
    monkeypatch.setattr(
        dynamic_rendezvous, "_delay", lambda seconds: original(0.02 if seconds == 1 else seconds)
    )


@pytest.mark.usefixtures("fast_polls")
def test_torch_alone_gives_both_places_to_the_nodes_without_state(server: dist.TCPStore) -> None:
    # What the claim is for: the worker holding the newest state is left out.
    joined = race_after_two_failures(server, guarded=False)
    assert sorted(joined) == ["127.0.0.2", "127.0.0.3"], joined


@pytest.mark.usefixtures("fast_polls")
def test_the_holder_of_the_newest_state_gets_a_place_though_it_joins_last(server: dist.TCPStore) -> None:
    joined = race_after_two_failures(server, guarded=True)
    assert len(joined) == 2 and "127.0.0.1" in joined, joined


# ------------------------------------------------- a member of a new round dies as the round forms


def client_at(server: dist.TCPStore, address: str) -> Any:
    from phalanx.worker.env import settings_from
    from phalanx.worker.launch import RendezvousClient

    env = {
        "PHALANX_RDZV_ENDPOINT": f"127.0.0.1:{server.port}",
        "PHALANX_JOB_UID": "race",
        "POD_IP": address,
        "PHALANX_MIN_NODES": "2",
        "PHALANX_MAX_NODES": "2",
    }
    overrides = {"command": ("python",), "keepalive_interval": 1.0, "keepalive_timeout": KEEPALIVE}
    client = RendezvousClient(settings_from(env, overrides))
    torch_elastic.set_state_cache(client.handler, 0.02)
    return client


def dies_when_the_round_forms(handler: torch_elastic.DynamicRendezvousHandler) -> None:
    """The node dies right after its join: before it says anything to the other members of the round."""
    executor = handler._op_executor
    run = executor.run

    def dying(state_handler: Any, *args: Any, **kwargs: Any) -> None:
        run(state_handler, *args, **kwargs)
        if isinstance(state_handler, dynamic_rendezvous._RendezvousJoinOp):
            handler._stop_heartbeats = lambda: None  # type: ignore[method-assign]
            raise SystemExit("killed")

    executor.run = dying  # type: ignore[method-assign]


@pytest.mark.usefixtures("fast_polls")
def test_a_member_whose_peer_died_as_the_round_formed_stays_in_the_rendezvous(server: dist.TCPStore) -> None:
    # The spare that took a failed worker's place (rank 0, it hosts the round's bootstrap address) dies as the
    # round forms: the survivor waits for that address. Its keep-alives must go on meanwhile (torch would
    # drop it, and new pods without state would take both places), and the wait must end after the
    # keep-alive timeout, not the store's.
    survivor, spare = client_at(server, "127.0.0.5"), client_at(server, "127.0.0.4")
    dies_when_the_round_forms(spare.handler)
    outcome: dict[str, Any] = {}

    def join(name: str, client: Any) -> None:
        started = time.monotonic()
        try:
            client.handler.next_rendezvous()
        except BaseException as error:
            outcome[name] = (type(error).__name__, time.monotonic() - started)

    threads = [
        threading.Thread(target=join, args=item, daemon=True)
        for item in (("survivor", survivor), ("spare", spare))
    ]
    for thread in threads:
        thread.start()
    observer = connect(server)
    backend = torch_elastic.C10dRendezvousBackend(observer, "race")
    node = torch_elastic.node_of(survivor.handler)
    beats = []
    while threads[0].is_alive() and len(beats) < 200:
        current = backend.get_state()
        if current is not None:
            state = pickle.loads(current[0])
            if state.complete and node in state.participants:
                beats.append(state.last_heartbeats[node])
        time.sleep(0.05)
    threads[0].join(timeout=30)
    assert outcome["spare"][0] == "SystemExit"
    name, waited = outcome["survivor"]
    assert name in ("DistStoreError", "DistError"), outcome
    assert waited < KEEPALIVE + 2.0, outcome  # the keep-alive timeout, not the store's 15 s
    # It kept its keep-alives going while it waited: still a participant, renewed within the timeout.
    current = backend.get_state()
    assert current is not None
    state = pickle.loads(current[0])
    assert node in state.participants, state.participants
    assert len(set(beats)) >= 2, beats
    survivor.handler._stop_heartbeats()
