"""kopf's start-up wait for its indexes by the number of objects listed: kopf's own set against the operator's.

Before its first handler, kopf indexes every object its first listings bring and waits for all of them: per
object it makes a toggle in one set, spawns the object's worker, and the worker, once the object is indexed,
drops its toggle and waits for the whole set (kopf/_core/reactor/queueing.py and processing.py). This benchmark
runs exactly that sequence, objects arriving one per turn of the event loop as a listing's do, through kopf's
own `ToggleSet` and through the operator's `LinearToggleSet` (operator/kopftoggles.py), side by side in one run.
The index handlers themselves and the API are left out: the figures are the wait alone, which is all that
differs between the two. An operator restarting beside a 12,500-pod gang lists its pods, their Leases and the
jobs: 12,500 objects and more.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target
from phalanx.operator import kopftoggles

NAME = "kopf-startup"
TITLE = "kopf's start-up wait for its indexes, by objects listed"
KOPF_SIZES = (500, 1_000, 2_000)
"""kopf's own set: its time grows with the square of the objects (2,000 take 10 to 17 s here)."""
LINEAR_SIZES = (500, 1_000, 2_000, 12_500, 40_000)
SEED_OBJECTS = 12_500
"""A 12,500-pod gang's pods: what an operator restarting beside it lists at the least."""
TARGET_SECONDS = 2.0
TRIALS = 3
QUICK_SIZES = (500, 1_000)


async def _startup(kind: type[Any], objects: int) -> float:
    """Seconds from the first listed object to every worker released, as kopf's queueing and processing do it."""
    toggles = kind(all)
    blocker = await toggles.make_toggle(name="orchestration blocker")

    async def worker(mine: Any) -> None:
        await asyncio.sleep(0)  # the object's index handlers
        await toggles.drop_toggle(mine)
        await toggles.wait_for(True)

    started = time.perf_counter()
    workers = []
    for number in range(objects):
        toggles.is_on()  # kopf looks whether the operator is indexed before each new object's worker
        mine = await toggles.make_toggle(name=f"object-{number}")
        workers.append(asyncio.create_task(worker(mine)))
        await asyncio.sleep(0)
    await toggles.drop_toggle(blocker)  # every listing is in
    await asyncio.gather(*workers)
    return time.perf_counter() - started


def measure(kind: type[Any], objects: int, trials: int) -> list[float]:
    return [asyncio.run(_startup(kind, objects)) for _ in range(trials)]


def run(context: Any, quick: bool) -> BenchResult:
    """Harness entry point (`phalanx bench --only kopf-startup`)."""
    del context
    started = time.monotonic()
    kopf_sizes = QUICK_SIZES if quick else KOPF_SIZES
    linear_sizes = QUICK_SIZES if quick else LINEAR_SIZES
    trials = 1 if quick else TRIALS
    theirs = {size: measure(kopftoggles.KOPF_TOGGLE_SET, size, trials) for size in kopf_sizes}
    ours = {size: measure(kopftoggles.LinearToggleSet, size, trials) for size in linear_sizes}
    metrics = []
    for size, samples in ours.items():
        baseline = (
            Baseline(
                text=f"kopf's own set, same run: {_median(theirs[size]):.2f} s p50",
                value=_median(theirs[size]),
            )
            if size in theirs
            else None
        )
        metrics.append(
            Metric(
                name=f"start-up wait, {size:,} objects",
                unit="s",
                samples=samples,
                description="the operator's set (operator/kopftoggles.py): first listed object -> every worker on",
                target=Target(
                    op="<=", value=TARGET_SECONDS, stat="p95", text="a restart beside the seed gang"
                )
                if size == SEED_OBJECTS
                else None,
                baseline=baseline,
            )
        )
    for size, samples in theirs.items():
        metrics.append(
            Metric(
                name=f"start-up wait, {size:,} objects, kopf's own set",
                unit="s",
                samples=samples,
                description="kopf 1.45's ToggleSet: every change wakes every waiting worker",
            )
        )
    projected = _projection(theirs)
    notes = [
        f"{trials} trials a size; objects arrive one per turn of the event loop, as a listing brings them. The "
        "index handlers and the API are not in the figures: only the wait, which is all the two sets differ in.",
    ]
    if projected is not None:
        notes.append(
            f"Projection (not measured): kopf's own set at {SEED_OBJECTS:,} objects, from its measured slope "
            f"(time ~ objects^{projected[1]:.2f}): about {projected[0]:,.0f} s before the first handler."
        )
    return BenchResult(
        name=NAME,
        title=TITLE,
        quick=quick,
        seconds=time.monotonic() - started,
        metrics=metrics,
        notes=notes,
        series=[
            _series("kopf's own set", theirs),
            _series("the operator's set", ours),
        ],
        details={
            "kopf": {str(size): samples for size, samples in theirs.items()},
            "linear": {str(size): samples for size, samples in ours.items()},
        },
    )


def _median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def _projection(measured: dict[int, list[float]]) -> tuple[float, float] | None:
    """kopf's set at the seed's objects from the slope of its two largest sizes (seconds, exponent)."""
    if len(measured) < 2:
        return None
    (small, small_samples), (large, large_samples) = sorted(measured.items())[-2:]
    exponent = math.log(_median(large_samples) / _median(small_samples)) / math.log(large / small)
    return _median(large_samples) * (SEED_OBJECTS / large) ** exponent, exponent


def _series(name: str, measured: dict[int, list[float]]) -> Series:
    return Series(
        name=name,
        x=[float(size) for size in measured],
        y=[_median(samples) for samples in measured.values()],
        x_label="objects listed",
        y_label="s",
        chart="start-up wait",
        log_log=True,
    )
