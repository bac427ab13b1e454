"""The operator's reading of a heartbeat hub (operator/hubview.py): the hub's word merged with the pods' own
Leases, and the hub's silence never taken for every worker's."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx import beatsummary
from phalanx.operator import api, detection, hubview, reconcile, viewclock

PREFIX = "demo-worker-"
HEARTBEAT = api.HeartbeatSpec(interval_seconds=1, timeout_seconds=5, progress_timeout_seconds=60)
HEALTHY = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}


def stamp(moment: datetime) -> str:
    return beatsummary.micro_time(moment)


def beat(at: datetime, step: int = 10, phase: str = "training") -> dict[str, str]:
    return {"step": str(step), "phase": phase, "renewTime": stamp(at)}


def hub_lease(at: datetime, beats: dict[int, dict[str, str]], pod: str = "demo-rdzv") -> dict[str, Any]:
    summary = beatsummary.summarise(PREFIX, beats, at, 1.5)
    return {
        "metadata": {
            "name": pod,
            "ownerReferences": [{"kind": "Pod", "name": pod, "uid": "uid-rdzv"}],
            "annotations": {beatsummary.SUMMARY_ANNOTATION: beatsummary.encode(summary)},
        }
    }


def test_a_hub_lease_is_read_only_when_named_after_its_owner_pod(now: datetime) -> None:
    body = hub_lease(now, {0: beat(now)})
    hub = hubview.read(body)
    assert hub is not None and hub.pod == "demo-rdzv" and hub.at == now
    foreign = {
        **body,
        "metadata": {**body["metadata"], "ownerReferences": [{"kind": "Pod", "name": "other"}]},
    }
    assert hubview.read(foreign) is None
    ownerless = {**body, "metadata": {**body["metadata"], "ownerReferences": []}}
    assert hubview.read(ownerless) is None
    garbled = {**body, "metadata": {**body["metadata"], "annotations": {beatsummary.SUMMARY_ANNOTATION: "{"}}}
    assert hubview.read(garbled) is None


def test_each_pod_gets_the_later_of_its_own_lease_and_the_hub_s_word(now: datetime) -> None:
    hub = hubview.read(hub_lease(now, {0: beat(now, step=12), 1: beat(now - timedelta(seconds=1), step=12)}))
    own = {
        f"{PREFIX}0": beat(now - timedelta(seconds=30), step=3, phase="starting"),  # before the hub took over
        f"{PREFIX}1": beat(now - timedelta(seconds=0.2), step=13),  # fell back to its own Lease
        f"{PREFIX}2": beat(now, step=13),  # not in the hub
    }
    pods = [f"{PREFIX}{index}" for index in range(3)]
    leases, gap = hubview.merge(own, hub, pods, now, 1.0, 5.0)
    assert gap is None
    assert (leases[f"{PREFIX}0"]["step"], leases[f"{PREFIX}0"]["phase"]) == ("12", "training")
    assert leases[f"{PREFIX}1"]["step"] == "13"
    assert leases[f"{PREFIX}2"] == own[f"{PREFIX}2"]
    # A pod of the summary that is not the job's (any more) is not added.
    assert hubview.merge({}, hub, [f"{PREFIX}1"], now, 1.0, 5.0)[0].keys() == {f"{PREFIX}1"}
    assert hubview.merge(own, None, pods, now, 1.0, 5.0) == (own, None)


def judged_silent(
    make_pod: Callable[..., dict[str, Any]], hub_at: datetime, now: datetime, own: dict[str, dict[str, str]]
) -> list[str]:
    """Who detection calls silent at `now`, the hub's last summary made at `hub_at`."""
    pods = [make_pod(f"{PREFIX}{index}") for index in range(3)]
    hub = hubview.read(hub_lease(hub_at, {index: beat(hub_at) for index in range(3)}))
    names = [pod["metadata"]["name"] for pod in pods]
    leases, gap = hubview.merge(own, hub, names, now, HEARTBEAT.interval_seconds, HEARTBEAT.timeout_seconds)
    gaps = () if gap is None else viewclock.joined((), gap)
    tracks = detection.update_tracks([], pods, leases, HEARTBEAT, "trainer", now, gaps)
    known = {(track.pod, track.uid) for track in tracks}
    failures = detection.detect(pods, leases, HEALTHY, tracks, known, HEARTBEAT, "trainer", now, gaps)
    return sorted(failure.pod for failure in failures if failure.cause == detection.HEARTBEAT_TIMEOUT)


def test_a_silent_hub_is_not_every_worker_s_silence_until_its_grace_is_over(
    make_pod: Callable[..., dict[str, Any]], now: datetime
) -> None:
    hub_at = now - timedelta(seconds=8)  # past the heartbeat timeout: every hub-fed beat is 8 s old
    assert judged_silent(make_pod, hub_at, now, {}) == []
    # A launcher that fell back to its own Lease is judged by it; the others wait for the hub.
    fallen_back = {f"{PREFIX}1": beat(now - timedelta(seconds=0.5))}
    assert judged_silent(make_pod, hub_at, now, fallen_back) == []
    grace = hubview.outage_grace_seconds(HEARTBEAT.interval_seconds, HEARTBEAT.timeout_seconds)
    long_gone = now - timedelta(seconds=grace + 1)
    assert judged_silent(make_pod, long_gone, now, fallen_back) == [f"{PREFIX}0", f"{PREFIX}2"]


def test_a_late_hub_opens_a_gap_from_its_last_summary(now: datetime) -> None:
    hub = hubview.read(hub_lease(now - timedelta(seconds=1.5), {0: beat(now)}))
    assert hub is not None
    assert hubview.merge({}, hub, [], now, 1.0, 5.0)[1] is None  # within two intervals: not late yet
    late = hubview.read(hub_lease(now - timedelta(seconds=2.5), {0: beat(now)}))
    assert late is not None
    assert hubview.merge({}, late, [], now, 1.0, 5.0)[1] == viewclock.Gap(start=late.at)


def test_gaps_join_so_no_moment_is_left_out_twice(now: datetime) -> None:
    second = timedelta(seconds=1)
    view = (viewclock.Gap(now - 10 * second, now - 6 * second), viewclock.Gap(now - 2 * second))
    joined = viewclock.joined(view, viewclock.Gap(now - 7 * second))
    assert joined == (viewclock.Gap(now - 10 * second),)
    assert viewclock.unseen_seconds(now - 20 * second, now, joined) == 10.0
    apart = viewclock.joined(view[:1], viewclock.Gap(now - 3 * second, now - 1 * second))
    assert apart == (view[0], viewclock.Gap(now - 3 * second, now - 1 * second))


def test_the_reconcile_wakes_when_a_silent_hub_s_gap_closes(now: datetime) -> None:
    grace = hubview.outage_grace_seconds(1.0, 5.0)
    for silent, expected in ((1.0, None), (3.0, grace - 3.0), (grace + 1.0, None)):
        hub = hubview.read(hub_lease(now - timedelta(seconds=silent), {0: beat(now)}))
        assert hubview.gap_closes_in(hub, now, 1.0, 5.0) == expected
    assert hubview.gap_closes_in(None, now, 1.0, 5.0) is None


def _gang(make_pod: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    pods = [make_pod(f"{PREFIX}{index}") for index in range(2)]
    return [*pods, make_pod(f"{PREFIX}2", role="spare"), make_pod("demo-rdzv", role="rendezvous")]


def test_a_reconcile_reads_the_hub_only_for_a_job_that_reports_through_it(
    make_job: Callable[..., dict[str, Any]], make_pod: Callable[..., dict[str, Any]], now: datetime
) -> None:
    beats = {0: beat(now, step=40), 1: beat(now, step=40), 2: beat(now, step=0, phase="standby")}
    hub = hubview.read(hub_lease(now, beats))
    started = beat(now - timedelta(seconds=30), step=0, phase="starting")  # each pod's own Lease, long quiet
    own = {f"{PREFIX}{index}": dict(started) for index in range(3)}
    heartbeat = {"intervalSeconds": 1, "timeoutSeconds": 5}
    hubbed = reconcile.plan(
        make_job(heartbeat={**heartbeat, "reporting": "hub"}),
        reconcile.Observed(pods=_gang(make_pod), now=now, leases=own, nodes=HEALTHY, hub=hub),
    )
    assert hubbed.status["step"] == 40 and hubbed.delete_pods == [] and hubbed.force_delete_pods == []
    roles = {worker["name"]: worker["role"] for worker in hubbed.status["workers"]}
    assert roles[f"{PREFIX}2"] == "spare"
    # The same summary beside a job whose workers renew their own Leases is nobody's word: they are silent.
    leased = reconcile.plan(
        make_job(heartbeat={**heartbeat, "reporting": "leases"}),
        reconcile.Observed(pods=_gang(make_pod), now=now, leases=own, nodes=HEALTHY, hub=hub),
    )
    assert leased.status.get("step") in (None, 0)
    assert sorted(leased.force_delete_pods) == [f"{PREFIX}0", f"{PREFIX}1", f"{PREFIX}2"]
