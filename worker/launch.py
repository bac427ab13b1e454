"""The pod's long-lived process: runs the user's command under torchrun's elastic agent.

    python -m phalanx.worker.launch [options] -- <user command...>

Settings come from the operator's environment contract (docs/ARCHITECTURE.md); flags override them.
What this adds to torchrun (see worker/README.md):
- a rendezvous against an external store (worker/rdzvclient.py: torch's c10d, or rounds decided in the store),
  fast timeouts, a standby role;
- survives the store going away: training continues, the launcher reconnects, then re-rendezvous;
- `phalanx/restart-epoch` in the store: when the operator bumps it, the worker group restarts at once;
- `phalanx/max-nodes` in the store: the number of active nodes follows the TrainingJob (worker/scaling.py);
- regroup requests in the TrainingJob's status restart a group that includes a failed worker at once
  (worker/regroup.py); the TrainingJob is watched (worker/jobwatch.py);
- restarts kill training processes outright (state lives in in-memory snapshots), SIGTERM lets them save;
- exit codes that tell user errors from infrastructure failures (worker/exitcodes.py);
- heartbeat Lease and Prometheus metrics from the training processes' status records.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from phalanx import beatsummary
from phalanx.worker import (
    attemptstore,
    autointerval,
    beathub,
    drillhook,
    gloonet,
    heartbeat,
    jobwatch,
    livegroup,
    oomwatch,
    preflight,
    regroup,
    rendezvous,
    rollback,
    safepickle,
    scaling,
    storegate,
    termination,
    trainerwatch,
    warmstart,
)
from phalanx.worker import fatal as trainer_fatal
from phalanx.worker.checkpoint import durable, lastsave, tiers
from phalanx.worker.checkpoint.rollback import ROLLBACK_ENV
from phalanx.worker.env import LaunchSettings, SettingsError, parse_nnodes, settings_from
from phalanx.worker.exitcodes import FATAL_TRAINER_EXITS, LauncherExit, TrainerExit
from phalanx.worker.forkserver import ForkServer
from phalanx.worker.metrics import PodMetrics
from phalanx.worker.torch_support import UnsupportedTorchError

try:
    from phalanx.worker import torch_elastic
    from phalanx.worker.c10dclient import RendezvousClient
    from phalanx.worker.rdzvclient import STORE_ERRORS, StoreConnections, StoreUnreachableError
    from phalanx.worker.roundsclient import RoundsClient
    from phalanx.worker.torch_elastic import (
        DefaultLogsSpecs,
        LocalElasticAgent,
        RendezvousClosedError,
        RendezvousGracefulExitError,
        RendezvousTimeoutError,
        RunResult,
        SignalException,
        WorkerSpec,
        WorkerState,
    )
except UnsupportedTorchError as unsupported:
    if __name__ != "__main__":
        raise
    # The launcher's own process: one line and the bad-setup exit code, not the traceback of an import.
    print(f"[phalanx-launch] {unsupported}", file=sys.stderr)
    sys.exit(int(LauncherExit.BAD_CONFIG))

logger = logging.getLogger("phalanx.launch")


class LauncherStop(Exception):
    """The launcher decided to stop the group for good; carries the exit code."""

    def __init__(self, code: LauncherExit, message: str) -> None:
        super().__init__(message)
        self.code = code


def rendezvous_client(settings: LaunchSettings) -> StoreConnections:
    """The client of the job's rendezvous for the protocol the settings name (worker/rdzvclient.py)."""
    if settings.rdzv_protocol == "rounds":
        return RoundsClient(settings)
    return RendezvousClient(settings)


class PhalanxAgent(LocalElasticAgent):
    """torchrun's local agent with Phalanx's restart policy, store resilience and restart epoch."""

    def __init__(
        self,
        spec: WorkerSpec,
        settings: LaunchSettings,
        client: StoreConnections,
        reporter: PodReporter,
        log_dir: str,
    ) -> None:
        super().__init__(
            spec=spec,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
            start_method="spawn",
            exit_barrier_timeout=max(settings.join_timeout, 60.0),
            shutdown_timeout=math.ceil(settings.shutdown_grace),
        )
        self._settings = settings
        self._client = client
        self._reporter = reporter
        self._epoch_seen = 0
        self._max_nodes_seen = settings.max_nodes
        self._attempt = 0
        self._restart_cause = "start"
        self._failures_without_progress = 0
        self._step_at_start: int | None = None
        self._store_lost_at: float | None = None
        self._last_reconnect_try = 0.0
        self.stop_reason: LauncherStop | None = None
        self._oom = oomwatch.OomWatch()
        self._kept_trainers = False
        """The running training processes left their group live and wait for the next one (livegroup.py)."""
        self._members: frozenset[Any] | None = None
        """The members of the round the running group formed from, as the client tells them (None: not known)."""
        self._attempt_store = (
            attemptstore.AttemptStore(client.secret, client.node_addr)
            if client.secret is not None and client.gates_training_store
            else None
        )
        """The training processes' store behind the job's gate (None: torch's own, hosted by training rank 0)."""
        if client.secret is not None and not client.gates_training_store:
            logger.warning(
                "this torch has no libuv (USE_LIBUV=0): the training processes' store is training rank 0's, "
                "not behind the job's gate; the job's NetworkPolicy is its only boundary"
            )

    # -- worker lifecycle -------------------------------------------------------------------------

    def group_started(self) -> float | None:
        """Unix time when the running worker group started; None while none runs."""
        return self._reporter.group_started

    def group_members(self) -> frozenset[Any] | None:
        """The members of the running group (None while none runs or when not known)."""
        return self._members if self._reporter.group_started is not None else None

    def training_pids(self) -> list[int]:
        """Pids of the training processes of the group that runs now (empty while none runs)."""
        context = self._pcontext
        return list(context.pids().values()) if context is not None else []

    def _stop_workers(self, worker_group: Any) -> None:
        # State lives in in-memory snapshots that survive the processes, so a restart kills at once:
        # waiting for ranks stuck in a collective is what makes recoveries slow.
        self._reporter.group_started = None
        self._kept_trainers = False
        if self._pcontext is not None:
            self._pcontext.close(signal.SIGKILL, timeout=10)

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        self._attempt += 1
        os.environ[heartbeat.GROUP_ATTEMPT_ENV] = str(self._attempt)
        os.environ["PHALANX_RESTART_CAUSE"] = self._restart_cause
        self._step_at_start = self._reporter.current().step
        trainer_fatal.clear(self._reporter.status_dir)
        self._oom.group_started()
        # From here on the group counts as started: a regroup request must know whether it predates it.
        self._reporter.attempt = self._attempt
        self._reporter.group_started = time.time()
        kept = self._kept_trainers and self._pcontext is not None and self._trainers_alive()
        if kept:
            pids = self._hand_over_group(worker_group)
        else:
            if self._kept_trainers:
                self._stop_workers(worker_group)  # one died while it waited: the group starts anew
            livegroup.clear(self._reporter.status_dir)
            pids = super()._start_workers(worker_group)
        self._kept_trainers = False
        self._reporter.launcher_phase = None
        logger.info(
            "group attempt %d (%s): rank %d of %d nodes, world size %d%s",
            self._attempt,
            self._restart_cause,
            worker_group.group_rank,
            worker_group.group_world_size,
            worker_group.workers[0].world_size if worker_group.workers else 0,
            ", training processes kept" if kept else "",
        )
        return pids

    # -- live regroup (worker/livegroup.py) -------------------------------------------------------

    def _local_ranks(self) -> range:
        return range(self._settings.nproc_per_node)

    def _trainers_alive(self) -> bool:
        pids = self.training_pids()
        states = [trainerwatch.process_state(pid) for pid in pids]
        return len(pids) == len(self._local_ranks()) and all(
            state is not None and state not in {"Z", "X"} for state in states
        )

    def _live_departure(self) -> str | None:
        """Why the group must re-form because a training process left it on its own (a peer went away)."""
        if not self._settings.live_regroup:
            return None
        directory = self._reporter.status_dir
        for local_rank in self._local_ranks():
            if livegroup.left_attempt(directory, local_rank) == self._attempt:
                reason = livegroup.left_reason(directory, local_rank)
                return f"local rank {local_rank} left group {self._attempt}: {reason}"
        return None

    def _release_live(self) -> bool:
        """Have the running training processes leave their group without ending; True when every one did
        within the leave timeout (they are kept for the next group), False to kill them instead."""
        directory = self._reporter.status_dir
        ranks = self._local_ranks()
        if (
            not self._settings.live_regroup
            or self._pcontext is None
            or any(livegroup.joined_attempt(directory, rank) != self._attempt for rank in ranks)
            or not self._trainers_alive()
        ):
            return False

        def all_left() -> bool:
            return all(livegroup.left_attempt(directory, rank) == self._attempt for rank in ranks)

        if all_left():
            return True
        stuck = self._stuck_in_a_step()
        if stuck is not None:
            # Blocked in a collective with a peer that froze: it cannot reach a step boundary, and gloo's
            # wait cannot be interrupted from inside the process. Waiting would only add to the recovery.
            logger.info("training processes restarted, not kept: %s", stuck)
            return False
        livegroup.request_leave(directory, self._attempt)
        deadline = time.monotonic() + self._settings.live_leave_timeout
        while not all_left():
            if time.monotonic() >= deadline or not self._trainers_alive():
                logger.warning(
                    "training processes did not leave group %d within %gs: restarting them",
                    self._attempt,
                    self._settings.live_leave_timeout,
                )
                return False
            time.sleep(0.01)
        return True

    def _stuck_in_a_step(self) -> str | None:
        """Which training process of this group has been in one step far longer than its steps take (None:
        none): one waiting on a peer that stopped answering."""
        now = time.time()
        for record in heartbeat.read_records(self._reporter.status_dir):
            if record.attempt != self._attempt or record.step_at is None or record.step_seconds is None:
                continue
            limit = max(STUCK_STEP_FACTOR * record.step_seconds, STUCK_STEP_FLOOR)
            if record.phase == "training" and now - record.step_at > limit:
                return f"rank {record.rank} has been in step {(record.step or 0) + 1} for {now - record.step_at:.1f}s"
        return None

    def _hand_over_group(self, worker_group: Any) -> dict[int, Any]:
        """Give the kept training processes the group that just formed (instead of starting new ones)."""
        spec = worker_group.spec
        restart_count = spec.max_restarts - self._remaining_restarts
        shared = {
            name: os.environ[name]
            for name in (heartbeat.GROUP_ATTEMPT_ENV, "PHALANX_RESTART_CAUSE", ROLLBACK_ENV)
            if name in os.environ
        }
        for worker in worker_group.workers:
            env = {
                **shared,
                "RANK": str(worker.global_rank),
                "LOCAL_RANK": str(worker.local_rank),
                "GROUP_RANK": str(worker_group.group_rank),
                "ROLE_RANK": str(worker.role_rank),
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "WORLD_SIZE": str(worker.world_size),
                "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
                "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": str(worker_group.master_addr),
                "MASTER_PORT": str(worker_group.master_port),
                "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            }
            livegroup.assign(self._reporter.status_dir, worker.local_rank, self._attempt, env)
        assert self._pcontext is not None
        return dict(self._pcontext.pids())

    def _rendezvous(self, worker_group: Any) -> None:
        self._reporter.launcher_phase = "rendezvous"
        started = time.monotonic()
        self._read_max_nodes()
        self._members = None
        self._client.offer_held_state()
        super()._rendezvous(worker_group)
        if self._attempt_store is not None:
            worker_group.master_addr, worker_group.master_port = self._attempt_store.open(
                worker_group.store, worker_group.group_rank
            )
        self._members = self._client.round_members()
        self._reporter.metrics.rendezvous_seconds.set(time.monotonic() - started)
        with contextlib.suppress(*STORE_ERRORS):
            self._epoch_seen = self._client.restart_epoch()

    def _read_max_nodes(self) -> None:
        """The round's max_nodes comes from the store, read before joining (all launchers agree)."""
        before = self._max_nodes_seen
        self._max_nodes_seen = self._client.max_nodes.refresh()
        if self._max_nodes_seen != before:
            logger.info("joining with max %d active nodes (was %d)", self._max_nodes_seen, before)

    def _initialize_resilient(self) -> None:
        """Rendezvous and start workers; rides out a store outage up to the join timeout."""
        deadline: float | None = None
        while True:
            try:
                self._initialize_workers(self._worker_group)
                # The group formed on the store in use now: an outage noticed earlier is over, and reacting
                # to it later would tear down this group for nothing.
                self._store_lost_at = None
                return
            except STORE_ERRORS as error:
                now = time.monotonic()
                deadline = deadline or now + self._settings.join_timeout
                logger.warning(
                    "rendezvous store unreachable, or a member of the new round gone (%s); reconnecting",
                    type(error).__name__,
                )
                self._stop_workers(self._worker_group)
                self._client.reconnect_until(deadline)
                self._restart_cause = "store-reconnected"

    def _restart(self, cause: str, keep_trainers: bool = False) -> None:
        """Re-form the group: the training processes leave it live when `keep_trainers` and they can
        (worker/livegroup.py), else they are killed and started anew."""
        self._restart_cause = cause
        self._reporter.metrics.restarts.labels(cause=cause).inc()
        self._reporter.group_restarts += 1
        self._reporter.restart_cause = cause
        logger.warning("restarting the worker group: %s", cause)
        self._reporter.launcher_phase = "rendezvous"
        if keep_trainers and self._release_live():
            self._reporter.group_started = None
            self._kept_trainers = True
        else:
            self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.STOPPED
        self._initialize_resilient()

    # -- the supervision loop ---------------------------------------------------------------------

    def _invoke_run(self, role: str = "default") -> RunResult:
        spec = self._worker_group.spec
        if self._settings.role == "spare":
            self._reporter.launcher_phase = "standby"
            self._client.wait_for_formed_group()
        self._initialize_resilient()
        self._client.watch_events()
        while True:
            time.sleep(spec.monitor_interval)
            result = self._monitor_workers(self._worker_group)
            self._worker_group.state = result.state
            if result.state == WorkerState.SUCCEEDED:
                return self._group_finished(result)
            if result.state in {WorkerState.UNHEALTHY, WorkerState.FAILED}:
                self._on_failure(result)
                continue
            lingering = self._lingering_after_finish()
            if lingering is not None:
                logger.warning("ending the training processes: %s", lingering)
                self._end_lingering_trainers()
                # A value for every worker: torch's agent records each one's end from them.
                ended = {worker.global_rank: None for worker in self._worker_group.workers}
                return self._group_finished(RunResult(state=WorkerState.SUCCEEDED, return_values=ended))
            cause = self._live_departure() or self._membership_change()
            if cause is not None:
                self._restart(cause, keep_trainers=True)

    def _group_finished(self, result: RunResult) -> RunResult:
        """The group ended well: meet the other nodes at torch's exit barrier, then return `result`."""
        self._reporter.group_started = None
        self._reporter.launcher_phase = "finished"
        self._exit_barrier()
        return result

    def _lingering_after_finish(self, now: float | None = None) -> str | None:
        """Why the group is over though its training processes still run (None: it is not): every one of
        them published `finished` (after its last save) more than `finished_grace` seconds ago."""
        pids = self.training_pids()
        if not pids:
            return None
        records = {record.pid: record for record in heartbeat.read_records(self._reporter.status_dir)}
        finished = [
            record for pid in pids if (record := records.get(pid)) is not None and record.phase == "finished"
        ]
        if len(finished) < len(pids):
            return None
        now = time.time() if now is None else now
        finished_at = max((record.phase_since or now) for record in finished)
        if now - finished_at <= self._settings.finished_grace:
            return None
        where = ", ".join(f"pid {pid} {trainerwatch.where_it_waits(pid)}" for pid in pids)
        return f"every one published 'finished' {now - finished_at:.0f}s ago and still runs ({where})"

    def _end_lingering_trainers(self) -> None:
        # SIGTERM first (a run's own handler is gone once it closed), SIGKILL soon after: all is saved.
        if self._pcontext is not None:
            self._pcontext.close(signal.SIGTERM, timeout=LINGERING_KILL_SECONDS)

    def _on_failure(self, result: RunResult) -> None:
        codes = sorted({failure.exitcode for failure in result.failures.values()})
        if codes == [TrainerExit.PREFLIGHT_RESTART]:
            # The preflight's own restart (worker/preflight.py): what it tests is the failure path, but it
            # is no failure and spends nothing.
            self._restart(heartbeat.PREFLIGHT_RESTART_CAUSE)
            return
        if -signal.SIGKILL in codes and self._oom.killed_since_start():
            self._give_up(result, LauncherStop(LauncherExit.OOM_KILLED, self._oom.describe()))
        fatal = [FATAL_TRAINER_EXITS[code] for code in codes if code in FATAL_TRAINER_EXITS]
        if fatal:
            # What the training processes said before they left comes first: it is what the user must fix.
            reasons = list(dict.fromkeys(trainer_fatal.read(self._reporter.status_dir)))
            said = f"training process exit codes {codes}: not retried"
            self._give_up(
                result, LauncherStop(fatal[0], "; ".join(reasons) + f" ({said})" if reasons else said)
            )
        progressed = self._made_progress()
        self._failures_without_progress = 0 if progressed else self._failures_without_progress + 1
        if self._failures_without_progress >= self._settings.max_failures_without_progress:
            self._give_up(
                result,
                LauncherStop(
                    LauncherExit.USER_CODE_FAILED,
                    f"the training command failed {self._failures_without_progress} times in a row "
                    f"without completing a step (exit codes {codes})",
                ),
            )
        if self._remaining_restarts <= 0:
            self._give_up(
                result,
                LauncherStop(
                    LauncherExit.RESTART_BUDGET_EXHAUSTED,
                    f"restart budget of {self._settings.max_restarts} spent (last exit codes {codes})",
                ),
            )
        self._remaining_restarts -= 1
        self._restart(f"failure exit={codes}")

    def _give_up(self, result: RunResult, stop: LauncherStop) -> None:
        self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.FAILED
        self.stop_reason = stop
        raise stop

    def _made_progress(self) -> bool:
        if self._reporter.silent_script():
            return True  # its progress is unknown: only the restart budget limits its retries
        step = self._reporter.current().step
        return step is not None and (self._step_at_start is None or step > self._step_at_start)

    def _membership_change(self) -> str | None:
        """Why the healthy group must re-form now, or None. Store trouble never stops training."""
        if self._store_lost_at is not None:
            now = time.monotonic()
            if now - self._last_reconnect_try < 1.0:
                return None
            self._last_reconnect_try = now
            if not self._client.try_reconnect():
                return None
            logger.warning(
                "rendezvous store back after %.1fs; re-forming the group", now - self._store_lost_at
            )
            self._store_lost_at = None
            return "store-reconnected"
        if not self._client.events.due():
            return None  # nothing announced, and the idle look is not due yet
        try:
            epoch = self._client.restart_epoch()
            if epoch != self._epoch_seen:
                return f"restart-epoch {self._epoch_seen}->{epoch}"
            waiting = self._client.waiting_with_room()
            if waiting > 0:
                return f"{waiting} node(s) waiting to join"
            if self._client.dropped():
                # Its training processes wait on peers that went on without them: they rejoin (the group is
                # full, so as the standby) instead of being judged hung.
                return "the group re-formed without this node (its rendezvous keep-alive lapsed)"
        except STORE_ERRORS as error:
            logger.warning("rendezvous store lost (%s); training continues", type(error).__name__)
            self._store_lost_at = time.monotonic()
        return None


BETWEEN_GROUPS = ("rendezvous", "standby")
"""The pod's phases while its launcher re-forms or stands by: no group of its runs."""

STUCK_STEP_FACTOR = 3.0
STUCK_STEP_FLOOR = 1.0
"""A training process that has spent more than max(factor x its last step's time, floor) seconds in the current
step is not asked to leave its group live: it waits on a peer (worker/livegroup.py)."""

STALL_GAP_SECONDS = 2.0
"""A pause this long between two of the reporter's looks (it looks every `PodReporter.POLL_SECONDS`) means the
launcher itself stood still."""
STALL_GRACE_SECONDS = 1.0
"""How long after such a stall the launcher holds its verdict on its training processes: its agent looks at
the group every `monitor_interval` (0.2 s) and restarts it if it re-formed without this node."""

LINGERING_KILL_SECONDS = 5
"""Seconds between SIGTERM and SIGKILL for training processes that finished and did not exit."""

HUB_STORE_TIMEOUT = 2.0
"""Seconds one beat into the store may take: a slower store is the hub out of reach, and the own Lease renews."""

SILENT_SCRIPT_SECONDS = 10.0
"""How long a running group's processes may take to write their first status record before the pod counts as
running a script that publishes none (long enough for a cold `import torch` on a busy node)."""


class PodReporter:
    """Reads the training processes' status records; renews the Lease and updates the metrics.

    It looks at the records every `POLL_SECONDS` (and at once when the launcher's phase changes), renews
    the Lease every heartbeat interval, and promptly after the changes the operator times
    (`heartbeat.RenewalSchedule`).
    """

    POLL_SECONDS = 0.1

    def __init__(self, settings: LaunchSettings, status_dir: Path, metrics: PodMetrics) -> None:
        self.settings = settings
        self.status_dir = status_dir
        self.metrics = metrics
        self.standby_probe: Callable[[], bool] = lambda: False
        self.trainer_pids: Callable[[], list[int]] = list
        """Pids of the running group's training processes (set by the agent)."""
        self.attempt: int | None = None
        """The launcher's current group attempt (records of older attempts are stale)."""
        self._group_started: float | None = None
        self.latest_group_started: float | None = None
        """Unix time when the latest worker group started (kept between groups)."""
        self.group_restarts = 0
        """Restarts of the worker group by this launcher."""
        self.restart_cause: str | None = None
        """Why the launcher last restarted its worker group (None: never)."""
        self.exit_code: int | None = None
        """Set once the launcher ends on its own (`finish`)."""
        self.preflight_failure: dict[str, str] | None = None
        """The heartbeat's preflight fields when the launcher itself failed the preflight."""
        self._launcher_phase: heartbeat.Phase | None = "starting"
        self._launcher_since = time.time()
        self._clock = heartbeat.PhaseClock()
        self._schedule = heartbeat.RenewalSchedule(settings.heartbeat_interval)
        self._watch = trainerwatch.TrainerWatch(settings.hang_factor, settings.hang_floor)
        self._verdict: trainerwatch.Verdict | None = None
        self._last_look = time.monotonic()
        self._stalled_until = 0.0
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._lease: Any = None
        self._lease_written = False
        self.hub: beathub.BeatSender | None = None
        """Where beats go first with `heartbeat.reporting: hub` (None: the own Lease only)."""
        self._last_sent: heartbeat.PodStatus | None = None
        self._last_phase: str | None = None
        self._thread = threading.Thread(target=self._loop, name="phalanx-reporter", daemon=True)

    @property
    def group_started(self) -> float | None:
        """Unix time when the current worker group started; None while none runs."""
        return self._group_started

    @group_started.setter
    def group_started(self, started: float | None) -> None:
        self._group_started = started
        if started is not None:
            self.latest_group_started = started

    @property
    def launcher_phase(self) -> heartbeat.Phase | None:
        """The launcher's own phase while it holds no running group (None: the training processes speak)."""
        return self._launcher_phase

    @launcher_phase.setter
    def launcher_phase(self, phase: heartbeat.Phase | None) -> None:
        if phase != self._launcher_phase:
            self._launcher_phase = phase
            self._launcher_since = time.time()
            self._changed.set()

    def current(self, records: list[heartbeat.StatusRecord] | None = None) -> heartbeat.PodStatus:
        phase = self._launcher_phase
        if phase == "rendezvous" and self.standby_probe():
            phase = "standby"
        if phase is None and self.group_left():
            # The records still say training until the agent's loop notices (it may have been stalled).
            phase = "rendezvous"
        if records is None:
            records = heartbeat.read_records(self.status_dir)
        status = heartbeat.combine(records, phase, attempt=self.attempt, launcher_since=self._launcher_since)
        if phase is None and not records and self.silent_script():
            # A script that publishes nothing (no StatusPublisher) still trains once its group runs: the
            # operator must see the pod in the group (a promoted spare is a worker), with its step unknown.
            status = replace(status, phase="training", phase_since=self.group_started)
        status = replace(
            status,
            group_started=self.group_started,
            group_restarts=self.group_restarts,
            restart_cause=self.restart_cause,
            exit_code=self.exit_code,
        )
        if status.phase in BETWEEN_GROUPS:
            status = replace(status, **self._latest_resumption(records))
        failure = self.preflight_failure
        if failure is None:
            return status
        return replace(
            status,
            preflight=failure["preflight"],
            preflight_reason=failure["preflight_reason"],
            preflight_message=failure["preflight_message"],
        )

    def _latest_resumption(self, records: list[heartbeat.StatusRecord]) -> dict[str, Any]:
        """Between groups: the latest group's start and where it resumed from, once it did (else nothing).

        A group that broke soon after its first step (the spare that took a failed worker's place lost as well)
        may have resumed and left within one look at the records: kept until the next group starts, these
        figures still tell the operator that training resumed, and when (docs/ARCHITECTURE.md)."""
        started = self.latest_group_started
        if started is None or self.attempt is None:
            return {}
        resumed = [
            record
            for record in records
            if record.attempt == self.attempt
            and record.resumed_at is not None
            and record.resumed_at >= started
        ]
        if not resumed:
            return {}
        leader = min(resumed, key=lambda record: record.rank if record.rank is not None else 1 << 30)
        return {
            "group_started": started,
            "resumed_at": leader.resumed_at,
            "restored_step": leader.restored_step,
            "restore_source": leader.restore_source,
        }

    def group_left(self) -> bool:
        """Some training process has left the running group live (worker/livegroup.py): it re-forms."""
        return self.attempt is not None and livegroup.any_left(self.status_dir, self.attempt)

    def silent_script(self) -> bool:
        """The group has run `SILENT_SCRIPT_SECONDS` and no training process of this pod ever wrote a status
        record: the script does not publish its progress."""
        started = self.group_started
        return (
            started is not None
            and time.time() - started >= SILENT_SCRIPT_SECONDS
            and not any(self.status_dir.glob("rank-*.json"))
        )

    def start(self) -> None:
        from phalanx.worker.lease import LeaseClient

        settings = self.settings
        if LeaseClient.available(os.environ, settings.pod_name, settings.pod_namespace):
            try:
                self._lease = LeaseClient(settings.pod_name, settings.pod_namespace, settings.pod_uid)
            except Exception as error:
                logger.warning("heartbeats off: cannot configure the Kubernetes client: %s", error)
        if settings.heartbeat_reporting == "hub" and settings.pod_name:
            self.hub = beathub.BeatSender(self._hub_connection, settings.pod_name, settings.heartbeat_timeout)
        if settings.metrics_port:
            self.metrics.serve(settings.metrics_port, settings.local_addr)
        self._thread.start()

    def _hub_connection(self) -> Any:
        """A store connection of the reporter's own, for its beats."""
        settings = self.settings
        secret = storegate.read_secret(settings.store_secret_file) if settings.store_secret_file else None
        return rendezvous.connect(settings.rdzv_host, settings.rdzv_port, HUB_STORE_TIMEOUT, secret)

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._tick(force=True)

    def finish(self, exit_code: int) -> None:
        """The last renewal: the pod ends on its own with `exit_code`. Its Lease goes quiet before the pod's
        status shows the exit, so it says so (`exiting`), and the operator waits for that exit code instead of
        calling the silence a frozen worker."""
        self.exit_code = exit_code
        self.launcher_phase = "finished" if exit_code == 0 else "exiting"
        self.stop()

    def _loop(self) -> None:
        wait = 0.0
        while not self._stop.is_set():
            self._changed.wait(wait)
            self._changed.clear()
            if self._stop.is_set():
                return
            try:
                self._tick(force=False)
            except Exception as error:
                logger.warning("heartbeat failed: %s", error)
            wait = min(self.POLL_SECONDS, self._schedule.wait_hint(time.monotonic()))

    def _recently_stalled(self) -> bool:
        """Whether the launcher itself stood still (stopped, starved of CPU) until a moment ago. What it sees
        of its training processes then spans its own stall, and its agent has yet to look at the group
        (re-formed without this node meanwhile, say): a verdict waits `STALL_GRACE_SECONDS`."""
        now = time.monotonic()
        gap, self._last_look = now - self._last_look, now
        if gap > STALL_GAP_SECONDS:
            self._stalled_until = now + STALL_GRACE_SECONDS
        return now < self._stalled_until

    def _judge(
        self, status: heartbeat.PodStatus, records: list[heartbeat.StatusRecord]
    ) -> heartbeat.PodStatus:
        """The status with the launcher's verdict on its training processes (trainerwatch.py)."""
        stalled = self._recently_stalled()
        if self._launcher_phase is not None or self.attempt is None or self.group_left():
            # A process between groups waits for its next one: it is not in a step, hung or not.
            self._watch.reset()
            self._verdict = None
        else:
            current = {
                record.rank if record.rank is not None else -record.pid: record
                for record in records
                if record.attempt == self.attempt
            }
            pids: list[int] = []
            # The agent may be tearing its group down right now: no pids is "nothing to judge", not an error.
            with contextlib.suppress(Exception):
                pids = self.trainer_pids()
            states = {pid: trainerwatch.process_state(pid) for pid in pids}
            ranks = {record.pid: record.rank for record in current.values()}
            verdict = self._watch.observe(current, states, ranks, status.checkpoint_save_seconds, time.time())
            if stalled:
                verdict = None
            if verdict is not None and (self._verdict is None or verdict.kind != self._verdict.kind):
                logger.warning("training process fault: %s", verdict.message)
            self._verdict = verdict
        verdict, threshold = self._verdict, self._watch.threshold
        return replace(
            status,
            fault=verdict.kind if verdict else None,
            fault_rank=verdict.rank if verdict else None,
            fault_since=verdict.since if verdict else None,
            fault_message=verdict.message if verdict else None,
            hang_threshold=round(threshold.seconds, 3) if threshold else None,
            hang_basis=threshold.basis if threshold else None,
        )

    def _tick(self, force: bool) -> None:
        records = heartbeat.read_records(self.status_dir)
        status = self._judge(self.current(records), records)
        since = self._clock.observe(status.phase, status.phase_since, time.time())
        status = replace(status, phase_since=since)
        if status.phase != self._last_phase:
            if status.phase == "standby" or self._last_phase == "standby":
                logger.info("phase %s -> %s", self._last_phase, status.phase)
            self._last_phase = status.phase
        self.metrics.update(status)
        now = time.monotonic()
        if not (self._schedule.due(now, status.phase, status.resumed_at, status.fault) or force):
            return
        self._schedule.renewed(now)
        if self._lease is None and self.hub is None:
            return
        body = heartbeat.lease_body(
            pod_name=self.settings.pod_name,
            namespace=self.settings.pod_namespace,
            pod_uid=self._lease.pod_uid() if self._lease is not None else self.settings.pod_uid or None,
            status=status,
            now=datetime.now(UTC),
            lease_duration_seconds=math.ceil(self.settings.heartbeat_timeout),
        )
        urgent = beathub.news_for_the_operator(self._last_sent, status)
        self._last_sent = status
        first = self._lease is not None and not self._lease_written
        if first:
            # Before the hub is asked: its first contact (a connection through the gate) may take a while.
            self._lease.renew(body)
            self._lease_written = True
        hub_took_it = self.hub is not None and self.hub.send(beatsummary.lease_summary(body))
        if (
            self._lease is not None
            and not first
            and beathub.writes_own_lease(hub_took_it, True, force, urgent)
        ):
            self._lease.renew(body)


# -- command line ---------------------------------------------------------------------------------


FLAG_FIELDS = (
    "rdzv_endpoint",
    "rdzv_protocol",
    "max_nodes_file",
    "job_file",
    "run_id",
    "nproc_per_node",
    "role",
    "max_restarts",
    "max_failures_without_progress",
    "join_timeout",
    "last_call_timeout",
    "keepalive_interval",
    "keepalive_timeout",
    "store_timeout",
    "monitor_interval",
    "shutdown_grace",
    "local_addr",
    "metrics_port",
    "heartbeat_interval",
    "collective_timeout",
    "warm_start",
    "live_regroup",
)


def settings_from_args(args: argparse.Namespace, env: dict[str, str]) -> LaunchSettings:
    overrides: dict[str, Any] = {name: getattr(args, name) for name in FLAG_FIELDS}
    if args.nnodes:
        overrides["min_nodes"], overrides["max_nodes"] = parse_nnodes(args.nnodes)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    overrides["command"] = tuple(command) or None
    settings = settings_from(env, overrides)
    if shutil.which(settings.command[0]) is None:
        raise SettingsError(f"command not found: {settings.command[0]!r}")
    return settings


def _configure_logging(verbose: bool, settings: LaunchSettings | None = None) -> None:
    name = (settings.pod_name if settings else "") or f"pid{os.getpid()}"
    logging.basicConfig(
        level=logging.INFO,
        format=f"[phalanx-launch {name}] %(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if not verbose:
        logging.getLogger(torch_elastic.LOGGER_NAME).setLevel(logging.ERROR)
        logging.getLogger("torch.distributed").setLevel(logging.ERROR)


def _raise_signal(signum: int, _frame: Any) -> None:
    raise SignalException(f"launcher got signal {signum}", sigval=signal.Signals(signum))


def _prepare_worker_environment(settings: LaunchSettings, status_dir: Path) -> None:
    """Variables every training process inherits (set before any worker starts)."""
    os.environ[heartbeat.STATUS_DIR_ENV] = str(status_dir)
    # The operator's automatic checkpoint interval reaches the trainers through this file (IntervalFollower).
    os.environ[autointerval.INTERVAL_FILE_ENV] = str(autointerval.interval_file(status_dir))
    os.environ["PHALANX_COLLECTIVE_TIMEOUT"] = f"{settings.collective_timeout:g}"
    os.environ.setdefault("PHALANX_JOB_UID", settings.run_id)
    # Training processes get a fresh store per attempt, hosted by the new rank 0, instead of one hosted
    # by the first rank-0 launcher: a reused store would keep stale keys and a dead node's address.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ[livegroup.LIVE_ENV] = "1" if settings.live_regroup else "0"
    if settings.nproc_per_node > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Pods whose address is on no interface share the host's (the local cluster's): gloo must use loopback.
    if gloonet.needs_loopback(settings.local_addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _status_dir(settings: LaunchSettings) -> Path:
    root = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="phalanx-status-", dir=root))


class JobFollowing:
    """What follows the TrainingJob (or the files that stand in for it): the feed and its followers."""

    def __init__(self, settings: LaunchSettings, interval_file: Path | None = None) -> None:
        self.settings = settings
        self.interval_file = interval_file
        """Where the trainers find the operator's automatic checkpoint interval (None: not passed on)."""
        self.view: jobwatch.JobView | None = None
        self.feed: jobwatch.JobFeed | jobwatch.FileJobFeed | None = None
        self.tickers: list[jobwatch.Ticker] = []
        self.writer = f"{settings.pod_name or settings.local_addr}/{os.getpid()}/{uuid.uuid4().hex[:8]}"

    def start_feed(self) -> None:
        """Start reading the job (a file, or a watch when Kubernetes is reachable); off without either."""
        from phalanx.worker.lease import TrainingJobApi, kubernetes_reachable

        settings = self.settings
        view = jobwatch.JobView()
        if settings.job_file:
            self.feed = jobwatch.FileJobFeed(settings.job_file, view).start()
        elif kubernetes_reachable(os.environ) and settings.job_name and settings.pod_namespace:
            try:
                api = TrainingJobApi(settings.job_name, settings.pod_namespace)
            except Exception as error:
                logger.warning("TrainingJob not followed: cannot configure the Kubernetes client: %s", error)
                return
            self.feed = jobwatch.JobFeed(api, view, poll_interval=settings.heartbeat_interval).start()
        else:
            return
        self.view = view

    def start_followers(self, client: StoreConnections, agent: PhalanxAgent) -> None:
        settings = self.settings
        source = scaling.desired_nodes_source(settings.max_nodes_file, self.view)
        if source is not None:
            follower = scaling.MaxNodesFollower(
                source, client.max_nodes, settings.min_nodes, self.writer, settings.heartbeat_interval
            )
            self.tickers.append(follower)
        if self.view is not None:
            view = self.view
            regrouper = regroup.Regrouper(
                view.current,
                lambda: client.store,
                agent.group_started,
                self.writer,
                settings.heartbeat_interval,
                forget=client.forget_departed,
                includes=lambda pod_keys: client.group_includes(agent.group_members(), pod_keys),
            )
            with contextlib.suppress(*STORE_ERRORS, RuntimeError):
                regrouper.seed()
            client.new_store_hooks.append(regrouper.seed)
            self.tickers.append(regrouper)
            # The operator's rollback requests (status.rollback) reach the trainers through the environment.
            rollbacks = rollback.RollbackFollower(
                view.current,
                lambda: client.store,
                agent.group_started,
                self.writer,
                settings.heartbeat_interval,
            )
            with contextlib.suppress(*STORE_ERRORS, RuntimeError):
                rollbacks.seed()
            client.new_store_hooks.append(rollbacks.seed)
            self.tickers.append(rollbacks)
            if self.interval_file is not None:
                self.tickers.append(
                    autointerval.IntervalFollower(
                        view.current, self.interval_file, settings.heartbeat_interval
                    )
                )
            self.tickers.append(
                drillhook.HangDrill(
                    view.current,
                    agent.training_pids,
                    settings.pod_name,
                    settings.pod_uid,
                    settings.heartbeat_interval,
                )
            )
        for ticker in self.tickers:
            if self.view is not None:
                self.view.subscribe(ticker.wake)
            ticker.start()
            ticker.wake()  # a first look at once, not after an interval

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        for ticker in self.tickers:
            ticker.stop()


def run(settings: LaunchSettings, server: ForkServer | None = None) -> int:
    """Supervise the pod's training until its work is over; returns the launcher's exit code. `server`: where
    warm interpreters are forked from (it ends with this call)."""
    status_dir = _status_dir(settings)
    log_dir = tempfile.mkdtemp(prefix="phalanx-launch-logs-")
    _prepare_worker_environment(settings, status_dir)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise_signal)
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

    reporter = PodReporter(settings, status_dir, PodMetrics())
    reporter.start()
    exit_code = int(LauncherExit.USER_CODE_FAILED)  # an unexpected error ends the launcher as a failure
    try:
        problem = _preflight_storage_problem(dict(os.environ))
        if problem is not None:
            exit_code = _fail_preflight(reporter, preflight.REASON_STORAGE, problem)
            return exit_code
        exit_code = _supervise(settings, reporter, log_dir, server)
        return exit_code
    finally:
        if server is not None:
            server.close()
        reporter.finish(exit_code)
        shutil.rmtree(status_dir, ignore_errors=True)
        shutil.rmtree(log_dir, ignore_errors=True)


CHECKPOINT_DIR_ENV = "PHALANX_CHECKPOINT_DIR"
"""The checkpoint location the operator gives the trainers (`spec.checkpoint.path`)."""


def _fail_preflight(reporter: PodReporter, reason: str, message: str) -> int:
    """The pod fails the preflight before any training: its last heartbeat says why; the launcher's exit code."""
    logger.error("preflight failed: %s", message)
    termination.write(f"preflight failed: {message}")
    reporter.preflight_failure = {
        "preflight": preflight.FAILED,
        "preflight_reason": reason,
        "preflight_message": message,
    }
    return int(LauncherExit.PREFLIGHT_FAILED)


def _preflight_storage_problem(env: dict[str, str]) -> str | None:
    """With the job's preflight on, what keeps this pod from using the checkpoint location (None: nothing).
    Every pod checks, spares too: any of them may have to save or restore."""
    steps = env.get(preflight.STEPS_ENV, "")
    directory = env.get(CHECKPOINT_DIR_ENV, "")
    if not steps.isdigit() or int(steps) <= 0 or not directory:
        return None
    problem = durable.probe_directory(directory)
    tier = tiers.DurableTier.from_env(env)
    return problem if problem is not None or tier is None else tiers.probe(tier)


def _supervise(
    settings: LaunchSettings, reporter: PodReporter, log_dir: str, server: ForkServer | None = None
) -> int:
    """Run the elastic agent until the pod's work is over; returns the launcher's exit code."""
    # Set when this launcher closes the rendezvous (see `ends_the_group`): how the group ended, said in the
    # store first. `left_alone`: it gives up alone, and the group goes on without it.
    outcome: rendezvous.GroupOutcome | None = None
    left_alone = False
    client: StoreConnections | None = None
    warm_pool: warmstart.WarmPool | None = None
    following = JobFollowing(settings, autointerval.interval_file(reporter.status_dir))
    logger.info(
        "launching %s: rendezvous %s id=%s nodes=%d:%d nproc=%d role=%s timeouts join=%gs last-call=%gs "
        "keepalive=%gs/%gs",
        " ".join(settings.command),
        settings.rdzv_endpoint,
        settings.run_id,
        settings.min_nodes,
        settings.max_nodes,
        settings.nproc_per_node,
        settings.role,
        settings.join_timeout,
        settings.last_call_timeout,
        settings.keepalive_interval,
        settings.keepalive_timeout,
    )
    try:
        following.start_feed()
        try:
            client = rendezvous_client(settings)
        except StoreUnreachableError as error:
            job = following.view.current() if following.view is not None else None
            if not preflight.pending(dict(os.environ), job):
                raise
            message = f"{settings.pod_name or settings.local_addr} cannot reach the job's rendezvous: {error}"
            return _fail_preflight(reporter, preflight.REASON_RENDEZVOUS, message)
        reporter.standby_probe = client.in_standby
        spec = WorkerSpec(
            role="trainer",
            local_world_size=settings.nproc_per_node,
            entrypoint=settings.command[0],
            args=tuple(settings.command[1:]),
            rdzv_handler=client.handler,
            max_restarts=settings.max_restarts,
            monitor_interval=settings.monitor_interval,
            local_addr=settings.local_addr,
        )
        agent = PhalanxAgent(spec, settings, client, reporter, log_dir)
        reporter.trainer_pids = agent.training_pids
        if settings.warm_start:
            warm_pool = warmstart.WarmPool(
                settings.nproc_per_node, title_room=len(" ".join(settings.command)), server=server
            ).start()
        following.start_followers(client, agent)
        node = settings.pod_name or settings.local_addr
        try:
            result = agent.run()
        except LauncherStop as stop:
            logger.error("%s", stop)
            termination.write(str(stop))
            if stop.code != LauncherExit.RENDEZVOUS_UNREACHABLE:
                if ends_the_group(settings, stop.code):
                    outcome = rendezvous.GroupOutcome(int(stop.code), f"{node}: {stop}")
                else:
                    left_alone = True
            return int(stop.code)
        if result is None:  # a standby released because the job ended
            return _left_a_closed_rendezvous(client)
        if result.is_failed():
            logger.error("worker group failed: %s", result.failures)
            if ends_the_group(settings, LauncherExit.USER_CODE_FAILED):
                outcome = rendezvous.GroupOutcome(
                    int(LauncherExit.USER_CODE_FAILED), f"{node}: worker group failed: {result.failures}"
                )
            else:
                left_alone = True
            return int(LauncherExit.USER_CODE_FAILED)
        logger.info("worker group finished")
        outcome = rendezvous.GroupOutcome(int(LauncherExit.SUCCESS), f"{node}: worker group finished")
        return int(LauncherExit.SUCCESS)
    except SignalException as error:
        logger.warning("stopped by %s after the training processes saved", error.sigval.name)
        if client is not None:
            with contextlib.suppress(Exception):
                client.stopping()
        if error.sigval == signal.SIGTERM:
            # A trainer that lost a peer to the same stop exited before its own SIGTERM came, unsaved.
            lastsave.save_unsaved()
        return 128 + int(error.sigval)
    except storegate.SecretError as error:
        logger.error("bad launcher configuration: %s", error)
        termination.write(str(error))
        return int(LauncherExit.BAD_CONFIG)
    except StoreUnreachableError as error:
        logger.error("rendezvous failed: %s", error)
        return int(LauncherExit.RENDEZVOUS_UNREACHABLE)
    except safepickle.RefusedPickle as error:
        logger.error("rendezvous refused: the store holds a state this launcher will not load: %s", error)
        return int(LauncherExit.RENDEZVOUS_UNREACHABLE)
    except RendezvousTimeoutError:
        logger.error(
            "rendezvous failed: fewer than %d nodes joined within the join timeout (%gs)",
            settings.min_nodes,
            settings.join_timeout,
        )
        return int(LauncherExit.RENDEZVOUS_UNREACHABLE)
    except RendezvousGracefulExitError:
        return _left_a_closed_rendezvous(client)
    except RendezvousClosedError:
        failed = _failed_outcome(client)
        if failed is not None:
            return _report_failed_group(failed)
        logger.error("the job's rendezvous is closed: the group already ended")
        return int(LauncherExit.RENDEZVOUS_UNREACHABLE)
    finally:
        following.stop()
        if warm_pool is not None:
            warm_pool.close()
        if outcome is not None and client is not None:
            # How it ended first: the launchers that find the rendezvous closed leave with the same verdict.
            with contextlib.suppress(Exception):
                rendezvous.publish_outcome(client.store, outcome)
            with contextlib.suppress(Exception):
                client.handler.shutdown()
        if left_alone and client is not None:
            # Out of the group at once: the others re-form now instead of after this node's keep-alive lapses.
            with contextlib.suppress(Exception):
                client.leave_alone()


REPLACEABLE_EXITS = frozenset(
    {LauncherExit.USER_CODE_FAILED, LauncherExit.RESTART_BUDGET_EXHAUSTED, LauncherExit.OOM_KILLED}
)
"""Give-ups that another pod in this one's place could get past: the training failing on this node only,
again and again, or the kernel killing it for memory."""


def ends_the_group(settings: LaunchSettings, code: int) -> bool:
    """Whether a launcher leaving with `code` ends the whole group: it says so in the store and closes the
    job's rendezvous, so every other launcher leaves too (torchrun's rule).

    Success always does, and so does a failure that restarting cannot help (bad configuration, a diverged
    loss, a failed preflight). A replaceable failure under the operator (`settings.job_name`) does not: the
    group re-forms without this pod, with a spare in its place, and the operator's failure policy decides
    about the pod (replaced and counted by default; the job fails once `maxRestarts` is spent). Closing the
    rendezvous there made every replacement find it closed and fail too, so one node's crash loop or OOM
    ended the whole job."""
    return not (settings.job_name and code in REPLACEABLE_EXITS)


def _failed_outcome(client: StoreConnections | None) -> rendezvous.GroupOutcome | None:
    """The group's failure, as the launcher that closed the rendezvous said it (None: no failure said)."""
    if client is None:
        return None
    outcome = None
    with contextlib.suppress(Exception):
        outcome = rendezvous.read_outcome(client.store)
    return outcome if outcome is not None and outcome.failed else None


def _report_failed_group(outcome: rendezvous.GroupOutcome) -> int:
    message = f"the job's group failed: {outcome.message}"
    logger.error("%s", message)
    termination.write(message)
    return outcome.code


def _left_a_closed_rendezvous(client: StoreConnections | None) -> int:
    """The exit code of a standby released by a closed rendezvous: success only when the group did not fail
    (a spare leaving a failed group with 0 made the operator see the job as finished)."""
    failed = _failed_outcome(client)
    if failed is not None:
        return _report_failed_group(failed)
    logger.info("the job ended while this node stood by")
    return int(LauncherExit.SUCCESS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.worker.launch", description=__doc__.split("\n")[0]
    )
    from phalanx.worker.cli import add_arguments

    add_arguments(parser)
    args = parser.parse_args(argv)
    return launch_from_args(args)


def launch_from_args(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args, dict(os.environ))
    except SettingsError as error:
        _configure_logging(args.verbose)
        logger.error("bad launcher configuration: %s", error)
        return int(LauncherExit.BAD_CONFIG)
    # First, while this process runs no thread and has set nothing up of its own: the fork server starts as
    # a copy of it as it is now, torch imported.
    server = _start_fork_server() if settings.warm_start else None
    _configure_logging(args.verbose, settings)
    return run(settings, server)


def _start_fork_server() -> ForkServer | None:
    try:
        return ForkServer.fork(warmstart.PRELOAD)
    except OSError as error:
        logger.warning("no fork server (%s): warm interpreters start as new processes", error)
        return None


def exit_now(code: int) -> NoReturn:
    """Leave with `code` once the launcher's own cleanup is done, skipping the interpreter's teardown: that
    teardown destroys torch's native objects (store clients) while a daemon thread (torch's rendezvous
    keep-alive, the heartbeat reporter) may still be inside one of them, and C++ then aborts the process with
    "terminate called without an active exception": SIGABRT instead of the exit code the pod reports."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
