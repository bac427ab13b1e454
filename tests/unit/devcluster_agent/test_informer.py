"""The list+watch informer: events, expired resource versions (410) and outages, against a scripted client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from phalanx.devcluster.agent.kube import ApiError, Informer


def obj(name: str, version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version)}}


class ScriptedClient:
    """Lists and watch streams played back in order; a stream entry that is an exception is raised."""

    def __init__(self, listings: list[list[dict]], streams: list[list[Any]], stop: threading.Event) -> None:
        self.listings = listings
        self.streams = streams
        self.stop = stop
        self.watch_versions: list[str] = []

    def get(self, path: str, params: dict) -> dict:
        items = self.listings.pop(0)
        return {"metadata": {"resourceVersion": str(100 + len(self.listings))}, "items": items}

    def watch(self, path: str, params: dict) -> Iterator[dict]:
        self.watch_versions.append(params["resourceVersion"])
        if not self.streams:
            self.stop.set()
            return
        for event in self.streams.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event


def run(
    listings: list[list[dict]], streams: list[list[Any]]
) -> tuple[list[tuple[str, str]], Informer, ScriptedClient]:
    stop = threading.Event()
    client = ScriptedClient(listings, streams, stop)
    seen: list[tuple[str, str]] = []
    informer = Informer(
        client, "/api/v1/pods", lambda kind, o: seen.append((kind, o["metadata"]["name"])), stop
    )  # type: ignore[arg-type]
    thread = informer.start()
    thread.join(20)
    assert not thread.is_alive()
    return seen, informer, client


def test_list_then_watch_events_update_the_cache() -> None:
    seen, informer, _ = run(
        [[obj("a", 1)]],
        [[{"type": "ADDED", "object": obj("b", 2)}, {"type": "DELETED", "object": obj("a", 3)}]],
    )
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert [o["metadata"]["name"] for o in informer.items()] == ["b"]


def test_expired_version_relists_and_synthesises_deletions() -> None:
    seen, informer, _ = run(
        [[obj("a", 1), obj("b", 1)], [obj("b", 5), obj("c", 5)]],
        [[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]],
    )
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b"), ("ADDED", "c")]
    assert informer.get("ns", "c") is not None


def test_outages_resume_from_the_last_seen_version() -> None:
    _, _, client = run(
        [[obj("a", 1)]],
        [
            [{"type": "MODIFIED", "object": obj("a", 7)}, ConnectionResetError("apiserver went away")],
            [ApiError(503, "Service Unavailable")],
            [{"type": "BOOKMARK", "object": obj("a", 9)}],
        ],
    )
    assert client.watch_versions == ["100", "7", "7", "9"]
