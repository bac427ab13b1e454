"""The job's rendezvous store: a standalone TCPStore server that no worker hosts, plus client helpers.

    python -m phalanx.worker.rendezvous --host H --port P

runs in its own pod; it prints one line `phalanx-rendezvous ready host=H port=P` once it accepts
connections and exits 0 on SIGTERM or SIGINT. Launchers connect to it as clients (`is_host=false`), so
the death of any worker never takes the rendezvous down.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from phalanx.worker.env import MAX_NODES_KEY, RESTART_EPOCH_KEY

READY_PREFIX = "phalanx-rendezvous ready"


def serve(host: str, port: int) -> dist.TCPStore:
    """Start the store server in this process (the server runs on a background thread).

    Left to itself the store's server listens on every address of the machine. Pods of the local
    cluster share one port space, so the listening socket is bound to `host` here and handed over:
    two jobs' stores on one machine then never collide.
    """
    listener = socket.create_server((host, port), backlog=1024)
    return dist.TCPStore(
        host_name=host,
        port=port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=30),
        master_listen_fd=listener.detach(),  # the store owns the socket from now on
    )


def connect(host: str, port: int, timeout: float) -> dist.TCPStore:
    """A client of the rendezvous store; raises (RuntimeError/DistError) if it is not reachable in `timeout`."""
    return dist.TCPStore(
        host_name=host,
        port=port,
        is_master=False,
        multi_tenant=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
    )


def read_restart_epoch(store: dist.Store) -> int:
    """Current restart epoch; `add(key, 0)` reads without blocking when the key is absent."""
    return int(store.add(RESTART_EPOCH_KEY, 0))


def request_restart(store: dist.Store) -> int:
    """Ask every launcher of the job to restart its worker group now; returns the new epoch."""
    return int(store.add(RESTART_EPOCH_KEY, 1))


def parse_max_nodes(raw: str) -> int | None:
    """The node count of a `phalanx/max-nodes` value (`"3"` or `"3 <writer>"`); None if malformed."""
    first = raw.split(" ", 1)[0]
    return int(first) if first.isdigit() and int(first) > 0 else None


def read_max_nodes(store: dist.Store, seed: int) -> str:
    """The raw `phalanx/max-nodes` value; an absent key is set to `seed` first (one atomic operation)."""
    return store.compare_set(MAX_NODES_KEY, "", str(seed)).decode()


def publish_max_nodes(store: dist.Store, expected_raw: str, value: int, writer: str) -> bool:
    """Replace `expected_raw` with `value`; True only for the one writer whose compare-and-set won."""
    mine = f"{value} {writer}"
    return store.compare_set(MAX_NODES_KEY, expected_raw, mine).decode() == mine


@dataclass(frozen=True)
class RoundView:
    """What a spare reads of the rendezvous state (torch's c10d rendezvous, kept in the store)."""

    round: int
    """Rounds formed before the current one; it grows each time the whole group re-forms."""
    complete: bool
    """The current round has formed: its participants train."""
    participants: int
    """Nodes in the current round."""
    waiting: int
    """Nodes queued for the next round (a late worker, or a node that wants back in)."""


def spare_may_join(view: RoundView, max_nodes: int, waited_out: bool) -> str | None:
    """Why a spare that has not joined yet may join now, or None while it must keep out of the way.

    A spare joins only where it cannot take a slot from a worker still arriving for the first round:
    - the round is complete and full: torch puts the spare in its redundancy list (a standby);
    - the group has re-formed since the first round and nobody else is queued: it is short of a node
      (one was lost) and needs the spare now;
    - `waited_out`: the workers did not all arrive within the join timeout, so a free slot is the spare's.
    """
    if view.complete and view.participants >= max_nodes:
        return "the group is full: standing by"
    if view.round > 0 and view.waiting == 0:
        return "the group re-formed short of nodes"
    if waited_out:
        return "the workers did not all arrive within the join timeout"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.rendezvous", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (the pod IP)")
    parser.add_argument("--port", type=int, default=29400, help="port to listen on (0: any free port)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        store = serve(args.host, args.port)
    except Exception as error:
        print(f"phalanx-rendezvous: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 3
    print(f"{READY_PREFIX} host={args.host} port={store.port}", flush=True)
    while not stop.wait(1.0):
        pass
    print("phalanx-rendezvous stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
