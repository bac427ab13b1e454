"""The trainer's side of the saver process: a reply is awaited only while one can still come."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from phalanx.worker.checkpoint import persister


class DyingSaver:
    """A saver whose output pipe has closed while the process has not quite ended: `poll()` says it runs once,
    then that it is gone (the kernel closes a dying process's files a moment before it can be reaped)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._polls = 0

    def poll(self) -> int | None:
        self._polls += 1
        return None if self._polls == 1 else -9

    def wait(self, timeout: float | None = None) -> int:
        return -9

    def kill(self) -> None:
        pass


class RunningSaver(DyingSaver):
    def poll(self) -> int | None:
        return None


def poll_in_thread(client: persister.PersisterClient) -> dict[str, Any] | None:
    found: list[dict[str, Any] | None] = []
    waiter = threading.Thread(target=lambda: found.append(client.poll(timeout=None)), daemon=True)
    waiter.start()
    waiter.join(10)
    assert found, "poll(timeout=None) still waits for a reply from a saver that is gone"
    return found[0]


def test_a_saver_whose_output_ended_is_dead_even_if_it_looks_alive(tmp_path: Path) -> None:
    client = persister.PersisterClient()
    client._process = DyingSaver(4242)  # type: ignore[assignment]
    client.in_flight = persister.PersistJob(7, 20, tmp_path)
    client._replies.put({"id": None, "exited": 4242})
    assert poll_in_thread(client) == {"id": 7, "ok": False, "error": "saver process died", "step": 20}
    assert client.in_flight is None


def test_an_earlier_savers_end_does_not_end_the_wait_for_the_current_one(tmp_path: Path) -> None:
    client = persister.PersisterClient()
    client._process = RunningSaver(5151)  # type: ignore[assignment]
    client.in_flight = persister.PersistJob(8, 30, tmp_path)
    client._replies.put({"id": None, "exited": 4242})  # the saver killed before this one was started
    client._replies.put({"id": 8, "ok": True, "step": 30})
    assert poll_in_thread(client) == {"id": 8, "ok": True, "step": 30}


def test_a_saver_whose_trainer_is_gone_ends_quietly(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    saver = subprocess.Popen(
        [sys.executable, "-m", "phalanx.worker.checkpoint.persister"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert saver.stdin is not None and saver.stdout is not None
    saver.stdout.close()  # the trainer died: the saver's answer has no reader
    job = {"op": "persist", "id": 1, "slot": str(tmp_path / "no-slot"), "seq": 1, "step": 5,
           "directory": str(tmp_path / "ckpt"), "keep": 1, "extra": None, "durable": None}  # fmt: skip
    saver.stdin.write(json.dumps(job) + "\n")
    saver.stdin.close()
    assert saver.wait(timeout=60) == 0
    assert saver.stderr is not None and saver.stderr.read() == ""
