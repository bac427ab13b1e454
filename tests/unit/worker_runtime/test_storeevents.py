"""The announced store events: a launcher looks at the store when told, or at its idle interval, not at every
monitor tick; a writer that never set its marker, or a store that restarted, hides no later event."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from localjob import wait_for

from phalanx.worker import storeevents
from phalanx.worker.storeevents import StoreEvents


@pytest.fixture
def server() -> Iterator[dist.TCPStore]:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield store


@pytest.fixture
def watch() -> Iterator[Callable[..., StoreEvents]]:
    """Starts watchers, closed after the test."""
    started: list[StoreEvents] = []

    def start(connect: Callable[[], Any], idle_interval: float) -> StoreEvents:
        started.append(StoreEvents(connect, idle_interval).start())
        return started[-1]

    yield start
    for events in started:
        events.close()


def client(port: int) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


class CountingStore:
    """A store connection that counts the requests made on it."""

    def __init__(self, store: dist.TCPStore) -> None:
        self.store = store
        self.requests = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.requests += 1
            return method(*args, **kwargs)

        return counted


def test_the_idle_interval_grows_with_the_group_and_never_drops_below_the_monitor_tick() -> None:
    assert storeevents.idle_look_interval(2, 0.2) == 0.2
    assert storeevents.idle_look_interval(100, 0.2) == 0.2
    assert storeevents.idle_look_interval(512, 0.2) == pytest.approx(1.024)
    assert storeevents.idle_look_interval(12_500, 0.2) == 25.0  # all launchers together: 500 looks a second


def test_a_look_is_due_at_once_then_only_when_an_event_comes(
    server: dist.TCPStore, watch: Callable[..., StoreEvents]
) -> None:
    events = watch(lambda: client(server.port), idle_interval=3600)
    assert events.due()  # the first look
    wait_for(lambda: events.watching, 10, "the watcher to wait on the store")
    events.due()  # anything announced before the watcher waited: one more look
    assert not events.due()
    storeevents.announce(client(server.port))
    wait_for(events.due, 10, "the announced event")
    assert not events.due()  # one look per event


def test_without_events_a_look_is_due_each_idle_interval(
    server: dist.TCPStore, watch: Callable[..., StoreEvents]
) -> None:
    events = watch(lambda: client(server.port), idle_interval=0.3)
    wait_for(lambda: events.watching, 10, "the watcher to wait on the store")
    assert events.due()
    assert not events.due()
    time.sleep(0.35)
    assert events.due()


def test_an_idle_watcher_makes_one_wait_and_one_read_per_slice(
    server: dist.TCPStore, monkeypatch: pytest.MonkeyPatch, watch: Callable[..., StoreEvents]
) -> None:
    monkeypatch.setattr(storeevents, "WATCH_SLICE", 0.2)
    connections: list[CountingStore] = []

    def connect() -> CountingStore:
        connections.append(CountingStore(client(server.port)))
        return connections[-1]

    watch(connect, idle_interval=0.1)
    time.sleep(1.1)
    # About 5 slices: each one wait and one read of the count, besides the first read.
    assert len(connections) == 1
    assert 4 <= connections[0].requests <= 14, connections[0].requests


def test_a_writer_that_never_set_its_marker_hides_no_later_event(
    server: dist.TCPStore, monkeypatch: pytest.MonkeyPatch, watch: Callable[..., StoreEvents]
) -> None:
    monkeypatch.setattr(storeevents, "WATCH_SLICE", 0.3)
    events = watch(lambda: client(server.port), idle_interval=3600)
    assert events.due()
    wait_for(lambda: events.watching, 10, "the watcher to wait on the store")
    writer = client(server.port)
    writer.add(storeevents.EVENTS_KEY, 1)  # counted, then the writer died before its marker
    storeevents.announce(writer)
    wait_for(events.due, 10, "the later event")


def test_while_the_store_is_gone_every_look_is_due_and_the_watcher_comes_back(
    watch: Callable[..., StoreEvents],
) -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    port = store.port
    events = watch(lambda: client(port), idle_interval=3600)
    wait_for(lambda: events.watching, 10, "the watcher to wait on the store")
    events.due()
    del store  # the store's server stops
    wait_for(lambda: not events.watching, 30, "the watcher to notice the store is gone")
    assert events.due() and events.due()
    restarted = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    assert restarted.port == port
    wait_for(lambda: events.watching, 30, "the watcher to come back")
    events.due()  # what was announced while it had no connection
    assert not events.due()
    storeevents.announce(client(port))
    wait_for(events.due, 10, "an event on the restarted store")
