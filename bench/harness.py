"""Runs the selected benchmarks and writes the report (`phalanx bench`, `make bench`).

Each benchmark gets a `Context`: scratch folders, and the local cluster, started on first use in a
temporary state dir (or the one given with --state-dir, which is left running) with the operator installed
by Helm. A benchmark that fails is reported with its error; the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from phalanx.bench import machine as machine_probe
from phalanx.bench import registry, report
from phalanx.bench.cluster import BenchCluster
from phalanx.bench.core import BenchResult


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Context:
    """What a benchmark may use: scratch space and the local cluster (started lazily)."""

    workdir: Path
    quick: bool
    state_dir: Path | None = None
    device: str = "cpu"
    """Where benchmarks that can use an accelerator put the state (`--device`)."""
    log: Callable[[str], None] = log
    _cluster: BenchCluster | None = field(default=None, init=False)

    def scratch(self, name: str) -> Path:
        """An empty folder of this run, removed at the end."""
        path = self.workdir / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def cluster(self) -> BenchCluster:
        """The local cluster with the operator running."""
        if self._cluster is None:
            self._cluster = BenchCluster.start(self.state_dir, self.workdir, self.log)
        self._cluster.ensure_operator()
        return self._cluster

    def describe_cluster(self) -> dict[str, object]:
        if self._cluster is None:
            return {}
        with contextlib.suppress(Exception):
            return self._cluster.describe()
        return {}

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def git_commit(package: Path | None = None) -> str:
    """The commit of the code being measured: that of the git checkout the running phalanx package (or
    `package`) lives in, as with an editable install; "" for an installed wheel, or where git is missing."""
    package = package or Path(str(resources.files("phalanx"))).resolve()
    try:
        result = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def run_one(entry: registry.Entry, context: Context, quick: bool) -> BenchResult:
    """Run one benchmark; its exception becomes the result's error."""
    context.log(f"{entry.name}: {entry.summary} ({'quick' if quick else 'full'})")
    load_before = machine_probe.load_average()
    started_at, started = utc_now(), time.monotonic()
    try:
        result = entry.load().run(context, quick)
    except Exception:
        result = BenchResult(name=entry.name, title=entry.summary, error=traceback.format_exc())
        context.log(f"{entry.name} failed:\n{result.error}")
    result = result.model_copy(
        update={
            "name": entry.name,
            "quick": quick,
            "started_at": started_at,
            "seconds": round(time.monotonic() - started, 1),
            "load_before": load_before,
            "load_after": machine_probe.load_average(),
        }
    )
    context.log(f"{entry.name}: done in {result.seconds:.0f} s" + (" (failed)" if result.error else ""))
    return result


def previous_run(out: Path) -> report.Run | None:
    try:
        return report.from_json((out / report.RESULTS_FILE).read_text())
    except (OSError, ValueError):
        return None


def run_benchmarks(
    entries: list[registry.Entry],
    *,
    quick: bool,
    out: Path,
    state_dir: Path | None = None,
    keep_others: bool = False,
    command: str = "",
    device: str = "cpu",
) -> report.Run:
    """Run `entries`, write results.json, report.md and plots into `out` (after each benchmark, too)."""
    out.mkdir(parents=True, exist_ok=True)
    previous = previous_run(out) if keep_others else None
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-bench-", dir=os.environ.get("PHALANX_BENCH_DIR")))
    context = Context(workdir=workdir, quick=quick, state_dir=state_dir, device=device)
    log(f"measuring the machine (scratch {workdir})")
    run = report.Run(
        started_at=utc_now(),
        command=command,
        quick=quick,
        commit=git_commit(),
        machine=machine_probe.measure(workdir / "probe", quick),
    )
    try:
        for entry in entries:
            run.results.append(run_one(entry, context, quick))
            run.cluster = context.describe_cluster() or run.cluster
            report.write(report.merge(previous, run), out)
    finally:
        context.close()
        shutil.rmtree(workdir, ignore_errors=True)
    final = report.merge(previous, run)
    report.write(final, out)
    log(f"report written to {out / report.REPORT_FILE}")
    return final


def main(args: argparse.Namespace) -> int:
    """Handler of `phalanx bench` (arguments from `phalanx.bench.cli`)."""
    from phalanx.errors import UserFacingError

    if getattr(args, "list", False):
        for entry in registry.BENCHMARKS:
            print(f"{entry.name:<18} {'cluster' if entry.needs_cluster else 'local  '}  {entry.summary}")
        return 0
    only = list(getattr(args, "only", None) or [])
    try:
        entries = registry.select(only)
    except ValueError as error:
        raise UserFacingError(str(error)) from None
    out = Path(args.out)
    run = run_benchmarks(
        entries,
        quick=bool(getattr(args, "quick", False)),
        out=out,
        state_dir=getattr(args, "state_dir", None),
        keep_others=bool(only) and not getattr(args, "fresh", False),
        device=getattr(args, "device", "cpu"),
        command="phalanx bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
    )
    print((out / report.REPORT_FILE).read_text())
    failed = [
        result.name for result in run.results if result.error and result.name in {e.name for e in entries}
    ]
    if failed:
        print(f"phalanx bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
