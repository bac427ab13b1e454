"""Following the TrainingJob (worker/jobwatch.py): watch continuity, re-list on 410, reconnects, polling."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from phalanx.worker.jobwatch import ApiStatusError, FileJobFeed, JobFeed, JobView, Ticker


def job(version: str, desired: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "resourceVersion": version},
        "status": {"replicas": {"desired": desired}},
    }


class ScriptedApi:
    """Answers list/watch/get calls from a script; stops the feed when the script runs out."""

    def __init__(self, script: list[tuple[str, Any]]) -> None:
        self.script = script
        self.calls: list[tuple[str, Any]] = []
        self.feed: JobFeed | None = None

    def _next(self, kind: str, argument: Any = None) -> Any:
        self.calls.append((kind, argument))
        assert self.script, f"unexpected {kind} call"
        expected, answer = self.script.pop(0)
        assert expected == kind, f"expected a {expected} call, got {kind}"
        if isinstance(answer, BaseException):
            self._stop_when_done()
            raise answer
        if kind != "watch":
            self._stop_when_done()
        return answer

    def _stop_when_done(self) -> None:
        if not self.script and self.feed is not None:
            self.feed.stop()

    def get(self) -> dict[str, Any]:
        return self._next("get")

    def list(self) -> tuple[dict[str, Any] | None, str]:
        return self._next("list")

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        events = self._next("watch", resource_version)
        yield from events
        self._stop_when_done()


def run_feed(script: list[tuple[str, Any]]) -> tuple[ScriptedApi, list[dict[str, Any]], JobFeed]:
    api = ScriptedApi(script)
    view = JobView()
    seen: list[dict[str, Any]] = []
    view.subscribe(lambda: seen.append(view.current() or {}))
    feed = JobFeed(api, view, poll_interval=0.01, backoff=(0.001, 0.002))
    api.feed = feed
    thread = threading.Thread(target=feed.run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the feed did not stop"
    return api, seen, feed


def versions(seen: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["resourceVersion"] for item in seen]


def test_watch_goes_on_from_the_last_resource_version_and_lists_again_after_410() -> None:
    api, seen, _ = run_feed(
        [
            ("list", (job("10", 2), "10")),
            ("watch", [{"type": "MODIFIED", "object": job("11", 3)}]),
            ("watch", [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]),
            ("watch", [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]),
            ("list", (job("20", 3), "21")),
            ("watch", [{"type": "MODIFIED", "object": job("22", 4)}]),
        ]
    )
    assert [call for call in api.calls if call[0] == "watch"] == [
        ("watch", "10"),
        ("watch", "11"),
        ("watch", "15"),
        ("watch", "21"),
    ]
    assert versions(seen) == ["10", "11", "20", "22"]


def test_errors_reconnect_from_where_the_watch_was() -> None:
    api, seen, feed = run_feed(
        [
            ("list", (job("5", 2), "5")),
            ("watch", ConnectionResetError("link down")),
            ("watch", ApiStatusError(500, "internal")),
            ("watch", [{"type": "MODIFIED", "object": job("6", 3)}]),
        ]
    )
    assert [call[1] for call in api.calls if call[0] == "watch"] == ["5", "5", "5"]
    assert versions(seen) == ["5", "6"] and not feed.polling


def test_a_refused_watch_falls_back_to_reading_the_job() -> None:
    api, seen, feed = run_feed(
        [
            ("list", ApiStatusError(403, "Forbidden")),
            ("get", job("7", 2)),
            ("get", ApiStatusError(500, "internal")),
            ("get", job("8", 3)),
        ]
    )
    assert feed.polling
    assert [call[0] for call in api.calls] == ["list", "get", "get", "get"]
    assert versions(seen) == ["7", "8"]


def test_file_feed_publishes_each_new_content_once(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    view = JobView()
    feed = FileJobFeed(str(path), view)
    assert not feed.read_once()
    path.write_text(json.dumps(job("1", 2)))
    assert feed.read_once()
    assert not feed.read_once()
    path.write_text('{"status": ')  # half written
    assert not feed.read_once()
    path.write_text(json.dumps(job("2", 3)))
    assert feed.read_once()
    assert versions([view.current() or {}]) == ["2"]


class Counting(Ticker):
    def __init__(self) -> None:
        super().__init__(interval=60.0)
        self.ticks = threading.Semaphore(0)

    def tick(self) -> None:
        self.ticks.release()


def test_a_ticker_runs_when_woken_without_waiting_for_its_interval() -> None:
    ticker = Counting().start()
    try:
        ticker.wake()
        assert ticker.ticks.acquire(timeout=10)
        ticker.wake()
        assert ticker.ticks.acquire(timeout=10)
    finally:
        ticker.stop()
