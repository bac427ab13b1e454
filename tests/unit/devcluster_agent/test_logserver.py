"""The kubelet log endpoint: line selection and the HTTPS server over real files."""

from __future__ import annotations

import ssl
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from phalanx.devcluster.agent.logserver import LogServer, log_files, render_line, select

LINES = [
    b"2026-01-01T00:00:01.000000Z one\n",
    b"2026-01-01T00:00:02.000000Z two\n",
    b"2026-01-01T00:00:03.5Z three\n",
]


def test_select_tail_and_since() -> None:
    assert select(LINES, 2, None) == LINES[1:]
    assert select(LINES, 0, None) == []
    assert select(LINES, None, datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)) == LINES[1:]


def test_timestamps_are_stripped_unless_asked_for() -> None:
    assert render_line(LINES[0], False) == b"one\n"
    assert render_line(LINES[0], True) == LINES[0]


def test_log_files_are_ordered_by_run(tmp_path: Path) -> None:
    for name in ("10.log", "2.log", "junk.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in log_files(tmp_path)] == ["2.log", "10.log"]


@pytest.fixture
def server(tmp_path: Path):
    logs = tmp_path / "logs" / "main"
    logs.mkdir(parents=True)
    (logs / "0.log").write_bytes(b"".join(LINES))
    (logs / "1.log").write_bytes(b"2026-01-01T00:00:09.000000Z current\n")
    live = threading.Event()
    live.set()

    def source(namespace: str, pod: str, container: str):
        if (namespace, pod) != ("ns", "p"):
            return None
        return tmp_path / "logs" / container, lambda path: live.is_set() and path.name == "1.log"

    server = LogServer(source, 0, tmp_path / "tls")
    server.start()
    yield server, logs, live
    server.stop()


def fetch(port: int, path: str) -> tuple[int, bytes]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=10
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_current_previous_tail_limit_and_unknown_pods(server) -> None:
    log_server, _, _ = server
    port = log_server.port
    assert fetch(port, "/containerLogs/ns/p/main") == (200, b"current\n")
    assert fetch(port, "/containerLogs/ns/p/main?previous=true&tailLines=2") == (200, b"two\nthree\n")
    assert fetch(port, "/containerLogs/ns/p/main?previous=true&limitBytes=6") == (200, b"one\ntw")
    assert fetch(port, "/containerLogs/ns/p/main?timestamps=true") == (
        200,
        b"2026-01-01T00:00:09.000000Z current\n",
    )
    assert fetch(port, "/containerLogs/ns/other/main")[0] == 404


def test_follow_streams_new_lines_until_the_run_ends(server) -> None:
    log_server, logs, live = server
    received: list[bytes] = []

    def follow() -> None:
        received.append(fetch(log_server.port, "/containerLogs/ns/p/main?follow=true")[1])

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.5)
    with open(logs / "1.log", "ab") as sink:
        sink.write(b"2026-01-01T00:00:10.000000Z later\n")
    time.sleep(0.5)
    live.clear()
    reader.join(10)
    assert received == [b"current\nlater\n"]
