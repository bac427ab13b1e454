"""Regroup on the operator's word: re-form a worker group that includes a failed worker, now.

When a worker dies without closing a socket (a frozen pod, a lost node), its peers can sit in a store
wait or in a collective that never errors until a timeout minutes later. The operator notices the silence
through the heartbeat Leases and writes into the TrainingJob's status

    status.regroup = {"before": "<RFC 3339 time>", "epoch": <int>, "reason": "<text>",
                      "departed": ["<pod>", ...], "departedUids": ["<pod uid>", ...]}

meaning "worker groups started before `before` include a worker that failed; re-form now". The epoch
grows with every new request. Every launcher also drops the departed pods' nodes from the rendezvous at once
(each launcher publishes its node under its pod's UID), so the round that re-forms never waits for their
keep-alives to lapse. Every launcher follows its TrainingJob (worker/jobwatch.py) and, for a
request it has not settled yet:

- a launcher whose worker group runs and started before `before` claims the request in the rendezvous
  store with compare-and-set of `phalanx/regroup-epoch`, from the value it read to `"<epoch> <writer>"`;
  the one launcher whose compare-and-set wins bumps `phalanx/restart-epoch`, which restarts every
  launcher's group once (worker/launch.py), and logs one line;
- a request whose epoch is not above the key's is done (another launcher claimed it, or it is older);
- an absent key (the store was recreated, so every group re-forms anyway) is seeded with the request's
  epoch, without a restart;
- a group started after `before` (or no group at all) is never restarted for it.

Launchers seed the key when they connect to a store with the newest epoch they have seen (0 before any
request), so that the first request of a job finds the key. `before` and the group's start are wall-clock
times of different machines: the operator should leave a margin for clock skew when it picks `before`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import torch.distributed as dist

from phalanx.worker import rendezvous
from phalanx.worker.env import REGROUP_EPOCH_KEY
from phalanx.worker.jobwatch import Ticker

logger = logging.getLogger("phalanx.launch")


@dataclass(frozen=True)
class RegroupRequest:
    """The operator's `status.regroup` of a TrainingJob."""

    before: datetime
    """Worker groups started before this moment (UTC) include a failed worker."""
    epoch: int
    """Grows with each request; a request is acted on once, by one launcher."""
    reason: str = ""
    """Why, for logs (e.g. the failed pod and what was seen)."""
    departed: tuple[str, ...] = ()
    """The failed or removed pods: their nodes are dropped from the rendezvous at once."""
    departed_uids: tuple[str, ...] = ()
    """Their UIDs, the keys under which their launchers published their rendezvous nodes."""


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time (`Z` or an offset; fractions of a second allowed) as an aware UTC datetime."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except (AttributeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None  # RFC 3339 always names its offset; a bare time is not trusted to be UTC
    return moment.astimezone(UTC)


def regroup_of(job: Mapping[str, Any] | None) -> RegroupRequest | None:
    """The TrainingJob's regroup request, or None when it has none or a malformed one."""
    raw = ((job or {}).get("status") or {}).get("regroup")
    if not isinstance(raw, Mapping):
        return None
    before_text = raw.get("before")
    before = parse_time(before_text) if isinstance(before_text, str) else None
    epoch = raw.get("epoch")
    if before is None or not isinstance(epoch, int) or isinstance(epoch, bool) or epoch <= 0:
        return None
    reason = raw.get("reason")
    pods = _strings(raw.get("departed"))
    return RegroupRequest(
        before=before,
        epoch=epoch,
        reason=reason if isinstance(reason, str) else "",
        departed=pods,
        departed_uids=_strings(raw.get("departedUids")),
    )


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


def regroup_due(request: RegroupRequest, group_started: float | None) -> bool:
    """Whether a group started at `group_started` (Unix time; None: no group runs) must re-form for it."""
    return group_started is not None and group_started < request.before.timestamp()


class Claim(Enum):
    """What a launcher's compare-and-set on `phalanx/regroup-epoch` found."""

    WON = "won"
    """This launcher moved the key to the request's epoch: it restarts the group."""
    LOST = "lost"
    """Another launcher moved the key first."""
    DONE = "done"
    """The key already holds this epoch or a newer one."""
    SEEDED = "seeded"
    """The key was absent (a recreated store): seeded with this epoch, no restart."""


def parse_epoch(raw: str) -> int | None:
    """The epoch of a `phalanx/regroup-epoch` value (`"3"` or `"3 <writer>"`); None if malformed."""
    first = raw.split(" ", 1)[0]
    return int(first) if first.isdigit() else None


def claim_epoch(store: dist.Store, key: str, epoch: int, writer: str) -> Claim:
    """Compare-and-set `key` to this request's epoch; the writer's name makes the winner unambiguous."""
    mine = f"{epoch} {writer}"
    raw = store.compare_set(key, "", mine).decode()
    if raw == mine:
        return Claim.SEEDED
    current = parse_epoch(raw)
    if current is not None and current >= epoch:
        return Claim.DONE
    won = store.compare_set(key, raw, mine).decode() == mine
    return Claim.WON if won else Claim.LOST


def claim_regroup(store: dist.Store, epoch: int, writer: str) -> Claim:
    """Claim a regroup request (`phalanx/regroup-epoch`); one launcher wins."""
    return claim_epoch(store, REGROUP_EPOCH_KEY, epoch, writer)


def seed_regroup_epoch(store: dist.Store, epoch: int) -> str:
    """Set the key to `epoch` when it is absent (one atomic operation); returns the key's value."""
    return seed_epoch(store, REGROUP_EPOCH_KEY, epoch)


def seed_epoch(store: dist.Store, key: str, epoch: int) -> str:
    """Set an epoch key (regroup, rollback) to `epoch` when it is absent; returns the key's value."""
    return store.compare_set(key, "", str(epoch)).decode()


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S.%f")[:-3]


class Regrouper(Ticker):
    """Acts on the TrainingJob's regroup requests for one launcher (see the module docstring)."""

    thread_name = "phalanx-regroup"
    failure = "cannot act on a regroup request"

    def __init__(
        self,
        job: Callable[[], Mapping[str, Any] | None],
        store: Callable[[], dist.Store],
        group_started: Callable[[], float | None],
        writer: str,
        interval: float,
        forget: Callable[[tuple[str, ...]], list[str]] | None = None,
        includes: Callable[[tuple[str, ...]], bool | None] | None = None,
    ) -> None:
        super().__init__(interval)
        self._forget = forget
        self._includes = includes
        """Whether the group that runs now includes any of the pods named (None: not known), to tell whether it
        must re-form for a departed pod whatever the clocks say."""
        self.forgotten = 0
        """The newest request epoch whose departed pods this launcher dropped from the rendezvous."""
        self._job = job
        self._store = store
        self._group_started = group_started
        self.writer = writer
        self.settled = 0
        """The newest request epoch this launcher is done with."""
        self.known = 0
        """The newest request epoch seen in the TrainingJob."""

    def seed(self, store: dist.Store | None = None) -> None:
        """Make sure a (new) store holds the key: the newest epoch seen, so old requests stay done."""
        request = regroup_of(self._job())
        if request is not None:
            self.known = max(self.known, request.epoch)
        seed_regroup_epoch(store if store is not None else self._store(), self.known)

    def tick(self) -> Claim | None:
        """One look at the newest request; returns what the claim found, or None when none was made."""
        request = regroup_of(self._job())
        if request is None:
            return None
        self.known = max(self.known, request.epoch)
        self._forget_departed(request)
        if request.epoch <= self.settled:
            return None
        started = self._group_started()
        if started is None:
            return None  # no group runs: the next one starts after `before`, but look again meanwhile
        if not regroup_due(request, started):
            self.settled = request.epoch
            logger.info(
                "regroup %d (%s): the worker group started at %s, after %s: nothing to do",
                request.epoch,
                request.reason,
                _clock(started),
                _clock(request.before.timestamp()),
            )
            return None
        store = self._store()
        if self._formed_without_departed(request):
            self.settled = request.epoch
            logger.info(
                "regroup %d (%s): the worker group that runs does not include %s: nothing to do",
                request.epoch,
                request.reason,
                ", ".join(request.departed),
            )
            return None
        claim = claim_regroup(store, request.epoch, self.writer)
        self.settled = request.epoch
        self._clear_problem()
        if claim is not Claim.WON:
            return claim
        if not regroup_due(request, self._group_started()):
            logger.info(
                "regroup %d (%s): the group re-formed meanwhile: nothing to do", request.epoch, request.reason
            )
            return claim
        restart_epoch = rendezvous.request_restart(store)
        logger.warning(
            "regroup %d (%s): the worker group started at %s, before %s: restarting it (restart epoch %d)",
            request.epoch,
            request.reason,
            _clock(started),
            _clock(request.before.timestamp()),
            restart_epoch,
        )
        return claim

    def _formed_without_departed(self, request: RegroupRequest) -> bool:
        """The running group is known to have formed without every departed pod's node. A group that re-formed
        quickly, within the margin the operator leaves for clock skew in `before`, must not restart again;
        the group's members decide where they are known, the clocks where they are not."""
        if self._includes is None or not request.departed:
            return False
        return self._includes(request.departed_uids + request.departed) is False

    def _forget_departed(self, request: RegroupRequest) -> None:
        # Whether or not this launcher's group must restart (survivors of a deleted pod often restart on
        # their own first), the round they form next waits for the departed nodes until they are dropped.
        if self._forget is None or not request.departed or request.epoch <= self.forgotten:
            return
        # By UID where the launchers published under it; by name where they run without one (no Kubernetes).
        dropped = self._forget(request.departed_uids + request.departed)
        self.forgotten = request.epoch
        if dropped:
            logger.warning(
                "regroup %d (%s): dropped the departed %s from the rendezvous",
                request.epoch,
                request.reason,
                ", ".join(dropped),
            )

    def start(self) -> Regrouper:
        super().start()
        return self
