"""The report's section on the seeds' scale: one row per job size from the scale benchmarks of the same report."""

from __future__ import annotations

from phalanx.bench import seedscale
from phalanx.bench.core import BenchResult, Metric


def _metric(name: str, unit: str, *samples: float) -> Metric:
    return Metric(name=name, unit=unit, samples=list(samples))


def test_one_row_per_size_from_both_benchmarks_with_the_envelope_beside() -> None:
    scale = BenchResult(
        name="scale",
        title="scale",
        metrics=[
            _metric("API writes/s in all, N=8", "writes/s", 80.0),
            _metric("API writes/s in all, N=512", "writes/s", 56.0),
            _metric("silent worker found past the timeout, N=512", "s", 0.4, 0.5, 0.9),
            _metric("gang bound, N=512", "s", 38.0),
            _metric("operator RSS, N=512", "MB"),  # no sample: not shown
        ],
    )
    rendezvous = BenchResult(
        name="rendezvous-scale",
        title="rendezvous-scale",
        metrics=[
            _metric("re-form, N=8", "s", 0.5),
            _metric("store rounds: re-form, N=512", "s", 0.32),
            _metric("store rounds without the gate: re-form, N=12500", "s", 6.1),
            _metric("formation", "s", 1.0),  # no size: not a row
        ],
    )
    lines = seedscale.section_lines([scale, rendezvous])
    assert lines[0] == "## At the seeds' scale"
    table = [line for line in lines if line.startswith("| ")]
    header, _, *rows = table
    assert "operator RSS" not in header and "re-form, torch's c10d" in header
    assert [row.split(" | ")[0] for row in rows] == ["| 8 (64)", "| 512 (4,096)", "| 12,500 (100,000)"]
    (row_512,) = [row for row in rows if row.startswith("| 512 ")]
    assert "0.5 s (0.9 s max)" in row_512 and "38 s" in row_512 and "0.32 s" in row_512
    assert any(line.startswith("- Kubernetes' scalability envelope") for line in lines)
    assert any("torchelastic" in line for line in lines)


def test_no_section_without_sized_results() -> None:
    other = BenchResult(name="recovery", title="recovery", metrics=[_metric("kill -> first step", "s", 0.8)])
    assert seedscale.section_lines([other]) == []
