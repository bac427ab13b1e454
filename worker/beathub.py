"""The heartbeat hub: one summary Lease for a whole job, however many workers it has.

With `heartbeat.reporting: hub` a launcher does not renew its pod's Lease every interval. It puts its beat (what
the Lease would say) into the job's rendezvous store, under a key of its own, through its own gated connection
(`BeatSender`). The hub, a container of the rendezvous pod (`python -m phalanx.worker.beathub`), reads every
beat each interval, summarises them (phalanx.beatsummary) and writes one Lease named after the rendezvous pod,
which the operator expands back into per-pod heartbeats (operator/hubview.py). The job's heartbeats then cost
the API server one write per interval instead of one per worker per interval.

The hub is a failure of its own, kept apart from the store: it runs in its own container, and the store does not
depend on it. Each summary it makes is also stamped into the store (`ALIVE_KEY`); a launcher that finds that
stamp older than the heartbeat timeout, or cannot reach the store, renews its own Lease again until the hub is
back. The operator, for its part, judges no worker silent while the hub is (operator/hubview.py).

A hang verdict is the one piece of news the operator holds until the others' next beats: it acts on it only
once every peer renewed after it (a peer that did not is the likelier culprit). Through the hub those renewals
would reach it in the next summary, up to an interval after they were made, so while a verdict waits the hub
reads the beats again a moment after each peer's next beat is due and publishes as soon as all have come: one
summary more per verdict, and the verdict acted on about an interval after it was made, as with each pod's
own Lease.

Nothing read from the store is trusted beyond a JSON object of strings (`beatsummary.decode_beat`): any member of
the job can write any key of its store.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from phalanx import beatsummary, contract

if TYPE_CHECKING:
    from phalanx.worker import heartbeat

logger = logging.getLogger("phalanx.beathub")

BEAT_PREFIX = "phalanx/hub/beat/"
"""A launcher's beat: this prefix and its pod's name."""
MEMBERS_KEY = "phalanx/hub/members"
"""The pods that beat, each name followed by a comma (`Store.append`): the keys the hub reads."""
ALIVE_KEY = "phalanx/hub/alive"
"""The Unix time of the hub's latest summary."""
FRESH_INTERVALS = 1.5
"""A beat renewed within this many intervals of a summary is fresh (classed by what it says alone)."""
ALIVE_LOOK_INTERVALS = 2
"""A launcher reads the hub's stamp every this many beats."""
RETRY_SECONDS = 5.0
"""After a failed connection, a launcher tries the store again no sooner than this."""
FORGET_AFTER_TIMEOUTS = 10
"""The hub leaves out a beat older than this many heartbeat timeouts (its pod was replaced long ago)."""
LOOK_MARGIN_SECONDS = 0.1
"""How long after each peer's next beat is due (a verdict plus an interval) the hub first looks for it."""
LOOK_FRACTION = 0.125
"""Then it looks again every this fraction of an interval (a read of the store, no write)..."""
LOOK_INTERVALS = 2.0
"""...until the verdict is this many intervals old: a peer that has not renewed by then is silent, and the
operator waits for its timeout, not for the hub."""


def member_names(raw: bytes, prefix: str) -> list[str]:
    """The pods named in `MEMBERS_KEY` that can be the job's workers (`prefix` and an index), each once."""
    seen: dict[str, None] = {}
    for name in raw.decode(errors="replace").split(","):
        index = name.removeprefix(prefix)
        if name.startswith(prefix) and index.isdigit() and int(index) <= beatsummary.MAX_INDEX:
            seen[name] = None
    return list(seen)


def news_for_the_operator(before: heartbeat.PodStatus | None, now: heartbeat.PodStatus) -> bool:
    """Whether the pod's news calls for the operator now: a new verdict on a training process (`fault`), or the
    group restarted by this launcher (a training process died)."""
    if before is None:
        return False
    verdict = now.fault is not None and (now.fault, now.fault_rank) != (before.fault, before.fault_rank)
    return verdict or (now.group_restarts or 0) > (before.group_restarts or 0)


def writes_own_lease(hub_took_it: bool, written_before: bool, force: bool, urgent: bool) -> bool:
    """Whether a beat also renews the pod's own Lease: always without the hub; with it, the first time (the pod's
    heartbeat exists before the hub hears of it), at the last word (the pod ends: no wait for the next summary),
    for news the operator acts on (one write, not a wait of up to an interval for the hub's next summary), and
    whenever the hub does not answer."""
    return not hub_took_it or not written_before or force or urgent


class BeatSender:
    """A launcher's side of the hub: its beat into the store, and whether the hub is taking beats.

    `connect` opens a store connection of the sender's own (a wait elsewhere never holds up a beat)."""

    def __init__(self, connect: Callable[[], Any], pod_name: str, timeout_seconds: float) -> None:
        self._connect = connect
        self.pod_name = pod_name
        self.timeout_seconds = timeout_seconds
        self._store: Any = None
        self._registered = False
        self._retry_at = 0.0
        self._beats = 0
        self._hub_at: float | None = None

    @property
    def connected(self) -> bool:
        """Whether the sender holds a store connection (False: the next beat opens one, or waits for its retry)."""
        return self._store is not None

    def send(self, beat: Mapping[str, str]) -> bool:
        """Put the beat into the store; True when the hub summarised within the heartbeat timeout (the beat
        will reach the operator), False when the pod's own Lease must carry it."""
        now = time.monotonic()
        if self._store is None and now < self._retry_at:
            return False
        try:
            if self._store is None:
                self._store = self._connect()
                self._registered = False
            store = self._store
            store.set(BEAT_PREFIX + self.pod_name, beatsummary.encode_beat(beat))
            if not self._registered:
                # After the first beat: every name the hub reads has a beat to read.
                store.append(MEMBERS_KEY, self.pod_name + ",")
                self._registered = True
            if self._beats % ALIVE_LOOK_INTERVALS == 0 or not self._hub_alive():
                self._hub_at = _stamp(store.get(ALIVE_KEY)) if store.check([ALIVE_KEY]) else None
            self._beats += 1
        except Exception as error:  # any store failure: the own Lease carries the beat
            logger.info("heartbeat hub unreachable (%s): the pod's own Lease carries its heartbeat", error)
            self._store, self._retry_at, self._hub_at = None, now + RETRY_SECONDS, None
            return False
        return self._hub_alive()

    def _hub_alive(self) -> bool:
        return self._hub_at is not None and abs(time.time() - self._hub_at) <= self.timeout_seconds


def _stamp(raw: bytes) -> float | None:
    try:
        return float(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------- the hub


class LeaseWriter:
    """The summary Lease, named after the rendezvous pod and owned by it (what the admission policy lets the
    pod's token write)."""

    def __init__(self, pod_name: str, namespace: str, pod_uid: str, duration_seconds: int) -> None:
        from phalanx.worker.lease import LeaseClient

        self._client = LeaseClient(pod_name, namespace, pod_uid)
        self.pod_name, self.namespace, self.pod_uid = pod_name, namespace, pod_uid
        self.duration_seconds = duration_seconds

    def write(self, summary_text: str, now: datetime) -> None:
        self._client.renew(
            summary_lease(
                self.pod_name, self.namespace, self.pod_uid, summary_text, now, self.duration_seconds
            )
        )


def summary_lease(
    pod_name: str, namespace: str, pod_uid: str, summary_text: str, now: datetime, duration_seconds: int
) -> dict[str, Any]:
    """The hub's Lease: the summary in one annotation (it carries no heartbeat phase: it is no pod's
    heartbeat)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": pod_name,
            "namespace": namespace,
            "labels": dict(contract.LEASE_LABELS),
            "annotations": {beatsummary.SUMMARY_ANNOTATION: summary_text},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "holderIdentity": pod_name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": beatsummary.micro_time(now),
        },
    }


class Hub:
    """Reads every beat of the job each interval and publishes the summary."""

    def __init__(
        self,
        connect: Callable[[], Any],
        prefix: str,
        interval_seconds: float,
        publish: Callable[[str, datetime], None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        forget_after: float = math.inf,
    ) -> None:
        self.connect = connect
        """Opens a connection to the job's store (again, after a failure: the store may have restarted)."""
        self.store: Any = None
        self.prefix = prefix
        self.interval_seconds = interval_seconds
        self.publish = publish
        self.clock = clock
        self.forget_after = forget_after
        """Seconds after which a pod's last beat is left out: its pod has long been replaced (a name that comes
        back beats again), and a summary that kept every beat of every pod a long job ever had would grow with
        its history."""

    def read_beats(self, now: datetime | None = None) -> dict[int, dict[str, str]]:
        """Every registered pod's latest beat that decodes and is not older than `forget_after`, by index."""
        if not self.store.check([MEMBERS_KEY]):
            return {}
        names = member_names(self.store.get(MEMBERS_KEY), self.prefix)
        if not names:
            return {}
        raws = self.store.multi_get([BEAT_PREFIX + name for name in names])
        beats = {}
        for name, raw in zip(names, raws, strict=True):
            beat = beatsummary.decode_beat(bytes(raw))
            if beat is not None and not self._forgotten(beat, now):
                beats[int(name.removeprefix(self.prefix))] = beat
        return beats

    def _forgotten(self, beat: Mapping[str, str], now: datetime | None) -> bool:
        renewed = beatsummary.parse_time(beat.get("renewTime"))
        return now is not None and renewed is not None and (now - renewed).total_seconds() > self.forget_after

    def once(self) -> dict[str, Any]:
        """One summary: read, summarise, publish, then stamp the store (launchers trust the hub from then)."""
        if self.store is None:
            self.store = self.connect()
        now = self.clock()
        beats = self.read_beats(now)
        verdict = beatsummary.earliest_verdict(beats.values())
        awaited = self._awaited(beats)
        fresh = FRESH_INTERVALS * self.interval_seconds
        settled = verdict if awaited is None else None
        summary = beatsummary.summarise(self.prefix, beats, now, fresh, settled=settled)
        self.publish(beatsummary.encode(summary), now)
        self.store.set(ALIVE_KEY, f"{time.time():.3f}")
        self._await(awaited, now)
        return summary

    def _awaited(self, beats: Mapping[int, Mapping[str, str]]) -> datetime | None:
        """The hang verdict still waiting on a live peer's renewal (a peer silent for longer than a fresh beat's
        age is not waited for)."""
        return beatsummary.awaited_verdict(beats.values(), FRESH_INTERVALS * self.interval_seconds)

    def _await(self, verdict: datetime | None, now: datetime) -> None:
        """Plan the looks for a hang verdict that the operator holds until every peer renewed after it: the first
        once each peer had an interval to renew, then every `LOOK_FRACTION` of one, for `LOOK_INTERVALS`."""
        self.awaited = verdict
        if verdict is None or (now - verdict).total_seconds() > LOOK_INTERVALS * self.interval_seconds:
            self.look_at = math.inf
            return
        first = (verdict - now).total_seconds() + self.interval_seconds + LOOK_MARGIN_SECONDS
        self.look_at = time.monotonic() + max(first, LOOK_FRACTION * self.interval_seconds)

    def verdict_settled(self) -> bool:
        """Whether the hang verdict awaited is now one the operator can act on (every peer renewed after it):
        then the next summary is due at once. Reads the beats only when a look is due."""
        if self.awaited is None or time.monotonic() < self.look_at:
            return False
        now = self.clock()
        try:
            still = self._awaited(self.read_beats(now))
        except Exception:  # the regular summary meets the failure and reconnects
            self.look_at = math.inf
            return False
        if still is not None and still == self.awaited:
            self._await(still, now)
            return False
        return True

    def run(self, stop: threading.Event) -> None:
        due = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= due or self.verdict_settled():
                due = time.monotonic() + self.interval_seconds
                try:
                    summary = self.once()
                    logger.debug(
                        "summary of %d beats in %d classes", summary["members"], len(summary["classes"])
                    )
                except Exception as error:  # the next interval tries again; the launchers fall back meanwhile
                    logger.warning("heartbeat summary failed: %s", error)
                    self.store, self.awaited, self.look_at = None, None, math.inf
            stop.wait(max(0.0, min(due, self.look_at) - time.monotonic()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.beathub", description=__doc__)
    parser.add_argument("--store", required=True, help="host:port of the job's rendezvous store (its gate)")
    parser.add_argument(
        "--job", required=True, help="the TrainingJob's name (its workers are <job>-worker-<i>)"
    )
    parser.add_argument("--interval", type=float, required=True, help="seconds between summaries")
    parser.add_argument("--timeout", type=float, required=True, help="the job's heartbeat timeout in seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from phalanx.worker import rendezvous, storegate

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    secret_file = os.environ.get(rendezvous.SECRET_FILE_ENV)
    secret = storegate.read_secret(secret_file) if secret_file else None
    pod_name, namespace, pod_uid = (
        os.environ.get(key, "") for key in ("POD_NAME", "POD_NAMESPACE", "POD_UID")
    )
    if not (pod_name and namespace and pod_uid):
        print("phalanx-beathub: POD_NAME, POD_NAMESPACE and POD_UID must be set", file=sys.stderr)
        return 2
    host, _, port = args.store.rpartition(":")

    def connect() -> Any:
        return rendezvous.connect(host, int(port), max(args.timeout, 5.0), secret)

    writer = LeaseWriter(pod_name, namespace, pod_uid, max(1, int(args.timeout)))
    print(f"phalanx-beathub: summarising {args.job}-worker-* every {args.interval:g}s", flush=True)
    forget_after = FORGET_AFTER_TIMEOUTS * args.timeout
    Hub(connect, f"{args.job}-worker-", args.interval, writer.write, forget_after=forget_after).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
