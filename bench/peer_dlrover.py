"""DLRover's flash checkpoint beside Phalanx's asynchronous save, on the same states in the same run.

For each state size (10 MB, 100 MB, 1 GB; quick: 10 MB), Phalanx's `Checkpointer` and DLRover's
`DdpCheckpointer` each save the checkpoint-stall benchmark's model a few times in a fresh process of their
own (`phalanx.bench.checkpoint_saves`): the training loop's stall per save and the time until the save is
persisted. No cluster and no `dlrover-run`: DLRover's checkpointer starts its own saver process when its
agent is absent, as its documentation describes. The report shows DLRover's figures over Phalanx's.

If DLRover cannot run here, the result says why (the exception and the version tried), keeps its published
figure, and still carries Phalanx's side.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from phalanx.bench import peers
from phalanx.bench.core import BenchResult, Metric, Timeout, Versus

NAME = "peer-dlrover"
TITLE = "DLRover flash checkpoint measured here beside Phalanx's asynchronous save"

FULL_SAVES = {10: 8, 100: 5, 1024: 3}
QUICK_SAVES = {10: 3}
CHILD_TIMEOUT_S = 900.0
ATTEMPTS = 2  # DLRover gets a second try per size; every failure is in the notes
# DLRover keeps its sockets under this folder and its shared memory in /dev/shm, both named after the run id.
DLROVER_SOCKET_DIR = Path("/tmp/ckpt_sock")
SHM_DIR = Path("/dev/shm")


def dlrover_version() -> str:
    try:
        return importlib.metadata.version("dlrover")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class SavesFailed(RuntimeError):
    pass


def run_saves(system: str, size_mb: int, saves: int, folder: Path) -> dict[str, Any]:
    """One system's saves in its own process; its leftovers (saver, sockets, shared memory) removed after."""
    run_id = f"phalanx-bench-{system}-{os.getpid()}-{size_mb}"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": run_id}
    log_path = folder / f"{system}-{size_mb}.log"
    command = [
        sys.executable,
        "-m",
        "phalanx.bench.checkpoint_saves",
        "--system",
        system,
        "--size-mb",
        str(size_mb),
        "--saves",
        str(saves),
        "--dir",
        str(folder / f"{system}-{size_mb}"),
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True
        )
        try:
            output, _ = process.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            output = ""
        finally:
            # The saver DLRover starts is a child of that process: the whole group goes.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            shutil.rmtree(DLROVER_SOCKET_DIR / run_id, ignore_errors=True)
            for leftover in SHM_DIR.glob(f"{run_id}_*"):
                leftover.unlink(missing_ok=True)
            shutil.rmtree(folder / f"{system}-{size_mb}", ignore_errors=True)
            # DLRover leaves its checkpoint data unsynced: written back now, not during the next measurement.
            os.sync()
    figures = peers.parse_saves(output)
    if figures is None:
        cause = peers.saves_error(output) or " / ".join(
            log_path.read_text(errors="replace").strip().splitlines()[-4:]
        )
        raise SavesFailed(f"{system} {size_mb} MB exited with {process.returncode}: {cause}")
    return figures


def metrics(
    sizes: list[int], ours: dict[int, dict[str, Any]], theirs: dict[int, dict[str, Any]]
) -> list[Metric]:
    found = []
    for size in sizes:
        phalanx_figures, dlrover_figures = ours.get(size, {}), theirs.get(size, {})
        stall_name, persist_name = f"phalanx stall, {size} MB", f"phalanx persist, {size} MB"
        found += [
            Metric(
                name=stall_name,
                unit="ms",
                samples=[value * 1e3 for value in phalanx_figures.get("stall_s", [])],
                description="training loop blocked in Checkpointer.save on a durable step",
            ),
            Metric(
                name=f"dlrover stall, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in dlrover_figures.get("stall_s", [])],
                description="training loop blocked in DdpCheckpointer.save_checkpoint(storage_type=DISK)",
                baseline=peers.DLROVER_STALL_PUBLISHED,
                versus=Versus(benchmark=NAME, metric=stall_name),
            ),
            Metric(
                name=persist_name,
                unit="ms",
                samples=[value * 1e3 for value in phalanx_figures.get("persist_s", [])],
                description="save call -> Checkpointer.wait() returns (the checkpoint committed on disk)",
            ),
            Metric(
                name=f"dlrover persist, {size} MB",
                unit="ms",
                samples=[value * 1e3 for value in dlrover_figures.get("persist_s", [])],
                description="save call -> DLRover's tracker file names the step (written and fsynced last)",
                versus=Versus(benchmark=NAME, metric=persist_name),
            ),
        ]
    return found


def run(context: Any, quick: bool) -> BenchResult:
    """Harness entry point (`phalanx bench --only peer-dlrover`)."""
    version = dlrover_version()
    plan = QUICK_SAVES if quick else FULL_SAVES
    folder = context.scratch(NAME)
    ours: dict[int, dict[str, Any]] = {}
    theirs: dict[int, dict[str, Any]] = {}
    failures: list[str] = []
    for size, saves in plan.items():
        context.log(f"{NAME}: {size} MB, {saves} saves each")
        ours[size] = run_saves("phalanx", size, saves, folder)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                theirs[size] = run_saves("dlrover", size, saves, folder)
                break
            except SavesFailed as error:
                failures.append(f"attempt {attempt}: {error}")
                context.log(f"{NAME}: DLRover failed: {error}")
    reason = f"dlrover {version}: " + "; ".join(failures) if failures and not theirs else ""
    notes = [
        f"DLRover {version} (flash checkpoint, DdpCheckpointer, its own saver process: no dlrover-run agent) and "
        "Phalanx's Checkpointer save the same float32 model as checkpoint-stall, each in a fresh process, one "
        "torch thread, waiting for every save to persist before the next.",
        "Sizes and saves measured after a warm-up: "
        + ", ".join(f"{size} MB x {saves}" for size, saves in plan.items())
        + ". Persist: from the save call until each system says the checkpoint is on disk.",
        "Not the same durability: DLRover's saver writes the checkpoint file with torch.save and fsyncs only "
        "its small done and tracker files (dlrover/python/elastic_agent/torch/ckpt_saver.py, "
        "common/storage.py), so its persist time can end before the data leaves the page cache; Phalanx's "
        "saver hashes and fsyncs the checkpoint data before it commits.",
    ]
    if reason:
        notes.insert(0, f"DLRover could not run here: {reason}")
    elif failures:
        notes.insert(0, f"DLRover {version} failed {len(failures)} time(s): " + "; ".join(failures))
    return BenchResult(
        name=NAME,
        title=TITLE,
        metrics=metrics(list(plan), ours, theirs),
        timeouts=[
            Timeout(
                name="benchmark: one system's saves at one size",
                seconds=CHILD_TIMEOUT_S,
                source="phalanx.bench.peer_dlrover",
            )
        ],
        notes=notes,
        details={
            "dlrover_version": version,
            "unavailable": reason,
            "phalanx": {str(size): figures for size, figures in ours.items()},
            "dlrover": {str(size): figures for size, figures in theirs.items()},
        },
    )
