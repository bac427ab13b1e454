"""The kubelet's log endpoint: HTTPS `GET /containerLogs/{ns}/{pod}/{container}` for `kubectl logs`.

The certificate is self-signed (the apiserver does not verify kubelet certificates unless told to). Supported
query parameters: follow, tailLines, timestamps, previous, limitBytes, sinceSeconds.
Each stored log line is `<RFC3339 timestamp> <text>` (see `runtime.ContainerProcess`).
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

log = logging.getLogger(__name__)

FOLLOW_POLL = 0.25


def log_files(logs_dir: Path) -> list[Path]:
    """A container's log files, oldest run first."""
    files = [p for p in logs_dir.glob("*.log") if p.stem.isdigit()]
    return sorted(files, key=lambda p: int(p.stem))


def render_line(line: bytes, timestamps: bool) -> bytes:
    if timestamps:
        return line
    _, _, text = line.partition(b" ")
    return text


def line_time(line: bytes) -> datetime | None:
    stamp, _, _ = line.partition(b" ")
    try:
        return datetime.fromisoformat(stamp.decode().replace("Z", "+00:00"))
    except ValueError:
        return None


def select(lines: list[bytes], tail: int | None, since: datetime | None) -> list[bytes]:
    if since is not None:
        lines = [line for line in lines if (line_time(line) or since) >= since]
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return lines


def ensure_certificate(directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not (cert.exists() and key.exists()):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "3650",
                "-subj",
                "/CN=phalanx-node-agent",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
        )
    return cert, key


LogSource = Callable[[str, str, str], tuple[Path, Callable[[Path], bool]] | None]
"""(namespace, pod, container) -> (the container's log folder, `is_live(file)`: whether that run may still
write), or None when the pod is not known here."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("logserver: " + format, *args)

    def _error(self, code: int, message: str) -> None:
        body = message.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if url.path in ("/healthz", "/readyz"):
            self._error(200, "ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._error(404, "not found")
            return
        _, namespace, pod, container = parts
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        source = self.server.source(namespace, pod, container)
        if source is None:
            self._error(404, f'pod "{pod}" in namespace "{namespace}" is not running on this node agent')
            return
        logs_dir, is_live = source
        files = log_files(logs_dir)
        previous = query.get("previous", "false").lower() == "true"
        if previous:
            if len(files) < 2:
                self._error(400, f'previous terminated container "{container}" in pod "{pod}" not found')
                return
            target = files[-2]
        elif files:
            target = files[-1]
        else:
            self._error(400, f'container "{container}" in pod "{pod}" is waiting to start')
            return
        tail = int(query["tailLines"]) if "tailLines" in query else None
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        since = None
        if "sinceSeconds" in query:
            since = datetime.now(UTC) - timedelta(seconds=int(query["sinceSeconds"]))
        timestamps = query.get("timestamps", "false").lower() == "true"
        follow = query.get("follow", "false").lower() == "true" and not previous
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        self._stream(target, tail, since, limit, timestamps, follow, is_live)

    def _stream(
        self,
        target: Path,
        tail: int | None,
        since: datetime | None,
        limit: int | None,
        timestamps: bool,
        follow: bool,
        is_live: Callable[[Path], bool],
    ) -> None:
        sent = 0
        with open(target, "rb") as source:
            lines = select(source.read().splitlines(keepends=True), tail, since)
            pending = b""
            while True:
                for line in lines:
                    chunk = render_line(line, timestamps)
                    if limit is not None and sent + len(chunk) > limit:
                        self.wfile.write(chunk[: limit - sent])
                        return
                    self.wfile.write(chunk)
                    sent += len(chunk)
                lines = []
                self.wfile.flush()
                if not follow:
                    return
                live = is_live(target)
                data = source.read()
                if not data:
                    if not live:
                        return
                    time.sleep(FOLLOW_POLL)
                    continue
                pending += data
                *complete, pending = pending.split(b"\n")
                lines = [line + b"\n" for line in complete]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    source: LogSource


class LogServer:
    def __init__(self, source: LogSource, port: int, tls_dir: Path, host: str = "127.0.0.1") -> None:
        self.server = _Server((host, port), _Handler)
        self.server.source = source
        cert, key = ensure_certificate(tls_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        # the handshake runs in the request's thread, so one slow client cannot stall accept()
        self.server.socket = context.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.port = self.server.server_address[1]

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name="logserver", daemon=True).start()
        log.info("kubelet log endpoint on https://127.0.0.1:%d", self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
