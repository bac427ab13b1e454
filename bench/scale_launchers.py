"""The heartbeats of a big job's launchers, emulated in one process for pods that only pretend to run.

Each pod of the job gets what its launcher would send, through the launcher's own code: the Lease body of
`worker.heartbeat.lease_body` (phase `training` for a worker, `standby` for a spare, a step that moves), renewed
as the pod's own Lease with `heartbeat.reporting: leases`, and with the hub put into the job's store by the
launcher's `worker.beathub.BeatSender`, the pod's own Lease written first and whenever the hub does not take the
beat (`worker.launch.PodReporter`). The job's pods are listed again every interval, so a replacement or a
promoted spare beats as its launcher would.

Their rendezvous is emulated as the launchers' own keeps the group: its members stay in it while they beat, and
a place left by a member that fell silent or went away is taken by a waiting pod (a hot spare first), which then
says `training`; a pod outside the group says `standby`. The operator's labels follow those heartbeats, as they
follow torch's promotions.

`silence(pod)` stops one pod's beats, as a frozen launcher's stop: the operator must find it. `report(pod, ...)`
gives one pod's launcher news for the operator, sent at once as the launcher's next look (every 0.1 s) sends it:
a verdict on a training process (`stopped`, or `hung` past its hang threshold) or a group restart (a training
process died); with the hub, such news also goes to the pod's own Lease (`worker.beathub.writes_own_lease`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Self

from phalanx import beatsummary, contract
from phalanx.bench.heartbeats import PacedRounds, raw_call, write_lease
from phalanx.worker import beathub, heartbeat

STEPS_PER_BEAT = 10
BEAT_SPREAD = 0.8
"""Each launcher beats at a phase of its own within the first `BEAT_SPREAD` of every interval, as real launchers,
each started on its own, do; the rest of the interval is the round's slack. Rounds that sent every pod's beat at
once had all peers renew within a moment of each other, so a wait for every peer's next beat (a hang verdict's)
lasted until the next round, half an interval on average; with real launchers' phases some peer has always just
beaten, and the wait is nearly a whole interval."""
HANG_THRESHOLD = 5.0
"""The hang threshold the emulated launchers report (a real one's is adaptive: worker/trainerwatch.py)."""
CONNECTING_THREADS = 64
"""Launchers connecting to the store at once (each real launcher connects on its own)."""


@dataclass(frozen=True)
class News:
    """What one pod's launcher has to tell beyond its beat: a verdict on a training process, group restarts."""

    fault: str | None = None
    group_restarts: int = 0
    frozen_step: int | None = None
    """The step a stopped or hung training process stays at."""
    frozen_since: float | None = None
    """Unix time it stopped advancing: the fault's start (`fault-since`) and the step's `step-at`."""


@dataclass(frozen=True)
class EmulatedPod:
    name: str
    uid: str
    index: int
    role: str


def pods_of(listing: dict[str, Any]) -> list[EmulatedPod]:
    """The Running trainer pods of a pod listing (pure)."""
    found = []
    for pod in listing.get("items") or []:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        role = labels.get(contract.LABEL_ROLE, "")
        if role not in (contract.ROLE_WORKER, contract.ROLE_SPARE):
            continue
        found.append(EmulatedPod(meta["name"], meta["uid"], int(labels.get(contract.LABEL_INDEX, "0")), role))
    return found


def regroup(group: list[str], pods: list[EmulatedPod], replicas: int, silent: set[str]) -> list[str]:
    """The group's members (pod uids) after a round: the members still there and beating keep their places, and
    the places left are taken by waiting pods, spares first, then by index (pure)."""
    present = {pod.uid for pod in pods if pod.uid not in silent}
    kept = [uid for uid in group if uid in present][:replicas]
    if not group:  # the first formation: the pods labelled workers
        waiting = sorted(pods, key=lambda pod: (pod.role != contract.ROLE_WORKER, pod.index))
    else:
        waiting = sorted(pods, key=lambda pod: (pod.role != contract.ROLE_SPARE, pod.index))
    for pod in waiting:
        if len(kept) >= replicas:
            break
        if pod.uid in present and pod.uid not in kept:
            kept.append(pod.uid)
    return kept


def beat_phase(pod: EmulatedPod, interval: float) -> float:
    """Seconds into each round at which `pod`'s launcher beats: fixed per pod, spread evenly over the pods by a
    hash of its uid (pure)."""
    return (zlib.crc32(pod.uid.encode()) / 2**32) * BEAT_SPREAD * interval


def beat_body(
    pod: EmulatedPod,
    namespace: str,
    step: int,
    group_started: float,
    timeout: float,
    training: bool,
    news: News | None = None,
) -> dict[str, Any]:
    """The Lease the pod's launcher would write now (pure but for the clock): `training` in the group, else
    `standby`; with its `news`."""
    news = news or News()
    frozen = news.frozen_step is not None
    step = news.frozen_step if news.frozen_step is not None else step
    status = heartbeat.PodStatus(
        phase="training" if training else "standby",
        step=step if training else None,
        step_at=(news.frozen_since if frozen else time.time()) if training else None,
        rank=pod.index if training else None,
        step_seconds=0.5 if training else None,
        loss=2.5 if training else None,
        group_started=group_started if training else None,
        group_restarts=news.group_restarts or None,
        restart_cause="a training process exited" if news.group_restarts else None,
        fault=news.fault,
        fault_rank=pod.index if news.fault else None,
        fault_since=news.frozen_since if news.fault else None,
        fault_message=f"{pod.name}: the launcher reports a training process {news.fault}"
        if news.fault
        else None,
        hang_threshold=HANG_THRESHOLD if training else None,
    )
    return heartbeat.lease_body(
        pod_name=pod.name,
        namespace=namespace,
        pod_uid=pod.uid,
        status=status,
        now=datetime.now(UTC),
        lease_duration_seconds=max(1, int(timeout)),
    )


class EmulatedLaunchers(PacedRounds):
    """Beats for every Running trainer pod of one job, every `interval`, each at its own phase (`beat_phase`),
    in a thread.

    `connect`: a store connection through the job's gate (None: no hub; every beat renews the pod's Lease)."""

    def __init__(
        self,
        new_api: Callable[[], Any],
        namespace: str,
        job: str,
        interval: float,
        timeout: float,
        connect: Callable[[], Any] | None = None,
        threads: int = 16,
        replicas: int = 0,
    ) -> None:
        from phalanx.worker.beathub import BeatSender

        super().__init__(new_api, interval, threads, "launcher")
        self.namespace, self.job = namespace, job
        self.timeout = timeout
        self._connect = connect
        self._sender = BeatSender
        self._senders: dict[str, Any] = {}
        self._connections = ThreadPoolExecutor(max_workers=CONNECTING_THREADS, thread_name_prefix="connect")
        self._connecting: set[str] = set()
        self._leases_written: set[str] = set()
        self._silenced: set[str] = set()
        """Uids of the pods whose launchers fell silent."""
        self._silenced_names: set[str] = set()
        self._reported_names: set[str] = set()
        self._news: dict[str, News] = {}
        """Per pod uid, the news its launcher tells (`report`)."""
        self._paths: dict[str, str] = {}
        self._failed: dict[str, int] = {}
        self.started = time.monotonic()
        self.replicas = replicas
        self._group: list[str] = []
        self._group_started = time.time()
        self._step = 0
        self.last_beat: dict[str, float] = {}
        """Monotonic time of each pod's last beat that went out (to the hub or its Lease)."""
        self.lease_writes = 0
        """Writes of the pods' own Leases (with the hub: the first, and those while the hub was out)."""
        self.hub_beats = 0
        """Beats the hub took."""
        self._listed: list[EmulatedPod] | None = None
        """The job's pods as last listed (`_list_pods`): what the launchers know of the group they are in."""
        self._lister = threading.Thread(target=self._list_pods, name="launcher-pods", daemon=True)

    def start(self) -> Self:
        # The first listing before the first round: every pod Running now beats at once.
        with contextlib.suppress(Exception):
            self._listed = self._pods()
        self._lister.start()
        return super().start()

    def stop(self) -> None:
        super().stop()
        self._lister.join(timeout=30)
        self._connections.shutdown(wait=True, cancel_futures=True)

    def _list_pods(self) -> None:
        """The job's pods, listed every interval on a thread of its own. A round beats from the latest listing:
        real launchers list no pods, and a listing of 520 pods that the API server is slow to answer (while a
        hundred other jobs start) must not hold every launcher's beat back past the heartbeat timeout."""
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # an error or a timed-out call: the next listing tries again
                listed = self._pods()
                with self._lock:
                    self._listed = listed

    def was_silenced(self, pod: str) -> bool:
        with self._lock:
            return pod in self._silenced_names

    def was_reported(self, pod: str) -> bool:
        with self._lock:
            return pod in self._reported_names

    def describe(self, pod: str, at: float) -> str:
        """What the emulation knows of `pod`'s beats at monotonic time `at` (for a false alarm's note)."""
        with self._lock:
            last = self.last_beat.get(pod)
            path = self._paths.get(pod, "none")
            failed = self._failed.get(pod, 0)
        age = f"{at - last:.1f} s" if last is not None else "never"
        return f"last beat {age} before, last path {path}, {failed} failed beats"

    def silence(self, pod: str, uid: str) -> float:
        """Stop the beats of pod `pod` (uid `uid`; a later pod of that name beats); returns the monotonic time of
        its last beat."""
        with self._lock:
            self._silenced.add(uid)
            self._silenced_names.add(pod)
            return self.last_beat.get(pod, time.monotonic())

    def _pods(self) -> list[EmulatedPod]:
        selector = f"{contract.LABEL_JOB_NAME}%3D{self.job}"
        status, data = raw_call(
            self._api, "GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}"
        )
        if status != 200:
            raise RuntimeError(f"listing the job's pods: {status}")
        return pods_of(json.loads(data))

    def _renew_lease(self, pod: EmulatedPod, body: dict[str, Any]) -> None:
        write_lease(self._api, self.namespace, pod.name, body, pod.uid in self._leases_written)
        with self._lock:
            self._leases_written.add(pod.uid)
            self.lease_writes += 1

    def freeze(self, pod: str, uid: str) -> None:
        """Pod `pod` (uid `uid`)'s training stops advancing (a stop or a hang begins): its step stays, it goes on
        beating, and no verdict is told yet."""
        with self._lock:
            before = self._news.get(uid, News())
            if before.frozen_step is None:
                self._news[uid] = replace(before, frozen_step=self._step, frozen_since=time.time())

    def report(self, pod: str, uid: str, fault: str | None = None, restarted: bool = False) -> float:
        """Pod `pod` (uid `uid`)'s launcher has news: a verdict on a training process (`fault`, from when its
        training stopped advancing: `freeze`, else now) or a restart of its group (`restarted`: a training
        process died). Sent at once, and carried by its later beats as a launcher keeps saying it; returns the
        monotonic time it went out."""
        # The pod as the launchers last listed it (a real launcher lists nothing: the time of a fresh listing of
        # every pod of the job is this emulation's, not the report's); listed afresh only when it is not there.
        with self._lock:
            listed = self._listed or []
        target = next((each for each in listed if each.uid == uid), None)
        if target is None:
            target = next((each for each in self._pods() if each.uid == uid), None)
        if target is None:
            raise RuntimeError(f"{pod} is not a Running trainer pod of the job")
        if fault:
            self.freeze(pod, uid)
        with self._lock:
            self._reported_names.add(pod)
            before = self._news.get(uid, News())
            self._news[uid] = replace(
                before,
                fault=fault or before.fault,
                group_restarts=before.group_restarts + (1 if restarted else 0),
            )
            group, group_started, step = set(self._group), self._group_started, self._step
        # From here on every beat of the pod carries the news, a round's as well as this one.
        sent = time.monotonic()
        self._beat(target, step, group_started, uid in group, urgent=True)
        return sent

    def _beat(
        self, pod: EmulatedPod, step: int, group_started: float, training: bool, urgent: bool = False
    ) -> None:
        with self._lock:
            if pod.uid in self._silenced:
                return
            news = self._news.get(pod.uid)
        body = beat_body(pod, self.namespace, step, group_started, self.timeout, training, news)
        try:
            took = False
            first = pod.uid not in self._leases_written
            if first:  # before the hub is asked, as the launcher does
                self._renew_lease(pod, body)
            if self._connect is not None:
                sender = self._senders.get(pod.uid)
                if sender is None or not sender.connected:
                    # Each launcher connects on its own: a slow handshake holds up no other pod's beat.
                    self._open(pod, body, sender)
                else:
                    took = sender.send(beatsummary.lease_summary(body))
                if took:
                    with self._lock:
                        self.hub_beats += 1
            if not first and beathub.writes_own_lease(took, True, False, urgent):
                self._renew_lease(pod, body)
        except Exception:  # an error or a timed-out call: the next round tries again
            with self._lock:
                self.failures += 1
                self._failed[pod.name] = self._failed.get(pod.name, 0) + 1
            return
        with self._lock:
            self.last_beat[pod.name] = time.monotonic()
            self._paths[pod.name] = "hub" if took else "lease"

    def _open(self, pod: EmulatedPod, body: dict[str, Any], sender: Any = None) -> None:
        """The pod's sender (`sender`, or a new one), connecting (and registering) with a beat on a thread of its
        own."""
        opener = self._connect
        if opener is None:
            return
        with self._lock:
            if pod.uid in self._connecting:
                return
            self._connecting.add(pod.uid)

        def connect() -> None:
            try:
                opened = sender if sender is not None else self._sender(opener, pod.name, self.timeout)
                opened.send(beatsummary.lease_summary(body))
                self._senders[pod.uid] = opened
            finally:
                with self._lock:
                    self._connecting.discard(pod.uid)

        self._connections.submit(connect)

    def _round(self) -> None:
        with self._lock:
            pods, silent = self._listed, set(self._silenced)
        if pods is None:
            return  # not listed yet
        group = regroup(self._group, pods, self.replicas, silent)
        if set(group) != set(self._group):
            # A new group: the launchers' rendezvous re-formed it with the replacement in.
            self._group_started = time.time()
        self._group = group
        self._step += STEPS_PER_BEAT
        members, started = set(group), time.monotonic()
        sent = []
        phased = sorted(((beat_phase(pod, self.interval), pod) for pod in pods), key=lambda each: each[0])
        for phase, pod in phased:
            if self._stop.wait(max(0.0, started + phase - time.monotonic())):
                break
            sent.append(
                self._pool.submit(self._beat, pod, self._step, self._group_started, pod.uid in members)
            )
        for beat in sent:
            beat.result()
