"""How current the operator's own view of the cluster is, and the gaps in it.

The operator judges heartbeats by their age: a Lease not renewed for `timeoutSeconds` is a silent worker.
But it sees Leases through its watch streams and indexes, and that view can fall behind the cluster: the
process paused (a long GC pause, CPU starvation, SIGSTOP), restarted, or a watch stalled, or the API server
itself was away. Judged by the wall clock, every heartbeat then looks as old as the gap, and every healthy
worker would be replaced the moment the operator looks again.

So the operator renews a Lease of its own, the view canary, every second (`CanaryWriter`), and sees its
renewals through the same Lease watch as the heartbeats (`ViewClock.saw`). Whenever the newest renewal it
has seen is older than `lag_seconds`, its view is stale: that stretch of time is a gap, and a heartbeat or a
progress clock is late only by the time outside the gaps (`seen_age`). A gap still going on counts up to the
present, so a reconcile that runs before the view caught up judges no heartbeat late for that gap; once the
backlog of events has arrived, the heartbeats are current again and judged as usual.

The canary's writer can fail for good (its Lease refused by RBAC): then nothing marks the view current, and
the clock reports no gaps at all (the wall clock judges, as without it) rather than excusing every silence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from phalanx import contract
from phalanx.operator.timeutil import format_micro_time, now

LOGGER = logging.getLogger(__name__)

CANARY_LABEL = "phalanx.dev/operator-view"
"""Label of the operator's view canary Lease (its value: the operator's name)."""
CANARY_NAME = "phalanx-operator-view"
"""Name of the canary Lease in each namespace it is written to."""
DEFAULT_INTERVAL_SECONDS = 1.0
DEFAULT_LAG_SECONDS = 3.0
"""A view whose newest canary is older than this is stale: two missed renewals, plus the watch's delivery."""
KEEP_SECONDS = 6 * 3600.0
"""Gaps older than this are forgotten: no heartbeat or progress clock is judged over a longer span."""
MAX_GAPS = 256


@dataclass(frozen=True)
class Gap:
    """A stretch of time during which the operator's view was stale."""

    start: datetime
    end: datetime | None = None
    """None: still going on."""


def joined(gaps: Sequence[Gap], extra: Gap) -> tuple[Gap, ...]:
    """`gaps` with `extra` added, overlapping ones joined (so no moment is left out twice), in order; an open gap
    (end None) runs on and absorbs every one that starts after it."""
    merged: list[Gap] = []
    for gap in sorted([*gaps, extra], key=lambda each: each.start):
        last = merged[-1] if merged else None
        if last is not None and (last.end is None or gap.start <= last.end):
            end = None if last.end is None or gap.end is None else max(last.end, gap.end)
            merged[-1] = Gap(last.start, end)
        else:
            merged.append(gap)
    return tuple(merged)


def unseen_seconds(since: datetime, until: datetime, gaps: Sequence[Gap]) -> float:
    """Seconds of [since, until] that fall inside a gap (an open gap runs up to `until`)."""
    total = 0.0
    for gap in gaps:
        start = max(gap.start, since)
        end = min(gap.end or until, until)
        if end > start:
            total += (end - start).total_seconds()
    return total


def seen_age(moment: datetime | None, until: datetime, gaps: Sequence[Gap] = ()) -> float | None:
    """Seconds from `moment` to `until` during which the operator's view was current (None: no moment)."""
    if moment is None:
        return None
    return (until - moment).total_seconds() - unseen_seconds(moment, until, gaps)


class ViewClock:
    """The gaps in the operator's view, from the canary renewals it has seen (thread-safe)."""

    def __init__(self, lag_seconds: float = DEFAULT_LAG_SECONDS, clock: Callable[[], datetime] = now) -> None:
        self.lag = timedelta(seconds=lag_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._newest: datetime | None = None
        self._gaps: list[Gap] = []
        self._started = clock()
        self._writer_broken: str | None = None

    def saw(self, renewed: datetime) -> None:
        """A canary renewal (its renew time) reached the operator's view."""
        at = self._clock()
        with self._lock:
            if self._newest is not None and renewed <= self._newest:
                return
            stale_since = (self._newest or self._started) + self.lag
            if at > stale_since:
                self._add_gap(stale_since, at)
            self._newest = renewed
            if at - renewed <= self.lag and self._gaps and self._gaps[-1].end == at:
                # Current again: say once how long the view was stale (a backlog arrives in many events).
                gap = self._gaps[-1]
                LOGGER.warning(
                    "the operator's view was stale from %s to %s (%.1fs without current watch events): no "
                    "heartbeat is judged late for that time",
                    format_micro_time(gap.start - self.lag),
                    format_micro_time(at),
                    (at - gap.start).total_seconds() + self.lag.total_seconds(),
                )
            self._forget_old(at)

    def writer_failed(self, reason: str | None) -> None:
        """The canary's writer failed for good (`reason`) or works again (None)."""
        with self._lock:
            if reason is not None and self._writer_broken is None:
                LOGGER.warning(
                    "the operator's view canary cannot be written (%s): heartbeats are judged by the wall "
                    "clock alone, and a pause of the operator may be taken for silent workers",
                    reason,
                )
            self._writer_broken = reason

    def gaps(self) -> tuple[Gap, ...]:
        """The gaps to leave out of heartbeat ages now, the one going on (if any) last."""
        at = self._clock()
        with self._lock:
            if self._writer_broken is not None:
                return ()
            stale_since = (self._newest or self._started) + self.lag
            if at <= stale_since:
                return tuple(self._gaps)
            last = self._gaps[-1] if self._gaps else None
            if last is not None and last.end is not None and stale_since <= last.end:
                # Still stale since the last gap was recorded (a backlog still arriving): one gap going on.
                return (*self._gaps[:-1], Gap(last.start))
            return (*self._gaps, Gap(stale_since))

    def _add_gap(self, start: datetime, end: datetime) -> None:
        """Record [start, end] as stale, joined to the last gap where they meet (a backlog's events)."""
        last = self._gaps[-1] if self._gaps else None
        if last is not None and last.end is not None and start <= last.end:
            self._gaps[-1] = Gap(last.start, max(last.end, end))
        else:
            self._gaps.append(Gap(start, end))

    def _forget_old(self, at: datetime) -> None:
        horizon = at - timedelta(seconds=KEEP_SECONDS)
        self._gaps = [gap for gap in self._gaps if gap.end is None or gap.end > horizon][-MAX_GAPS:]


def canary_lease(namespace: str, holder: str, renewed: datetime, operator_name: str) -> dict[str, Any]:
    """The canary Lease as written (a merge patch body, or the object to create)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": CANARY_NAME,
            "namespace": namespace,
            "labels": {**contract.LEASE_LABELS, CANARY_LABEL: operator_name},
        },
        "spec": {"holderIdentity": holder, "renewTime": format_micro_time(renewed)},
    }


class OperatorView:
    """The view clocks of the namespaces the canary is written to, and which one judges a job's heartbeats.

    Watching the whole cluster, one canary serves every job: all Leases come through one watch stream. Watching
    some namespaces, each has a stream of its own, so each gets its own canary; a job in a namespace without
    one (a namespace pattern) is judged by the wall clock alone."""

    def __init__(
        self, namespaces: Sequence[str], clusterwide: bool, lag_seconds: float = DEFAULT_LAG_SECONDS
    ) -> None:
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.clusterwide = clusterwide
        self.clocks = {namespace: ViewClock(lag_seconds) for namespace in self.namespaces}

    def saw(self, namespace: str, renewed: datetime) -> None:
        clock = self.clocks.get(namespace)
        if clock is not None:
            clock.saw(renewed)

    def writer_failed(self, namespace: str, reason: str | None) -> None:
        clock = self.clocks.get(namespace)
        if clock is not None:
            clock.writer_failed(reason)

    def gaps(self, job_namespace: str) -> tuple[Gap, ...]:
        """The stale stretches of the view that judges the heartbeats of jobs in `job_namespace`."""
        if self.clusterwide and self.namespaces:
            return self.clocks[self.namespaces[0]].gaps()
        clock = self.clocks.get(job_namespace)
        return clock.gaps() if clock is not None else ()


TRANSIENT_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Answers to a canary write that say nothing about the writer itself (the API server busy or away)."""


class CanaryWriter:
    """Renews the view canary in each of the view's namespaces every `interval` seconds, on its own thread.

    `renew(lease)` writes one canary Lease (creating it when missing) and raises on failure; an exception with
    an HTTP `status` outside `TRANSIENT_STATUSES` (403: RBAC refuses it) marks that namespace's writer broken
    until a write succeeds again; a transient failure leaves the gap to grow, as the view is stale then."""

    def __init__(
        self,
        view: OperatorView,
        renew: Callable[[dict[str, Any]], None],
        holder: str,
        operator_name: str,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], datetime] = now,
    ) -> None:
        self.view = view
        self.renew = renew
        self.holder = holder
        self.operator_name = operator_name
        self.interval = interval_seconds
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew_once(self) -> None:
        for namespace in self.view.namespaces:
            try:
                self.renew(canary_lease(namespace, self.holder, self._clock(), self.operator_name))
            except Exception as error:
                status = getattr(error, "status", None)
                if isinstance(status, int) and status not in TRANSIENT_STATUSES:
                    self.view.writer_failed(namespace, f"{status} {getattr(error, 'reason', '') or error}")
                else:
                    LOGGER.info("view canary not renewed in %s: %s", namespace, error)
            else:
                self.view.writer_failed(namespace, None)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="phalanx-view-canary", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            self.renew_once()
            if self._stop.wait(self.interval):
                return
