"""Emulated store-rounds members spread over several processes, driven as one group.

One interpreter holding thousands of members' threads spends more CPU on its own lock than on the protocol:
at 12,500 threads each member's share of a re-form costs about 6 ms of CPU, against 0.75 ms at 2,048. A real
job's members each have a machine, so `emulated_launchers --processes K` puts the members in K processes of a
few thousand each (forked before any connection or thread), and this driver times each phase from its start
to the last member's return in any of them (CLOCK_MONOTONIC is one clock for every process of the machine).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

SPARE_WAIT = 60.0
"""Seconds a new spare may take to stand in line."""


def _serve(
    connection: Connection, indices: list[int], make: Callable[[int], Any], timeout: float, wave: int
) -> None:
    """One process's members: connects them, then runs the driver's commands on all of them at once."""
    from phalanx.bench.emulated_launchers import cpu_seconds, in_parallel

    members: list[Any] = []
    errors: list[str] = []
    for first in range(0, len(indices), wave):
        connected, failed, _ = in_parallel(
            [functools.partial(make, index) for index in indices[first : first + wave]], timeout
        )
        members += [member for member in connected if member is not None]
        errors += failed
    connection.send({"errors": errors[:3]})
    spare: tuple[Any, threading.Thread, list[Any]] | None = None
    while True:
        command, argument = connection.recv()
        if command == "stop":
            return
        if command == "spare":
            member = make(argument)
            outcome: list[Any] = []

            def stand_by(member: Any = member, outcome: list[Any] = outcome) -> None:
                try:
                    seat = member.join()
                    outcome.append((seat.round, seat.world_size))
                except Exception as error:
                    outcome.append(f"{type(error).__name__}: {error}"[:300])

            thread = threading.Thread(target=stand_by, daemon=True)
            thread.start()
            deadline = time.monotonic() + SPARE_WAIT
            while member.waiting_spares() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            spare = (member, thread, outcome)
            connection.send({})
            continue
        cpu = cpu_seconds()
        if command == "join":
            calls = [member.join for member in members]
        else:  # "reform": the argument is the dead member's UID, named by the operator's regroup
            members = [member for member in members if member.uid != argument]
            calls = [functools.partial(member.reform, [argument]) for member in members]
        results, failures, finished = in_parallel([_seat_of(call) for call in calls], timeout)
        if command == "reform" and spare is not None:
            member, thread, outcome = spare
            thread.join(timeout)
            finished = finished and not thread.is_alive()
            results += [item for item in outcome if not isinstance(item, str)]
            failures += [item for item in outcome if isinstance(item, str)]
            members.append(member)
            spare = None
        connection.send(
            {
                "done_at": time.monotonic(),
                "cpu": cpu_seconds() - cpu,
                "results": [result for result in results if result],
                "failures": failures[:5],
                "finished": finished,
            }
        )


def _seat_of(call: Callable[[], Any]) -> Callable[[], tuple[int, int]]:
    def seat() -> tuple[int, int]:
        taken = call()
        return taken.round, taken.world_size

    return seat


class RoundsPool:
    """`nodes` members (UIDs `uid-<index>`) in `processes` forked processes, and the phases run over all."""

    def __init__(
        self, nodes: int, processes: int, make: Callable[[int], Any], timeout: float, wave: int
    ) -> None:
        self.timeout = timeout
        context = multiprocessing.get_context("fork")
        self._pipes: list[Connection] = []
        self._owner: dict[str, int] = {}
        self._processes = []
        for number in range(processes):
            indices = list(range(number, nodes, processes))
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, indices, make, timeout, wave), daemon=True)
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)
            self._owner.update({f"uid-{index}": number for index in indices})
        self.errors = [error for pipe in self._pipes for error in self._answer(pipe)["errors"]]

    def _answer(self, pipe: Connection) -> dict[str, Any]:
        if not pipe.poll(self.timeout * 2):
            raise TimeoutError("an emulating process did not answer")
        answer: dict[str, Any] = pipe.recv()
        return answer

    def uids(self) -> list[str]:
        return sorted(self._owner)

    def add_spare(self, index: int) -> None:
        """A hot spare standing in line, in the process with the fewest members."""
        number = min(range(len(self._pipes)), key=lambda n: list(self._owner.values()).count(n))
        self._pipes[number].send(("spare", index))
        self._answer(self._pipes[number])
        self._owner[f"uid-{index}"] = number

    def phase(self, command: str, argument: Any = None) -> tuple[float, dict[str, Any]]:
        """Run `command` on every member at once; (its start, the processes' answers merged)."""
        if command == "reform":
            self._owner.pop(argument)
        started = time.monotonic()
        for pipe in self._pipes:
            pipe.send((command, argument))
        answers = [self._answer(pipe) for pipe in self._pipes]
        return started, {
            "done_at": max(answer["done_at"] for answer in answers),
            "cpu": sum(answer["cpu"] for answer in answers),
            "results": [tuple(result) for answer in answers for result in answer["results"]],
            "failures": [failure for answer in answers for failure in answer["failures"]],
            "finished": all(answer["finished"] for answer in answers),
        }

    def victim(self, chooser: random.Random) -> str:
        return chooser.choice(self.uids())

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop", None))
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def emulate(
    nodes: int,
    reforms: int,
    processes: int,
    endpoint: str,
    secret_file: str,
    store_pid: int,
    timeout: float,
) -> dict[str, Any]:
    """Form a group of `nodes` store-rounds members, held by `processes` processes, then re-form it `reforms`
    times, each after one member's death (named by the operator's regroup) with a hot spare in line: each
    member its own store connection through the job's gate, `join()` to form, `reform(departed)` after a death,
    the spare waiting in `join()` for a seat."""
    from phalanx.bench.emulated_launchers import (
        Phase,
        cpu_seconds,
        recorded,
        store_io_bytes,
    )
    from phalanx.worker import rendezvous, storegate
    from phalanx.worker.storerounds import StoreRounds

    rendezvous.raise_open_files_limit()
    host, port = endpoint.rsplit(":", 1)
    secret = storegate.read_secret(secret_file) if secret_file else None

    def launcher(index: int) -> StoreRounds:
        store = rendezvous.connect(host, int(port), timeout, secret)
        return StoreRounds(store, f"uid-{index}", nodes, nodes, timeout=timeout)

    started = time.monotonic()
    pool = RoundsPool(nodes, processes, launcher, timeout, wave=storegate.MAX_PENDING_HANDSHAKES // 2)
    report: dict[str, Any] = {
        "nodes": nodes, "protocol": "rounds", "processes": processes,
        "start_seconds": time.monotonic() - started, "phases": [],
    }  # fmt: skip
    try:
        if pool.errors:
            report["error"] = f"launchers could not start: {pool.errors[:3]}"
            return report

        def timed(name: str, command: str, argument: Any = None) -> Phase:
            io_before, store_cpu = store_io_bytes(store_pid), cpu_seconds(store_pid)
            began, answer = pool.phase(command, argument)
            return Phase(
                name,
                seconds=answer["done_at"] - began if answer["finished"] and not answer["failures"] else None,
                store_bytes=store_io_bytes(store_pid) - io_before,
                rounds=sorted({result[0] for result in answer["results"]}),
                world_sizes=sorted({result[1] for result in answer["results"]}),
                failures=answer["failures"][:5],
                store_cpu_seconds=cpu_seconds(store_pid) - store_cpu,
                members_cpu_seconds=answer["cpu"],
            )

        if not recorded(report, timed("formation", "join"), "the group did not form"):
            return report
        chooser = random.Random(nodes)
        for attempt in range(reforms):
            victim = pool.victim(chooser)  # a seated member: chosen before the spare joins the members
            pool.add_spare(nodes + attempt)
            if not recorded(report, timed(f"re-form {attempt + 1}", "reform", victim)):
                break
        report["seconds"] = time.monotonic() - started
        return report
    finally:
        pool.close()
