"""The saver process: persists snapshots from shared memory to durable checkpoints.

It runs as ``python -m phalanx.worker.checkpoint.persister`` (a separate process, so persisting never
competes with the training loop for the interpreter lock), niced, and reads jobs as JSON lines on
stdin; each job names a snapshot slot and its sequence number. It writes ``state.bin`` straight from
the slot while hashing it, checks that the slot was not rewritten meanwhile, commits atomically and
purges old checkpoints. A SIGKILL at any point leaves at most a temporary folder that loaders ignore.
This module stays torch-free so the process starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from phalanx.worker.checkpoint import durable, layout, slots, tiers

log = logging.getLogger(__name__)


class SnapshotRef(Protocol):
    """A committed snapshot slot (see :class:`shm_store.SlotInfo`)."""

    @property
    def path(self) -> Path: ...

    @property
    def seq(self) -> int: ...

    @property
    def step(self) -> int: ...


def persist_slot(
    slot: Path,
    seq: int,
    directory: Path,
    step: int,
    keep: int,
    extra: dict[str, Any] | None = None,
    purge: bool = True,
) -> dict[str, Any]:
    """Write snapshot ``slot`` (sequence ``seq``) as durable checkpoint ``step``; returns figures."""
    started = time.perf_counter()
    tmp = durable.new_tmp_dir(directory, step)
    try:
        size, digest = durable.write_file_from_chunks(
            tmp / layout.STATE_FILE, slots.payload_chunks(slot, expected_seq=seq)
        )
        final = durable.commit(tmp, step, "replicated", {layout.STATE_FILE: (size, digest)}, extra)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    removed = durable.purge(directory, keep) if purge else []
    return {
        "path": str(final),
        "bytes": size,
        "seconds": time.perf_counter() - started,
        "purged": len(removed),
    }


def commit_folder(
    tmp: Path, directory: Path, step: int, keep: int, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """Hash, fsync and commit a folder another writer filled (a sharded DCP save), then purge."""
    started = time.perf_counter()
    final = durable.commit(tmp, step, "sharded", None, extra)
    size = sum(entry.stat().st_size for entry in final.iterdir())
    removed = durable.purge(directory, keep)
    return {
        "path": str(final),
        "bytes": size,
        "seconds": time.perf_counter() - started,
        "purged": len(removed),
    }


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    directory, step, keep = Path(job["directory"]), int(job["step"]), int(job["keep"])
    if job.get("op") == "commit":
        result = commit_folder(Path(job["tmp"]), directory, step, keep, job.get("extra"))
    else:
        result = persist_slot(Path(job["slot"]), int(job["seq"]), directory, step, keep, job.get("extra"))
    if job.get("durable"):
        result.update(
            copy_to_durable_tier(tiers.DurableTier.from_job(job["durable"]), Path(result["path"]), step)
        )
    return result


def copy_to_durable_tier(tier: tiers.DurableTier, folder: Path, step: int) -> dict[str, Any]:
    """Copy a committed checkpoint to the durable tier; a failure is reported, not raised: the fast tier
    holds the checkpoint, and the next copy is tried with the next checkpoint."""
    try:
        return tiers.copy_checkpoint(tier, folder, step)
    except Exception as error:
        log.warning("copy of step %d to the durable tier %s failed: %s", step, tier.url, error)
        return {"durable_error": f"{type(error).__name__}: {error}"}


def _lower_priority() -> None:
    """Yield CPU and I/O to the training loop."""
    with contextlib.suppress(OSError):
        os.nice(10)
    with contextlib.suppress(Exception):
        import psutil

        psutil.Process().ionice(psutil.IOPRIO_CLASS_BE, 7)


def main() -> int:
    _lower_priority()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if job.get("op") == "exit":
            break
        reply: dict[str, Any] = {"id": job.get("id"), "step": job.get("step")}
        try:
            reply.update(run_job(job))
            reply["ok"] = True
        except Exception as error:
            reply.update(ok=False, error=f"{type(error).__name__}: {error}")
        try:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            # The trainer is gone (killed during the save, which is complete or abandoned by the commit rules):
            # nobody to answer, and nothing to say in the job's output.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    return 0


@dataclass
class PersistJob:
    id: int
    step: int
    slot: Path
    submitted: float = field(default_factory=time.perf_counter)


LIVENESS_CHECK_SECONDS = 1.0
"""How often a wait for the saver's reply checks that the saver still runs."""


class PersisterClient:
    """Starts and feeds the saver process; restarts it when it dies."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next_id = 0
        self.in_flight: PersistJob | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _start(self) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "phalanx.worker.checkpoint.persister"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        replies = self._replies
        stdout = process.stdout
        assert stdout is not None

        def pump() -> None:
            for line in stdout:
                with contextlib.suppress(ValueError):
                    replies.put(json.loads(line))
            replies.put({"id": None, "exited": process.pid})

        threading.Thread(target=pump, name="phalanx-persister-replies", daemon=True).start()
        self._process = process

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def submit(
        self,
        slot: SnapshotRef,
        directory: Path,
        keep: int,
        extra: dict[str, Any] | None,
        durable: dict[str, Any] | None = None,
    ) -> PersistJob:
        """Hand snapshot ``slot`` to the saver process (and have it copy the checkpoint to the durable tier
        ``durable``, a :meth:`tiers.DurableTier.as_job`, when given)."""
        line = {
            "op": "persist",
            "slot": str(slot.path),
            "seq": slot.seq,
            "step": slot.step,
            "directory": str(directory),
            "keep": keep,
            "extra": extra,
            "durable": durable,
        }
        return self.submit_job(slot.step, slot.path, line)

    def submit_commit(
        self,
        tmp: Path,
        step: int,
        directory: Path,
        keep: int,
        extra: dict[str, Any] | None,
        durable: dict[str, Any] | None = None,
    ) -> PersistJob:
        """Have the saver process commit a folder filled by another writer (then copy it, as `submit`)."""
        line = {
            "op": "commit",
            "tmp": str(tmp),
            "step": step,
            "directory": str(directory),
            "keep": keep,
            "extra": extra,
            "durable": durable,
        }
        return self.submit_job(step, tmp, line)

    def ensure_started(self) -> None:
        """Start the saver process if it does not run (again, after it died: counted in `restarts`)."""
        if not self.alive():
            if self._process is not None:
                self.restarts += 1
            self._start()

    def submit_job(self, step: int, source: Path, line: dict[str, Any]) -> PersistJob:
        if self.in_flight is not None:
            raise RuntimeError("a persist job is already in flight")
        self.ensure_started()
        self._next_id += 1
        job = PersistJob(self._next_id, step, source)
        line = {**line, "id": job.id}
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(line) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._lost(job)
        self.in_flight = job
        return job

    def _lost(self, job: PersistJob) -> PersistJob:
        self._replies.put({"id": job.id, "step": job.step, "ok": False, "error": "saver process died"})
        self.in_flight = job
        return job

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None:
        """The reply to the in-flight job if it has come (or the saver died); None while it runs."""
        if self.in_flight is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            # The end of the saver's output is how its death is usually seen, but a process that inherited
            # its pipe can keep that end from coming: a long wait looks at the process itself now and then.
            wait = LIVENESS_CHECK_SECONDS if remaining is None else min(remaining, LIVENESS_CHECK_SECONDS)
            try:
                reply = self._replies.get(timeout=wait) if wait > 0.0 else self._replies.get_nowait()
            except queue.Empty:
                if not self.alive():
                    reply = {"id": self.in_flight.id, "ok": False, "error": "saver process died"}
                elif remaining is None or remaining > wait:
                    continue
                else:
                    return None
            if "exited" in reply:
                if self._process is None or reply["exited"] != self._process.pid:
                    continue  # an earlier saver's end, dealt with when it died
                # This saver's output ended. Its pipe closes a moment before the process is gone, so it may
                # still look alive here: wait for its end rather than wait for a reply that cannot come.
                self._reap()
                reply = {"id": self.in_flight.id, "ok": False, "error": "saver process died"}
            if reply.get("id") != self.in_flight.id:
                continue
            reply.setdefault("step", self.in_flight.step)
            self.in_flight = None
            return reply

    def _reap(self) -> None:
        """Collect the saver whose output ended; one that somehow lives on without it is killed."""
        process = self._process
        assert process is not None
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self, timeout: float = 600.0) -> dict[str, Any] | None:
        """Wait for the in-flight job, then stop the process."""
        reply = self.poll(timeout=timeout) if self.in_flight else None
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert process.stdin is not None
                process.stdin.write(json.dumps({"op": "exit"}) + "\n")
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        return reply


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
