"""The report: Markdown with the machine, every metric's p50/p95/max, targets missed, timeouts; JSON; plots."""

from __future__ import annotations

from pathlib import Path

from phalanx.bench import report
from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout
from phalanx.bench.machine import Machine


def machine() -> Machine:
    return Machine(
        cpus=2,
        cpu_model="Test CPU",
        memory_gib=16.0,
        memory_available_gib=12.0,
        memcpy_gb_per_s=9.5,
        memcpy_median_gb_per_s=8.1,
        fsync_ms_p50=0.2,
        fsync_ms_p95=0.9,
        fsync_ms_max=1.5,
        cpu_busy_percent=60.0,
        load_average=[3.5, 2.0, 1.0],
        python="3.11.7",
        torch="2.13.0",
        kernel="6.1",
    )


def gang_result() -> BenchResult:
    return BenchResult(
        name="gang-creation",
        title="Gang creation at scale",
        quick=True,
        started_at="2026-01-01T00:00:00+00:00",
        seconds=42.0,
        metrics=[
            Metric(
                name="pods created per second",
                unit="pods/s",
                samples=[62.0],
                target=Target(op=">=", value=100),
                baseline=Baseline(text="Volcano ~42 pods/s", value=42),
            ),
            Metric(name="time to Running", unit="s", samples=[1.0, 2.0, 3.0, 9.0]),
        ],
        timeouts=[
            Timeout(name="gang schedule timeout", seconds=30, source="spec.gang.scheduleTimeoutSeconds")
        ],
        notes=["one short: the gang never started"],
        series=[Series(name="created", x=[0.0, 1.0], y=[1.0, 2.0], chart="pods")],
        load_before=[3.0, 2.0, 1.0],
        load_after=[4.0, 2.5, 1.2],
    )


def a_run(*results: BenchResult) -> report.Run:
    return report.Run(
        started_at="2026-01-01T00:00:00+00:00",
        command="phalanx bench --quick",
        quick=True,
        machine=machine(),
        cluster={"nodes": "3 agent nodes, 5 simulated"},
        results=list(results),
    )


def test_markdown_has_machine_summary_misses_timeouts_and_plot() -> None:
    failed = BenchResult(
        name="rerendezvous", title="Re-rendezvous", error="Traceback ...\nBenchError: no pods\n"
    )
    text = report.render_markdown(a_run(gang_result(), failed))
    assert "| 2 (Test CPU) | 16.0 GiB (12.0 GiB available) | 9.5 / 8.1 GB/s | 0.2 / 0.9 / 1.5 ms |" in text
    assert "3.50 / 2.00 / 1.00" in text
    summary_row = next(
        line for line in text.splitlines() if line.startswith("| gang-creation | pods created")
    )
    assert "| 62 pods/s | 62 pods/s | 62 pods/s | p50 >= 100 pods/s | Volcano ~42 pods/s |" in summary_row
    assert "missed by 38 pods/s" in summary_row
    assert "- gang-creation / pods created per second: missed by 38 pods/s" in text
    assert "- rerendezvous: did not finish (BenchError: no pods)" in text
    assert "| gang schedule timeout | 30 | spec.gang.scheduleTimeoutSeconds |" in text
    assert "| time to Running | 4 | 2.5 s | 8.1 s | 8.82 s | 9 s |" in text
    assert "![gang-creation](gang-creation.png)" in text
    assert "- one short: the gang never started" in text


def test_a_missed_target_says_why_when_the_benchmark_knows() -> None:
    result = gang_result()
    result.metrics[0].samples = [50.0]
    result.metrics[0].why_missed = "the apiserver shares two cores with everything else"
    text = report.render_markdown(a_run(result))
    missed = text.split("## Targets missed", 1)[1].split("\n## ", 1)[0]
    assert "Why: the apiserver shares two cores with everything else" in missed
    # Met: no explanation shown.
    result.metrics[0].samples = [150.0]
    assert "Why:" not in report.render_markdown(a_run(result))


def test_nothing_missed_says_none() -> None:
    result = gang_result()
    result.metrics[0].samples = [150.0]
    text = report.render_markdown(a_run(result))
    assert "## Targets missed\n\nNone." in text


def test_json_round_trip_and_merge_keeps_other_benchmarks() -> None:
    first = a_run(gang_result(), BenchResult(name="kill-during-save", title="Kill"))
    again = report.from_json(report.to_json(first))
    assert again == first
    newer = gang_result().model_copy(update={"seconds": 7.0})
    merged = report.merge(first, a_run(newer))
    assert [result.name for result in merged.results] == ["kill-during-save", "gang-creation"]
    assert merged.results[1].seconds == 7.0
    assert report.merge(None, first) is first


def test_write_puts_json_markdown_and_a_png_per_benchmark(tmp_path: Path) -> None:
    flat = BenchResult(
        name="flat", title="Only single numbers", metrics=[Metric(name="one", unit="s", samples=[1])]
    )
    written = report.write(a_run(gang_result(), flat), tmp_path)
    assert {path.name for path in written} == {"results.json", "report.md", "gang-creation.png"}
    assert (tmp_path / "gang-creation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![flat]" not in (tmp_path / "report.md").read_text()


def test_json_figures_keep_six_digits_and_unix_times_their_milliseconds() -> None:
    assert report.rounded(1795500123.456789) == 1795500123.457
    assert report.rounded(0.000123456789) == 0.000123457
    assert report.rounded(12.3456789) == 12.3457
    assert report.rounded({"a": [2.0, float("inf"), 0.0]}) == {"a": [2.0, float("inf"), 0.0]}
