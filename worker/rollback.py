"""Roll back on the operator's word: restart every worker group from a checkpoint before an anomaly.

A training-health signal with `action: Rollback` makes the operator write into the TrainingJob's status

    status.rollback = {"epoch": <int>, "atOrBeforeStep": <int>, "skipBatches": <int or "all">,
                       "fromStep": <int>, "reason": "<text>", "requestedAt": "<RFC 3339 time>"}

meaning "restore the newest checkpoint at or before `atOrBeforeStep` and train on from there". Every launcher
follows its TrainingJob (worker/jobwatch.py) and, for a request newer than the last it passed on:

- puts it into the environment of every training process it starts from now on (`PHALANX_ROLLBACK`, JSON);
  the trainers' `Checkpointer.load` carries it out once (worker/checkpoint/rollback.py): a state already of
  the rolled-back run is restored as it is, so later ordinary restarts never roll back again;
- if its worker group runs and was started before the request reached it, claims the request in the
  rendezvous store with compare-and-set of `phalanx/rollback-epoch` (as for regroups, worker/regroup.py);
  the one winner bumps `phalanx/restart-epoch`, which restarts every launcher's group once. A group started
  with the request in its environment, or no group at all, needs no restart: the next group start carries
  it. An absent key (a recreated store: every group re-forms anyway) is seeded without a restart.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import torch.distributed as dist

from phalanx.worker import rendezvous
from phalanx.worker.checkpoint.rollback import ROLLBACK_ENV, RollbackRequest, request_from
from phalanx.worker.env import ROLLBACK_EPOCH_KEY
from phalanx.worker.jobwatch import Ticker
from phalanx.worker.regroup import Claim, claim_epoch, seed_epoch

logger = logging.getLogger("phalanx.launch")


def rollback_of(job: Mapping[str, Any] | None) -> RollbackRequest | None:
    """The TrainingJob's rollback request, or None when it has none or a malformed one."""
    raw = ((job or {}).get("status") or {}).get("rollback")
    return request_from(raw) if isinstance(raw, Mapping) else None


def claim_rollback(store: dist.Store, epoch: int, writer: str) -> Claim:
    """Compare-and-set `phalanx/rollback-epoch` to this request's epoch; one launcher wins."""
    return claim_epoch(store, ROLLBACK_EPOCH_KEY, epoch, writer)


def needs_restart(group_started: float | None, passed_on_at: float) -> bool:
    """Whether the group that runs (started at `group_started`, Unix time; None: none runs) predates the
    moment the request went into the trainers' environment, so it must restart to carry it out."""
    return group_started is not None and group_started < passed_on_at


class RollbackFollower(Ticker):
    """Passes the TrainingJob's rollback requests on to one launcher's trainers (module docstring)."""

    thread_name = "phalanx-rollback"
    failure = "cannot act on a rollback request"

    def __init__(
        self,
        job: Callable[[], Mapping[str, Any] | None],
        store: Callable[[], dist.Store],
        group_started: Callable[[], float | None],
        writer: str,
        interval: float,
        environ: MutableMapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(interval)
        self._job = job
        self._store = store
        self._group_started = group_started
        self.writer = writer
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self.passed_on: RollbackRequest | None = None
        """The newest request put into the trainers' environment."""
        self.passed_on_at = 0.0
        self.settled = 0
        """The newest request epoch this launcher is done with."""

    def seed(self, store: dist.Store | None = None) -> None:
        """Make sure a (new) store holds the key: the newest epoch seen, so old requests stay done."""
        self._pass_on(rollback_of(self._job()))
        known = self.passed_on.epoch if self.passed_on is not None else 0
        seed_epoch(store if store is not None else self._store(), ROLLBACK_EPOCH_KEY, known)

    def _pass_on(self, request: RollbackRequest | None) -> None:
        if request is None or (self.passed_on is not None and request.epoch <= self.passed_on.epoch):
            return
        self._environ[ROLLBACK_ENV] = request.to_env()
        self.passed_on, self.passed_on_at = request, self._clock()
        logger.info(
            "rollback %d (%s): training processes started from now on restore the newest state at or "
            "before step %d",
            request.epoch,
            request.reason,
            request.at_or_before_step,
        )

    def tick(self) -> Claim | None:
        """One look at the newest request; returns what the claim found, or None when none was made."""
        request = rollback_of(self._job())
        self._pass_on(request)
        if request is None or request.epoch <= self.settled:
            return None
        started = self._group_started()
        if started is None:
            return None  # the next group starts with the request in its environment
        if not needs_restart(started, self.passed_on_at):
            self.settled = request.epoch
            return None
        claim = claim_rollback(self._store(), request.epoch, self.writer)
        self.settled = request.epoch
        self._clear_problem()
        if claim is Claim.WON:
            restart_epoch = rendezvous.request_restart(self._store())
            logger.warning(
                "rollback %d (%s): restarting the worker group to restore the newest state at or before "
                "step %d (restart epoch %d)",
                request.epoch,
                request.reason,
                request.at_or_before_step,
                restart_epoch,
            )
        return claim

    def start(self) -> RollbackFollower:
        super().start()
        return self
