"""The README's main command, run against the test session's cluster."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from .conftest import Cluster, Operator, assert_demo_succeeded

pytestmark = pytest.mark.e2e

DEMO_NAMESPACE = "phalanx-demo"
DEMO_JOB = "tinygpt"
DEMO_STORY: list[tuple[str, ...]] = [
    # The gang is created, placed and trains.
    ("CreatedPods",),
    ("AllScheduled",),
    ("Training",),
    # The preflight's planned restart from its checkpoint, then its verdict: no failure's Events.
    ("PreflightRestart",),
    ("Passed",),
    # The demo's kill, and the new spare that refills the pool in the same reconcile.
    ("Killed",),
    ("CreatedPods",),
    # The spare takes the slot and training resumes, told by two heartbeats: the first reconcile to see the
    # spare train may or may not have seen the group resume yet.
    ("SparePromoted", "Recovered"),
    ("TrainingFinished",),
]
"""The Events of the demo's job, in the order they were posted: each entry is a group of reasons that appear
once each, in any order among themselves, and nothing else in between; `told_story` first takes out the parts
the machine's speed decides (`VARIABLE`)."""
VARIABLE = """Variable parts of the story, all true:
- `Training` right after `SparePromoted`: `Running` went False (fewer than minReplicas in the group) when a
  reconcile saw the failure before the spare joined, and True again in the reconcile that relabels the spare;
- `StepTimeDrift` Warnings, each followed by a `TrainingHealthy` (but the last, which may still be on when the
  job ends): the step time really drifts on a loaded machine (the default health check, 15%)."""


def demo_events(cluster: Cluster) -> list[dict[str, Any]]:
    """The Events of the demo's job (this run's: the job's uid) in the order the operator posted them: their
    resourceVersion (one operator, one reconcile of a job at a time) orders them where their timestamps, to
    the second, do not."""
    uid = cluster.get_json("trainingjob", DEMO_JOB, "-n", DEMO_NAMESPACE)["metadata"]["uid"]
    events = cluster.get_json(
        "events", "-n", DEMO_NAMESPACE, "--field-selector", f"involvedObject.uid={uid}"
    )["items"]
    return sorted(events, key=lambda event: int(event["metadata"]["resourceVersion"]))


def told_story(reasons: list[str]) -> list[str]:
    """`reasons` without the parts `VARIABLE` allows (checked on the way: a `TrainingHealthy` only ends a
    `StepTimeDrift`)."""
    story: list[str] = []
    drifting = False
    for reason in reasons:
        if reason == "StepTimeDrift":
            assert not drifting, f"StepTimeDrift twice without TrainingHealthy between: {reasons}"
            drifting = True
        elif reason == "TrainingHealthy":
            assert drifting, f"TrainingHealthy without a signal before it: {reasons}"
            drifting = False
        elif not (reason == "Training" and story[-1:] == ["SparePromoted"]):
            story.append(reason)
    return story


def story_mismatch(reasons: list[str], story: list[tuple[str, ...]]) -> str | None:
    """Where `reasons` departs from `story` (None when it tells it exactly)."""
    position = 0
    for group in story:
        found = reasons[position : position + len(group)]
        if sorted(found) != sorted(group):
            return f"at Event {position}: expected {sorted(group)}, found {found}"
        position += len(group)
    if position != len(reasons):
        return f"unexpected Events after the story: {reasons[position:]}"
    return None


@pytest.mark.compat
def test_demo_trains_through_an_injected_failure(cluster: Cluster, operator: Operator, tmp_path) -> None:
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "phalanx.cli",
                "demo",
                "--state-dir",
                str(cluster.state_dir),
                "--report",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        # The demo upgrades the release to the chart's defaults, two replicas among them; the tests after it
        # act on the operator's one process.
        operator.scale(cluster, 1)
    summary = assert_demo_succeeded(result, tmp_path)
    assert summary["kill_method"] == "agent"  # the node agent's fault injection: its nodes run processes
    # The story the Events tell is the run's, nothing more: no failure's Events for the preflight's planned
    # restart, no restart for a spare, no promotion of the spare released at the end.
    events = demo_events(cluster)
    told = "\n".join(f"{e['type']:7} {e['reason']}: {e['message']}" for e in events)
    mismatch = story_mismatch(told_story([event["reason"] for event in events]), DEMO_STORY)
    assert mismatch is None, f"{mismatch} (the variable parts taken out)\n{told}"
    (killed,) = [event for event in events if event["reason"] == "Killed"]
    assert summary["killed_worker"] in killed["message"], told
    (promoted,) = [event for event in events if event["reason"] == "SparePromoted"]
    assert f"took the slot of failed worker {summary['killed_worker']}" in promoted["message"], told
    assert summary["restarts"]["total"] == 1, summary["restarts"]
