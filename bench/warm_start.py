"""Warm interpreters: a fork of the launcher's fork server beside a new process that imports torch itself.

Part of ``phalanx bench`` (``--only warm-start``). A launcher keeps one waiting interpreter per local rank and
replaces each one used, a few seconds into every recovery (worker/warmstart.py). This measures, side by side
in one run, what one such interpreter costs until it is ready to take over a training command:
- ``fork``: asked of the fork server (worker/forkserver.py) that a launcher-like process forked from itself
  after importing torch, as the launcher does;
- ``new process``: a new interpreter importing the same modules (what every replacement cost before, and what
  torchrun pays for each training process it starts);
as the time to ready, the CPU it spent, and its proportional set size (its share of the memory it maps, shared
pages divided among the processes mapping them) while it waits. Both run in a driver process of their own, so
the fork happens as in a launcher: before any thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

NAME = "warm-start"
TITLE = "Warm interpreter start: fork server vs new process"

DRIVER = r"""
import json, os, subprocess, sys, time
import torch.distributed  # what the launcher has imported when it forks its server
from phalanx.worker.forkserver import ForkServer
from phalanx.worker.warmstart import PRELOAD

FORKS, NEW = int(sys.argv[1]), int(sys.argv[2])
TICK = os.sysconf("SC_CLK_TCK")

def pss_mb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")

def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

server = ForkServer.fork(PRELOAD)
# The server imports the rest of PRELOAD before it serves: the first answer waits for it.
started = time.monotonic()
first = server.start_interpreter()
server_ready = time.monotonic() - started
first.stdin.close(); first.wait(10)
forks = []
for _ in range(FORKS):
    started = time.monotonic()
    waiting = server.start_interpreter()
    ready = time.monotonic() - started
    time.sleep(0.05)  # settled: its title set, its pages touched as a waiting one touches them
    forks.append({"ready_s": ready, "cpu_s": cpu_s(waiting.pid), "pss_mb": pss_mb(waiting.pid)})
    waiting.stdin.close(); waiting.wait(10)
server.close()
new = []
probe = "import sys\nfor name in %r: __import__(name)\nprint('ready', flush=True)\nsys.stdin.readline()\n" % (PRELOAD,)
for _ in range(NEW):
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    process.stdout.readline()
    ready = time.monotonic() - started
    new.append({"ready_s": ready, "cpu_s": cpu_s(process.pid), "pss_mb": pss_mb(process.pid)})
    process.stdin.close(); process.wait(30)
print(json.dumps({"server_ready_s": server_ready, "fork": forks, "new": new}))
"""


def measure(forks: int, new: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(forks), str(new)], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"the warm-start driver failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(context: Any, quick: bool) -> Any:
    """Harness entry point (`phalanx bench --only warm-start`)."""
    from phalanx.bench.core import Baseline, BenchResult, Metric

    forks, new = (20, 3) if quick else (100, 10)
    figures = measure(forks, new)
    baseline = Baseline(
        text="a new interpreter importing torch: what torchrun pays for every training process"
    )
    metrics = []
    for key, label, unit, scale in (
        ("ready_s", "time to ready", "ms", 1000.0),
        ("cpu_s", "CPU spent", "s", 1.0),
        ("pss_mb", "memory while waiting (PSS)", "MB", 1.0),
    ):
        fork_samples = [sample[key] * scale for sample in figures["fork"]]
        new_samples = [sample[key] * scale for sample in figures["new"]]
        metrics += [
            Metric(
                name=f"{label}, fork",
                unit=unit,
                samples=fork_samples,
                description=f"one waiting interpreter from the fork server: {label}",
            ),
            Metric(
                name=f"{label}, new process",
                unit=unit,
                samples=new_samples,
                description=f"one new interpreter importing the same modules: {label}",
                baseline=baseline,
            ),
        ]
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics,
        notes=[
            f"{forks} forks and {new} new processes, one at a time, in a driver that imported torch.distributed "
            "and forked its server as a launcher does; the modules are worker/warmstart.py's PRELOAD.",
            f"The server itself was ready to fork {figures['server_ready_s']:.1f} s after it was forked (its "
            "own imports beyond the launcher's, once per pod).",
            "PSS divides shared pages among the processes mapping them: a fork shares the server's and the "
            "launcher's; a new process shares only the files it maps with other processes.",
            "No timeouts are involved.",
        ],
        details=figures,
    )
