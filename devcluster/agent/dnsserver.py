"""The cluster DNS server: UDP and TCP on the pod network's first address (P.0.1:53), answering from a `DnsTable`.

With an upstream resolver (the real node's server), names outside the cluster domain are forwarded to it
instead of refused, as cluster DNS does for containers that resolve public names."""

from __future__ import annotations

import logging
import socket
import socketserver
import struct
import threading
from pathlib import Path

from phalanx.devcluster.agent import dnswire
from phalanx.devcluster.agent.dnstable import DnsTable

log = logging.getLogger(__name__)


UPSTREAM_TIMEOUT_SECONDS = 3.0


def forward(data: bytes, upstream: tuple[str, int]) -> bytes:
    """The upstream resolver's response to a query, or SERVFAIL when it does not answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(UPSTREAM_TIMEOUT_SECONDS)
        try:
            sock.sendto(data, upstream)
            response, _ = sock.recvfrom(65535)
            return response
        except OSError:
            query = dnswire.decode_query(data)
            return dnswire.encode_response(query, dnswire.RCODE_SERVFAIL, [])


def upstream_resolver(resolv_conf: str = "/etc/resolv.conf") -> tuple[str, int] | None:
    """The host's first IPv4 nameserver (this server runs on the host, so a loopback one serves as well)."""
    try:
        lines = Path(resolv_conf).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and "." in fields[1]:
            return (fields[1], 53)
    return None


def answer(table: DnsTable, data: bytes, upstream: tuple[str, int] | None = None) -> bytes | None:
    """The response bytes for a query (None when the bytes are not even a header)."""
    try:
        query = dnswire.decode_query(data)
    except dnswire.DnsFormatError:
        if len(data) < 12:
            return None
        msg_id, flags = struct.unpack("!HH", data[:4])
        bare = dnswire.Query(msg_id, flags, (), b"")
        return dnswire.encode_response(bare, dnswire.RCODE_FORMERR, [])
    if len(query.questions) != 1 or (query.flags >> 11) & 0xF != 0:
        return dnswire.encode_response(query, dnswire.RCODE_NOTIMP, [])
    question = query.questions[0]
    result = table.lookup(question.name)
    if result is None and upstream is not None:
        return forward(data, upstream)
    if result is None:
        return dnswire.encode_response(query, dnswire.RCODE_REFUSED, [])
    if not result.exists:
        return dnswire.encode_response(query, dnswire.RCODE_NXDOMAIN, [])
    wanted = [ip for ip in result.addresses if (":" in ip) == (question.qtype == dnswire.TYPE_AAAA)]
    if question.qtype not in (dnswire.TYPE_A, dnswire.TYPE_AAAA, 255):
        wanted = []
    return dnswire.encode_response(query, dnswire.RCODE_OK, wanted)


class _UdpHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        response = answer(self.server.table, data, self.server.upstream)  # type: ignore[attr-defined]
        if response is not None:
            sock.sendto(response, self.client_address)


class _TcpHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.connection.settimeout(5)
        while True:
            header = self.rfile.read(2)
            if len(header) < 2:
                return
            (length,) = struct.unpack("!H", header)
            response = answer(self.server.table, self.rfile.read(length), self.server.upstream)  # type: ignore[attr-defined]
            if response is None:
                return
            self.wfile.write(struct.pack("!H", len(response)) + response)


class _Udp(socketserver.ThreadingUDPServer):
    allow_reuse_address = True
    daemon_threads = True
    table: DnsTable
    upstream: tuple[str, int] | None = None


class _Tcp(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    table: DnsTable
    upstream: tuple[str, int] | None = None


class DnsServer:
    def __init__(
        self, table: DnsTable, host: str, port: int, upstream: tuple[str, int] | None = None
    ) -> None:
        self.udp = _Udp((host, port), _UdpHandler)
        self.tcp = _Tcp((host, self.udp.server_address[1]), _TcpHandler)
        for server in (self.udp, self.tcp):
            server.table = table
            server.upstream = upstream
        self.address = self.udp.server_address

    def start(self) -> None:
        for server in (self.udp, self.tcp):
            threading.Thread(target=server.serve_forever, name="dns", daemon=True).start()
        log.info("cluster DNS on %s:%s (udp+tcp)", *self.address)

    def stop(self) -> None:
        for server in (self.udp, self.tcp):
            server.shutdown()
            server.server_close()


def query(
    host: str, port: int, name: str, qtype: int = dnswire.TYPE_A, timeout: float = 2.0
) -> tuple[int, list[str]]:
    """Ask a DNS server over UDP (for tests and health checks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(dnswire.encode_query(4242, name, qtype), (host, port))
        data, _ = sock.recvfrom(4096)
    return dnswire.decode_response(data)
