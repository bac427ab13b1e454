from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from phalanx.operator import nodeview


def node(name: str, version: str, ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": version, "labels": {"zone": "a"}},
        "status": {"conditions": [{"type": "Ready", "status": ready}], "allocatable": {"cpu": "8"}},
    }


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(version: str) -> dict[str, Any]:
    return event("BOOKMARK", {"metadata": {"resourceVersion": version}})


class ScriptedApi:
    """List pages and watch streams given in advance, each entry either an answer or an exception; when the
    watches run out the view is stopped."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.listed: list[str | None] = []
        self.watched_from: list[str] = []
        self.view: nodeview.NodeView | None = None
        self.seen_during_watch: list[dict[str, Any]] = []

    def list_page(self, token: str | None) -> dict[str, Any]:
        self.listed.append(token)
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch_from(self, version: str) -> Iterator[dict[str, Any]]:
        assert self.view is not None
        self.watched_from.append(version)
        if not self.watches:
            self.view.stop()
            return
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        for item in answer:
            if isinstance(item, Exception):
                raise item
            yield item

    def run(self, on_change: Any = None) -> nodeview.NodeView:
        view = nodeview.NodeView(self.list_page, self.watch_from, backoff=(0.0, 0.0))
        view.on_change = on_change
        self.view = view
        view.run()
        return view


def page(items: list[dict[str, Any]], version: str, token: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": version}
    if token:
        metadata["continue"] = token
    return {"items": items, "metadata": metadata}


def test_a_paged_list_fills_the_view_and_the_watch_goes_on_from_the_first_pages_version() -> None:
    api = ScriptedApi(
        lists=[page([node("n1", "5")], "10", token="more"), page([node("n2", "6")], "10")],
        watches=[[]],
    )
    view = api.run()
    assert api.listed == [None, "more"]
    assert api.watched_from == ["10", "10"]
    assert view.synced.is_set()
    assert sorted(view) == ["n1", "n2"] and len(view) == 2
    (summary,) = view["n1"]
    assert summary["ready"] == "True" and summary["labels"] == {"zone": "a"}
    assert summary["allocatable"] == {"cpu": "8"}


def test_events_change_the_view_and_the_next_watch_starts_after_the_newest_version_bookmarks_included() -> (
    None
):
    api = ScriptedApi(
        lists=[page([node("n1", "5"), node("n2", "6")], "10")],
        watches=[
            [
                event("MODIFIED", node("n1", "11", ready="False")),
                event("DELETED", node("n2", "12")),
                event("ADDED", node("n3", "13")),
                bookmark("20"),
            ]
        ],
    )
    view = api.run()
    assert api.watched_from == ["10", "20"]
    assert sorted(view) == ["n1", "n3"]
    assert view["n1"][0]["ready"] == "False"
    assert view.get("n2") is None
    assert (view.events, view.lists) == (3, 1)


def test_a_node_s_health_changing_or_its_deletion_is_told_its_heartbeat_labels_and_room_are_not() -> None:
    def renewed(name: str, version: str, ready: str = "True") -> dict[str, Any]:
        body = node(name, version, ready)
        body["status"]["conditions"][0]["lastHeartbeatTime"] = f"2026-01-01T00:00:{version}Z"
        body["metadata"]["labels"] = {"zone": "b"}
        return body

    tainted = node("n2", "15")
    tainted["spec"] = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}
    told: list[str] = []
    api = ScriptedApi(
        lists=[page([node("n1", "5"), node("n2", "6")], "10")],
        watches=[
            [
                event("MODIFIED", renewed("n1", "11")),
                event("MODIFIED", renewed("n1", "12", ready="Unknown")),
                event("MODIFIED", renewed("n1", "13", ready="Unknown")),
                event("MODIFIED", renewed("n1", "14")),
                event("MODIFIED", tainted),
                event("DELETED", node("n2", "16")),
                event("ADDED", node("n3", "17")),
            ]
        ],
    )
    api.run(told.append)
    assert told == ["n1", "n1", "n2", "n2", "n3"]


def test_a_failing_change_callback_leaves_the_view_watching() -> None:
    def refuse(name: str) -> None:
        raise RuntimeError("no")

    api = ScriptedApi(
        lists=[page([node("n1", "5")], "10")],
        watches=[[event("MODIFIED", node("n1", "11", ready="False")), event("ADDED", node("n2", "12"))]],
    )
    view = api.run(refuse)
    assert view["n1"][0]["ready"] == "False" and "n2" in view
    assert api.watched_from == ["10", "12"]


@pytest.mark.parametrize("expiry", ["error event", "410 answer"])
def test_an_expired_version_lists_again_and_a_node_deleted_meanwhile_drops_out(expiry: str) -> None:
    expired: Any = (
        [event("ERROR", {"code": 410, "message": "too old resource version"})]
        if expiry == "error event"
        else ApiException(status=410, reason="Gone")
    )
    api = ScriptedApi(
        lists=[page([node("n1", "5"), node("n2", "6")], "10"), page([node("n1", "30")], "31")],
        watches=[expired],
    )
    view = api.run()
    assert api.watched_from == ["10", "31"]
    assert list(view) == ["n1"]
    assert view.lists == 2


def test_a_broken_stream_is_watched_again_from_where_it_was_without_a_list() -> None:
    api = ScriptedApi(
        lists=[page([node("n1", "5")], "10")],
        watches=[
            [event("MODIFIED", node("n1", "11")), ConnectionResetError("reset by peer")],
            ApiException(status=500, reason="Internal Server Error"),
            [event("ERROR", {"code": 500, "message": "internal error"})],
        ],
    )
    view = api.run()
    assert api.watched_from == ["10", "11", "11", "11"]
    assert view.lists == 1 and list(view) == ["n1"]


def test_the_view_is_not_synced_until_a_whole_list_was_read() -> None:
    release = threading.Event()
    listed_once = threading.Event()

    class SlowApi(ScriptedApi):
        def list_page(self, token: str | None) -> dict[str, Any]:
            answer = super().list_page(token)
            listed_once.set()
            release.wait(5)
            return answer

    api = SlowApi(
        lists=[
            ApiException(status=503, reason="Unavailable"),
            page([node("n1", "5")], "10", token="more"),
            page([node("n2", "6")], "10"),
        ],
        watches=[],
    )
    view = nodeview.NodeView(api.list_page, api.watch_from, backoff=(0.0, 0.0))
    api.view = view
    thread = threading.Thread(target=view.run)
    thread.start()
    assert listed_once.wait(5)
    # The first answer was refused and the second is a first page only: nothing is shown, nothing synced.
    assert not view.synced.is_set() and len(view) == 0
    release.set()
    thread.join(5)
    assert view.synced.is_set() and sorted(view) == ["n1", "n2"]


def test_the_paths_ask_for_pages_and_a_watch_with_bookmarks() -> None:
    assert nodeview.list_query(None) == "/api/v1/nodes?limit=500"
    assert nodeview.list_query("abc=") == "/api/v1/nodes?limit=500&continue=abc%3D"
    assert nodeview.watch_query("42") == (
        "/api/v1/nodes?watch=true&resourceVersion=42&allowWatchBookmarks=true&timeoutSeconds=300"
    )
