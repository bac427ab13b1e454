"""The rendezvous-at-scale benchmark: emulated launchers form and re-form a real group through the job's gated
store (the launcher's own rendezvous client), the bytes come from the store process, and projections are
labelled as such."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from phalanx.bench import emulated_launchers, rendezvous_scale, rounds_pool


def test_a_power_law_is_fitted_on_logarithms_and_projected() -> None:
    fit = rendezvous_scale.power_law([(8, 0.5), (64, 32.0), (512, 2048.0)])
    assert fit is not None
    scale, exponent = fit
    assert math.isclose(exponent, 2.0) and math.isclose(scale, 0.5 / 64)
    assert math.isclose(rendezvous_scale.projected(fit, 12_500) or 0, 0.5 / 64 * 12_500**2)
    assert rendezvous_scale.power_law([(8, 1.0)]) is None
    assert rendezvous_scale.power_law([(8, 1.0), (8, 2.0)]) is None
    assert rendezvous_scale.projected(None, 12_500) is None


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    secret_file = tmp_path / "secret"
    secret_file.write_text("s" * 64)
    process, port = rendezvous_scale.start_store(secret_file)
    try:
        yield process, port, secret_file
    finally:
        process.terminate()
        process.wait(30)


def test_emulated_launchers_form_and_re_form_a_group_through_the_gated_store(store) -> None:  # type: ignore[no-untyped-def]
    process, port, secret_file = store
    report = emulated_launchers.emulate(
        nodes=3,
        reforms=2,
        endpoint=f"127.0.0.1:{port}",
        secret_file=str(secret_file),
        store_pid=process.pid,
        timeout=120,
        keepalive=(1.0, 5.0),
    )
    assert "error" not in report, report
    formation, *reforms = report["phases"]
    assert formation["name"] == "formation" and formation["world_sizes"] == [3]
    assert [phase["name"] for phase in reforms] == ["re-form 1", "re-form 2"]
    rounds = [phase["rounds"] for phase in report["phases"]]
    # Every member came back from the same round, one round later each time, the group whole again.
    assert rounds == [[0], [1], [2]], rounds
    for phase in report["phases"]:
        assert phase["seconds"] > 0 and phase["world_sizes"] == [3] and not phase["failures"]
        # The rendezvous state crossed the store's gate: bytes counted at the store process.
        assert phase["store_bytes"] > 1000


@pytest.mark.parametrize(("nodes", "processes"), [(4, 1), (7, 3)])
def test_store_rounds_re_form_through_the_gated_store_with_the_spare_in_place(  # type: ignore[no-untyped-def]
    store, nodes: int, processes: int
) -> None:
    """With `--processes 3` the members live in three forked processes: each phase is timed to the last of them,
    and the spare stands in one of them and takes the dead member's place."""
    process, port, secret_file = store
    report = rounds_pool.emulate(
        nodes=nodes,
        reforms=2,
        processes=processes,
        endpoint=f"127.0.0.1:{port}",
        secret_file=str(secret_file),
        store_pid=process.pid,
        timeout=60,
    )
    assert "error" not in report, report
    assert [phase["rounds"] for phase in report["phases"]] == [[1], [2], [3]]
    for phase in report["phases"]:
        # The spare's seat is among the results: the group is whole again at every round.
        assert phase["world_sizes"] == [nodes] and not phase["failures"] and phase["seconds"] > 0
        assert phase["store_bytes"] > 100 and phase["members_cpu_seconds"] is not None


def test_the_result_keeps_every_variant_s_reports_and_why_each_stopped() -> None:
    """So that one variant measured again can be set beside the others' stored figures."""

    def size(nodes: int, seconds: float) -> dict[str, object]:
        phase = {
            "seconds": seconds,
            "store_bytes": 1000 * nodes,
            "members_cpu_seconds": 0.5,
            "store_cpu_seconds": 0.1,
        }
        return {"nodes": nodes, "phases": [{"name": "formation", **phase}, {"name": "re-form 1", **phase}]}

    reports = {"c10d": [size(8, 0.4)], "rounds": [size(8, 0.01), size(64, 0.05)], "rounds-ungated": []}
    stopped = {"c10d": "c10d: N = 16 was not carried: timed out", "rounds": "", "rounds-ungated": ""}
    result = rendezvous_scale.result_of(reports, stopped)
    assert result.details["sizes"] == reports and result.details["stopped"] == stopped
    assert result.notes[0].startswith("c10d: N = 16 was not carried")
    names = {metric.name for metric in result.metrics}
    assert {"re-form, N=8", "store rounds: re-form, N=64"} <= names
