"""Leader election over a Lease (operator/leadership.py) against an in-memory Lease store that, like the API
server, refuses a write carrying a stale resourceVersion."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from phalanx.operator import leadership
from phalanx.operator.kube import Kube
from phalanx.operator.leadership import LeaderElector, LeaseTiming, NotLeader, claimable

TIMING = LeaseTiming(lease_seconds=8, renew_deadline_seconds=6, retry_seconds=1)
PATH = "/apis/coordination.k8s.io/v1/namespaces/ops/leases"


class LeaseStore:
    """One namespace's Leases, as the API server keeps them: every write moves the resourceVersion on, and a
    write carrying an older one is refused (409)."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.down = False
        self.writes: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if self.down:
            raise ConnectionError("the API server does not answer")
        name = path.rsplit("/", 1)[1] if path != PATH else body["metadata"]["name"]
        if method == "GET":
            if name not in self.leases:
                raise ApiException(status=404)
            return copy.deepcopy(self.leases[name])
        if method == "POST" and name in self.leases:
            raise ApiException(status=409)
        if method == "PUT":
            current = self.leases.get(name)
            if current is None:
                raise ApiException(status=404)
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409)
        self.version += 1
        stored = {
            "metadata": {"name": name, "resourceVersion": str(self.version)},
            "spec": dict(body["spec"]),
        }
        self.leases[name] = stored
        self.writes.append((method, stored["spec"]["holderIdentity"]))
        return copy.deepcopy(stored)

    def holder(self, name: str = "leader") -> str:
        return str(self.leases[name]["spec"]["holderIdentity"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: LeaseStore, clock: Clock, identity: str, lost: list[str] | None = None) -> LeaderElector:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return LeaderElector(
        store.request,
        "ops",
        "leader",
        identity,
        TIMING,
        on_lost=(lost.append if lost is not None else None),
        clock=clock,
        wall=lambda: start + timedelta(seconds=clock.now),
    )


def test_the_first_replica_creates_the_lease_and_the_second_stands_by() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.attempt() and a.holds() and a.leading.is_set()
    assert not b.attempt() and not b.holds() and not b.leading.is_set()
    spec = store.leases["leader"]["spec"]
    assert (
        spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 8 and spec["leaseTransitions"] == 0
    )
    for _ in range(20):  # the holder renews every second; the standby never takes over
        clock.now += 1
        assert a.attempt() and not b.attempt()
    assert store.holder() == "a"


def test_a_standby_takes_over_only_after_the_lease_stood_still_for_its_duration() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.attempt()
    clock.now += 0.5
    assert not b.attempt()  # first seen now
    for _ in range(7):  # the holder is gone: nothing renews
        clock.now += 1
        assert not b.attempt()
    clock.now += 0.6  # 7.6 s since the standby first saw this version: not yet
    assert not b.attempt()
    clock.now += 0.5  # 8.1 s
    assert b.attempt() and b.holds()
    spec = store.leases["leader"]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_a_released_lease_is_taken_at_once() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    a.attempt()
    assert not b.attempt()
    a.release()
    assert not a.holds() and store.holder() == ""
    # Released on the way out: a write still under way in this process is refused, and takes nothing back.
    with pytest.raises(NotLeader):
        a.fence()
    assert store.holder() == ""
    assert b.attempt() and store.holder() == "b"


def test_a_restarted_process_of_the_same_pod_takes_its_own_lease_back_at_once() -> None:
    store, clock = LeaseStore(), Clock()
    elector(store, clock, "pod-0").attempt()
    clock.now += 2
    assert elector(store, clock, "pod-0").attempt()


def test_the_leader_acts_only_until_its_renew_deadline_which_ends_before_any_takeover() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    a.attempt()
    clock.now += TIMING.renew_deadline_seconds - 0.01
    assert a.holds()
    clock.now += 0.02
    assert not a.holds()
    # A standby that saw that renewal at the very moment it was written waits longer than that.
    assert not claimable(
        leadership.Observed("a", "1", TIMING.lease_seconds, 1000.0),
        "b",
        1000.0 + TIMING.renew_deadline_seconds,
    )


def test_a_leader_paused_past_its_lease_is_fenced_off_and_sends_nothing() -> None:
    """The leader's process stops (a pause, a starved node) past its Lease; the standby takes over; the old
    leader wakes with a write under way: the fence refuses it, and the old leader reports the loss."""
    store, clock = LeaseStore(), Clock()
    lost: list[str] = []
    a, b = elector(store, clock, "a", lost), elector(store, clock, "b")
    a.attempt()
    b.attempt()
    clock.now += TIMING.lease_seconds + 1  # a is paused: no renewal
    assert b.attempt() and store.holder() == "b"
    sent: list[str] = []
    kube = Kube.__new__(Kube)
    kube.fence = a.fence
    kube.client = None  # type: ignore[assignment]

    def send(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0])
        raise AssertionError("a fenced-off replica sent a request")

    kube.client = type("Client", (), {"param_serialize": send})()  # type: ignore[assignment]
    with pytest.raises(NotLeader, match="held by b"):
        kube.request("POST", "/api/v1/namespaces/team/pods", {"metadata": {"name": "p"}})
    assert sent == [] and lost == ["b"] and a.lost.is_set()
    with pytest.raises(NotLeader):  # and it stays fenced off
        a.fence()
    assert not a.attempt() and store.holder() == "b"


def test_a_leader_paused_while_nobody_took_over_renews_and_goes_on() -> None:
    """One replica paused past its Lease with no standby (or a standby that did not take it yet): its fence
    renews the Lease with the resourceVersion of its own last write, which proves nobody wrote it since."""
    store, clock = LeaseStore(), Clock()
    lost: list[str] = []
    a = elector(store, clock, "a", lost)
    a.attempt()
    clock.now += 60
    a.fence()
    assert a.holds() and lost == [] and store.holder() == "a"


def test_while_the_api_server_is_away_the_leader_refuses_writes_then_resumes() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    a.attempt()
    store.down = True
    clock.now += TIMING.renew_deadline_seconds + 1
    with pytest.raises(NotLeader, match="cannot renew"):
        a.fence()
    store.down = False
    a.fence()
    assert a.holds()


def test_two_standbys_racing_for_a_free_lease_get_one_leader() -> None:
    store, clock = LeaseStore(), Clock()
    a = elector(store, clock, "a")
    a.attempt()
    b, c = elector(store, clock, "b"), elector(store, clock, "c")
    b.attempt(), c.attempt()
    clock.now += TIMING.lease_seconds + 1
    # Both read the same version before either writes: the API server accepts the first write only.
    real = store.request
    barrier = threading.Barrier(2)

    def racing(method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        if method == "GET":
            found = real(method, path, body)
            barrier.wait(timeout=5)
            return found
        return real(method, path, body)

    b._request = c._request = racing
    results: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda e=e: results.update({e.identity: e.attempt()})) for e in (b, c)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(results.values()) == [False, True], results
    assert store.holder() == next(name for name, won in results.items() if won)


def test_lease_times_must_leave_the_standby_waiting_longer_than_the_leader_acts() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaseTiming(lease_seconds=5, renew_deadline_seconds=6, retry_seconds=1)
    from phalanx.errors import UserFacingError
    from phalanx.operator.settings import settings_from

    with pytest.raises(UserFacingError, match="leaseRenewDeadlineSeconds"):
        settings_from({"PHALANX_OPERATOR_LEASE_DURATION_SECONDS": "4"})
    assert settings_from({"PHALANX_OPERATOR_LEADER_ELECTION": "true"}).leader_election


def test_standby_health_answers_liveness_probes() -> None:
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    health = leadership.StandbyHealth("127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        health.close()
    # Closed: the port is free for kopf's own liveness endpoint.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
