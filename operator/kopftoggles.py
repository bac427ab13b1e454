"""kopf's start-up wait for its indexes, in time that grows with the objects listed, not with their square.

kopf runs no handler until every index has taken in its first listing: each listed object gets a toggle in one
`ToggleSet`, and each object's worker, once the object is indexed, drops its toggle and waits for the whole set
to be on. kopf's set waits on one asyncio.Condition, and every toggle made or dropped wakes every worker waiting
on it: N objects listed cost about N²/2 wake-ups. Measured with kopf 1.45's own set, objects arriving as a
listing brings them (`phalanx bench --only kopf-startup`): 2,000 objects took 10 s of one core, 12,500 would take
about 270 s (projected from the slope), and an operator restarting beside a 12,500-pod gang lists its pods, their
Leases and the jobs: it would sit blind for many minutes before its first reconcile. The operator's set takes
0.84 s at 12,500 objects.

`LinearToggleSet` keeps kopf's semantics and its Condition (single toggles still wait on it) but judges the set
once per change and keeps one asyncio.Event per state: a set waited for wakes its waiters once, when it reaches
the state they wait for. `install` puts it in kopf's place before the operator starts; kopf builds its sets
from the module's name at run time (`aiotoggles.ToggleSet(all)`), and the version is pinned, which a unit test
checks along with the behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from kopf._cogs.aiokits import aiotoggles

KOPF_TOGGLE_SET = aiotoggles.ToggleSet
"""kopf's own set, kept for comparison (tests, the benchmark)."""


class _JudgingCondition(asyncio.Condition):
    """The set's Condition: every change of the set or of one of its toggles notifies it, so each notification
    judges the set again."""

    def __init__(self, judge: Callable[[], None]) -> None:
        super().__init__()
        self._judge = judge

    def notify_all(self) -> None:
        super().notify_all()
        self._judge()


class LinearToggleSet(aiotoggles.ToggleSet):
    """kopf's `ToggleSet`, waited for through one Event per state instead of the shared Condition."""

    def __init__(self, fn: Callable[[Iterable[bool]], bool]) -> None:
        super().__init__(fn)
        self._reached = {True: asyncio.Event(), False: asyncio.Event()}
        self._condition = _JudgingCondition(self._judge)
        self._judge()

    def _judge(self) -> None:
        # One pass, cut short at the first toggle that decides: while kopf's listing is indexed, the set holds
        # the objects not indexed yet, all off.
        state = self.is_on()
        self._reached[state].set()
        self._reached[not state].clear()

    async def wait_for(self, __state: bool) -> None:
        wanted = bool(__state)
        while self.is_on() != wanted:
            await self._reached[wanted].wait()


def install() -> None:
    """Let kopf build `LinearToggleSet`s from now on (before `kopf.operator` starts)."""
    aiotoggles.ToggleSet = LinearToggleSet  # type: ignore[misc]
