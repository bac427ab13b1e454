"""Every node of the cluster as the operator needs it: one list, then one watch, on a thread of its own.

The operator reads nodes twice: the health of the nodes its pods are bound to (a node lost, NotReady or tainted
NoExecute) and, while a gang waits to be placed, every node's allocatable room (operator/capacity.py). Both
need every Node, so every Node is watched. A kopf index did this before: kopf runs each event through a worker
task per object, and every listed object through its start-up wait (operator/kopftoggles.py), which with
12,695 nodes held the operator's one interpreter at a whole core, so that no handler ran for minutes. Here an
event costs one JSON decode and one small summary (`status.summarize_node`), and the nodes are out of kopf's
start-up wait altogether: a list-then-watch as client-go's reflector does it, the list paged,
the watch resumed from the newest resourceVersion it saw (bookmarks included), a fresh list when that version
has expired (410 Gone), a pause that grows after other errors, and a stream silent past its read timeout
treated as broken (the API server sends a bookmark about every minute).

Until its first list is complete the view is not `synced`, and the operator acts on no job: a bound node
missing from the view reads as deleted. After that a fresh list replaces the whole view at once, so a node
deleted while no watch ran drops out and no reader ever sees a half-read cluster.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from kubernetes.client.rest import ApiException

from phalanx.operator import status as observe
from phalanx.operator.kube import Kube

LOGGER = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
LIST_PAGE_SIZE = 500
"""Nodes per page of a list: one answer of 12,500 nodes would be tens of megabytes decoded at once."""
WATCH_SECONDS = 300
"""The watch's server-side timeout: the API server ends it and it is made again from the newest version."""
READ_TIMEOUT_SECONDS = 150.0
"""A watch silent this long is broken (bookmarks come about every minute) and is made again."""
BACKOFF_SECONDS = (0.5, 5.0)
"""The first and the longest pause after a failed list or watch."""

Summary = dict[str, Any]
ListPage = Callable[[str | None], dict[str, Any]]
"""One page of the node list from a continue token (None: the first); the API server's answer."""
WatchFrom = Callable[[str], Iterator[dict[str, Any]]]
"""The watch events (`{"type": ..., "object": ...}`) after a resourceVersion."""


class NodeView(Mapping[str, tuple[Summary, ...]]):
    """Node summaries by node name, shaped as kopf's indexes are (a collection per key, here of one), so the
    reconciler reads it as it read the index it replaces. Thread-safe for readers: the watcher replaces single
    entries or, after a list, the whole map."""

    def __init__(
        self,
        list_page: ListPage,
        watch_from: WatchFrom,
        summarize: Callable[[dict[str, Any]], Summary] = observe.summarize_node,
        backoff: tuple[float, float] = BACKOFF_SECONDS,
    ) -> None:
        self._list_page = list_page
        self._watch_from = watch_from
        self._summarize = summarize
        self._backoff = backoff
        self._nodes: dict[str, tuple[Summary, ...]] = {}
        self._version: str | None = None
        """The newest resourceVersion seen (None: a list is due)."""
        self.synced = threading.Event()
        """Set once the first list is complete; never cleared (later lists replace the view whole)."""
        self.events = 0
        """Watch events taken in (bookmarks not counted)."""
        self.lists = 0
        """Complete lists read: 1 at the start, 1 more for each expired resourceVersion."""
        self.on_change: Callable[[str], None] | None = None
        """Called on the watch's thread with a node's name when a watch event changes its health (`health`) or
        deletes it: the jobs bound to it are looked at then, not at their next periodic reconcile."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="phalanx-node-view", daemon=True)

    def __getitem__(self, name: str) -> tuple[Summary, ...]:
        return self._nodes[name]

    def __iter__(self) -> Iterator[str]:
        # Over a copy of the names: the watcher changes the map meanwhile.
        return iter(list(self._nodes))

    def __len__(self) -> int:
        return len(self._nodes)

    def start(self) -> NodeView:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        pause = self._backoff[0]
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self._relist()
                self._follow()
                pause = self._backoff[0]
            except ApiException as error:
                if error.status == 410:
                    self._version = None  # expired: list again, at once
                    continue
                pause = self._trouble(error, pause)
            except Exception as error:  # a broken stream, a refused connection: watch again after a pause
                pause = self._trouble(error, pause)

    def _trouble(self, error: Exception, pause: float) -> float:
        LOGGER.warning("node watch: %s; again in %.1f s", error, pause)
        self._stop.wait(pause)
        return min(pause * 2, self._backoff[1])

    def _relist(self) -> None:
        """Read every node, page by page, and replace the view with them; the watch goes on from the list."""
        fresh: dict[str, tuple[Summary, ...]] = {}
        token: str | None = None
        version = ""
        while True:
            page = self._list_page(token)
            metadata = page.get("metadata") or {}
            # Every page of a paged list is read at the first page's version.
            version = version or str(metadata.get("resourceVersion") or "")
            for node in page.get("items") or []:
                fresh[node["metadata"]["name"]] = (self._summarize(node),)
            token = metadata.get("continue") or None
            if token is None:
                break
        self._nodes = fresh
        self._version = version
        self.lists += 1
        if not self.synced.is_set():
            LOGGER.info("node view: %d nodes listed", len(fresh))
        self.synced.set()

    def _follow(self) -> None:
        """Take the events of one watch in, from the newest version seen; a broken stream leaves that version
        where its last event put it, an expired one (410) clears it: a list is due."""
        assert self._version is not None
        for event in self._watch_from(self._version):
            if self._stop.is_set():
                return
            kind = event.get("type")
            node = event.get("object") or {}
            if kind == "ERROR":
                raise ApiException(status=node.get("code"), reason=node.get("message"))
            metadata = node.get("metadata") or {}
            if kind != "BOOKMARK":
                self.events += 1
                name = metadata["name"]
                before = self._nodes.get(name)
                if kind == "DELETED":
                    self._nodes.pop(name, None)
                    after = None
                else:
                    after = self._nodes[name] = (self._summarize(node),)
                if health(before) != health(after):
                    self._changed(name)
            self._version = str(metadata.get("resourceVersion") or self._version)

    def _changed(self, name: str) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(name)
        except Exception:  # the view must go on; the jobs' periodic reconciles still see the node
            LOGGER.exception("acting on node %s's change", name)


def health(entry: tuple[Summary, ...] | None) -> tuple[Any, ...] | None:
    """What of a node's summary a job acts on (Ready, NoExecute taints, a drill's crash); its heartbeat times,
    labels and room change without concerning a running job. None: no such node."""
    if not entry:
        return None
    summary = entry[0]
    return (summary.get("ready"), tuple(summary.get("noExecute") or ()), summary.get("drillCrash"))


def list_query(token: str | None) -> str:
    """The path of one page of the node list."""
    query: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
    if token:
        query["continue"] = token
    return f"{NODES_PATH}?{urlencode(query)}"


def watch_query(version: str) -> str:
    """The path of a watch of every node after `version`."""
    query = {
        "watch": "true",
        "resourceVersion": version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": WATCH_SECONDS,
    }
    return f"{NODES_PATH}?{urlencode(query)}"


def for_cluster(kube: Kube) -> NodeView:
    """A node view reading through the operator's client (not started)."""
    return NodeView(
        lambda token: kube.request("GET", list_query(token)),
        lambda version: kube.stream(watch_query(version), READ_TIMEOUT_SECONDS),
    )
