"""World size 4 -> 3 -> 5 with sharded (DCP) state: the optimisation does not notice the changes.

Three runs of real processes (gloo) train one sharded model: steps 1-4 at 4 ranks, 5-7 at 3, 8-10 at 5.
Each run resumes from the previous one's durable checkpoint, written by the background save after the
first run and by the SIGTERM (emergency) save after the second; the pods that stay keep in-memory
snapshots of another world size, which must not be used. Within the epoch no sample is skipped or
repeated, the global batch stays the same, and every step's loss equals an uninterrupted
single-process run's (same global batches in the same order, so the same optimisation).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from elastic_sharded import DATASET_LEN, GLOBAL_BATCH, SEED, reference_losses
from helpers import run_ranks

from phalanx.worker.data import ElasticSampler

PHASES = ((4, 4, "async"), (3, 7, "emergency"), (5, 10, "none"))
"""(world size, last step, how that step is saved) of each run: the periodic background save, the
SIGTERM save, nothing (the last run)."""


def pods(workdir: Path, world: int) -> list[dict[str, str]]:
    """Rank r runs on pod r: pods that stay keep their /dev/shm snapshots from the previous run."""
    return [
        {"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(world)
    ]


def test_world_size_4_3_5_keeps_sample_order_global_batch_and_loss_curve(workdir: Path) -> None:
    runs: list[list[dict[str, Any]]] = []
    previous_stop = 0
    for world, stop_at, final_save in PHASES:
        extra = {"stop_at": stop_at, "final_save": final_save}
        results = run_ranks("elastic_sharded", world, workdir, pods(workdir, world), extra)
        expected_source = "none" if previous_stop == 0 else "disk"
        for result in results:
            assert (result["start_step"], result["source"]) == (previous_stop, expected_source)
            assert (result["final_step"], result["world_size"]) == (stop_at, world)
        runs.append(results)
        previous_stop = stop_at

    order = ElasticSampler(DATASET_LEN, GLOBAL_BATCH, seed=SEED).order(0)
    consumed: list[int] = []
    losses: dict[int, float] = {}
    for results in runs:
        steps = [record["step"] for record in results[0]["records"]]
        for position, step in enumerate(steps):
            shares = [result["records"][position] for result in results]
            assert {share["step"] for share in shares} == {step}
            batch = [index for share in shares for index in share["indices"]]
            assert len(batch) == GLOBAL_BATCH, f"global batch changed at step {step}"
            assert batch == order[(step - 1) * GLOBAL_BATCH : step * GLOBAL_BATCH]
            assert len({share["loss"] for share in shares}) == 1, "ranks disagree on the loss"
            consumed.extend(batch)
            losses[step] = shares[0]["loss"]

    last_step = PHASES[-1][1]
    assert len(consumed) == len(set(consumed)), "a sample was repeated"
    assert consumed == order[: last_step * GLOBAL_BATCH], "a sample was skipped"

    reference = reference_losses(last_step)
    assert reference[-1] < 0.8 * reference[0], "the model does not learn: the comparison would be weak"
    for step in range(1, last_step + 1):
        assert abs(losses[step] - reference[step - 1]) <= 1e-9 * abs(reference[step - 1]), (
            f"step {step}: loss {losses[step]} differs from the uninterrupted run's {reference[step - 1]}"
        )
    largest_move = max(abs(b - a) for a, b in itertools.pairwise(reference))
    for _, resumed_after, _ in PHASES[:-1]:
        jump = abs(losses[resumed_after + 1] - losses[resumed_after])
        assert jump <= largest_move * 1.001, f"the loss jumps after resuming at step {resumed_after}"
