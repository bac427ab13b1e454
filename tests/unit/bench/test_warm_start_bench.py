"""The warm-start benchmark measures both paths in one run: a fork is ready without importing anything."""

from __future__ import annotations

from phalanx.bench import warm_start


def test_both_paths_are_measured_and_a_fork_imports_nothing() -> None:
    figures = warm_start.measure(forks=3, new=1)
    assert len(figures["fork"]) == 3 and len(figures["new"]) == 1
    (new,) = figures["new"]
    # A new interpreter imports torch itself; a fork already holds it.
    assert new["cpu_s"] > 0.5
    assert all(fork["cpu_s"] < new["cpu_s"] / 5 for fork in figures["fork"])
    assert all(fork["ready_s"] < new["ready_s"] for fork in figures["fork"])
    assert all(0 < fork["pss_mb"] < new["pss_mb"] for fork in figures["fork"])
