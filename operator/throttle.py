"""Pauses of one job's pod creations after the API server refused some.

Two kinds of refusal pause a job's creations: "not now" (429 throttled, 5xx failing) and "no" (any other
4xx but 409 AlreadyExists: the pod itself is invalid, forbidden, over a quota), which sending the same pod
again would only repeat. Either stops the job's creations for a while, doubling the pause with every further
refusal (or waiting as long as the server's `Retry-After` asks), so a large gang never hammers a struggling
API server, a pod the server will not take is not sent again every reconcile, and the other jobs' requests are
not stuck behind its retries. A "no" is the user's to see (`rejection_message`, a `FailedCreate` Event); its
pause ends as soon as the job's spec changes, since the new spec may build pods the server takes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RETRYABLE_CLASS = 500
THROTTLED = 429
ALREADY_EXISTS = 409
ANSWER_LIMIT = 512
"""Characters of the server's message kept in a `FailedCreate` Event (a pod's validation errors can run long)."""


def is_refusal(status: int | None) -> bool:
    """Whether an API answer says "not now" (throttled or failing) rather than "no" (a 4xx about the object)."""
    return status is not None and (status == THROTTLED or status >= RETRYABLE_CLASS)


def is_rejection(status: int | None) -> bool:
    """Whether an API answer says "no" to the object itself: a 4xx other than 409 (it exists already, the
    idempotent case) and 429 (not now). Sending the same object again gets the same answer."""
    return (
        status is not None and 400 <= status < RETRYABLE_CLASS and status not in (ALREADY_EXISTS, THROTTLED)
    )


def retry_after_seconds(headers: Mapping[str, Any] | None) -> float | None:
    """The `Retry-After` of an answer in seconds (None when absent or not a number of seconds)."""
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except (TypeError, ValueError):
                return None
    return None


def describe_answer(status: int | None, reason: str | None, body: str | bytes | None) -> str:
    """`422 Invalid: Pod "x" is invalid: ...`: the code, the Status object's reason (else the HTTP reason)
    and its message, cut to `ANSWER_LIMIT` characters."""
    found: Any = None
    if body:
        try:
            found = json.loads(body)
        except ValueError:
            found = None
    status_reason = found.get("reason") if isinstance(found, dict) else None
    message = found.get("message") if isinstance(found, dict) else None
    if message is None and body and not isinstance(found, dict):
        message = body.decode(errors="replace") if isinstance(body, bytes) else body
    text = " ".join(str(message or "").split())
    if len(text) > ANSWER_LIMIT:
        text = text[: ANSWER_LIMIT - 3] + "..."
    head = f"{status} {status_reason or reason or ''}".strip()
    return f"{head}: {text}" if text else head


@dataclass(frozen=True)
class Rejection:
    """A pod the API server refused to create, and what it answered (`describe_answer`)."""

    pod: str
    answer: str
    pause: float
    """Seconds the job's creations pause after it."""

    def __str__(self) -> str:
        return f"pod {self.pod} refused: {self.answer}"


def rejection_message(rejections: Sequence[Rejection]) -> str:
    """The `FailedCreate` Event of one round of creations: the first pod refused and the server's answer,
    how many more were refused, and when the next attempt is."""
    first = rejections[0]
    others = f" ({len(rejections) - 1} more pods refused)" if len(rejections) > 1 else ""
    return f"{first}{others}; next attempt in {first.pause:g}s"


def pause_seconds(refusals: int, first: float, longest: float, retry_after: float | None = None) -> float:
    """The pause after the `refusals`-th refusal in a row: `first`, doubling per refusal, at most `longest`;
    a longer `Retry-After` from the server wins (capped the same way)."""
    pause = min(first * 2 ** max(refusals - 1, 0), longest)
    if retry_after is not None:
        pause = min(max(pause, retry_after), longest)
    return pause


@dataclass(frozen=True)
class _Pause:
    refusals: int
    until: float
    generation: int | None
    """The job's generation whose pods were rejected; None for "not now" refusals."""


class CreationThrottle:
    """Per job: refusals in a row and until when its creations pause (thread-safe)."""

    def __init__(
        self, first: float = 1.0, longest: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first = first
        self.longest = longest
        self._clock = clock
        self._state: dict[tuple[str, str], _Pause] = {}
        self._rejections: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def paused_for(self, key: tuple[str, str], generation: int | None = None) -> float:
        """Seconds the job's creations still pause (0: they may go on). A pause that a rejection started ends
        once the job is at another `generation` (its spec changed), and the refusals count from 0 again."""
        with self._lock:
            state = self._state.get(key)
            if state is None:
                return 0.0
            if state.generation is not None and generation is not None and generation != state.generation:
                del self._state[key]
                return 0.0
        return max(state.until - self._clock(), 0.0)

    def refused(
        self, key: tuple[str, str], retry_after: float | None = None, generation: int | None = None
    ) -> float:
        """Record a refusal; returns the pause it starts. Refusals during a pause (requests already in
        flight) do not lengthen it. `generation`: the job's generation when the server rejected its pod (a
        "no"), so that a new spec may try at once; None for "not now"."""
        with self._lock:
            state = self._state.get(key, _Pause(0, 0.0, None))
            moment = self._clock()
            if state.until > moment:
                return state.until - moment
            refusals = state.refusals + 1
            pause = pause_seconds(refusals, self.first, self.longest, retry_after)
            self._state[key] = _Pause(refusals, moment + pause, generation)
            return pause

    def rejected(self, key: tuple[str, str], rejection: Rejection) -> None:
        """Remember what the server answered the job's latest rejected pod (`rejection`), until a batch of its
        creations goes through."""
        with self._lock:
            self._rejections[key] = str(rejection)

    def rejection(self, key: tuple[str, str]) -> str | None:
        """The job's latest rejected pod and the server's answer (`rejected`); None once creations succeed."""
        with self._lock:
            return self._rejections.get(key)

    def succeeded(self, key: tuple[str, str]) -> None:
        """A batch went through without refusal: the next refusal starts from the first pause again."""
        with self._lock:
            self._state.pop(key, None)
            self._rejections.pop(key, None)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._state.pop(key, None)
            self._rejections.pop(key, None)
