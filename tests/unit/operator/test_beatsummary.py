"""The heartbeat hub's summary (phalanx.beatsummary): small at any N, and never kinder than the beats it stands
for. Each pod's expanded heartbeat says what its own beat says in every field the operator acts on, is never
fresher than the pod's own renewal, and a fresh pod never looks older than the hub's freshness window; detection
judges the expansion as it judges the beats."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from phalanx import beatsummary
from phalanx.beatsummary import decode, decode_beat, encode, encode_beat, expand, format_ranges, parse_ranges
from phalanx.operator import api, detection

PREFIX = "demo-worker-"
FRESH = 3.0
HEARTBEAT = api.HeartbeatSpec(interval_seconds=1, timeout_seconds=5, progress_timeout_seconds=10)
HEALTHY = {"node-a": {"labels": {}, "ready": "True", "noExecute": []}}


def stamp(moment: datetime) -> str:
    return beatsummary.micro_time(moment)


def beat(
    now: datetime, index: int, *, step: int = 100, phase: str = "training", age: float = 0.4, **extra: str
) -> dict[str, str]:
    """A training launcher's beat, its per-pod figures (rank, loss, step time, phase start) its own."""
    return {
        "step": str(step),
        "phase": phase,
        "rank": str(index),
        "world-size": "12500",
        "loss": f"{2.5 + index / 1e5:.5f}",
        "step-seconds": f"{0.5 + (index % 7) / 100:.3f}",
        "phase-since": stamp(now - timedelta(seconds=60, microseconds=index * 37)),
        "group-started": stamp(now - timedelta(seconds=90, microseconds=index * 11)),
        "checkpoint-step": "100",
        "fault": "",
        "exit-code": "",
        "renewTime": stamp(now - timedelta(seconds=age)),
        "ownerUid": f"uid-{PREFIX}{index}",
        **extra,
    }


def summary_of(beats: dict[int, dict[str, str]], now: datetime) -> dict[str, Any]:
    """What the operator decodes from the hub's Lease."""
    text = encode(beatsummary.summarise(PREFIX, beats, now, FRESH))
    decoded = decode(text)
    assert decoded is not None
    return decoded


def assert_faithful(beats: dict[int, dict[str, str]], now: datetime) -> dict[str, Any]:
    """Each pod's expansion against its own beat: the contract of the module docstring."""
    expanded = expand(summary_of(beats, now))
    assert set(expanded) == {f"{PREFIX}{index}" for index in beats}
    for index, own in beats.items():
        seen = expanded[f"{PREFIX}{index}"]
        assert seen["phase"] == own["phase"], index
        # The class's slowest member's step: never ahead of the pod's, and a pod alone in its class is exact.
        assert int(seen["step"]) <= int(own["step"]), index
        for field in ("fault", "exit-code"):
            assert seen.get(field, "") == own.get(field, ""), (index, field)
        renewed, own_renewed = (
            beatsummary.parse_time(seen["renewTime"]),
            beatsummary.parse_time(own["renewTime"]),
        )
        assert renewed is not None and own_renewed is not None
        assert renewed <= own_renewed, index
        if (now - own_renewed).total_seconds() <= FRESH:
            assert (now - renewed).total_seconds() <= FRESH, index
        else:
            assert (own_renewed - renewed).total_seconds() < 1.0, index
        for field in beatsummary.LATEST_OF_CLASS:
            if own.get(field):
                assert seen[field] >= own[field], (index, field)
    return expanded


def test_steady_training_at_12500_pods_is_one_small_class(now: datetime) -> None:
    # Caught mid-renewal: a random half of the gang already reports the next step and the new checkpoint.
    shuffle = random.Random(1)
    beats = {}
    for index in range(12_500):
        ahead = shuffle.random() < 0.5
        beats[index] = beat(now, index, step=101 if ahead else 100, age=shuffle.uniform(0, 2))
        beats[index]["checkpoint-step"] = "100" if ahead else "50"
    summary = summary_of(beats, now)
    assert len(summary["classes"]) == 1
    assert not summary["listed"]
    assert len(encode(summary)) < 2_000
    (only,) = summary["classes"]
    assert only["pods"] == "0-12499"
    assert (only["fields"]["step"], only["fields"]["checkpoint-step"]) == ("100", "50")
    assert_faithful(beats, now)


def test_a_faulted_pod_is_listed_whole(now: datetime) -> None:
    beats = {index: beat(now, index) for index in range(64)}
    beats[17] = beat(
        now, 17, fault="hung", **{"fault-rank": "3", "fault-since": stamp(now), "hang-threshold": "2.5"}
    )
    summary = summary_of(beats, now)
    assert list(summary["listed"]) == ["17"]
    assert expand(summary)[f"{PREFIX}17"] == beats[17]
    assert_faithful(beats, now)


def test_a_silent_pod_stays_silent_and_never_ages_a_fresh_one(now: datetime) -> None:
    beats = {index: beat(now, index) for index in range(100)}
    beats[5] = beat(now, 5, age=7.3)
    beats[6] = beat(now, 6, age=8.9)
    expanded = assert_faithful(beats, now)
    # Renewed in different seconds: each keeps its own renewal (same-second pods may share the older one).
    assert [expanded[f"{PREFIX}{index}"]["renewTime"] for index in (5, 6)] == [
        beats[5]["renewTime"],
        beats[6]["renewTime"],
    ]
    assert {expanded[f"{PREFIX}{index}"]["renewTime"] for index in (4, 7)} == {beats[4]["renewTime"]}


def test_random_gangs_are_expanded_faithfully(now: datetime) -> None:
    shuffle = random.Random(7)
    phases = ["training", "training", "training", "saving", "rendezvous", "standby", "restoring", "exiting"]
    for _ in range(40):
        beats = {}
        for index in range(shuffle.randrange(1, 400)):
            extra: dict[str, str] = {}
            if shuffle.random() < 0.02:
                extra["fault"] = "hung"
            if shuffle.random() < 0.02:
                extra["exit-code"] = "1"
            beats[index] = beat(
                now,
                index,
                step=shuffle.choice([99, 100, 101]),
                phase=shuffle.choice(phases),
                age=shuffle.choice([0.1, 0.9, 2.5, 4.0, 6.6, 30.2]),
                **extra,
            )
        assert_faithful(beats, now)


def test_a_mass_reform_with_every_beat_distinct_is_merged_under_the_size_bound(now: datetime) -> None:
    shuffle = random.Random(3)
    beats = {
        index: beat(
            now,
            index,
            step=index,  # every pod at its own step: no two alike
            phase=shuffle.choice(["rendezvous", "standby", "restoring"]),
            age=shuffle.choice([0.2, 1.5, 8.0 + index % 40]),
            **{"restart-cause": f"cause {index}"},
        )
        for index in range(12_500)
    }
    text = encode(beatsummary.summarise(PREFIX, beats, now, FRESH))
    assert len(text) <= beatsummary.MAX_SUMMARY_BYTES
    summary = decode(text)
    assert summary is not None and len(summary["classes"]) <= beatsummary.MAX_CLASSES
    expanded = expand(summary)
    for index, own in beats.items():
        seen = expanded[f"{PREFIX}{index}"]
        assert seen["phase"] == own["phase"]
        assert int(seen["step"]) <= int(own["step"])  # a merged class reads as its slowest member
        renewed, own_renewed = (
            beatsummary.parse_time(seen["renewTime"]),
            beatsummary.parse_time(own["renewTime"]),
        )
        assert renewed is not None and own_renewed is not None and renewed <= own_renewed
        if (now - own_renewed).total_seconds() <= FRESH:
            assert (now - renewed).total_seconds() <= FRESH


def test_too_many_faults_fall_back_into_classes(now: datetime) -> None:
    beats = {
        index: beat(now, index, fault="hung", **{"fault-message": "x" * 500 + str(index)})
        for index in range(2_000)
    }
    summary = summary_of(beats, now)
    assert len(encode(summary)) <= beatsummary.MAX_SUMMARY_BYTES
    expanded = expand(summary)
    assert all(expanded[f"{PREFIX}{index}"]["fault"] == "hung" for index in beats)


@pytest.mark.parametrize("age", [0.5, 6.0])
def test_detection_judges_the_expansion_as_it_judges_the_beats(
    make_pod: Callable[..., dict[str, Any]], now: datetime, age: float
) -> None:
    pods = [make_pod(f"{PREFIX}{index}") for index in range(8)]
    beats = {index: beat(now, index) for index in range(8)}
    beats[3] = beat(now, 3, age=age)
    beats[5] = beat(now, 5, fault="stopped", **{"fault-since": stamp(now - timedelta(seconds=0.5))})
    raw = {f"{PREFIX}{index}": dict(value) for index, value in beats.items()}
    hubbed = expand(summary_of(beats, now))

    def failures(leases: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
        tracks = detection.update_tracks([], pods, leases, HEARTBEAT, "trainer", now - timedelta(seconds=1))
        tracks = detection.update_tracks(tracks, pods, leases, HEARTBEAT, "trainer", now)
        known = {(track.pod, track.uid) for track in tracks}
        found = detection.detect(pods, leases, HEALTHY, tracks, known, HEARTBEAT, "trainer", now)
        return sorted((failure.cause, failure.pod) for failure in found)

    assert failures(hubbed) == failures(raw)
    assert failures(raw)  # the case judges something: the hung rank, and the silent pod when it is


def test_a_class_beat_is_not_a_recreated_pod_s(
    make_pod: Callable[..., dict[str, Any]], now: datetime
) -> None:
    # The pod of index 2 was replaced by a new one of the same name after the old one's last beat: the class
    # renewal (no ownerUid) predates the new pod, so it is not taken as the new pod's heartbeat.
    beats = {index: beat(now, index) for index in range(4)}
    hubbed = expand(summary_of(beats, now))
    recreated = make_pod(f"{PREFIX}2", uid="uid-new", created=stamp(now - timedelta(seconds=0.1)))
    assert detection.heartbeat_of(recreated, hubbed) is None
    older = make_pod(f"{PREFIX}1", created=stamp(now - timedelta(seconds=60)))
    assert detection.heartbeat_of(older, hubbed) is not None


def test_ranges_round_trip_and_junk_is_skipped() -> None:
    assert format_ranges([5, 1, 2, 3, 9, 10, 3]) == "1-3,5,9-10"
    assert list(parse_ranges("1-3,5,9-10")) == [1, 2, 3, 5, 9, 10]
    assert list(parse_ranges("x,3-1,-4,7-,2-2,99999999")) == [2]
    assert format_ranges([]) == ""


def test_beats_and_summaries_from_outside_are_checked() -> None:
    assert decode_beat(encode_beat({"step": "1", "phase": "training", "gone": None})) == {
        "step": "1",
        "phase": "training",
    }
    for raw in (b"not json", b"[1]", b'{"step": 1}', b'{"a": "' + b"x" * beatsummary.MAX_BEAT_BYTES + b'"}'):
        assert decode_beat(raw) is None
    good = {"v": 1, "at": "2026-01-01T00:00:00Z", "prefix": PREFIX, "classes": [], "listed": {}}
    assert decode(json.dumps(good)) == good
    for bad in (
        {**good, "v": 2},
        {**good, "at": "yesterday"},
        {**good, "classes": {}},
        {**good, "prefix": 1},
    ):
        assert decode(json.dumps(bad)) is None
    assert decode("x" * (beatsummary.MAX_SUMMARY_BYTES + 1)) is None
    odd = {
        **good,
        "classes": [
            {"pods": "0-1", "renewTime": "2026-01-01T00:00:00Z", "fields": {"phase": "training"}},
            {"pods": "2", "renewTime": 5, "fields": {"phase": "training"}},
            {"pods": "3", "fields": {"phase": 1}},
            "junk",
        ],
        "listed": {"4": {"phase": "training"}, "x": {"phase": "training"}, "5": {"step": 1}},
    }
    assert sorted(expand(odd)) == [f"{PREFIX}0", f"{PREFIX}1", f"{PREFIX}4"]
