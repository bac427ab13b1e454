"""Rendezvous at scale: a group of N launchers formed, then re-formed after one member's death with a hot
spare taking its place, at N = 8, 64, 512 and on towards 12,500 (100,000 GPUs at 8 per pod).

Part of ``phalanx bench`` (``--only rendezvous-scale``). The job's store runs as in its rendezvous pod
(``python -m phalanx.worker.rendezvous`` behind the job's gate, with a secret); N emulated launchers
(``phalanx.bench.emulated_launchers``: the launcher's own rendezvous client, one thread each, in one process of
their own) form the group, then one member dies N times over (its keep-alives stop, the operator's regroup
expires its node) and every survivor re-enters the rendezvous beside the waiting spare. Measured per size:
the time to form, the time to re-form (from the death to the last member's return) and the bytes the store
process moved for it. Two protocols side by side: today's path, torch's dynamic rendezvous (c10d), whose one
pickled state is read and rewritten by every member, so the bytes per re-form grow with the square of the
members; and the store-decided rounds of worker/storerounds.py, where a re-form writes only the change. Sizes
run until one fails to finish within its budget; the report says which and why, and projects the larger
sizes from the measured slope, labelled as a projection.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = "rendezvous-scale"
TITLE = "Rendezvous at scale: form and re-form after a death, N = 8 to 12,500 members"

SIZES = (8, 16, 32, 64, 512, 12_500)
QUICK_SIZES = (8, 16)
ROUNDS_SIZES = (8, 64, 512, 2048, 4096)
"""The store-decided rounds' sizes through the job's gate: each member costs the store's process three open
files there (the gate's two sockets, the store's one) and as many in the emulating process, and this machine
holds a process to 20,000 (a hard limit it cannot raise), so 12,500 runs without the gate (`UNGATED_SIZES`)."""
ROUNDS_QUICK_SIZES = (8, 64)
UNGATED_SIZES = (12_500,)
MEMBERS_PER_PROCESS = 2048
"""The most store-rounds members one emulating process holds: past it the interpreter's threads spend more CPU
contending for its lock than on the protocol (bench/rounds_pool.py)."""
PROTOCOLS = {"c10d": "c10d", "rounds": "store rounds", "rounds-ungated": "store rounds without the gate"}
"""The variants measured side by side and their names in the report."""
EMULATED = {"c10d": "c10d", "rounds": "rounds", "rounds-ungated": "rounds"}
"""The protocol each variant's emulated launchers speak (emulated_launchers --protocol)."""
GATED = {"c10d": True, "rounds": True, "rounds-ungated": False}
"""Whether the variant's store stands behind the job's gate, as in the rendezvous pod."""
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


def start_store(secret_file: Path | None) -> tuple[subprocess.Popen[str], int]:
    """The job's store as its rendezvous pod runs it, behind the gate (without it when `secret_file` is None);
    (process, port)."""
    from phalanx.worker import rendezvous

    env = {key: value for key, value in os.environ.items() if key != rendezvous.SECRET_FILE_ENV}
    if secret_file is not None:
        env[rendezvous.SECRET_FILE_ENV] = str(secret_file)
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


def run_size(
    nodes: int,
    reforms: int,
    port: int,
    secret_file: Path | None,
    store_pid: int,
    protocol: str = "c10d",
    processes: int = 1,
) -> dict[str, Any]:
    """One size of one protocol in a driver process of its own; its JSON report, or why there is none."""
    budget = RENDEZVOUS_TIMEOUT * (reforms + 1) + 120 + nodes * 0.2
    command = [
        sys.executable, "-m", "phalanx.bench.emulated_launchers", "--nodes", str(nodes),
        "--reforms", str(reforms), "--endpoint", f"127.0.0.1:{port}", "--secret-file", str(secret_file or ""),
        "--store-pid", str(store_pid), "--timeout", str(RENDEZVOUS_TIMEOUT),
        "--keepalive", *(str(value) for value in KEEPALIVE), "--protocol", protocol,
        "--processes", str(processes),
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


def emulating_processes(protocol: str, nodes: int) -> int:
    """How many processes hold the emulated members: store rounds' members in processes of at most
    `MEMBERS_PER_PROCESS` (bench/rounds_pool.py); c10d's in one, as measured so far."""
    return 1 if EMULATED[protocol] == "c10d" else math.ceil(nodes / MEMBERS_PER_PROCESS)


def open_files_hard_limit() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def measure(
    protocol: str, sizes: tuple[int, ...], quick: bool, secret_file: Path
) -> tuple[list[dict[str, Any]], str]:
    """Each size of one protocol against a fresh store, until one is not carried; (reports, why it stopped)."""
    reports: list[dict[str, Any]] = []
    for nodes in sizes:
        reforms = QUICK_REFORMS if quick else (LARGE_REFORMS if nodes >= LARGE else REFORMS)
        # A fresh store per size: no state of a smaller group lingers in it.
        gate_secret = secret_file if GATED[protocol] else None
        store, port = start_store(gate_secret)
        try:
            report = run_size(
                nodes,
                reforms,
                port,
                gate_secret,
                store.pid,
                EMULATED[protocol],
                emulating_processes(protocol, nodes),
            )
        finally:
            store.terminate()
            try:
                store.wait(30)
            except subprocess.TimeoutExpired:  # thousands of connections to close: it may take longer
                store.kill()
                store.wait(30)
        reports.append(report)
        if report.get("error"):
            return reports, f"{PROTOCOLS[protocol]}: N = {nodes} was not carried: {report['error']}"
    return reports, ""


@dataclass
class Measured:
    """One protocol's figures: metrics and the points (N, p50) the fits and the plots take."""

    metrics: list[Any] = field(default_factory=list)
    formation: list[tuple[float, float]] = field(default_factory=list)
    reform: list[tuple[float, float]] = field(default_factory=list)
    bytes: list[tuple[float, float]] = field(default_factory=list)


def figures(protocol: str, reports: list[dict[str, Any]]) -> Measured:
    from phalanx.bench.core import Baseline, Metric, Target, percentile

    # c10d's metrics keep the names of the reports before the store rounds were measured beside it.
    tag = "" if protocol == "c10d" else f"{PROTOCOLS[protocol]}: "
    path = {
        "c10d": "c10d, the launcher's protocol below 32 pods",
        "rounds": "store rounds, worker/storerounds.py: the launcher's `rounds` protocol, the default from 32 pods",
        "rounds-ungated": "store rounds straight to the store, without the job's gate, which this machine's open-"
        "files limit does not hold at this size",
    }[protocol]
    out = Measured()
    for report in reports:
        nodes = report["nodes"]
        formations = completed([p for p in report["phases"] if p["name"] == "formation"])
        reforms_done = completed(reform_phases(report))
        if formations:
            out.formation.append((nodes, formations[0]["seconds"]))
        if reforms_done:
            times = [phase["seconds"] for phase in reforms_done]
            out.reform.append((nodes, percentile(times, 0.5)))
            moved = [phase["store_bytes"] / 1e6 for phase in reforms_done]
            out.bytes.append((nodes, percentile(moved, 0.5)))
            bound = TARGETS.get(nodes)
            out.metrics.append(
                Metric(
                    name=f"{tag}re-form, N={nodes}",
                    unit="s",
                    samples=times,
                    description=f"one of {nodes} members dead -> every member back from the rendezvous with the "
                    f"hot spare in its place ({path})",
                    target=Target(
                        op="<=", value=bound, stat="p50", text=f"<= {bound:g} s p50 at {nodes} members"
                    )
                    if bound
                    else None,
                    baseline=Baseline(text=TORCHELASTIC_PUBLISHED) if nodes >= LARGE else None,
                )
            )
            out.metrics.append(
                Metric(
                    name=f"{tag}bytes per re-form, N={nodes}",
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
                out.metrics.append(
                    Metric(
                        name=f"{tag}{who} CPU per re-form, N={nodes}",
                        unit="s",
                        samples=[phase[key] for phase in reforms_done],
                        description=description,
                    )
                )
        if formations:
            out.metrics.append(
                Metric(
                    name=f"{tag}formation, N={nodes}",
                    unit="s",
                    samples=[phase["seconds"] for phase in formations],
                    description=f"{nodes} launchers asked at once -> the last one back with the formed group "
                    f"({path})",
                )
            )
    return out


def projections_of(protocol: str, measured: Measured) -> tuple[dict[str, dict[int, float]], list[str]]:
    """The issue's sizes this machine did not carry, projected from the measured slope, and their notes."""
    fits = {
        "formation": power_law(measured.formation),
        "re-form": power_law(measured.reform),
        "bytes per re-form": power_law(measured.bytes),
    }
    carried = {nodes for nodes, _ in measured.reform}
    projections: dict[str, dict[int, float]] = {}
    notes = []
    for name, fit in fits.items():
        unit = "MB" if name.startswith("bytes") else "s"
        for size in PROJECTED:
            value = None if size in carried else projected(fit, size)
            if fit is not None and value is not None:
                projections.setdefault(name, {})[size] = value
                notes.append(
                    f"Projection of this emulation on this machine, not a measurement: {PROTOCOLS[protocol]} "
                    f"{name} at N = {size:,} = {value:.3g} {unit} (power law fitted to the measured sizes, "
                    f"exponent {fit[1]:.2f})."
                )
    return projections, notes


def per_member_cpu_notes(reports: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What one member's share of a re-form costs the emulation at each size, beside the store's own CPU: a
    share that grows with N is the emulating interpreter's (its threads contend for its lock), not the
    protocol's, whose per-member work is the same few round trips at any size."""
    notes = []
    for protocol, name in PROTOCOLS.items():
        if protocol == "c10d":
            continue
        shares = []
        for report in reports.get(protocol, []):
            phases = completed(reform_phases(report))
            if phases:
                members = sum(phase["members_cpu_seconds"] for phase in phases) / len(phases)
                store = sum(phase["store_cpu_seconds"] for phase in phases) / len(phases)
                nodes = report["nodes"]
                shares.append(
                    f"{members / nodes * 1000:.2f} ms a member and {store:.2f} s the store at N = {nodes:,}"
                )
        if shares:
            notes.append(
                f"{name}: CPU per re-form, "
                + "; ".join(shares)
                + ". A member's share is the same four round trips at every size; where it grows with N, an "
                "emulating interpreter's threads are contending for its lock (a real job's members each have a "
                "machine). The store's CPU is the part a real job pays in one place."
            )
    return notes


def run(context: Any, quick: bool) -> Any:
    """Harness entry point (`phalanx bench --only rendezvous-scale`)."""
    reports, stopped = measure_variants(tuple(PROTOCOLS), quick)
    return result_of(reports, stopped)


def measure_variants(
    variants: tuple[str, ...], quick: bool
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Each variant's reports by size, and why each stopped short ('' when it ran every size)."""
    sizes = {
        "c10d": QUICK_SIZES if quick else SIZES,
        "rounds": ROUNDS_QUICK_SIZES if quick else ROUNDS_SIZES,
        "rounds-ungated": () if quick else UNGATED_SIZES,
    }
    reports: dict[str, list[dict[str, Any]]] = {}
    stopped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="phalanx-rdzv-scale-") as scratch:
        secret_file = Path(scratch) / "secret"
        secret_file.write_text(secrets.token_hex(32))
        secret_file.chmod(0o600)
        for protocol in variants:
            reports[protocol], stopped[protocol] = measure(protocol, sizes[protocol], quick, secret_file)
    return reports, stopped


def result_of(reports: dict[str, list[dict[str, Any]]], stopped: dict[str, str]) -> Any:
    """The benchmark's result from every variant's reports (`details` keeps them, and why each stopped, so a
    variant measured again can be set beside the others' stored figures)."""
    from phalanx.bench.core import BenchResult, Series, Timeout
    from phalanx.worker import rendezvous

    measured = {protocol: figures(protocol, reports[protocol]) for protocol in PROTOCOLS}
    notes = [
        "Two protocols side by side, each against a fresh store per size. c10d is the baseline: torch's "
        "dynamic rendezvous as the launcher sets it up (poll interval scaled with the group, "
        "worker/rendezvous.py), its state one pickled object that every member reads and rewrites by "
        "compare-and-set; the launcher uses it below 32 pods (`rendezvous.protocol: auto`). Store rounds "
        "(worker/storerounds.py, the launcher's `rounds` protocol) decide each round in the store: a ticket "
        "per member at formation, and at a re-form every survivor checks in and one decider, once all have, "
        "writes only the change (the departed, the spare's seat, the ranks that move); survivors keep their "
        "ranks. The emulation runs the protocol's calls as the launchers make them, through the same gate and "
        "store.",
        "The store runs as in the job's rendezvous pod, behind the job's gate (every byte passes the gate's "
        "relay); the members are emulated launchers, one thread each, in a process of their own (store rounds: "
        f"in processes of at most {MEMBERS_PER_PROCESS:,} members, bench/rounds_pool.py): on 2 cores the "
        "members' own CPU competes with the store's, which a real job spreads over N machines.",
        "A re-form starts at the member's death, with the operator's regroup already at hand (its node expired "
        "at once); the operator's detection time and the launchers' monitor interval (0.2 s) come on top.",
        f"Through the gate every member costs the store's process {rendezvous.FILES_PER_CONNECTION} open files and "
        f"the emulating process as many; this machine holds a process to {open_files_hard_limit():,} (a hard "
        "limit it cannot raise), so store rounds run through the gate up to "
        f"{max(ROUNDS_SIZES):,} members and without it at {', '.join(f'{n:,}' for n in UNGATED_SIZES)}: there "
        "the store's CPU is the store's alone, the gate's relay comes on top (compare the two variants' store "
        "CPU at the sizes both ran).",
    ]
    for protocol, why in stopped.items():
        if why:
            limit = emulation_limit(reports[protocol][-1]) if protocol == "c10d" else ""
            notes.insert(0, why + "." + limit)
    for protocol in PROTOCOLS:
        busy = [
            (report["nodes"], phase["members_cpu_seconds"] / phase["seconds"])
            for report in reports[protocol]
            for phase in completed(reform_phases(report))
            if phase["seconds"]
        ]
        if busy:
            by_size = {nodes: max(cores for size, cores in busy if size == nodes) for nodes, _ in busy}
            notes.append(
                f"{PROTOCOLS[protocol]}: the emulated members kept "
                + ", ".join(f"{cores:.1f} cores busy at N = {nodes}" for nodes, cores in by_size.items())
                + f" of the machine's {os.cpu_count()}: the times are "
                "what one machine takes to run every member's share of the protocol, an upper bound on a real "
                "job's, whose members each have a machine; the bytes and the store's CPU are the store's own."
            )
    notes.extend(per_member_cpu_notes(reports))
    projections: dict[str, dict[str, dict[int, float]]] = {}
    for protocol in PROTOCOLS:
        projections[protocol], projected_notes = projections_of(protocol, measured[protocol])
        notes.extend(projected_notes)
    series = [
        Series(name=f"{PROTOCOLS[protocol]} {name}", x=[float(x) for x, _ in points], y=[y for _, y in points],
               x_label="members (N)", y_label=unit, chart=chart, log_log=True)
        for protocol in PROTOCOLS
        for name, points, unit, chart in (
            ("formation p50", measured[protocol].formation, "s", "time against N (log-log)"),
            ("re-form p50", measured[protocol].reform, "s", "time against N (log-log)"),
            ("bytes per re-form p50", measured[protocol].bytes, "MB", "bytes per re-form against N (log-log)"),
        )
        if points
    ]  # fmt: skip
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=[metric for protocol in PROTOCOLS for metric in measured[protocol].metrics],
        timeouts=[
            Timeout(name="rendezvous keep-alive interval", seconds=KEEPALIVE[0], source="launcher default"),
            Timeout(name="rendezvous keep-alive timeout", seconds=KEEPALIVE[1], source="launcher default"),
            Timeout(name="one formation or re-form, at most", seconds=RENDEZVOUS_TIMEOUT, source=NAME),
        ],
        notes=notes,
        series=series,
        details={"sizes": reports, "stopped": stopped, "projections": projections},
    )
