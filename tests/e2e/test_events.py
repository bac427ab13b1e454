"""The operator's Events against the real API server: the same Warning again raises the count of one object;
Normal Events, the job's story, are each kept."""

from __future__ import annotations

import uuid

import pytest

from phalanx.operator.kube import Kube
from phalanx.operator.reconcile import Event

from .conftest import Cluster
from .test_operator import events_for

pytestmark = pytest.mark.e2e


def test_a_repeated_event_raises_the_count_of_one_object(cluster: Cluster, namespace: str) -> None:
    kube = Kube(cluster.api)
    job = {"metadata": {"name": "evented", "namespace": namespace, "uid": str(uuid.uuid4())}}
    for _ in range(3):
        kube.post_event(job, Event("Warning", "Probe", "the same refusal again"))
    kube.post_event(job, Event("Warning", "Probe", "another refusal"))
    kube.post_event(job, Event("Normal", "Probe", "the same refusal again"))
    kube.post_event(job, Event("Normal", "Probe", "the same refusal again"))
    found = sorted((e["type"], e["message"], e["count"]) for e in events_for(cluster, namespace, "evented"))
    assert found == [
        ("Normal", "the same refusal again", 1),
        ("Normal", "the same refusal again", 1),
        ("Warning", "another refusal", 1),
        ("Warning", "the same refusal again", 3),
    ], found
    (repeated,) = [e for e in events_for(cluster, namespace, "evented") if e["count"] == 3]
    assert repeated["lastTimestamp"] >= repeated["firstTimestamp"]
