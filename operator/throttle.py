"""Pauses of one job's pod creations after the API server refused some (429 throttled, 5xx failing).

A job whose creations are refused stops sending them for a while, doubling the pause with every further
refusal (or waiting as long as the server's `Retry-After` asks), so a large gang never hammers a struggling
API server, and the other jobs' requests are not stuck behind its retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

RETRYABLE_CLASS = 500
THROTTLED = 429


def is_refusal(status: int | None) -> bool:
    """Whether an API answer says "not now" (throttled or failing) rather than "no" (a 4xx about the object)."""
    return status is not None and (status == THROTTLED or status >= RETRYABLE_CLASS)


def retry_after_seconds(headers: Mapping[str, Any] | None) -> float | None:
    """The `Retry-After` of an answer in seconds (None when absent or not a number of seconds)."""
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except (TypeError, ValueError):
                return None
    return None


def pause_seconds(refusals: int, first: float, longest: float, retry_after: float | None = None) -> float:
    """The pause after the `refusals`-th refusal in a row: `first`, doubling per refusal, at most `longest`;
    a longer `Retry-After` from the server wins (capped the same way)."""
    pause = min(first * 2 ** max(refusals - 1, 0), longest)
    if retry_after is not None:
        pause = min(max(pause, retry_after), longest)
    return pause


class CreationThrottle:
    """Per job: refusals in a row and until when its creations pause (thread-safe)."""

    def __init__(
        self, first: float = 1.0, longest: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first = first
        self.longest = longest
        self._clock = clock
        self._state: dict[tuple[str, str], tuple[int, float]] = {}
        self._lock = threading.Lock()

    def paused_for(self, key: tuple[str, str]) -> float:
        """Seconds the job's creations still pause (0: they may go on)."""
        with self._lock:
            _, until = self._state.get(key, (0, 0.0))
        return max(until - self._clock(), 0.0)

    def refused(self, key: tuple[str, str], retry_after: float | None = None) -> float:
        """Record a refusal; returns the pause it starts. Refusals during a pause (requests already in
        flight) do not lengthen it."""
        with self._lock:
            refusals, until = self._state.get(key, (0, 0.0))
            moment = self._clock()
            if until > moment:
                return until - moment
            refusals += 1
            pause = pause_seconds(refusals, self.first, self.longest, retry_after)
            self._state[key] = (refusals, moment + pause)
            return pause

    def succeeded(self, key: tuple[str, str]) -> None:
        """A batch went through without refusal: the next refusal starts from the first pause again."""
        with self._lock:
            self._state.pop(key, None)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._state.pop(key, None)
