"""Heartbeats for worker pods that never run (simulated nodes): the benchmark renews their Leases itself.

Each Lease follows the heartbeat contract (docs/ARCHITECTURE.md): named after the pod, owned by it,
`holderIdentity` and `renewTime`, the `phalanx.dev/*` annotations, phase `training` with a step that
moves, so the operator sees what it sees from real launchers, at the same rate.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Self

from phalanx import contract

ANNOTATION_PREFIX = "phalanx.dev/"
REQUEST_TIMEOUT = 10


def micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    pod: str, uid: str, namespace: str, step: int, rank: int, world_size: int, duration: int, now: datetime
) -> dict[str, Any]:
    """The Lease a training launcher would write for `pod` at `step` (pure)."""
    annotations = {
        "step": str(step),
        # When the step was reached, as a real launcher says it: without it the operator keeps each worker's
        # last step change itself, in the job's status (`status.tracking`), rewritten at every reconcile.
        "step-at": micro_time(now),
        "loss": "2.5",
        "step-seconds": "0.5",
        "samples-per-second": "64",
        "grad-norm": "1.0",
        "checkpoint-step": str(step - step % 100),
        "rank": str(rank),
        "world-size": str(world_size),
        "phase": "training",
    }
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": pod,
            "namespace": namespace,
            "annotations": {ANNOTATION_PREFIX + key: value for key, value in annotations.items()},
            "labels": dict(contract.LEASE_LABELS),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid, "blockOwnerDeletion": False}
            ],
        },
        "spec": {"holderIdentity": pod, "leaseDurationSeconds": duration, "renewTime": micro_time(now)},
    }


def raw_call(
    api: Any, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, bytes]:
    """One API call without the client's models: (status, body bytes)."""
    method, url, headers, payload, post = api.param_serialize(
        method,
        path,
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, payload, post, _request_timeout=REQUEST_TIMEOUT)
    return response.status, response.read()


def write_lease(api: Any, namespace: str, name: str, body: dict[str, Any], known: bool) -> None:
    """Create the pod's Lease (`known`: renew it); a Lease left by an earlier pod of that name is taken over."""
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    status = 0
    if not known:
        status, _ = raw_call(api, "POST", leases, body)
    if known or status == 409:
        status, _ = raw_call(api, "PATCH", f"{leases}/{name}", body, "application/merge-patch+json")
    if status >= 300:
        raise RuntimeError(f"lease {name}: {status}")


class PacedRounds:
    """A round every `interval` seconds on a thread of its own, its calls on a pool of `threads`: a round that
    fails is counted and the next one tries again, one that overruns the interval is counted as late."""

    def __init__(self, new_api: Any, interval: float, threads: int, name: str) -> None:
        self.interval = interval
        self._api = new_api()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}s", daemon=True)
        self._lock = threading.Lock()
        self.failures = 0
        self.late_rounds = 0
        """Rounds that took longer than the interval (this process could not keep up)."""

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)
        self._api.close()

    def _round(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._round()
            except Exception:
                with self._lock:
                    self.failures += 1
            spent = time.monotonic() - started
            if spent > self.interval:
                self.late_rounds += 1
            self._stop.wait(max(0.0, self.interval - spent))


class HeartbeatSimulator(PacedRounds):
    """Renews one Lease per running worker pod of a namespace every `interval` seconds, in a thread.

    Raw REST calls (no model objects): at 200 Leases every 5 s the client's model (de)serialization
    alone would keep a core busy on a small machine.
    """

    def __init__(
        self,
        new_api: Any,
        namespace: str,
        interval: float,
        duration: int,
        world_size: int,
        steps_per_beat: int = 10,
        threads: int = 4,
    ) -> None:
        super().__init__(new_api, interval, threads, "heartbeat")
        self.namespace = namespace
        self.duration = duration
        self.world_size = world_size
        self.steps_per_beat = steps_per_beat
        self._beats: dict[str, int] = {}
        self._created: set[str] = set()
        self._last: dict[str, float] = {}
        self.writes = 0
        self._listed: dict[str, float] = {}
        """When each pod was first listed Running: its first renewal's gap counts from then."""
        self.max_gap = 0.0
        """Longest time a Running pod's Lease went unrenewed: between two renewals, or from the pod's first
        listing as Running to its first renewal (above the heartbeat timeout, the operator rightly declares the
        pod dead: this process, not the operator, fell behind)."""

    def _call(self, method: str, path: str) -> tuple[int, bytes]:
        return raw_call(self._api, method, path)

    def _workers(self) -> list[dict[str, Any]]:
        status, data = self._call(
            "GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=phalanx.dev%2Frole%3Dworker"
        )
        if status != 200:
            raise RuntimeError(f"listing worker pods: {status}")
        return [
            pod
            for pod in json.loads(data).get("items") or []
            if (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        ]

    def _beat(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid, name = meta["uid"], meta["name"]
        with self._lock:
            beats = self._beats.get(uid, 0) + 1
            self._beats[uid] = beats
            known = uid in self._created
        index = int((meta.get("labels") or {}).get("phalanx.dev/index", "0"))
        body = lease_body(
            name,
            uid,
            self.namespace,
            beats * self.steps_per_beat,
            index % self.world_size,
            self.world_size,
            self.duration,
            datetime.now(UTC),
        )
        try:
            write_lease(self._api, self.namespace, name, body, known)
        except Exception:  # an error or a timed-out call: the next round tries again
            with self._lock:
                self.failures += 1
            return
        now = time.monotonic()
        with self._lock:
            self._created.add(uid)
            self.writes += 1
            since = self._last.get(uid, self._listed.get(uid))
            if since is not None:
                self.max_gap = max(self.max_gap, now - since)
            self._last[uid] = now

    def _round(self) -> None:
        workers = self._workers()
        listed = time.monotonic()
        with self._lock:
            for pod in workers:
                self._listed.setdefault(pod["metadata"]["uid"], listed)
        list(self._pool.map(self._beat, workers))
