"""`phalanx bench`: run the benchmarks against a local cluster and write the report."""

from __future__ import annotations

import argparse
from pathlib import Path

from phalanx.bench import registry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run the benchmarks (report.md, results.json, plots)",
        description="Runs the benchmarks (every one, or those named with --only) and writes report.md, "
        "results.json and one PNG per benchmark. Cluster benchmarks start a local cluster in a temporary "
        "state dir and stop it at the end, unless --state-dir names one to reuse (left running). "
        f"Benchmarks: {', '.join(registry.names())}.",
    )
    parser.add_argument("--quick", action="store_true", help="smoke mode: small sizes, few repeats")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="folder for the report (default: %(default)s in the working directory; `make bench`: bench/results)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="use (or start) the local cluster in this state dir"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with --only: drop the other benchmarks' results from the report instead of keeping them",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where checkpoint-stall keeps the state: cuda measures snapshots and restores against the pinned "
        "copies of a GPU (1, 8 and 32 GiB)",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from phalanx.bench import harness

    return harness.main(args)
