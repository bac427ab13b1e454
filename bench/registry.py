"""The benchmarks `phalanx bench` knows, in the order it runs them.

A benchmark is a module with `NAME` (its entry's name), `TITLE` and `run(context, quick) -> BenchResult`
(`phalanx.bench.core`); `context` is a `phalanx.bench.harness.Context` (scratch folders, the cluster).
Adding one is a module plus one entry here; the harness writes its report, JSON and plot.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Entry:
    """One registered benchmark."""

    name: str
    module: str
    needs_cluster: bool
    summary: str

    def load(self) -> ModuleType:
        module = importlib.import_module(self.module)
        if getattr(module, "NAME", None) != self.name or not callable(getattr(module, "run", None)):
            raise RuntimeError(f"{self.module} must define NAME = {self.name!r} and run(context, quick)")
        return module


BENCHMARKS: tuple[Entry, ...] = (
    Entry(
        "checkpoint-stall",
        "phalanx.bench.checkpoint_stall",
        False,
        "training stall per save: sync vs async vs the in-memory copy, 10 MB / 100 MB / 1 GB",
    ),
    Entry(
        "kill-during-save",
        "phalanx.bench.kill_during_save",
        False,
        "SIGKILL of the saver at random moments of a save, then a load: 0 corrupt loads in 200 trials",
    ),
    Entry(
        "warm-start",
        "phalanx.bench.warm_start",
        False,
        "a waiting training interpreter: fork of the launcher's fork server vs a new process importing torch",
    ),
    Entry(
        "gang-creation",
        "phalanx.bench.gang_creation",
        True,
        "a 1,000-worker TrainingJob on simulated nodes: pods/s, time to Running, partial gangs",
    ),
    Entry(
        "operator-scale",
        "phalanx.bench.operator_scale",
        True,
        "100 TrainingJobs: event -> action latency, operator RSS/CPU, API writes/s in steady state",
    ),
    Entry(
        "operator-takeover",
        "phalanx.bench.operator_takeover",
        True,
        "the operator's acting replica killed or stopped -> the standby holds the Lease and acts",
    ),
    Entry(
        "rerendezvous",
        "phalanx.bench.rerendezvous",
        True,
        "re-rendezvous of real training pods after kubectl scale (grow and shrink)",
    ),
    Entry(
        "rendezvous-scale",
        "phalanx.bench.rendezvous_scale",
        False,
        "a group of N = 8 to 12,500 emulated launchers formed and re-formed after a death: time and bytes",
    ),
    Entry(
        "heartbeat-hub",
        "phalanx.bench.heartbeat_hub",
        False,
        "a job of N = 8 to 12,500 emulated launchers beating through its hub: API writes/s, hub cost, silence seen",
    ),
    Entry(
        "scale",
        "phalanx.bench.scale",
        False,
        "one TrainingJob of N pods of 8 GPUs (N = 8, 64, 512) on simulated nodes with emulated launchers: API "
        "writes/s (the job's share), operator watch events/s, CPU and RSS, silent-worker detection, gang bound",
    ),
    Entry(
        "reconcile-cost",
        "phalanx.bench.reconcile_cost",
        False,
        "one reconcile of one job of 8 to 12,500 workers: time, and the status written against 64 KiB",
    ),
    Entry(
        "kopf-startup",
        "phalanx.bench.kopf_startup",
        False,
        "kopf's start-up wait for its indexes by objects listed: kopf's own set vs the operator's (12,500 objects)",
    ),
    Entry(
        "recovery",
        "phalanx.bench.recovery",
        True,
        "worker killed -> first step after resume, by stage: hot spare vs new pod vs RestartJob from disk",
    ),
    Entry(
        "hang-detection",
        "phalanx.bench.hang_detection",
        True,
        "frozen pod and hung trainer -> detection vs the timeouts; false alarms while saving every 2 steps",
    ),
    Entry(
        "goodput",
        "phalanx.bench.goodput",
        True,
        "30 min with a random failure every ~5 min beside an undisturbed twin: goodput, every lost second attributed",
    ),
    Entry(
        "peer-torchft",
        "phalanx.bench.peer_torchft",
        False,
        "torchft (lighthouse + 3 replica groups, CPU/gloo): replica SIGKILLed -> survivors' next committed step",
    ),
    Entry(
        "peer-kubeflow",
        "phalanx.bench.peer_kubeflow",
        True,
        "Kubeflow Trainer v2.3.0 TrainJob (torch-distributed, on JobSet): worker SIGKILLed / frozen, beside Phalanx",
    ),
    Entry(
        "peer-jobset",
        "phalanx.bench.peer_jobset",
        True,
        "JobSet v0.12.0 with a restart failure policy: worker SIGKILLed / frozen, beside Phalanx",
    ),
    Entry(
        "peer-dlrover",
        "phalanx.bench.peer_dlrover",
        False,
        "DLRover flash checkpoint beside Phalanx's async save: stall per save and time to persist, 10 MB-1 GB",
    ),
)


def names() -> list[str]:
    return [entry.name for entry in BENCHMARKS]


def select(wanted: list[str] | None) -> list[Entry]:
    """The entries named in `wanted` (all when empty), in registry order; unknown names are refused."""
    if not wanted:
        return list(BENCHMARKS)
    unknown = sorted(set(wanted) - set(names()))
    if unknown:
        raise ValueError(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names())}")
    return [entry for entry in BENCHMARKS if entry.name in wanted]
