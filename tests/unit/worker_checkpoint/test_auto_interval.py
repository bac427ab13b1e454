"""The automatic checkpoint interval in the Checkpointer: ranks agree on every durable step, a fixed interval
is untouched."""

from __future__ import annotations

from pathlib import Path

from helpers import advance_to, build_state, run_ranks

from phalanx.worker import Checkpointer
from phalanx.worker.autointerval import BOOTSTRAP_STEPS


class Offer:
    """What a launcher's file holds: the interval a rank-0 Checkpointer reads (None: no file yet)."""

    def __init__(self, value: int | None = None) -> None:
        self.value = value

    def __call__(self) -> int | None:
        return self.value


def durable_steps(
    ckpt: Checkpointer, steps: int, offer: Offer | None = None, changes: dict[int, int] | None = None
) -> list[int]:
    """Train `steps` steps; the steps where a durable save happened. `changes`: after step -> the value
    `offer` holds from then on."""
    taken = []
    for step in range(1, steps + 1):
        advance_to(ckpt.state, step)
        before = ckpt.stats["durable_saves_total"]
        ckpt.save(step)
        if ckpt.stats["durable_saves_total"] > before:
            taken.append(step)
        if offer is not None and changes and step in changes:
            offer.value = changes[step]
    return taken


def test_a_fixed_interval_saves_at_its_multiples_as_always(workdir: Path) -> None:
    ckpt = Checkpointer(build_state(), workdir / "ckpt", interval_steps=4, interval_source=lambda: 99)
    assert not ckpt.auto
    assert durable_steps(ckpt, 13) == [4, 8, 12]
    assert ckpt.interval_steps == 4
    ckpt.load()
    ckpt.close()


def test_auto_starts_at_the_bootstrap_interval_and_follows_the_source_at_durable_saves(workdir: Path) -> None:
    offer = Offer()
    ckpt = Checkpointer(build_state(), workdir / "ckpt", interval_steps="auto", interval_source=offer)
    assert ckpt.auto and ckpt.interval_steps == BOOTSTRAP_STEPS
    assert ckpt.save_seconds is None
    # Nothing offered: the bootstrap interval; 4 offered from step 12 on: taken at the next durable save (20).
    taken = durable_steps(ckpt, 30, offer, changes={12: 4})
    assert taken == [10, 20, 24, 28]
    assert ckpt.interval_steps == 4 and ckpt.next_durable_step == 32
    assert ckpt.save_seconds is not None and ckpt.save_seconds >= 0
    assert ckpt.stats["last_durable_save_step"] == 28
    # A forced save counts as a durable one: the interval runs on from it.
    ckpt.save(30, force_durable=True)
    assert ckpt.next_durable_step == 34
    ckpt.close()


def test_ranks_switch_interval_at_the_same_step_whatever_their_own_files_say(workdir: Path) -> None:
    # Each pod's launcher writes its own file; they disagree (and one has none). Rank 0's word counts.
    (workdir / "interval-0").write_text("3\n")
    (workdir / "interval-1").write_text("5\n")
    # Each process plays one pod: its own snapshot folder.
    pods = [{"PHALANX_SNAPSHOT_DIR": str(workdir / f"pod-{rank}"), "LOCAL_RANK": "0"} for rank in range(3)]
    results = run_ranks(
        "auto_interval", 3, workdir, pods, extra={"steps": 30, "change_at": 8, "new_interval": 7}
    )
    expected = [3, 6, 9, 16, 23, 30]
    for result in results:
        assert result["durable"] == expected, results
        assert result["intervals"] == [3, 3, 7, 7, 7, 7], results
        # A restore agrees again: the restored step plus rank 0's interval.
        assert result["restored"] == 30 and result["next_after_restore"] == 37, results
        assert result["save_seconds"] is not None and result["save_seconds"] >= 0
