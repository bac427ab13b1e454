"""The heartbeat hub's worker side (worker/beathub.py) against a real TCPStore: launchers' beats in, one summary
out, and a launcher falls back to its own Lease whenever the hub or the store is not there."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import torch.distributed as dist

from phalanx import beatsummary
from phalanx.worker import beathub, heartbeat
from phalanx.worker.beathub import BeatSender, Hub

PREFIX = "demo-worker-"


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def client(port: int) -> dist.TCPStore:
    # Generous: on a loaded CI machine a connection has taken longer than 5 s.
    return dist.TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=20)
    )


def lease_of(pod: str, step: int, phase: str = "training") -> dict[str, Any]:
    status = heartbeat.PodStatus(phase=phase, step=step, rank=int(pod.rsplit("-", 1)[1]))  # type: ignore[arg-type]
    return heartbeat.lease_body(
        pod_name=pod,
        namespace="ml",
        pod_uid=f"uid-{pod}",
        status=status,
        now=datetime.now(UTC),
        lease_duration_seconds=30,
    )


class Published:
    def __init__(self) -> None:
        self.summaries: list[dict[str, Any]] = []

    def __call__(self, text: str, now: datetime) -> None:
        summary = beatsummary.decode(text)
        assert summary is not None
        self.summaries.append(summary)


def test_a_launcher_s_beat_is_what_the_operator_keeps_of_its_lease() -> None:
    body = lease_of(f"{PREFIX}3", step=41)
    beat = beatsummary.lease_summary(body)
    assert beat["step"] == "41" and beat["phase"] == "training" and beat["rank"] == "3"
    assert beat["renewTime"] == body["spec"]["renewTime"]
    assert beat["ownerUid"] == f"uid-{PREFIX}3"
    assert beathub.member_names(
        b"demo-worker-1,demo-worker-1,other-worker-2,demo-worker-x,,demo-worker-0,", PREFIX
    ) == [
        f"{PREFIX}1",
        f"{PREFIX}0",
    ]


def test_beats_reach_one_summary_and_the_launchers_learn_the_hub_took_them(server: dist.TCPStore) -> None:
    senders = [BeatSender(lambda: client(server.port), f"{PREFIX}{index}", 30.0) for index in range(5)]
    beats = {sender.pod_name: beatsummary.lease_summary(lease_of(sender.pod_name, 7)) for sender in senders}
    # Before the hub's first summary no launcher may rely on it: each renews its own Lease.
    assert [sender.send(beats[sender.pod_name]) for sender in senders] == [False] * 5
    published = Published()
    hub = Hub(lambda: client(server.port), PREFIX, 1.0, published)
    summary = hub.once()
    assert summary["members"] == 5
    expanded = beatsummary.expand(published.summaries[-1])
    assert sorted(expanded) == sorted(beats)
    assert all(expanded[pod]["step"] == "7" for pod in beats)
    assert [sender.send(beats[sender.pod_name]) for sender in senders] == [True] * 5
    # A second run of a launcher (a restarted container) registers again: still one member.
    again = BeatSender(lambda: client(server.port), f"{PREFIX}0", 30.0)
    again.send(beats[f"{PREFIX}0"])
    assert hub.once()["members"] == 5


def test_what_is_not_a_beat_is_left_out(server: dist.TCPStore) -> None:
    writer = client(server.port)
    writer.set(beathub.BEAT_PREFIX + f"{PREFIX}0", b"\x80garbage")
    writer.set(
        beathub.BEAT_PREFIX + f"{PREFIX}1", beatsummary.encode_beat({"step": "3", "phase": "training"})
    )
    writer.append(beathub.MEMBERS_KEY, f"{PREFIX}0,{PREFIX}1,")
    published = Published()
    assert Hub(lambda: client(server.port), PREFIX, 1.0, published).once()["members"] == 1


def test_a_hub_silent_past_the_timeout_sends_the_launcher_back_to_its_lease(server: dist.TCPStore) -> None:
    sender = BeatSender(lambda: client(server.port), f"{PREFIX}0", 2.0)
    beat = beatsummary.lease_summary(lease_of(f"{PREFIX}0", 1))
    stale = datetime.now(UTC).timestamp() - 5.0
    client(server.port).set(beathub.ALIVE_KEY, f"{stale:.3f}")
    assert [sender.send(beat) for _ in range(3)] == [False, False, False]
    client(server.port).set(beathub.ALIVE_KEY, f"{datetime.now(UTC).timestamp():.3f}")
    assert sender.send(beat) is True


def test_an_unreachable_store_is_the_own_lease_and_a_retry_later() -> None:
    attempts: list[int] = []

    def refuse() -> Any:
        attempts.append(1)
        raise RuntimeError("connection refused")

    sender = BeatSender(refuse, f"{PREFIX}0", 30.0)
    assert sender.send({"step": "1"}) is False
    assert sender.send({"step": "2"}) is False  # no second attempt before RETRY_SECONDS
    assert len(attempts) == 1


def test_the_hub_reconnects_after_its_store_went_away() -> None:
    first = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    port = first.port
    published = Published()
    connections: list[int] = []

    def connect() -> Any:
        connections.append(1)
        return client(port)

    hub = Hub(connect, PREFIX, 0.05, published)
    hub.once()
    del first  # the store is gone: the next summary fails
    stop = threading.Event()
    replacement: list[dist.TCPStore] = []

    def serve_again() -> None:
        replacement.append(
            dist.TCPStore(
                "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
            )
        )

    runner = threading.Thread(target=hub.run, args=(stop,))
    runner.start()
    try:
        serve_again()
        deadline = datetime.now(UTC) + timedelta(seconds=20)
        while len(published.summaries) < 3 and datetime.now(UTC) < deadline:
            stop.wait(0.05)
    finally:
        stop.set()
        runner.join(10)
    assert len(published.summaries) >= 3
    assert len(connections) >= 2
    assert client(port).check([beathub.ALIVE_KEY])


def test_a_beat_long_past_every_timeout_is_left_out_of_the_summary(server: dist.TCPStore) -> None:
    now = datetime.now(UTC)
    writer = client(server.port)
    for index, age in ((0, 1.0), (1, 299.0), (2, 301.0)):
        beat = {
            "step": "3",
            "phase": "training",
            "renewTime": beatsummary.micro_time(now - timedelta(seconds=age)),
        }
        writer.set(beathub.BEAT_PREFIX + f"{PREFIX}{index}", beatsummary.encode_beat(beat))
        writer.append(beathub.MEMBERS_KEY, f"{PREFIX}{index},")
    hub = Hub(lambda: client(server.port), PREFIX, 1.0, Published(), clock=lambda: now, forget_after=300.0)
    summary = hub.once()
    assert summary["members"] == 2
    assert sorted(beatsummary.expand(summary)) == [f"{PREFIX}0", f"{PREFIX}1"]


def test_news_the_operator_acts_on_goes_to_the_pod_s_own_lease_at_once_beside_the_hub() -> None:
    from phalanx.worker.heartbeat import PodStatus

    training = PodStatus(phase="training", step=5, group_restarts=0)
    hung = PodStatus(phase="training", step=5, group_restarts=0, fault="hung", fault_rank=3)
    restarted = PodStatus(phase="rendezvous", group_restarts=1)
    assert beathub.news_for_the_operator(training, hung)
    assert not beathub.news_for_the_operator(hung, hung)  # said once
    assert beathub.news_for_the_operator(hung, PodStatus(phase="training", fault="hung", fault_rank=4))
    assert beathub.news_for_the_operator(training, restarted)
    assert not beathub.news_for_the_operator(training, PodStatus(phase="training", step=6, group_restarts=0))
    assert not beathub.news_for_the_operator(None, hung)  # the first beat is written anyway
    # With the hub taking beats, the own Lease waits, but for the first beat, the last word and news.
    assert not beathub.writes_own_lease(hub_took_it=True, written_before=True, force=False, urgent=False)
    assert beathub.writes_own_lease(hub_took_it=True, written_before=True, force=False, urgent=True)
    assert beathub.writes_own_lease(hub_took_it=True, written_before=False, force=False, urgent=False)
    assert beathub.writes_own_lease(hub_took_it=True, written_before=True, force=True, urgent=False)
    assert beathub.writes_own_lease(hub_took_it=False, written_before=True, force=False, urgent=False)


def put_beat(writer: dist.TCPStore, index: int, renewed: datetime, **fields: str) -> None:
    beat = {"phase": "training", "step": "9", "renewTime": beatsummary.micro_time(renewed), **fields}
    writer.set(beathub.BEAT_PREFIX + f"{PREFIX}{index}", beatsummary.encode_beat(beat))
    writer.append(beathub.MEMBERS_KEY, f"{PREFIX}{index},")


def run_hub_until(hub: Hub, published: Published, summaries: int, seconds: float) -> float:
    """Run the hub until it published `summaries` summaries or `seconds` passed; returns the seconds it took."""
    stop = threading.Event()
    runner = threading.Thread(target=hub.run, args=(stop,))
    started = datetime.now(UTC)
    runner.start()
    try:
        while (
            len(published.summaries) < summaries and (datetime.now(UTC) - started).total_seconds() < seconds
        ):
            stop.wait(0.02)
    finally:
        stop.set()
        runner.join(10)
    return (datetime.now(UTC) - started).total_seconds()


def test_a_hang_verdict_is_published_once_every_peer_renewed_after_it_not_at_the_next_interval(
    server: dist.TCPStore,
) -> None:
    # Regular summaries every 30 s; a verdict 29 s old whose peers last beat before it. The operator holds the
    # verdict until every peer renewed after it: once they have, the hub publishes without waiting 30 s.
    now = datetime.now(UTC)
    writer = client(server.port)
    verdict_at = now - timedelta(seconds=29)
    since = beatsummary.micro_time(verdict_at - timedelta(seconds=3))
    put_beat(writer, 0, now, fault="hung", **{"fault-since": since, "hang-threshold": "3"})
    for index in (1, 2):
        put_beat(writer, index, verdict_at - timedelta(seconds=1))
    # A spare is no peer in the group; a pod replaced long ago whose beat lingers in the store will never renew:
    # neither is waited for.
    put_beat(writer, 3, verdict_at - timedelta(seconds=20), phase="standby")
    put_beat(writer, 4, verdict_at - timedelta(seconds=50))
    published = Published()
    hub = Hub(lambda: client(server.port), PREFIX, 30.0, published)
    hub.store = hub.connect()
    assert beatsummary.awaited_verdict(hub.read_beats().values()) == verdict_at

    def renew_peers() -> None:
        threading.Event().wait(1.0)
        put_beat(writer, 1, datetime.now(UTC))
        put_beat(writer, 2, datetime.now(UTC))

    threading.Thread(target=renew_peers).start()
    took = run_hub_until(hub, published, 2, 20.0)
    assert len(published.summaries) == 2, "the settled verdict waited for the next interval"
    assert took < 10.0
    expanded = beatsummary.expand(published.summaries[-1])
    assert all(beatsummary.parse_time(expanded[f"{PREFIX}{i}"]["renewTime"]) > verdict_at for i in (1, 2))  # type: ignore[operator]
    # The summary says so: the operator acts on it without working it out pod by pod.
    assert beatsummary.settled_verdict(published.summaries[-1]) == verdict_at
    assert beatsummary.settled_verdict(published.summaries[0]) is None
    assert hub.awaited is None


def test_no_summary_more_while_a_peer_stays_silent_after_a_verdict(server: dist.TCPStore) -> None:
    # A peer that never renews after the verdict is the likelier culprit: the operator waits for its timeout, and
    # the hub's looks (reads of the store) publish nothing more than its regular summaries.
    now = datetime.now(UTC)
    writer = client(server.port)
    since = beatsummary.micro_time(now - timedelta(seconds=23))
    put_beat(writer, 0, now, fault="hung", **{"fault-since": since, "hang-threshold": "3"})
    put_beat(writer, 1, now - timedelta(seconds=21))
    published = Published()
    hub = Hub(lambda: client(server.port), PREFIX, 30.0, published)
    run_hub_until(hub, published, 2, 4.0)
    assert len(published.summaries) == 1
    assert hub.awaited is not None


def test_the_verdict_the_hub_waits_on_is_the_operator_s() -> None:
    now = datetime.now(UTC)
    since = now - timedelta(seconds=5)
    hung = {
        "fault": "hung",
        "fault-since": beatsummary.micro_time(since),
        "hang-threshold": "2.5",
        "phase": "training",
    }
    judged = since + timedelta(seconds=2.5)

    def peer(age: float, phase: str = "training") -> dict[str, str]:
        return {"phase": phase, "renewTime": beatsummary.micro_time(judged - timedelta(seconds=age))}

    assert beatsummary.verdict_time(hung) == judged
    assert beatsummary.verdict_time({**hung, "fault": "stopped"}) is None
    assert beatsummary.verdict_time({**hung, "fault-since": "soon"}) is None
    assert beatsummary.awaited_verdict([hung, peer(0.5)]) == judged
    assert beatsummary.awaited_verdict([hung, peer(-0.5)]) is None
    assert beatsummary.awaited_verdict([hung, peer(0.5, phase="standby")]) is None
    assert beatsummary.awaited_verdict([peer(0.5)]) is None
    # A peer silent since long before the verdict is not waited for (its pod is gone, or it is the culprit).
    assert beatsummary.awaited_verdict([hung, peer(4.0)], live_seconds=3.0) is None
    assert beatsummary.awaited_verdict([hung, peer(2.0)], live_seconds=3.0) == judged
    assert beatsummary.earliest_verdict([peer(1.0), hung]) == judged
    # Two ranks judged hung: the earlier verdict counts, and neither is the other's peer.
    later = {**hung, "hang-threshold": "4"}
    assert beatsummary.awaited_verdict([hung, later, peer(-0.1)]) is None
