"""Many launchers' rendezvous in one process: what N pods' launchers send the job's store, without N pods.

Each emulated launcher is the launcher's own client of the rendezvous (`phalanx.worker.launch.RendezvousClient`:
its two store connections through the job's gate, torch's dynamic rendezvous handler as the launcher sets it up,
its keep-alives, its node published for the operator's word, the freshness guard), driven the way the
launcher drives it, one thread each: `next_rendezvous()` to form the group; on a member's death the operator's
regroup (its node expired at once, `forget_departed`), after which every survivor re-enters the rendezvous and
the waiting hot spare fills the place. With `--protocol rounds` the same group and deaths go through the
store-decided rounds of worker/storerounds.py instead (bench/rounds_pool.py, the members in `--processes`
processes). Nothing trains: what is measured is the rendezvous alone.

Run as its own process (`python -m phalanx.bench.emulated_launchers ...`), so that its threads and the store
process it talks to are measured apart from the harness. It prints one JSON object: the timings and the
store process's bytes read and written (from /proc/PID/io) for each phase.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LAUNCHER_START_TIMEOUT = 60.0


@dataclass
class Phase:
    """One timed rendezvous of the whole group."""

    name: str
    seconds: float | None = None
    """From the phase's start (all members asked at once; for a re-form: the member's death) until the last
    member's `next_rendezvous` returned; None if it did not finish within the timeout."""
    store_bytes: int | None = None
    """Bytes the store process read and wrote meanwhile (its gate and its store: every byte the rendezvous
    moved)."""
    rounds: list[int] = field(default_factory=list)
    """The rendezvous round each member returned with (one number when the group agreed)."""
    world_sizes: list[int] = field(default_factory=list)
    """The group size each member returned with."""
    failures: list[str] = field(default_factory=list)
    """Errors raised in members' rendezvous (first few)."""
    store_cpu_seconds: float | None = None
    """CPU time the store process spent meanwhile."""
    members_cpu_seconds: float | None = None
    """CPU time this process (every emulated member) spent meanwhile: near the wall time times the cores, the
    emulation itself is what limits the phase, not the store."""


def store_io_bytes(pid: int) -> int:
    """Bytes the process read and wrote through system calls (sockets included)."""
    figures = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(figures["rchar"]) + int(figures["wchar"])


def cpu_seconds(pid: int | str = "self") -> float:
    """User and system CPU time of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settings_for(
    index: int, endpoint: str, secret_file: str, nodes: int, role: str, keepalive: tuple[float, float]
) -> Any:
    from phalanx.worker.env import LaunchSettings

    interval, timeout = keepalive
    return LaunchSettings(
        rdzv_endpoint=endpoint,
        run_id="scale",
        command=("true",),
        min_nodes=nodes,
        max_nodes=nodes,
        role=role,  # type: ignore[arg-type]
        local_addr="127.0.0.1",
        store_secret_file=secret_file,
        pod_name=f"launcher-{index}",
        pod_uid=f"uid-{index}",
        keepalive_interval=interval,
        keepalive_timeout=timeout,
        join_timeout=600.0,
    )


def in_parallel(calls: Sequence[Callable[[], Any]], timeout: float) -> tuple[list[Any], list[str], bool]:
    """Run each call on a thread of its own at once; (results, errors, all finished in time)."""
    results: list[Any] = [None] * len(calls)
    errors: list[str] = []

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            results[index] = call()
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}"[:300])

    threads = [
        threading.Thread(target=run, args=(index, call), daemon=True) for index, call in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return results, errors, not any(thread.is_alive() for thread in threads)


def rendezvous_of(member: Any) -> tuple[int, int]:
    """One launcher's rendezvous: (the round it joined, the group's size)."""
    from phalanx.worker import torch_elastic

    info = member.handler.next_rendezvous()
    return torch_elastic.round_state(member.handler).round, info.world_size


def timed_rendezvous(
    name: str,
    members: list[Any],
    store_pid: int,
    timeout: float,
    before: Callable[[], None] | None = None,
    waiting: list[tuple[threading.Thread, list[Any]]] = (),  # type: ignore[assignment]
) -> Phase:
    """Every member's `next_rendezvous()` at once (`timed_phase`)."""
    calls = [functools.partial(rendezvous_of, member) for member in members]
    return timed_phase(name, calls, store_pid, timeout, before, waiting)


def timed_phase(
    name: str,
    calls: Sequence[Callable[[], tuple[int, int]]],
    store_pid: int,
    timeout: float,
    before: Callable[[], None] | None = None,
    waiting: list[tuple[threading.Thread, list[Any]]] = (),  # type: ignore[assignment]
) -> Phase:
    """Every member's rendezvous call at once (each returns (round, group size)), timed from the start (after
    `before`, if given), and the rendezvous already under way on the `waiting` threads (each with a one-place
    list for its result)."""
    phase = Phase(name)
    io_before = store_io_bytes(store_pid)
    store_cpu, own_cpu = cpu_seconds(store_pid), cpu_seconds()
    started = time.monotonic()
    if before is not None:
        before()
    results, errors, finished = in_parallel(calls, timeout)
    deadline = started + timeout
    for thread, outcome in waiting:
        thread.join(max(0.0, deadline - time.monotonic()))
        finished = finished and not thread.is_alive()
        if outcome and isinstance(outcome[0], str):
            errors.append(outcome[0])
        elif outcome:
            results.append(outcome[0])
    if finished and not errors:
        phase.seconds = time.monotonic() - started
    phase.store_bytes = store_io_bytes(store_pid) - io_before
    phase.store_cpu_seconds = cpu_seconds(store_pid) - store_cpu
    phase.members_cpu_seconds = cpu_seconds() - own_cpu
    phase.rounds = sorted({result[0] for result in results if result})
    phase.world_sizes = sorted({result[1] for result in results if result})
    phase.failures = errors[:5]
    return phase


def standing_by(spare: Any) -> tuple[threading.Thread, list[Any]]:
    """A spare's launcher as it runs: once the group is formed it enters the rendezvous and waits there, in the
    wait list, for a place. Returns its thread and the list its outcome lands in."""
    from phalanx.worker import torch_elastic

    outcome: list[Any] = []

    def stand_by() -> None:
        try:
            spare.wait_for_formed_group()
            outcome.append(rendezvous_of(spare))
        except Exception as error:
            outcome.append(f"{type(error).__name__}: {error}"[:300])

    thread = threading.Thread(target=stand_by, daemon=True)
    thread.start()
    node = torch_elastic.node_of(spare.handler)
    deadline = time.monotonic() + LAUNCHER_START_TIMEOUT
    while time.monotonic() < deadline and thread.is_alive():
        state = torch_elastic.round_state(spare.handler)
        if node in state.redundancy_list or node in state.wait_list:
            break
        time.sleep(0.05)
    return thread, outcome


def recorded(report: dict[str, Any], phase: Phase, failure: str = "") -> bool:
    """Add a phase to the report; False, with the report's error said (`failure`, else that the phase did
    not finish), when it did not finish."""
    report["phases"].append(asdict(phase))
    if phase.seconds is None:
        report["error"] = failure or f"{phase.name} did not finish"
    return phase.seconds is not None


def emulate(
    nodes: int,
    reforms: int,
    endpoint: str,
    secret_file: str,
    store_pid: int,
    timeout: float,
    keepalive: tuple[float, float],
) -> dict[str, Any]:
    """Form a group of `nodes` emulated launchers, then re-form it `reforms` times, each after one member's
    death with a hot spare waiting to take its place."""
    from phalanx.worker import rendezvous, torch_elastic
    from phalanx.worker.launch import RendezvousClient

    rendezvous.raise_open_files_limit()
    # As the launcher sets it (worker/launch.py): each round's rank 0 publishes its address afresh, instead of
    # the first rank 0 serving every later round.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    started = time.monotonic()
    members, errors, finished = in_parallel(
        [
            functools.partial(
                RendezvousClient, settings_for(index, endpoint, secret_file, nodes, "worker", keepalive)
            )
            for index in range(nodes)
        ],
        LAUNCHER_START_TIMEOUT + nodes * 0.1,
    )
    report: dict[str, Any] = {"nodes": nodes, "start_seconds": time.monotonic() - started, "phases": []}
    if errors or not finished:
        report["error"] = f"launchers could not start: {errors[:3] or 'timed out'}"
        return report
    if not recorded(
        report, timed_rendezvous("formation", members, store_pid, timeout), "the group did not form"
    ):
        return report
    chooser = random.Random(nodes)
    for attempt in range(reforms):
        index = nodes + attempt
        spare = RendezvousClient(settings_for(index, endpoint, secret_file, nodes, "spare", keepalive))
        waiting = standing_by(spare)
        victim = members.pop(chooser.randrange(len(members)))

        def death(victim: Any = victim) -> None:
            # The pod is gone: no more keep-alives. The operator names it in a regroup request; the launcher
            # that claims it expires the dead node's keep-alive at once (worker/regroup.py).
            torch_elastic.stop_keep_alives(victim.handler)
            members[0].forget_departed((victim.settings.pod_uid,))

        phase = timed_rendezvous(
            f"re-form {attempt + 1}", members, store_pid, timeout, before=death, waiting=[waiting]
        )
        members.append(spare)
        if not recorded(report, phase):
            break
    report["seconds"] = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.bench.emulated_launchers", description=__doc__)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--reforms", type=int, default=1)
    parser.add_argument(
        "--endpoint", required=True, help="host:port of the job's rendezvous store (its gate)"
    )
    parser.add_argument("--secret-file", default="", help="the job's store secret")
    parser.add_argument("--store-pid", type=int, required=True, help="the store's process, for its bytes")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one rendezvous may take")
    parser.add_argument(
        "--keepalive", type=float, nargs=2, default=(1.0, 5.0), metavar=("INTERVAL", "TIMEOUT")
    )
    parser.add_argument(
        "--protocol",
        choices=("c10d", "rounds"),
        default="c10d",
        help="c10d: the launcher's rendezvous today; rounds: the store-decided rounds of worker/storerounds.py",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="rounds: spread the members over this many processes (bench/rounds_pool.py)",
    )
    args = parser.parse_args(argv)
    if args.protocol == "rounds":
        from phalanx.bench import rounds_pool

        report = rounds_pool.emulate(
            args.nodes,
            args.reforms,
            args.processes,
            args.endpoint,
            args.secret_file,
            args.store_pid,
            args.timeout,
        )
    else:
        report = emulate(
            args.nodes,
            args.reforms,
            args.endpoint,
            args.secret_file,
            args.store_pid,
            args.timeout,
            tuple(args.keepalive),
        )
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
