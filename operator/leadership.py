"""Leader election over a Lease: of the operator's replicas exactly one acts, and one that was paused past its
lease never acts again before it has proved that no other replica took over.

Every replica runs a `LeaderElector`. The holder renews the Lease every `retry_seconds`; the others read it as
often, and one of them writes itself in once the Lease has stood unchanged for `lease_seconds` by its own clock
(or at once when the holder released it on its way out). Every write carries the resourceVersion last read, so
of two replicas writing at once the API server accepts one.

Fencing: the holder acts only until `renew_deadline_seconds` after its last successful renewal *began*, which
is shorter than `lease_seconds`, the least time another replica waits from the moment it saw that renewal. Every
write the operator sends passes `fence()` first: within the deadline it returns at once; past it (the process
was paused, starved, or cut off from the API server) it renews on the spot, with the resourceVersion of its own
last write, which the API server accepts only when no other replica wrote the Lease in between. A replica that
finds the Lease taken calls `on_lost` (the operator exits: its container restarts as a standby) and sends
nothing more. kopf's own bookkeeping writes (its annotations on the TrainingJob) do not pass through here; they
follow handlers that do, and record only what kopf has handled.

The times follow client-go's leader election with shorter defaults (8 s, 6 s, 1 s against 15 s, 10 s, 2 s), so
that a killed leader is replaced within 15 s; a leader stopped on purpose (SIGTERM: a rolling update, a
drain) releases the Lease and its successor acts within about one `retry_seconds`.
"""

from __future__ import annotations

import http.server
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes.client.rest import ApiException

from phalanx.operator.timeutil import format_micro_time, now

LOGGER = logging.getLogger(__name__)

Request = Callable[..., Any]
"""`Kube.request` without the fence: (method, path, body=None, content_type=...) -> decoded JSON."""


LEASE_KIND = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}


class NotLeader(RuntimeError):
    """A write refused because this replica does not hold the Lease (or cannot tell that it still does)."""


@dataclass(frozen=True)
class LeaseTiming:
    """How long a claim lasts, how long its holder acts on it, and how often the Lease is read or renewed."""

    lease_seconds: float = 8.0
    """A holder's claim lasts this long after a candidate last saw the Lease change."""
    renew_deadline_seconds: float = 6.0
    """The holder acts until this long after its last successful renewal began (less than `lease_seconds`)."""
    retry_seconds: float = 1.0
    """Seconds between renewals by the holder, and between reads by the others."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renew deadline < lease duration, got "
                f"{self.retry_seconds} s, {self.renew_deadline_seconds} s, {self.lease_seconds} s"
            )


@dataclass(frozen=True)
class Observed:
    """The Lease as a replica last read it, and when (its own monotonic clock) it first saw that version."""

    holder: str
    resource_version: str
    lease_seconds: float
    first_seen: float


def claimable(observed: Observed | None, identity: str, at: float) -> bool:
    """May `identity` write itself into the Lease at monotonic time `at`? When there is none, when it is free
    (released), when it is its own (a restarted container of the same pod: the process that held it is gone),
    or when it has stood unchanged for its whole duration since first seen."""
    if observed is None or observed.holder in ("", identity):
        return True
    return at - observed.first_seen >= observed.lease_seconds


def lease_spec(
    identity: str, timing: LeaseTiming, current: dict[str, Any] | None, at: datetime
) -> dict[str, Any]:
    """The Lease's spec with `identity` as holder, renewed at `at`: its acquire time and transitions kept for a
    renewal, moved on for a takeover."""
    spec = dict(current or {})
    renewal = spec.get("holderIdentity") == identity
    stamp = format_micro_time(at)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": math.ceil(timing.lease_seconds),
        "acquireTime": spec.get("acquireTime") if renewal and spec.get("acquireTime") else stamp,
        "renewTime": stamp,
        "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if renewal or not current else 1),
    }


class LeaderElector:
    """One replica's side of the election (thread-safe); `start()` runs it on a thread of its own."""

    def __init__(
        self,
        request: Request,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        *,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = now,
    ) -> None:
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timing = timing or LeaseTiming()
        self._request = request
        self._on_lost = on_lost
        self._clock, self._wall = clock, wall
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._guard = threading.RLock()
        self._observed: Observed | None = None
        self._mine: str | None = None
        """resourceVersion of this replica's last accepted write: only a Lease still at it may be renewed."""
        self._valid_until = -math.inf
        self.leading = threading.Event()
        """Set once this replica first holds the Lease."""
        self.lost = threading.Event()
        """Set once this replica, having held the Lease, found it held by another."""
        self._released = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self) -> bool:
        """Within the renew deadline of this replica's last successful renewal."""
        return not self.lost.is_set() and self._clock() < self._valid_until

    def fence(self) -> None:
        """Return only if this replica holds the Lease: at once within its renew deadline, else after renewing it
        now (which fails if another replica wrote the Lease since this one last did). Raises `NotLeader`."""
        if self.holds():
            return
        with self._guard:
            if self.holds():
                return
            try:
                if self.attempt():
                    return
            except Exception as error:  # the API server away: nothing proves the Lease is still ours
                raise NotLeader(
                    f"cannot renew the operator's Lease {self.namespace}/{self.name}: {error}"
                ) from error
        if self._released:
            raise NotLeader("this replica released the operator's Lease: it is stopping")
        holder = self._observed.holder if self._observed else "nobody"
        raise NotLeader(f"the operator's Lease {self.namespace}/{self.name} is held by {holder or 'nobody'}")

    def attempt(self) -> bool:
        """One read and, where this replica may, one write of the Lease: whether it holds the Lease now."""
        with self._guard:
            if self.lost.is_set() or self._released:
                return False
            began = self._clock()
            current = self._read()
            if current is None:
                return self._write(None, began)
            meta, spec = current["metadata"], current.get("spec") or {}
            version = str(meta.get("resourceVersion", ""))
            holder = str(spec.get("holderIdentity") or "")
            if self._observed is None or self._observed.resource_version != version:
                seconds = float(spec.get("leaseDurationSeconds") or self.timing.lease_seconds)
                self._observed = Observed(holder, version, seconds, began)
            if self._mine is not None:
                # This replica has held it: only an unchanged Lease is still its own.
                if version != self._mine:
                    self._lose(holder or "a release by another replica")
                    return False
                return self._write(current, began)
            if not claimable(self._observed, self.identity, began):
                return False
            return self._write(current, began)

    def _read(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._request("GET", f"{self._path}/{self.name}")
            return found
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _write(self, current: dict[str, Any] | None, began: float) -> bool:
        spec = lease_spec(self.identity, self.timing, (current or {}).get("spec"), self._wall())
        try:
            if current is None:
                body = {
                    **LEASE_KIND,
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
                written = self._request("POST", self._path, body)
            else:
                body = {**LEASE_KIND, "metadata": {**current["metadata"]}, "spec": spec}
                written = self._request("PUT", f"{self._path}/{self.name}", body)
        except ApiException as error:
            if error.status == 409:
                # Another replica wrote it first (a conflict on the resourceVersion, or it created it).
                if self._mine is not None:
                    self._lose("another replica")
                return False
            raise
        first = self._mine is None
        self._mine = str(written["metadata"]["resourceVersion"])
        self._valid_until = began + self.timing.renew_deadline_seconds
        if first:
            LOGGER.info("holding the operator's Lease %s/%s as %s", self.namespace, self.name, self.identity)
        self.leading.set()
        return True

    def _lose(self, holder: str) -> None:
        self._valid_until = -math.inf
        if self.lost.is_set():
            return
        self.lost.set()
        LOGGER.error(
            "the operator's Lease %s/%s was taken by %s: this replica stops acting",
            self.namespace,
            self.name,
            holder,
        )
        if self._on_lost is not None:
            self._on_lost(holder)

    def release(self) -> None:
        """Give the Lease up (on a clean stop), so that a standby takes over at its next read."""
        with self._guard:
            self._released = True  # from now on nothing of this process writes or takes the Lease again
            if self._mine is None or self.lost.is_set():
                return
            self._valid_until = -math.inf
            try:
                current = self._read()
                if current is None or str(current["metadata"].get("resourceVersion")) != self._mine:
                    return
                spec = {**(current.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
                self._request(
                    "PUT",
                    f"{self._path}/{self.name}",
                    {**LEASE_KIND, "metadata": current["metadata"], "spec": spec},
                )
                LOGGER.info("released the operator's Lease %s/%s", self.namespace, self.name)
            except Exception as error:  # its successor waits out the lease instead
                LOGGER.warning("could not release the operator's Lease: %s", error)
            self._mine = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.timing.retry_seconds + 5)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            try:
                self.attempt()
            except Exception as error:
                LOGGER.warning("operator Lease %s/%s: %s", self.namespace, self.name, error)
            self._stop.wait(self.timing.retry_seconds)


class StandbyHealth:
    """`/healthz` answering 200 while this replica stands by, on the port kopf's liveness endpoint takes once it
    leads (closed before kopf starts)."""

    def __init__(self, host: str, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"standby": true}'
                self.send_response(200 if self.path.startswith("/healthz") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="standby-health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
