"""The heartbeat hub as the `heartbeat-hub` benchmark runs it: worker/beathub.py's `Hub`, in a process of its own
(so that its CPU is its own), against the job's store, publishing to a record instead of the API server.

Run as `python -m phalanx.bench.hub_process --port P --job NAME --interval S --seconds D [--watch POD]`; it prints
`ready` once connected (its first summary made), then, D seconds later or when its input ends, one JSON object: each summary's time, the seconds it took (read, summarise, encode), its size and class count, the
watched pod's renewal as the summary expands it, and the process's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from phalanx import beatsummary


def cpu_seconds() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.bench.hub_process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret-file", default="")
    parser.add_argument("--job", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--watch", default="")
    args = parser.parse_args(argv)
    from phalanx.worker import rendezvous, storegate
    from phalanx.worker.beathub import Hub

    secret = storegate.read_secret(args.secret_file) if args.secret_file else None
    records: list[dict[str, Any]] = []
    started_cpu = cpu_seconds()

    def publish(text: str, now: datetime) -> None:
        summary = beatsummary.decode(text)
        watched = None
        if summary is not None and args.watch:
            watched = (beatsummary.expand(summary).get(args.watch) or {}).get("renewTime")
        records.append(
            {
                "at": now.timestamp(),
                "bytes": len(text),
                "members": summary["members"] if summary else 0,
                "classes": len(summary["classes"]) if summary else 0,
                "watched_renewal": watched,
            }
        )

    hub = Hub(
        lambda: rendezvous.connect("127.0.0.1", args.port, 30.0, secret),
        f"{args.job}-worker-",
        args.interval,
        publish,
    )
    took: list[float] = []
    once = hub.once

    def timed_once() -> dict[str, Any]:
        began = time.perf_counter()
        try:
            return once()
        finally:
            took.append(time.perf_counter() - began)

    hub.once = timed_once  # type: ignore[method-assign]
    hub.once()  # connected, and the first summary made: the driver may start its clock
    print("ready", flush=True)
    stop = threading.Event()
    deadline = threading.Timer(args.seconds, stop.set)
    deadline.daemon = True  # a pending timer must not keep the process from ending
    deadline.start()

    def stop_at_end_of_input() -> None:
        sys.stdin.read()  # the driver closes our input once it is done
        stop.set()

    threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    hub.run(stop)
    for record, seconds in zip(records, took, strict=False):
        record["seconds"] = seconds
    print(json.dumps({"summaries": records, "cpu_seconds": cpu_seconds() - started_cpu}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
