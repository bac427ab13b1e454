from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.reactor import orchestration, running

from phalanx.operator import kopftoggles

Fn = Callable[[Iterable[bool]], bool]


def test_kopf_builds_its_sets_by_the_modules_name_in_the_version_pinned() -> None:
    # `install` swaps the module's name: kopf must still look it up there when the operator starts.
    assert kopf.__version__.startswith("1.45."), kopf.__version__
    assert "aiotoggles.ToggleSet(all)" in inspect.getsource(orchestration)
    assert "aiotoggles.ToggleSet(any)" in inspect.getsource(running)


def test_install_puts_the_linear_set_in_kopfs_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiotoggles, "ToggleSet", kopftoggles.KOPF_TOGGLE_SET)
    kopftoggles.install()
    assert aiotoggles.ToggleSet is kopftoggles.LinearToggleSet


async def _states(kind: type[aiotoggles.ToggleSet], fn: Fn) -> list[bool]:
    """The set's state after each step of one script, and whether a waiter for each state was released."""
    toggles = kind(fn)
    seen = [toggles.is_on()]
    first = await toggles.make_toggle(False, name="a")
    seen.append(toggles.is_on())
    second = await toggles.make_toggle(True, name="b")
    seen.append(toggles.is_on())
    await first.turn_to(True)
    seen.append(toggles.is_on())
    await second.turn_to(False)
    seen.append(toggles.is_on())
    await toggles.drop_toggle(second)
    seen.append(toggles.is_on())
    await toggles.drop_toggles([first])
    seen.append(toggles.is_on())
    for state in (True, False):
        try:
            await asyncio.wait_for(toggles.wait_for(state), 0.05)
            seen.append(True)
        except TimeoutError:
            seen.append(False)
    return seen


@pytest.mark.parametrize("fn", [all, any])
def test_the_linear_set_says_and_waits_as_kopfs_own(fn: Fn) -> None:
    ours = asyncio.run(_states(kopftoggles.LinearToggleSet, fn))
    theirs = asyncio.run(_states(kopftoggles.KOPF_TOGGLE_SET, fn))
    assert ours == theirs


def test_waiters_are_released_once_the_set_is_on_and_none_waits_on_the_shared_condition() -> None:
    async def scenario() -> tuple[int, int, int]:
        toggles = kopftoggles.LinearToggleSet(all)
        blocker = await toggles.make_toggle(name="blocker")
        released = 0

        async def worker(index: int) -> None:
            nonlocal released
            mine = await toggles.make_toggle(name=str(index))
            await toggles.drop_toggle(mine)
            await toggles.wait_for(True)
            released += 1

        tasks = [asyncio.create_task(worker(index)) for index in range(1000)]
        for _ in range(5):
            await asyncio.sleep(0)
        # kopf's own set parks every such worker on its one Condition, where each change wakes them all.
        condition_waiters = len(toggles._condition._waiters or ())  # type: ignore[attr-defined]
        before = released
        await blocker.turn_to(True)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return condition_waiters, before, released

    condition_waiters, before, after = asyncio.run(scenario())
    assert (condition_waiters, before, after) == (0, 0, 1000)


def test_a_set_that_turns_off_again_holds_its_waiters() -> None:
    async def scenario() -> bool:
        toggles = kopftoggles.LinearToggleSet(any)
        flag = await toggles.make_toggle(False)
        waiter = asyncio.create_task(toggles.wait_for(True))
        await flag.turn_to(True)
        await flag.turn_to(False)  # on and off again before the waiter ran: it must look again, and wait
        await asyncio.sleep(0.01)
        held = not waiter.done()
        await flag.turn_to(True)
        await asyncio.wait_for(waiter, 1)
        return held

    assert asyncio.run(scenario())
