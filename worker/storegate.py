"""An authenticated door in front of the job's rendezvous store.

torch's TCPStore authenticates nothing, and any client can list its keys, so a secret kept inside the store
protects nothing. With the job's secret (a file the operator mounts into the job's pods only), the rendezvous
pod's store listens on loopback alone, and a `Gate` on the pod's address lets a connection through to it only
once the peer has proved that it knows the secret: an HMAC-SHA256 challenge and response, both ways, so that
the launcher also learns that it reached the job's own store and not a squatter's.

torch's client cannot answer a challenge, so a launcher reaches the gate through a `Forwarder`: a loopback
listener in the launcher's own process that torch's client connects to. It accepts only connections from its
own process (or, for the training processes' store, from the processes it started), answers the gate's
challenge, then relays bytes both ways.

The training processes' own store of each group attempt (torch's env:// rendezvous, MASTER_ADDR) stands
behind a gate of the same kind, hosted by the launcher of node rank 0 (worker/attemptstore.py).

What it does not do: encrypt. Whoever sits on the path between a launcher and the rendezvous pod can still
read and alter the bytes of a connection that authenticated; the pod network is trusted for that, and the
job's NetworkPolicy keeps the rest of the cluster from reaching the pods at all. Where pods share the host's
network namespace (the local cluster's node agent), the store's loopback port is reachable from every pod on
that host: only a real node's pod network namespace makes the loopback the pod's own.

Protocol (fixed lengths, one round trip):

    gate -> client   MAGIC + server nonce (32 bytes)
    client -> gate   client nonce (32 bytes) + HMAC(secret, b"client" + server nonce + client nonce)
    gate -> client   HMAC(secret, b"server" + server nonce + client nonce), then the store's bytes
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

logger = logging.getLogger("phalanx.storegate")

MAGIC = b"PHXGATE1"
NONCE_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
HANDSHAKE_TIMEOUT = 5.0
"""Seconds a peer has to answer the challenge before the gate drops it."""
MAX_PENDING_HANDSHAKES = 16_384
"""Connections still proving themselves at once; more are dropped unread (a flood cannot hold the gate). A whole
gang connects at once when it starts (12,500 launchers of a 100,000-GPU job, each with a connection or two): at
256, the launchers of a 512-pod gang past the first 256 were dropped and waited out their retry. Each pending one
costs a socket and a coroutine for at most `HANDSHAKE_TIMEOUT`."""
MIN_SECRET_BYTES = 16
RELAY_CHUNK = 1 << 16

T = TypeVar("T")


class GateRefused(RuntimeError):
    """The gate and this client do not share the job's secret (or the peer is no gate of ours). A RuntimeError,
    as torch's own failures to reach a store are: callers retry it the same way."""


class SecretError(Exception):
    """The job's store secret cannot be read, or is too short to be one."""


def read_secret(path: str) -> bytes:
    """The secret in `path` (surrounding whitespace dropped); raises `SecretError` saying what is wrong."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as error:
        raise SecretError(f"cannot read the job's store secret {path}: {error.strerror or error}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(
            f"the job's store secret {path} holds {len(secret)} bytes; at least {MIN_SECRET_BYTES}"
        )
    return secret


def _mac(secret: bytes, side: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, side + server_nonce + client_nonce, hashlib.sha256).digest()


def client_proof(secret: bytes, challenge: bytes, client_nonce: bytes) -> bytes:
    """What a client sends after reading the gate's `challenge` (MAGIC + server nonce)."""
    if len(challenge) != len(MAGIC) + NONCE_BYTES or not challenge.startswith(MAGIC):
        raise GateRefused("the peer is not a Phalanx store gate")
    server_nonce = challenge[len(MAGIC) :]
    return client_nonce + _mac(secret, b"client", server_nonce, client_nonce)


def check_client(secret: bytes, server_nonce: bytes, proof: bytes) -> bytes | None:
    """The gate's answer to a client's `proof`, or None when the client does not know the secret."""
    client_nonce, mac = proof[:NONCE_BYTES], proof[NONCE_BYTES:]
    if len(client_nonce) != NONCE_BYTES or not hmac.compare_digest(
        mac, _mac(secret, b"client", server_nonce, client_nonce)
    ):
        return None
    return _mac(secret, b"server", server_nonce, client_nonce)


def check_gate(secret: bytes, challenge: bytes, proof: bytes, answer: bytes) -> None:
    """Raise `GateRefused` unless `answer` proves that the gate knows the secret too."""
    expected = _mac(secret, b"server", challenge[len(MAGIC) :], proof[:NONCE_BYTES])
    if not hmac.compare_digest(answer, expected):
        raise GateRefused("the store's gate does not know the job's secret: it is not this job's store")


class _EventLoop:
    """One asyncio loop on a daemon thread per process, shared by every gate and forwarder in it."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid = 0

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            # A forked child has the parent's loop object but not its thread.
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="phalanx-store-gate", daemon=True).start()
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop

    @classmethod
    def run(cls, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, cls.get()).result(timeout)


def _close_server(server: asyncio.Server) -> None:
    """Stop `server` listening, on the loop's own thread: asyncio's Server is not thread-safe, and closing it
    from another thread while one of its connections ended on the loop broke asyncio's bookkeeping
    (a TypeError from inside `Server.close`)."""

    async def close() -> None:
        server.close()

    _EventLoop.run(close())


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Relay both ways until either side ends; then both ends are closed."""
    await asyncio.gather(_pump(a[0], b[1]), _pump(b[0], a[1]), return_exceptions=True)


class Gate:
    """Listens on `listener`; relays each connection that proves it knows `secret` to the store at `backend`."""

    def __init__(self, listener: socket.socket, backend: tuple[str, int], secret: bytes) -> None:
        self.port: int = listener.getsockname()[1]
        self._backend = backend
        self._secret = secret
        self._pending = 0
        self._refused = 0
        self._last_refusal_logged = 0.0
        self._server = _EventLoop.run(self._start(listener))

    async def _start(self, listener: socket.socket) -> asyncio.Server:
        return await asyncio.start_server(self._admit, sock=listener)

    @property
    def refused(self) -> int:
        """Connections dropped for not knowing the secret (or not answering in time) so far."""
        return self._refused

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._pending >= MAX_PENDING_HANDSHAKES:
            self._refuse(peer, "too many connections proving themselves at once")
            writer.close()
            return
        self._pending += 1
        try:
            server_nonce = secrets.token_bytes(NONCE_BYTES)
            writer.write(MAGIC + server_nonce)
            proof = await asyncio.wait_for(reader.readexactly(NONCE_BYTES + MAC_BYTES), HANDSHAKE_TIMEOUT)
            answer = check_client(self._secret, server_nonce, proof)
            if answer is None:
                self._refuse(peer, "it does not know the job's secret")
                writer.close()
                return
            backend = await asyncio.open_connection(*self._backend)
            writer.write(answer)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as error:
            self._refuse(peer, f"no answer to the challenge ({type(error).__name__})")
            writer.close()
            return
        finally:
            self._pending -= 1
        await _splice((reader, writer), backend)

    def _refuse(self, peer: Any, why: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._last_refusal_logged >= 10.0:  # a flood of strangers must not flood the log
            self._last_refusal_logged = now
            logger.warning("store gate: refused %s: %s (%d refused so far)", peer, why, self._refused)

    def close(self) -> None:
        _close_server(self._server)


async def _open_gate(
    host: str, port: int, secret: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the gate at host:port, through the handshake: this side has proved that it knows
    `secret`, and the gate that it does too. Raises `GateRefused` (or OSError) otherwise."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        challenge = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
        proof = client_proof(secret, challenge, secrets.token_bytes(NONCE_BYTES))
        writer.write(proof)
        try:
            answer = await reader.readexactly(MAC_BYTES)
        except asyncio.IncompleteReadError:
            raise GateRefused("the store's gate refused this pod: the job's secret does not match") from None
        check_gate(secret, challenge, proof, answer)
    except BaseException:
        writer.close()
        raise
    return reader, writer


def check_reachable(host: str, port: int, secret: bytes, timeout: float) -> None:
    """One handshake with the gate at host:port, so that a wrong secret is said as such instead of as a store
    that does not answer. Raises `GateRefused` or OSError (TimeoutError past `timeout`)."""

    async def once() -> None:
        _, writer = await asyncio.wait_for(_open_gate(host, port, secret), timeout)
        writer.close()

    _EventLoop.run(once())


class Forwarder:
    """A loopback port in this process that leads, through the handshake, to the gate at (host, port).

    Only connections from this process itself are relayed: on a host whose pods share one loopback, another
    pod must not borrow this launcher's standing with the gate."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = HANDSHAKE_TIMEOUT,
        serve_descendants: bool = False,
    ) -> None:
        """`serve_descendants`: also relay connections from the processes this one started (and theirs)."""
        self._remote = (host, port)
        self._secret = secret
        self._timeout = timeout
        listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = listener.getsockname()[1]
        self._ownership = _OwnershipChecks(self.port, serve_descendants)
        self._server = _EventLoop.run(asyncio.start_server(self._relay, sock=listener))

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if not await self._ownership.own(peer[1]):
            logger.warning("store forwarder: refused %s: not a connection of this process", peer)
            writer.close()
            return
        try:
            remote = await asyncio.wait_for(_open_gate(*self._remote, self._secret), self._timeout)
        except (TimeoutError, GateRefused, ConnectionError, OSError) as error:
            logger.warning("store forwarder: cannot pass through the gate at %s:%d: %s", *self._remote, error)
            writer.close()
            return
        await _splice((reader, writer), remote)

    def close(self) -> None:
        _close_server(self._server)


_forwarders: dict[tuple[str, int, bytes], tuple[int, Forwarder]] = {}
_forwarders_lock = threading.Lock()


def forwarder_for(host: str, port: int, secret: bytes) -> Forwarder:
    """This process's forwarder to the gate at host:port (one per gate, made on first use; a forked child
    makes its own, since the parent's loop thread did not come with it)."""
    key = (host, port, secret)
    with _forwarders_lock:
        made = _forwarders.get(key)
        if made is None or made[0] != os.getpid():
            made = _forwarders[key] = (os.getpid(), Forwarder(host, port, secret))
        return made[1]


class _OwnershipChecks:
    """Answers a forwarder's question, whose is this connection, for all the connections waiting at once.

    Each answer reads the kernel's TCP tables and this process's open files, and both grow with the
    connections the process holds: a launcher holds a few, but a process that opens thousands (the scale
    benchmark's emulated launchers) would pay for every connection a read of all the others, the square of
    them in all. Connections that arrive while one look runs share the next one, off the loop's thread."""

    def __init__(self, local_port: int, or_descendants: bool) -> None:
        self._local_port = local_port
        self._or_descendants = or_descendants
        self._waiting: list[tuple[int, asyncio.Future[bool]]] = []
        self._looking: asyncio.Task[None] | None = None

    async def own(self, peer_port: int) -> bool:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        self._waiting.append((peer_port, answer))
        if self._looking is None:
            self._looking = loop.create_task(self._look())
        return await answer

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    owned = await loop.run_in_executor(
                        None,
                        own_connections,
                        [port for port, _ in batch],
                        self._local_port,
                        self._or_descendants,
                    )
                except Exception as error:  # an answer for each waiting connection, even when it is a failure
                    owned = [False] * len(batch)
                    logger.warning("store forwarder: cannot tell whose connections these are: %s", error)
                for (_, answer), mine in zip(batch, owned, strict=True):
                    if not answer.done():
                        answer.set_result(mine)
        finally:
            self._looking = None


def own_connections(peer_ports: Sequence[int], local_port: int, or_descendants: bool = False) -> list[bool]:
    """For each of `peer_ports`, whether the loopback connection from it to `local_port` was made by a socket of
    this process (or, with `or_descendants`, of a process it started, or one they started): its inode, found
    in the kernel's TCP table, is among that process's open files. One read of the tables and of the open files
    serves them all."""
    inodes = _loopback_socket_inodes(set(peer_ports), local_port)
    owned = _owned_sockets(or_descendants) if inodes else set()
    return [inodes.get(port) in owned for port in peer_ports]


def _owned_sockets(or_descendants: bool) -> set[str]:
    """The links (`socket:[inode]`) of the sockets this process holds open, and its descendants' with
    `or_descendants`."""
    owners = [os.getpid()]
    if or_descendants:
        with contextlib.suppress(psutil.Error):
            owners.extend(child.pid for child in psutil.Process().children(recursive=True))
    links: set[str] = set()
    for pid in owners:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:"):
                        links.add(link)
    return links


def _loopback_socket_inodes(peer_ports: set[int], local_port: int) -> dict[int, str]:
    """The links (`socket:[inode]`) of the TCP sockets bound to 127.0.0.1 at one of `peer_ports` and
    connected to 127.0.0.1:`local_port`, by port: IPv4 sockets, or IPv6 ones speaking IPv4-mapped addresses
    (torch's client makes those)."""
    tables = (("/proc/self/net/tcp", "0100007F"), ("/proc/self/net/tcp6", "0000000000000000FFFF00000100007F"))
    found: dict[int, str] = {}
    for path, loopback in tables:
        local_prefix, remote = f"{loopback}:", f"{loopback}:{local_port:04X}"
        with contextlib.suppress(OSError), open(path) as table:
            next(table, None)
            for line in table:
                fields = line.split()
                if len(fields) > 9 and fields[2] == remote and fields[1].startswith(local_prefix):
                    port = int(fields[1][len(local_prefix) :], 16)
                    if port in peer_ports:
                        found[port] = f"socket:[{fields[9]}]"
    return found
