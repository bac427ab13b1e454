"""Peers beside Phalanx: the replicas' step lines, a kill's outcome, the saves' result, the ratios' rows."""

from __future__ import annotations

import json

import pytest

from phalanx.bench import peer_dlrover, peer_torchft, peers, report
from phalanx.bench.core import Baseline, BenchResult, Metric, Versus
from phalanx.bench.peers import StepLine

from .test_bench_report import machine

NOW = "2026-01-01T10:00:00+00:00"


def test_step_lines_parse_and_anything_else_is_ignored() -> None:
    assert peers.parse_step("STEP 12 1795600930.5 3 1\n") == StepLine(12, 1795600930.5, 3, True)
    assert peers.parse_step("STEP 12 1795600930 2 0") == StepLine(12, 1795600930.0, 2, False)
    assert peers.parse_step("2026-11-25T10:02:29 [INFO] [torchft::manager] STEP 1") is None
    assert peers.parse_step("STEP twelve 1.0 3 1") is None
    assert peers.parse_step("STEP 1 1.0 3 2") is None


def test_lighthouse_address_from_its_log() -> None:
    log = "2026-11-25T10:01:47.044 [INFO] [torchft::lighthouse] - Lighthouse listening on: http://vm:44613\n"
    assert peers.lighthouse_address(log) == "http://vm:44613"
    assert peers.lighthouse_address("starting\n") is None


def steps(*lines: tuple[int, float, int, int]) -> list[StepLine]:
    return [
        StepLine(step, time, participants, bool(committed)) for step, time, participants, committed in lines
    ]


def test_recovery_is_the_first_commit_in_a_quorum_without_the_victim() -> None:
    survivors = {
        # a step already past its allreduce commits in the old quorum just after the kill: not a recovery
        "a": steps((10, 99.0, 3, 1), (11, 100.1, 3, 1), (11, 103.0, 3, 0), (12, 105.2, 2, 1)),
        "b": steps((10, 99.0, 3, 1), (11, 100.2, 3, 1), (12, 105.4, 2, 1)),
    }
    outcome = peers.kill_outcome(100.0, 3, survivors)
    assert outcome is not None
    assert outcome.seconds == pytest.approx(5.4)  # the slower survivor decides
    assert outcome.steps_lost == 0
    assert outcome.discarded == 1


def test_steps_lost_when_a_survivor_goes_back() -> None:
    survivors = {
        "a": steps((20, 99.0, 3, 1), (18, 104.0, 2, 1)),
        "b": steps((20, 99.0, 3, 1), (21, 104.0, 2, 1)),
    }
    outcome = peers.kill_outcome(100.0, 3, survivors)
    assert outcome is not None
    assert outcome.steps_lost == 3  # step 20 committed before, 18 the first after: 18, 19 and 20 again


def test_no_outcome_until_every_survivor_recovered() -> None:
    one_recovered = {"a": steps((5, 101.0, 2, 1)), "b": steps((5, 100.5, 3, 1))}
    assert peers.kill_outcome(100.0, 3, one_recovered) is None
    assert peers.kill_outcome(100.0, 3, {}) is None


def test_ratios() -> None:
    assert peers.ratio(5.0, 2.0) == 2.5
    assert peers.ratio(5.0, 0.0) is None
    assert peers.ratio(None, 2.0) is None
    assert peers.ratio_text(5.0, 2.0) == "2.5x"
    assert peers.ratio_text(0.0, 0.0) == "both 0"
    assert peers.ratio_text(2.0, 0.0) == "Phalanx 0, peer 2"
    assert peers.ratio_text(None, 1.0) == "-"


def saves_line(**figures: object) -> str:
    return "RESULT " + json.dumps(figures)


def test_saves_result_is_the_last_result_line() -> None:
    output = "log line\n" + saves_line(stall_s=[0.01, 0.02], persist_s=[0.1, 0.2], system="dlrover") + "\n"
    found = peers.parse_saves(output)
    assert found is not None and found["stall_s"] == [0.01, 0.02] and found["system"] == "dlrover"
    assert peers.parse_saves("Traceback ...\nImportError: no grpc\n") is None
    assert peers.parse_saves("RESULT {not json") is None
    assert peers.parse_saves(saves_line(stall_s=[0.01], persist_s="soon")) is None
    assert peers.parse_saves(saves_line(stall_s=[0.01])) is None


def test_a_failed_saves_run_names_its_cause_not_the_destructor_noise_after_it() -> None:
    output = "ERROR TimeoutError: Timed out waiting for socket server: factory.\n"
    assert peers.saves_error(output) == "TimeoutError: Timed out waiting for socket server: factory."
    assert peers.saves_error(saves_line(stall_s=[0.01], persist_s=[0.1])) == ""


def test_a_peer_without_samples_but_no_reason_points_to_the_notes() -> None:
    result = torchft([])
    assert (
        peers.comparison_rows([recovery(), result], NOW)[0].ratio
        == "no peer samples (its failures are in the notes)"
    )


def recovery(started_at: str = NOW, hot_spare: list[float] | None = None) -> BenchResult:
    return BenchResult(
        name="recovery",
        title="Recovery",
        started_at=started_at,
        metrics=[
            Metric(name="hot-spare: kill -> first step", unit="s", samples=hot_spare or [2.0, 2.5, 3.0]),
            Metric(name="hot-spare: steps lost", unit="count", samples=[0.0, 1.0]),
        ],
    )


def torchft(samples: list[float], details: dict[str, object] | None = None) -> BenchResult:
    return BenchResult(
        name="peer-torchft",
        title="torchft",
        started_at=NOW,
        metrics=[
            Metric(
                name="torchft: kill -> next committed step",
                unit="s",
                samples=samples,
                baseline=Baseline(text="published: Ray+torchft ~5 s", value=5.0),
                versus=Versus(benchmark="recovery", metric="hot-spare: kill -> first step"),
            ),
            Metric(
                name="torchft: steps lost",
                unit="count",
                samples=[0.0] * len(samples),
                versus=Versus(benchmark="recovery", metric="hot-spare: steps lost", stat="max"),
            ),
        ],
        details=details or {},
    )


def test_ratio_to_phalanx_from_the_same_invocation() -> None:
    rows = peers.comparison_rows([recovery(), torchft([5.0, 5.1, 5.2])], NOW)
    assert [row.metric for row in rows] == ["torchft: kill -> next committed step", "torchft: steps lost"]
    assert rows[0].peer == "5.1 s" and rows[0].phalanx == "2.5 s"
    assert rows[0].ratio == "2.04x"
    assert rows[0].published == "published: Ray+torchft ~5 s"
    assert rows[1].ratio == "0x"  # compared on the max: Phalanx lost one step, torchft none


def test_no_ratio_when_recovery_ran_in_another_invocation_or_not_at_all() -> None:
    older = recovery(started_at="2025-12-31T23:00:00+00:00")
    assert (
        peers.comparison_rows([older, torchft([5.0])], NOW)[0].ratio == "recovery not run in this invocation"
    )
    assert peers.comparison_rows([torchft([5.0])], NOW)[0].ratio == "recovery not run in this invocation"
    failed = recovery().model_copy(update={"error": "Traceback\nRuntimeError: no cluster"})
    assert (
        peers.comparison_rows([failed, torchft([5.0])], NOW)[0].ratio
        == "recovery did not finish in this invocation"
    )


def test_a_peer_that_could_not_run_says_why_beside_its_published_number() -> None:
    reason = "torchft 0.2.0: import torchft: ImportError: libtorch_python.so: undefined symbol"
    rows = peers.comparison_rows([recovery(), torchft([], {"unavailable": reason})], NOW)
    assert rows[0].peer == "-"
    assert rows[0].ratio == f"peer could not run here: {reason}"
    assert rows[0].published == "published: Ray+torchft ~5 s"


def test_report_has_the_peers_table_after_the_summary() -> None:
    run = report.Run(
        started_at=NOW,
        command="phalanx bench",
        quick=True,
        machine=machine(),
        results=[recovery(), torchft([6.0])],
    )
    text = report.render_markdown(run)
    assert text.index("## Summary") < text.index("## Peers, measured") < text.index("## Targets missed")
    assert (
        "| peer-torchft | torchft: kill -> next committed step | 6 s | recovery / hot-spare: kill -> first step (p50) | 2.5 s | 2.4x |"
        in text
    )
    assert "## Peers, measured" not in report.render_markdown(
        run.model_copy(update={"results": [recovery()]})
    )


def test_peer_metrics_compare_with_metrics_that_exist() -> None:
    """Every peer metric names a Phalanx metric its benchmark really produces (here: DLRover's own)."""
    figures = {"stall_s": [0.01], "persist_s": [0.1]}
    found = peer_dlrover.metrics([10], {10: figures}, {10: figures})
    names = {metric.name for metric in found}
    compared = [metric for metric in found if metric.versus is not None]
    assert len(compared) == 2
    assert all(metric.versus.metric in names for metric in compared if metric.versus)
    result = BenchResult(name=peer_dlrover.NAME, title="", started_at=NOW, metrics=found)
    assert [row.ratio for row in peers.comparison_rows([result], NOW)] == ["1x", "1x"]
    torchft_versus = [metric.versus for metric in peer_torchft.metrics([]) if metric.versus]
    assert {versus.metric for versus in torchft_versus} == {
        "hot-spare: kill -> first step",
        "hot-spare: steps lost",
    }


def test_an_unavailable_torchft_keeps_its_published_figures() -> None:
    result = peer_torchft.unavailable_result("torchft 0.2.0: lighthouse listening: not within 30 s", [])
    assert result.error is None  # the bench goes on and does not fail
    assert peers.unavailable(result) == "torchft 0.2.0: lighthouse listening: not within 30 s"
    assert all(not metric.samples for metric in result.metrics)
    assert result.metric("torchft: kill -> next committed step").baseline == peers.TORCHFT_PUBLISHED
    assert any("could not run here" in note for note in result.notes)
