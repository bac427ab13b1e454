"""Rendezvous at scale: a group of N launchers formed, then re-formed after one member's death with a hot
spare taking its place, at N = 8, 64, 512 and on towards 12,500 (100,000 GPUs at 8 per pod).

Part of ``phalanx bench`` (``--only rendezvous-scale``). The job's store runs as in its rendezvous pod
(``python -m phalanx.worker.rendezvous`` behind the job's gate, with a secret); N emulated launchers
(``phalanx.bench.emulated_launchers``: the launcher's own rendezvous client, one thread each, in one process of
their own) form the group, then one member dies N times over (its keep-alives stop, the operator's regroup
expires its node) and every survivor re-enters the rendezvous beside the waiting spare. Measured per size:
the time to form, the time to re-form (from the death to the last member's return) and the bytes the store
process moved for it. This is today's path: torch's dynamic rendezvous (c10d), whose one pickled state is
read and rewritten by every member, so the bytes per re-form grow with the square of the members. Sizes run
until one fails to finish within its budget; the report says which and why, and projects the larger sizes
from the measured slope, labelled as a projection.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAME = "rendezvous-scale"
TITLE = "Rendezvous at scale: form and re-form after a death, N = 8 to 12,500 members"

SIZES = (8, 16, 32, 64, 512, 12_500)
QUICK_SIZES = (8, 16)
REFORMS, QUICK_REFORMS, LARGE_REFORMS = 5, 2, 2
"""Re-forms per size: fewer at 512 and beyond, where one takes minutes."""
LARGE = 512
RENDEZVOUS_TIMEOUT = 300.0
"""Seconds one formation or re-form may take before the size counts as not carried."""
KEEPALIVE = (1.0, 5.0)
"""The launchers' rendezvous keep-alive interval and timeout (the launcher's defaults, worker/env.py)."""
STORE_START_TIMEOUT = 30.0
TARGETS = {512: 3.0, 12_500: 10.0}
PROJECTED = tuple(TARGETS)
"""The sizes the issue bounds: projected from the measured slope where this machine did not carry them."""
"""The issue's bound on the p50 re-form time at that size, seconds."""
TORCHELASTIC_PUBLISHED = "torchelastic's own figure for its c10d rendezvous: about 10 s at 4,000 hosts"


def start_store(secret_file: Path) -> tuple[subprocess.Popen[str], int]:
    """The job's store as its rendezvous pod runs it, behind the gate; (process, port)."""
    from phalanx.worker import rendezvous

    env = {**os.environ, rendezvous.SECRET_FILE_ENV: str(secret_file)}
    process = subprocess.Popen(
        [sys.executable, "-m", "phalanx.worker.rendezvous", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + STORE_START_TIMEOUT
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith(rendezvous.READY_PREFIX):
            port = int(line.split("port=")[1].split()[0])
            return process, port
    process.kill()
    raise RuntimeError("the rendezvous store did not start")


def run_size(nodes: int, reforms: int, port: int, secret_file: Path, store_pid: int) -> dict[str, Any]:
    """One size in a driver process of its own; its JSON report, or why there is none."""
    budget = RENDEZVOUS_TIMEOUT * (reforms + 1) + 120 + nodes * 0.2
    command = [
        sys.executable, "-m", "phalanx.bench.emulated_launchers", "--nodes", str(nodes),
        "--reforms", str(reforms), "--endpoint", f"127.0.0.1:{port}", "--secret-file", str(secret_file),
        "--store-pid", str(store_pid), "--timeout", str(RENDEZVOUS_TIMEOUT),
        "--keepalive", *(str(value) for value in KEEPALIVE),
    ]  # fmt: skip
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=budget, check=False)
    except subprocess.TimeoutExpired:
        return {"nodes": nodes, "error": f"the driver ran past its budget of {budget:.0f} s", "phases": []}
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        return {
            "nodes": nodes,
            "error": f"the driver exited {result.returncode}: {' / '.join(tail)}",
            "phases": [],
        }
    report: dict[str, Any] = json.loads(lines[-1])
    report["driver_seconds"] = time.monotonic() - started
    return report


def reform_phases(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [phase for phase in report["phases"] if phase["name"].startswith("re-form")]


def completed(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [phase for phase in phases if phase["seconds"] is not None]


def power_law(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(a, b) of y = a * x**b fitted by least squares on logarithms; None with fewer than two points."""
    usable = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in usable}) < 2:
        return None
    count = len(usable)
    mean_x = sum(x for x, _ in usable) / count
    mean_y = sum(y for _, y in usable) / count
    slope = sum((x - mean_x) * (y - mean_y) for x, y in usable) / sum((x - mean_x) ** 2 for x, _ in usable)
    return math.exp(mean_y - slope * mean_x), slope


def projected(fit: tuple[float, float] | None, x: float) -> float | None:
    return None if fit is None else fit[0] * x ** fit[1]


def emulation_limit(report: dict[str, Any]) -> str:
    """What the phase that did not finish says of its limit: the members' CPU against the cores, the store's."""
    phases = report.get("phases") or []
    if not phases or phases[-1].get("members_cpu_seconds") is None:
        return ""
    last = phases[-1]
    cores = os.cpu_count() or 1
    wall = RENDEZVOUS_TIMEOUT
    return (
        f" Over its {wall:.0f} s the emulated members used {last['members_cpu_seconds']:.0f} CPU-s and the store "
        f"{last['store_cpu_seconds']:.0f} CPU-s, of {cores * wall:.0f} the machine's {cores} cores had, and "
        f"{last['store_bytes'] / 1e6:.0f} MB passed the store: every member re-reads and unpickles the whole "
        "state at each poll, so the members' CPU grows with the square of N, and here all of it lands on one "
        "machine"
    )


def run(context: Any, quick: bool) -> Any:
    """Harness entry point (`phalanx bench --only rendezvous-scale`)."""
    from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout, percentile

    sizes = QUICK_SIZES if quick else SIZES
    reports: list[dict[str, Any]] = []
    stopped = ""
    with tempfile.TemporaryDirectory(prefix="phalanx-rdzv-scale-") as scratch:
        secret_file = Path(scratch) / "secret"
        secret_file.write_text(secrets.token_hex(32))
        secret_file.chmod(0o600)
        for nodes in sizes:
            reforms = QUICK_REFORMS if quick else (LARGE_REFORMS if nodes >= LARGE else REFORMS)
            # A fresh store per size: no state of a smaller group lingers in it.
            store, port = start_store(secret_file)
            try:
                report = run_size(nodes, reforms, port, secret_file, store.pid)
            finally:
                store.terminate()
                store.wait(30)
            reports.append(report)
            if report.get("error"):
                stopped = f"N = {nodes} was not carried: {report['error']}"
                break

    metrics: list[Metric] = []
    formation_points, reform_points, bytes_points = [], [], []
    for report in reports:
        nodes = report["nodes"]
        formations = completed([p for p in report["phases"] if p["name"] == "formation"])
        reforms_done = completed(reform_phases(report))
        if formations:
            formation_points.append((nodes, formations[0]["seconds"]))
        if reforms_done:
            times = [phase["seconds"] for phase in reforms_done]
            reform_points.append((nodes, percentile(times, 0.5)))
            moved = [phase["store_bytes"] / 1e6 for phase in reforms_done]
            bytes_points.append((nodes, percentile(moved, 0.5)))
            bound = TARGETS.get(nodes)
            metrics.append(
                Metric(
                    name=f"re-form, N={nodes}",
                    unit="s",
                    samples=times,
                    description=f"one of {nodes} members dead -> every member back from the rendezvous with the "
                    "hot spare in its place (c10d, today's path)",
                    target=Target(
                        op="<=", value=bound, stat="p50", text=f"<= {bound:g} s p50 at {nodes} members"
                    )
                    if bound
                    else None,
                    baseline=Baseline(text=TORCHELASTIC_PUBLISHED) if nodes >= LARGE else None,
                )
            )
            metrics.append(
                Metric(
                    name=f"bytes per re-form, N={nodes}",
                    unit="MB",
                    samples=moved,
                    description="bytes the store process read and wrote during one re-form (gate and store)",
                )
            )
            for who, key, description in (
                ("members'", "members_cpu_seconds", "CPU time all emulated members together spent during one "
                 "re-form (a real job spreads it over N machines)"),
                ("store's", "store_cpu_seconds", "CPU time the store process (its gate and its store) spent "
                 "during one re-form"),
            ):  # fmt: skip
                metrics.append(
                    Metric(
                        name=f"{who} CPU per re-form, N={nodes}",
                        unit="s",
                        samples=[phase[key] for phase in reforms_done],
                        description=description,
                    )
                )
        if formations:
            metrics.append(
                Metric(
                    name=f"formation, N={nodes}",
                    unit="s",
                    samples=[phase["seconds"] for phase in formations],
                    description=f"{nodes} launchers asked at once -> the last one back with the formed group",
                )
            )

    notes = [
        "Today's path, the baseline the issue's new protocol is to beat: torch's dynamic rendezvous (c10d) as "
        "the launcher sets it up (poll interval scaled with the group, worker/rendezvous.py), its state one "
        "pickled object that every member reads and rewrites by compare-and-set.",
        "The store runs as in the job's rendezvous pod, behind the job's gate (every byte passes the gate's "
        "relay); the members are emulated launchers in one process of their own, one thread each, with the "
        "launcher's own rendezvous client: on 2 cores the members' own CPU competes with the store's, which a "
        "real job spreads over N machines.",
        "A re-form starts at the member's death, with the operator's regroup already at hand (its node expired "
        "at once); the operator's detection time and the launchers' monitor interval (0.2 s) come on top.",
    ]
    busy = [
        (report["nodes"], phase["members_cpu_seconds"] / phase["seconds"])
        for report in reports
        for phase in completed(reform_phases(report))
        if phase["seconds"]
    ]
    if busy:
        by_size = {nodes: max(cores for size, cores in busy if size == nodes) for nodes, _ in busy}
        notes.append(
            "The emulated members kept "
            + ", ".join(f"{cores:.1f} cores busy at N = {nodes}" for nodes, cores in by_size.items())
            + f" of the machine's {os.cpu_count()} (most in one interpreter, under its lock): the times are what "
            "one machine takes to run every member's share of the protocol, an upper bound on a real job's, "
            "whose members each have a machine; the bytes and the store's CPU are the store's own, as in a job."
        )
    fits = {
        "formation": power_law(formation_points),
        "re-form": power_law(reform_points),
        "bytes per re-form": power_law(bytes_points),
    }
    measured = {nodes for nodes, _ in reform_points}
    projections: dict[str, dict[int, float]] = {}
    for name, fit in fits.items():
        if fit is None:
            continue
        unit = "MB" if name.startswith("bytes") else "s"
        for size in PROJECTED:
            if size in measured:
                continue
            value = projected(fit, size)
            if value is not None:
                projections.setdefault(name, {})[size] = value
                notes.append(
                    f"Projection of this emulation on this machine, not a measurement: {name} at N = {size:,} = "
                    f"{value:.3g} {unit} (power law fitted to the measured sizes, exponent {fit[1]:.2f})."
                )
    if stopped:
        notes.insert(0, stopped + "." + emulation_limit(reports[-1]))
    series = [
        Series(name=name, x=[float(x) for x, _ in points], y=[y for _, y in points], x_label="members (N)",
               y_label=unit, chart=chart)
        for name, points, unit, chart in (
            ("formation p50", formation_points, "s", "time against N"),
            ("re-form p50", reform_points, "s", "time against N"),
            ("bytes per re-form p50", bytes_points, "MB", "bytes per re-form against N"),
        )
        if points
    ]  # fmt: skip
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics,
        timeouts=[
            Timeout(name="rendezvous keep-alive interval", seconds=KEEPALIVE[0], source="launcher default"),
            Timeout(name="rendezvous keep-alive timeout", seconds=KEEPALIVE[1], source="launcher default"),
            Timeout(name="one formation or re-form, at most", seconds=RENDEZVOUS_TIMEOUT, source=NAME),
        ],
        notes=notes,
        series=series,
        details={"sizes": reports, "projections": projections},
    )
