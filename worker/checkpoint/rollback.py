"""Rolling a run back to a step chosen by the operator (pure rules, torch-free).

A training-health signal with `action: Rollback` makes the operator write `status.rollback = {epoch,
atOrBeforeStep, skipBatches, fromStep, ...}`; every launcher passes the newest request it knows to its
trainers in `PHALANX_ROLLBACK` (JSON) and one of them restarts the group (worker/rollback.py). The
trainers' `Checkpointer.load` then applies it once:

- Every saved state (in-memory snapshot header, durable manifest) records `rollback_epoch`: the newest
  rollback its run went through (0 before any). A state of an older epoch than the request whose step is
  past `atOrBeforeStep` belongs to the run that was abandoned: it is never restored again, wherever it is.
- A restore whose chosen state is of an older epoch than the request *applies* the rollback: it is the
  newest state at or before the bound (from memory, a peer or the disk), the abandoned states are set
  aside, and the data cursor skips the batches asked for. States saved from then on carry the request's
  epoch, so a later ordinary restart (a lost worker) restores the newest state of the new run and never
  rolls back again, whatever the environment still says.
- With no state at or before the bound anywhere, training starts from scratch (step 0): the run before the
  bound is gone (a retention of `keep` checkpoints shorter than the detection delay, or an anomaly before the
  first checkpoint) and the abandoned states are not trusted. The heartbeat says so (`restored-step` 0,
  `restore-source` none) and the operator reports it.

Ranks agree on one request: the one of the highest epoch any rank was given (a launcher whose view of the
TrainingJob lags passes an older one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLLBACK_ENV = "PHALANX_ROLLBACK"
"""The newest rollback request the launcher knows, as JSON (see `RollbackRequest.to_env`)."""
EPOCH_KEY = "rollback_epoch"
"""Key of a state's rollback epoch in snapshot headers and durable manifests."""
SKIP_SEEN = -1
"""`skip_batches` value meaning: skip every batch the abandoned run trained on after the restored step."""


@dataclass(frozen=True)
class RollbackRequest:
    """Restore the newest state at or before `at_or_before_step` (once per epoch), then skip batches."""

    epoch: int
    """Grows with each rollback of the job (`status.rollback.epoch`)."""
    at_or_before_step: int
    """The newest state whose step is at most this is restored."""
    skip_batches: int = 0
    """Global batches to skip after the restored step; `SKIP_SEEN`: those the abandoned run trained on (up
    to `from_step`)."""
    from_step: int | None = None
    """The step the abandoned run had reached when the rollback was decided."""
    reason: str = ""

    def to_env(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "atOrBeforeStep": self.at_or_before_step,
                "skipBatches": "all" if self.skip_batches == SKIP_SEEN else self.skip_batches,
                "fromStep": self.from_step,
                "reason": self.reason,
            },
            separators=(",", ":"),
        )

    def as_ints(self) -> list[int]:
        """The request as integers, for a collective (`from_ints` reads them back)."""
        return [
            self.epoch,
            self.at_or_before_step,
            self.skip_batches,
            -1 if self.from_step is None else self.from_step,
        ]


NO_REQUEST_INTS = [0, -1, 0, -1]


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def parse_skip(value: Any) -> int:
    """`skipBatches` as the request carries it: a count, or `all` (`SKIP_SEEN`); anything else 0."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return SKIP_SEEN
    count = _integer(value)
    return count if count is not None and count >= 0 else 0


def request_from(raw: Mapping[str, Any] | None) -> RollbackRequest | None:
    """A request from its wire form (`status.rollback` or the environment's JSON); None if malformed."""
    if not isinstance(raw, Mapping):
        return None
    epoch = _integer(raw.get("epoch"))
    bound = _integer(raw.get("atOrBeforeStep"))
    if epoch is None or epoch <= 0 or bound is None or bound < 0:
        return None
    from_step = _integer(raw.get("fromStep"))
    reason = raw.get("reason")
    return RollbackRequest(
        epoch=epoch,
        at_or_before_step=bound,
        skip_batches=parse_skip(raw.get("skipBatches")),
        from_step=from_step if from_step is not None and from_step >= 0 else None,
        reason=reason if isinstance(reason, str) else "",
    )


def from_env(env: Mapping[str, str] | None = None) -> RollbackRequest | None:
    """The request the launcher passed (`PHALANX_ROLLBACK`), if any."""
    text = (os.environ if env is None else env).get(ROLLBACK_ENV, "")
    if not text.strip():
        return None
    try:
        return request_from(json.loads(text))
    except ValueError:
        return None


def from_ints(values: Sequence[int]) -> RollbackRequest | None:
    epoch, bound, skip, from_step = (int(value) for value in values)
    if epoch <= 0 or bound < 0:
        return None
    return RollbackRequest(epoch, bound, skip, None if from_step < 0 else from_step)


def agree(offers: Iterable[Sequence[int]]) -> RollbackRequest | None:
    """The request every rank follows: of all ranks' offers (`as_ints`), the one of the highest epoch."""
    requests = [request for offer in offers if (request := from_ints(offer)) is not None]
    return max(requests, key=lambda request: request.epoch, default=None)


def epoch_of(meta: Mapping[str, Any] | None) -> int:
    """The rollback epoch a snapshot header or manifest records (0: saved before any rollback)."""
    value = _integer((meta or {}).get(EPOCH_KEY))
    return value if value is not None and value > 0 else 0


def restorable(step: int, epoch: int, request: RollbackRequest | None) -> bool:
    """Whether a state of `step` saved in rollback epoch `epoch` may be restored under `request`: a state
    of the abandoned run (older epoch, past the bound) never may."""
    if request is None or epoch >= request.epoch:
        return True
    return step <= request.at_or_before_step


def applies(request: RollbackRequest | None, restored_epoch: int) -> bool:
    """Whether restoring a state of `restored_epoch` carries out `request` now (it was not yet)."""
    return request is not None and restored_epoch < request.epoch


def abandoned(step: int, epoch: int, request: RollbackRequest | None) -> bool:
    """A state of the run the rollback abandoned (to be dropped or set aside)."""
    return not restorable(step, epoch, request)


def newest_restorable(
    candidates: Iterable[tuple[int, int]], request: RollbackRequest | None
) -> tuple[int, int] | None:
    """Of `(step, epoch)` candidates, the newest one `request` allows (the newest step; of equal steps the
    newer epoch)."""
    allowed = [(step, epoch) for step, epoch in candidates if restorable(step, epoch, request)]
    return max(allowed, default=None)


def batches_to_skip(request: RollbackRequest, restored_step: int) -> int:
    """Global batches to skip after restoring `restored_step`: the request's count, or (`all`) those the
    abandoned run trained on after that step, up to where it was when the rollback was decided."""
    if request.skip_batches != SKIP_SEEN:
        return max(request.skip_batches, 0)
    if request.from_step is None:
        return 0
    return max(request.from_step - restored_step, 0)


def lineage_epoch(request: RollbackRequest | None, restored_epoch: int) -> int:
    """The rollback epoch of everything saved after a restore of a state of `restored_epoch`."""
    return max(request.epoch if request is not None else 0, restored_epoch)


def newest_held(held: Sequence[tuple[int, int]]) -> tuple[int, int, list[int]]:
    """Of every rank's in-memory candidate `(step, epoch)` (step -1: none), the state to restore: its step,
    its epoch and the ranks that hold it (of equal steps, those of the newest epoch). Step -1: none held."""
    step = max((step for step, _ in held), default=-1)
    if step < 0:
        return -1, 0, []
    epoch = max(epoch for held_step, epoch in held if held_step == step)
    return step, epoch, [rank for rank, (s, e) in enumerate(held) if (s, e) == (step, epoch)]
