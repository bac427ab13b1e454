"""Conditions keyed by type; lastTransitionTime moves only when the status does."""

from __future__ import annotations

from datetime import datetime, timedelta

from phalanx.operator.conditions import find, is_true, set_condition


def test_new_condition_is_added_with_the_time_and_generation(now: datetime) -> None:
    conditions, changed = set_condition([], "Running", True, "Training", "2 workers", now=now, generation=3)
    assert changed
    (condition,) = conditions
    assert condition.to_wire() == {
        "type": "Running",
        "status": "True",
        "reason": "Training",
        "message": "2 workers",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
        "observedGeneration": 3,
    }


def test_same_status_keeps_the_transition_time_but_updates_the_message(now: datetime) -> None:
    first, _ = set_condition([], "Running", True, "Training", "2 workers", now=now, generation=1)
    later = now + timedelta(minutes=5)
    second, changed = set_condition(first, "Running", True, "Training", "3 workers", now=later, generation=2)
    assert not changed
    condition = find(second, "Running")
    assert condition is not None
    assert condition.last_transition_time == "2026-01-01T12:00:00Z"
    assert (condition.message, condition.observed_generation) == ("3 workers", 2)


def test_status_change_moves_the_transition_time_and_keeps_other_types(now: datetime) -> None:
    conditions, _ = set_condition([], "Running", True, "Training", "", now=now, generation=1)
    conditions, _ = set_condition(
        conditions, "GangScheduled", True, "AllScheduled", "", now=now, generation=1
    )
    later = now + timedelta(seconds=30)
    conditions, changed = set_condition(
        conditions, "Running", False, "Suspended", "", now=later, generation=2
    )
    assert changed and not is_true(conditions, "Running") and is_true(conditions, "GangScheduled")
    assert [condition.type for condition in conditions] == ["Running", "GangScheduled"]
    running = find(conditions, "Running")
    assert running is not None and running.last_transition_time == "2026-01-01T12:00:30Z"
