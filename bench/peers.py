"""Peers measured beside Phalanx: their published numbers, what their processes print, and the ratios.

Pure code. `peer-torchft` and `peer-dlrover` run the peers; this module parses what the peers' processes
print, turns a kill into a recovery time and steps lost, and builds the report's "Peers, measured" rows:
each peer's figure over Phalanx's from the same `phalanx bench` invocation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from phalanx.bench.core import Baseline, BenchResult, Metric, fmt

TORCHFT_PUBLISHED = Baseline(text="published: Ray+torchft ~5 s", value=5.0)
DLROVER_STALL_PUBLISHED = Baseline(text="published: DLRover flash checkpoint 0.2 s stall", value=200.0)


# ---------------------------------------------------------------------------------------------- torchft


@dataclass(frozen=True)
class StepLine:
    """One optimizer step of a torchft replica, as `phalanx.bench.torchft_replica` prints it."""

    step: int
    """The replica's step after the attempt (it advances only on a commit)."""
    time: float
    """Unix time the attempt ended."""
    participants: int
    """Replica groups in the quorum of that step."""
    committed: bool
    """Whether the step was committed (every replica in the quorum completed it)."""


STEP_LINE = re.compile(r"^STEP (\d+) (\d+(?:\.\d+)?) (\d+) ([01])$")


def parse_step(line: str) -> StepLine | None:
    """A replica's `STEP <step> <time> <participants> <committed>` line; None for any other line."""
    match = STEP_LINE.match(line.strip())
    if match is None:
        return None
    step, time, participants, committed = match.groups()
    return StepLine(int(step), float(time), int(participants), committed == "1")


@dataclass(frozen=True)
class KillOutcome:
    """What a replica's SIGKILL cost the survivors."""

    seconds: float
    """Kill -> every survivor committed a step in a quorum without the killed replica."""
    steps_lost: int
    """Committed steps a survivor rolled back: its highest committed before the kill + 1 - its first
    committed after it (the most of any survivor)."""
    discarded: int
    """Step attempts the survivors discarded (not committed) between the kill and their recovery."""


def kill_outcome(
    kill_time: float, quorum_before: int, survivors: dict[str, list[StepLine]]
) -> KillOutcome | None:
    """From each survivor's step lines: how long from `kill_time` until all committed a step in a quorum
    smaller than `quorum_before` (a step that was already past its allreduce when the kill came may still
    commit in the old quorum: that is not a recovery), the steps they lost and the attempts they discarded;
    None while some survivor has not recovered."""
    if not survivors:
        return None
    recovered_at, lost, discarded = [], [], 0
    for lines in survivors.values():
        before = [line.step for line in lines if line.committed and line.time <= kill_time]
        after = [line for line in lines if line.time > kill_time]
        first_commit = next((line for line in after if line.committed), None)
        recovery = next(
            (line for line in after if line.committed and line.participants < quorum_before), None
        )
        if first_commit is None or recovery is None:
            return None
        recovered_at.append(recovery.time)
        lost.append(max(0, max(before, default=0) + 1 - first_commit.step))
        discarded += sum(1 for line in after if not line.committed and line.time <= recovery.time)
    return KillOutcome(seconds=max(recovered_at) - kill_time, steps_lost=max(lost), discarded=discarded)


LISTENING = re.compile(r"listening on:\s*(\S+)")


def lighthouse_address(log: str) -> str | None:
    """The address torchft's lighthouse says it listens on (`Lighthouse listening on: http://host:port`)."""
    match = LISTENING.search(log)
    return match.group(1) if match else None


# ---------------------------------------------------------------------------------------------- ratios


def ratio(peer: float | None, ours: float | None) -> float | None:
    """The peer's figure over Phalanx's; None when either is missing or Phalanx's is zero."""
    if peer is None or ours is None or ours == 0:
        return None
    return peer / ours


def ratio_text(peer: float | None, ours: float | None) -> str:
    if peer is None or ours is None:
        return "-"
    if ours == 0:
        return "both 0" if peer == 0 else f"Phalanx 0, peer {fmt(peer)}"
    value = ratio(peer, ours)
    return f"{value:.3g}x" if value is not None else "-"


def ran_in(result: BenchResult, started_at: str) -> bool:
    """Whether `result` belongs to the invocation that started at `started_at` (not kept from an older
    one by `--only`): its own start is no earlier (both UTC ISO 8601, which sort as text)."""
    return not started_at or result.started_at >= started_at


def unavailable(result: BenchResult) -> str:
    """Why the peer of `result` could not run here (with the version tried), or ""."""
    reason = result.details.get("unavailable")
    return str(reason) if reason else ""


@dataclass(frozen=True)
class Row:
    """One line of the report's peers table."""

    benchmark: str
    metric: str
    peer: str
    phalanx_metric: str
    phalanx: str
    ratio: str
    published: str


def comparison_rows(results: list[BenchResult], started_at: str = "") -> list[Row]:
    """Every peer metric (one with `versus`) beside Phalanx's figure from the same invocation."""
    by_name = {result.name: result for result in results}
    rows = []
    for result in results:
        reason = unavailable(result)
        for metric in result.metrics:
            if metric.versus is None:
                continue
            stat = metric.versus.stat
            peer_value = metric.summary().get(stat)
            ours_metric, missing = _phalanx_metric(by_name.get(metric.versus.benchmark), metric, started_at)
            ours_value = ours_metric.summary().get(stat) if ours_metric else None
            never = _never(result).get(metric.name)
            if peer_value is None:
                ratio_cell = (
                    f"peer could not run here: {reason}"
                    if reason
                    else never or "no peer samples (its failures are in the notes)"
                )
            elif missing:
                ratio_cell = missing
            else:
                ratio_cell = ratio_text(peer_value, ours_value)
            rows.append(
                Row(
                    benchmark=result.name,
                    metric=metric.name,
                    peer=fmt(peer_value, metric.unit),
                    phalanx_metric=f"{metric.versus.benchmark} / {metric.versus.metric} ({stat})",
                    phalanx=fmt(ours_value, ours_metric.unit if ours_metric else ""),
                    ratio=ratio_cell,
                    published=metric.baseline.text if metric.baseline else "-",
                )
            )
    return rows


def _never(result: BenchResult) -> dict[str, str]:
    """Metrics of a peer that never did what they time (a frozen worker never noticed), and the text that
    says so: `details["never"]`."""
    found = result.details.get("never")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _phalanx_metric(
    result: BenchResult | None, peer_metric: Metric, started_at: str
) -> tuple[Metric | None, str]:
    """Phalanx's metric for `peer_metric`, or why there is none in this invocation."""
    versus = peer_metric.versus
    assert versus is not None
    missing = f"{versus.benchmark} not run in this invocation"
    if result is None or not ran_in(result, started_at):
        return None, missing
    if result.error:
        return None, f"{versus.benchmark} did not finish in this invocation"
    try:
        metric = result.metric(versus.metric)
    except KeyError:
        return None, f"{versus.benchmark} did not measure {versus.metric!r} in this invocation"
    if not metric.samples:
        return None, f"{versus.benchmark} has no samples of {versus.metric!r}"
    return metric, ""


# ---------------------------------------------------------------------------------------------- DLRover


def parse_saves(output: str) -> dict[str, Any] | None:
    """The `RESULT {json}` line `phalanx.bench.checkpoint_saves` prints last: stalls and persist times in
    seconds; None when there is none or it is not a JSON object with both lists of numbers."""
    for line in reversed(output.splitlines()):
        if not line.startswith("RESULT "):
            continue
        try:
            found = json.loads(line[len("RESULT ") :])
        except ValueError:
            return None
        if not isinstance(found, dict):
            return None
        for key in ("stall_s", "persist_s"):
            values = found.get(key)
            if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
                return None
        return found
    return None


def saves_error(output: str) -> str:
    """The `ERROR <exception>` line `phalanx.bench.checkpoint_saves` prints when its saves failed, or ""."""
    for line in reversed(output.splitlines()):
        if line.startswith("ERROR "):
            return line[len("ERROR ") :].strip()
    return ""
