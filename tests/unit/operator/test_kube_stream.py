"""`Kube.stream` against a small HTTP server that answers as the API server answers a watch: chunked, one JSON
event per line, lines split across chunks at any byte."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from phalanx.operator.kube import Kube

EVENTS = [
    {"type": "ADDED", "object": {"metadata": {"name": "n1", "resourceVersion": "11"}}},
    {
        "type": "MODIFIED",
        "object": {"metadata": {"name": "n1", "resourceVersion": "12"}, "spec": {"x": "é" * 50}},
    },
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
]


class WatchAnswer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        if "refuse" in self.path:
            body = b'{"kind":"Status","code":403,"message":"nodes is forbidden"}'
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = b"".join(json.dumps(event).encode() + b"\n" for event in EVENTS)
        # Chunks of 7 bytes: every line (and one multi-byte character) is cut somewhere.
        for start in range(0, len(data), 7):
            piece = data[start : start + 7]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[tuple[Kube, list[str]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WatchAnswer)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Kube(kubernetes.client.ApiClient(configuration)), server.paths  # type: ignore[attr-defined]
    finally:
        server.shutdown()


def test_a_watch_is_read_event_by_event_whatever_its_chunks(kube: tuple[Kube, list[str]]) -> None:
    client, paths = kube
    events = list(client.stream("/api/v1/nodes?watch=true&resourceVersion=10", 5.0))
    assert events == EVENTS
    assert paths == ["/api/v1/nodes?watch=true&resourceVersion=10"]


def test_a_refused_watch_raises_with_the_api_servers_status(kube: tuple[Kube, list[str]]) -> None:
    client, _ = kube
    with pytest.raises(ApiException) as refused:
        list(client.stream("/api/v1/nodes?watch=true&refuse=1", 5.0))
    assert refused.value.status == 403 and "forbidden" in str(refused.value.body)
