"""The heartbeat hub by job size: API writes per second for a job's heartbeats, the hub's own cost, and how soon
a silent worker shows in its summary (`phalanx bench --only heartbeat-hub`).

Each size runs the job's store as its rendezvous pod does (`python -m phalanx.worker.rendezvous`, behind the gate
up to 4,096 members), N emulated launchers in this process (the launcher's own `worker.beathub.BeatSender`, one
store connection each, each sending a training beat every interval, spread over it), and the hub
(`worker.beathub.Hub`) in a process of its own (bench/hub_process.py) publishing to a record instead of the API
server: each record is one Lease write. The baseline is the Lease path measured in the same run's terms: one
write per worker per interval, which is what `heartbeat.reporting: leases` costs by construction.

A third of the way through, worker 0's launcher falls silent. The operator can call it silent once a summary shows its
renewal older than the heartbeat timeout: the delay past the timeout is what the hub adds to detection.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phalanx.bench.core import Baseline, BenchResult, Metric, Series, Target, Timeout

NAME = "heartbeat-hub"
TITLE = "Heartbeats through the hub by job size: API writes/s, hub cost, silence seen"
SIZES = (8, 64, 512, 2_048, 12_500)
QUICK_SIZES = (8, 64)
GATED_UP_TO = 4_096
"""Members reach the store through the gate up to this size (each costs 3 open files on either side; this
machine holds a process to 20,000)."""
INTERVAL = 2.0
TIMEOUT = 10.0
WARM_INTERVALS = 3
MEASURED_INTERVALS = 8
SENDING_THREADS = 32
WRITES_BOUND = 20.0
"""The issue's bound on a job's heartbeat writes per second, whatever its size."""
JOB = "big"
HUB_AT_MOST = 600.0
"""Seconds the hub process runs at most (it stops when the driver closes its input)."""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def beat_for(index: int, step: int) -> dict[str, str]:
    """A training launcher's beat at `step` (what `beatsummary.lease_summary` makes of its Lease)."""
    from phalanx import beatsummary
    from phalanx.worker import heartbeat

    status = heartbeat.PodStatus(phase="training", step=step, rank=index, step_seconds=0.5, loss=2.5)
    body = heartbeat.lease_body(
        pod_name=f"{JOB}-worker-{index}",
        namespace="ml",
        pod_uid=f"uid-{index}",
        status=status,
        now=datetime.now(UTC),
        lease_duration_seconds=int(TIMEOUT),
    )
    return beatsummary.lease_summary(body)


def measure(members: int, scratch: Path) -> dict[str, Any]:
    from phalanx.bench.rendezvous_scale import start_store
    from phalanx.worker import rendezvous, storegate
    from phalanx.worker.beathub import BeatSender

    gated = members <= GATED_UP_TO
    secret_file = scratch / f"secret-{members}"
    secret_file.write_text(secrets.token_hex(32))
    secret_file.chmod(0o600)
    store, port = start_store(secret_file if gated else None)
    try:
        secret = storegate.read_secret(str(secret_file)) if gated else None
        senders = [
            BeatSender(
                lambda: rendezvous.connect("127.0.0.1", port, 30.0, secret), f"{JOB}-worker-{index}", TIMEOUT
            )
            for index in range(members)
        ]
        seconds = INTERVAL * (WARM_INTERVALS + MEASURED_INTERVALS)
        hub = subprocess.Popen(
            [
                sys.executable, "-m", "phalanx.bench.hub_process", "--port", str(port), "--job", JOB,
                "--interval", str(INTERVAL), "--seconds", str(HUB_AT_MOST), "--watch", f"{JOB}-worker-0",
                *(["--secret-file", str(secret_file)] if gated else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert hub.stdout is not None
        if hub.stdout.readline().strip() != "ready":
            raise RuntimeError("the hub did not start")
        connected = connect_all(senders)
        sent, latencies, last_beat = drive(senders, seconds)
        time.sleep(INTERVAL)  # the hub's summary of the last beats
        out, _ = hub.communicate(input="", timeout=120)
        store_cpu = cpu_seconds(store.pid)
    finally:
        store.kill()
        store.wait(30)
    report = json.loads(out)
    return {
        "members": members,
        "gated": gated,
        "sent": sent,
        "latencies": latencies,
        "last_beat": last_beat,
        "connect_seconds": connected,
        "store_cpu": store_cpu,
        "hub": report,
        "seconds": seconds,
    }


def connect_all(senders: list[Any]) -> list[float]:
    """Each launcher's first beat, which opens its store connection (through the gate: a handshake) and
    registers its pod: the seconds each took, all launchers at once as a gang starts."""

    def first(index: int) -> float:
        began = time.perf_counter()
        senders[index].send(beat_for(index, 0))
        return time.perf_counter() - began

    with ThreadPoolExecutor(SENDING_THREADS) as pool:
        return list(pool.map(first, range(len(senders))))


def drive(senders: list[Any], seconds: float) -> tuple[list[float], list[float], float]:
    """Every sender beats once per interval, spread over it, for `seconds`; worker 0 falls silent a third of
    the way.
    Returns the times of the beats sent, the seconds each send took, and worker 0's last beat."""
    started = time.monotonic()
    silenced_at = time.time() + seconds / 3
    last_of_first = [0.0]
    sent: list[float] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def beat(index: int, step: int) -> None:
        if index == 0 and time.time() >= silenced_at:
            return
        began = time.perf_counter()
        said = beat_for(index, step)
        senders[index].send(said)
        took = time.perf_counter() - began
        if index == 0:
            last_of_first[0] = datetime.fromisoformat(said["renewTime"].replace("Z", "+00:00")).timestamp()
        with lock:
            sent.append(time.time())
            latencies.append(took)

    with ThreadPoolExecutor(SENDING_THREADS) as pool:
        step = 0
        while time.monotonic() - started < seconds:
            tick = time.monotonic()
            futures = []
            for index in range(len(senders)):
                due = tick + INTERVAL * index / len(senders)
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                futures.append(pool.submit(beat, index, step))
            for future in futures:
                future.result()
            step += 1
            rest = tick + INTERVAL - time.monotonic()
            if rest > 0:
                time.sleep(rest)
    return sent, latencies, last_of_first[0]


def silence_seen_after(figures: dict[str, Any]) -> float | None:
    """Seconds past the heartbeat timeout at which a summary first showed worker 0 silent for longer than it."""
    last_beat = figures["last_beat"]
    for record in figures["hub"]["summaries"]:
        renewed = record.get("watched_renewal")
        if not renewed or record["at"] <= last_beat:
            continue  # before its last beat (a slow start may have left its first one old): not this silence
        moment = datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp()
        if record["at"] - moment > TIMEOUT:
            return record["at"] - (last_beat + TIMEOUT)
    return None


def run(context: Any, quick: bool) -> BenchResult:
    """Harness entry point (`phalanx bench --only heartbeat-hub`)."""
    scratch = context.scratch(NAME)
    sizes = QUICK_SIZES if quick else SIZES
    figures: dict[int, dict[str, Any]] = {}
    stopped: dict[int, str] = {}
    for members in sizes:
        try:
            figures[members] = measure(members, scratch)
        except Exception as error:  # a size this machine does not carry: reported, the rest still run
            stopped[members] = f"{type(error).__name__}: {error}"
            break
    metrics: list[Metric] = []
    notes: list[str] = []
    for members, measured in figures.items():
        summaries = measured["hub"]["summaries"][WARM_INTERVALS:]
        span = max(1e-9, (summaries[-1]["at"] - summaries[0]["at"])) if len(summaries) > 1 else INTERVAL
        writes = (len(summaries) - 1) / span if len(summaries) > 1 else 0.0
        beats_per_second = len(measured["sent"]) / measured["seconds"]
        metrics.append(
            Metric(
                name=f"API writes/s for heartbeats, N={members}",
                unit="writes/s",
                samples=[writes],
                description="the job's heartbeat writes to the API server per second: one summary Lease per hub interval",
                target=Target(op="<=", value=WRITES_BOUND, stat="max", text="at most 20 for the whole job")
                if members >= 512
                else None,
                baseline=Baseline(
                    text="`heartbeat.reporting: leases`: one Lease renewal per worker per interval",
                    value=round(members / INTERVAL, 1),
                ),
            )
        )
        plain = [
            ("hub summary", "s", [r["seconds"] for r in summaries if "seconds" in r], "one summary: every beat read from the store, summarised, encoded"),
            ("summary size", "KiB", [r["bytes"] / 1024 for r in summaries], "the summary Lease's annotation (one class per distinct beat the operator acts on)"),
            ("beat send", "ms", [t * 1000 for t in measured["latencies"]], "one launcher's beat into the store (and every other beat, a read of the hub's stamp)"),
            ("first beat", "ms", [t * 1000 for t in measured["connect_seconds"]], "a launcher's first beat: its store connection opened (through the gate, a handshake) and its pod registered, every launcher at once"),
        ]  # fmt: skip
        for name, unit, samples, description in plain:
            metrics.append(
                Metric(name=f"{name}, N={members}", unit=unit, samples=samples, description=description)
            )
        seen = silence_seen_after(measured)
        if seen is not None:
            metrics.append(
                Metric(
                    name=f"silence seen past the timeout, N={members}",
                    unit="s",
                    samples=[seen],
                    description="worker 0's launcher falls silent -> the first summary showing it silent longer than the timeout, minus the timeout",
                    target=Target(op="<=", value=3.0, stat="max", text="a silent worker detected within 3 s")
                    if members >= 512
                    else None,
                )
            )
        hub_cpu = measured["hub"]["cpu_seconds"] / measured["seconds"]
        notes.append(
            f"N = {members:,} ({'through the gate' if measured['gated'] else 'straight to the store, without the gate'}): "
            f"beats sent {beats_per_second:,.0f}/s of {members / INTERVAL:,.0f}/s wanted; the hub's CPU "
            f"{hub_cpu:.0%} of a core, the store's {measured['store_cpu'] / measured['seconds']:.0%}; "
            f"{statistics.median([r['classes'] for r in summaries]) if summaries else 0:.0f} classes per summary."
        )
    for members, why in stopped.items():
        notes.append(f"N = {members:,} was not carried: {why}.")
    notes.append(
        "The launchers are emulated in one process (a real job's are spread over N machines): where beats sent fall "
        "short of those wanted, this process is the limit, not the store or the hub."
    )
    xs = [float(members) for members in figures]
    return BenchResult(
        name=NAME,
        title=TITLE,
        quick=quick,
        metrics=metrics,
        timeouts=[
            Timeout(
                name="heartbeat interval (launchers' and the hub's)", seconds=INTERVAL, source="heartbeat-hub"
            ),
            Timeout(name="heartbeat timeout", seconds=TIMEOUT, source="heartbeat-hub"),
        ],
        series=[
            Series(
                name="hub: API writes/s",
                x=xs,
                y=[m.samples[0] for m in metrics if m.name.startswith("API writes/s")],
                x_label="workers",
                y_label="writes/s",
                chart="writes",
                log_log=True,
            ),
            Series(
                name="leases: API writes/s",
                x=xs,
                y=[members / INTERVAL for members in figures],
                x_label="workers",
                y_label="writes/s",
                chart="writes",
                log_log=True,
            ),
        ],
        notes=notes,
        details={
            str(members): {"hub": m["hub"], "store_cpu": m["store_cpu"]} for members, m in figures.items()
        },
    )
