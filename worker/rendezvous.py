"""The job's rendezvous store: a standalone TCPStore server that no worker hosts, plus client helpers.

    python -m phalanx.worker.rendezvous --host H --port P

runs in its own pod; it prints one line `phalanx-rendezvous ready host=H port=P` once it accepts
connections and exits 0 on SIGTERM or SIGINT. Launchers connect to it as clients (`is_host=false`), so
the death of any worker never takes the rendezvous down. With the job's secret (`PHALANX_STORE_SECRET_FILE`,
mounted by the operator) the store itself listens on loopback only, behind the authenticating gate of
worker/storegate.py on H:P, and clients pass the gate (`connect(..., secret=...)`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import pickle
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import torch.distributed as dist

from phalanx.worker import safepickle, storeevents, storegate
from phalanx.worker.env import FRESHEST_KEY, MAX_NODES_KEY, OUTCOME_KEY, RESTART_EPOCH_KEY

logger = logging.getLogger("phalanx.launch")

READY_PREFIX = "phalanx-rendezvous ready"
SECRET_FILE_ENV = "PHALANX_STORE_SECRET_FILE"
"""The file holding the job's store secret (a Secret the operator makes per job and mounts into its pods)."""


def libuv_transport() -> bool:
    """Whether stores use libuv, by the rule torch's own launcher follows: yes unless USE_LIBUV is not "1".

    torch builds without libuv (Debian's) need USE_LIBUV=0, for torch's stores and these alike.
    """
    return os.environ.get("USE_LIBUV", "1") == "1"


def serve(host: str, port: int) -> dist.TCPStore:
    """Start the store server in this process (the server runs on a background thread).

    Left to itself the store's server listens on every address of the machine. Pods of the local
    cluster share one port space, so the listening socket is bound to `host` here and handed over:
    two jobs' stores on one machine then never collide.
    """
    listener = socket.create_server((host, port), backlog=1024)
    return dist.TCPStore(
        host_name=host,
        # The port bound (port 0 picks one): the store's transport without libuv checks the two agree.
        port=listener.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=30),
        master_listen_fd=listener.detach(),  # the store owns the socket from now on
        use_libuv=libuv_transport(),
    )


@dataclass
class GatedServer:
    """A store on loopback and the gate that admits the job's pods to it (see worker/storegate.py)."""

    store: dist.TCPStore
    gate: storegate.Gate

    @property
    def port(self) -> int:
        """The gate's port: the one clients connect to."""
        return self.gate.port


def serve_gated(host: str, port: int, secret: bytes) -> GatedServer:
    """The store on a loopback port of its own, reached only through a gate on host:port that requires
    `secret`."""
    listener = socket.create_server((host, port), backlog=1024)
    try:
        store = serve("127.0.0.1", 0)
    except BaseException:
        listener.close()
        raise
    return GatedServer(store, storegate.Gate(listener, ("127.0.0.1", store.port), secret))


def connect(host: str, port: int, timeout: float, secret: bytes | None = None) -> dist.TCPStore:
    """A client of the rendezvous store; raises (RuntimeError/DistError) if it is not reachable in `timeout`.

    With `secret`, through this process's forwarder to the store's gate: the gate is asked first, so that
    a secret it refuses is said as such (`storegate.GateRefused`, a RuntimeError)."""
    if secret is not None:
        try:
            storegate.check_reachable(host, port, secret, min(timeout, storegate.HANDSHAKE_TIMEOUT))
        except OSError as error:
            raise dist.DistNetworkError(f"the rendezvous store's gate at {host}:{port}: {error}") from None
        host, port = "127.0.0.1", storegate.forwarder_for(host, port, secret).port
    return dist.TCPStore(
        host_name=host,
        port=port,
        is_master=False,
        multi_tenant=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout),
        use_libuv=libuv_transport(),
    )


def read_restart_epoch(store: dist.Store) -> int:
    """Current restart epoch; `add(key, 0)` reads without blocking when the key is absent."""
    return int(store.add(RESTART_EPOCH_KEY, 0))


def request_restart(store: dist.Store) -> int:
    """Ask every launcher of the job to restart its worker group now; returns the new epoch."""
    epoch = int(store.add(RESTART_EPOCH_KEY, 1))
    storeevents.announce(store)
    return epoch


@dataclass(frozen=True)
class GroupOutcome:
    """How the group ended, as the launcher that closed the rendezvous said: its exit code and why."""

    code: int
    message: str

    @property
    def failed(self) -> bool:
        return self.code != 0

    def encode(self) -> str:
        return json.dumps({"code": self.code, "message": self.message})

    @classmethod
    def parse(cls, raw: str) -> GroupOutcome | None:
        """None for anything but the JSON `encode` writes (the store is not trusted further)."""
        try:
            fields = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(fields, dict):
            return None
        code, message = fields.get("code"), fields.get("message")
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
            return None
        return cls(code, message[:2000] if isinstance(message, str) else "")


def publish_outcome(store: dist.Store, outcome: GroupOutcome) -> None:
    """Say how the group ended before closing its rendezvous; the first launcher to say it wins (a spare's
    later "success" never hides a failure)."""
    store.compare_set(OUTCOME_KEY, "", outcome.encode())


def read_outcome(store: dist.Store) -> GroupOutcome | None:
    """How the group ended (None: nobody said, or not in the expected form)."""
    if not store.check([OUTCOME_KEY]):
        return None
    return GroupOutcome.parse(store.get(OUTCOME_KEY).decode(errors="replace"))


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


def has_room(complete: bool, participants: int, max_nodes: int) -> bool:
    """Whether re-forming the group could admit a queued node: the round is still open, or it is complete
    with fewer participants than the active nodes wanted."""
    return not complete or participants < max_nodes


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


CONNECTIONS_PER_LAUNCHER = 3
"""A launcher's connections to the job's store: its own keys, its round's waits, its watch of the events."""
FILES_PER_CONNECTION = 3
"""Open files one connection costs the rendezvous pod: the gate's two sockets and the store's one."""


def raise_open_files_limit() -> int:
    """Raise this process's open-files limit to its hard limit, and return it: each launcher costs the store
    `CONNECTIONS_PER_LAUNCHER * FILES_PER_CONNECTION` of them (a 12,500-pod job about 112,500), and a container
    runtime may start processes at a soft limit of 1,024 under a hard one of 524,288 (Go's runtime raises its
    own, Python's does not)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.worker.rendezvous", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (the pod IP)")
    parser.add_argument("--port", type=int, default=29400, help="port to listen on (0: any free port)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    secret_file = os.environ.get(SECRET_FILE_ENV)
    try:
        secret = storegate.read_secret(secret_file) if secret_file else None
    except storegate.SecretError as error:
        print(f"phalanx-rendezvous: {error}", file=sys.stderr)
        return 2
    try:
        server = serve(args.host, args.port) if secret is None else serve_gated(args.host, args.port, secret)
    except Exception as error:
        print(f"phalanx-rendezvous: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 3
    gated = " gated" if secret is not None else ""
    print(f"{READY_PREFIX} host={args.host} port={server.port}{gated}", flush=True)
    print(f"phalanx-rendezvous: up to {raise_open_files_limit()} open files", flush=True)
    while not stop.wait(1.0):
        pass
    print("phalanx-rendezvous stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------------------- state polling

STORE_READS_PER_SECOND = 1000.0
"""The rate of rendezvous-state reads the store is asked to bear from nodes waiting in a round."""
SYNC_POLL_BOUNDS = (0.05, 1.0)
"""The shortest and longest pause between two reads of the rendezvous state by a waiting node."""
TORCH_SYNC_DELAY = 1
"""The pause torch's rendezvous executor asks for between two reads of the state (`_delay(seconds=1)`)."""


def sync_poll_interval(max_nodes: int) -> float:
    """Seconds between two reads of the shared rendezvous state by a node waiting in a round.

    torch waits a fixed second between reads (to spare the store at thousands of nodes). Every step of a
    re-rendezvous (join, the last call, the round's completion seen by each node) waits for one such read,
    so at tens of nodes that second is most of a regroup. Scaled with the group so that all nodes together
    read about `STORE_READS_PER_SECOND` times a second: 50 ms up to 50 nodes, torch's second at 1,000."""
    low, high = SYNC_POLL_BOUNDS
    return min(high, max(low, max(1, max_nodes) / STORE_READS_PER_SECOND))


def install_sync_poll(interval: float) -> bool:
    """Make torch's rendezvous executor pause `interval` seconds instead of one between state reads.

    The pause is a module-level call in torch (`dynamic_rendezvous._delay(seconds=1)` in the executor's
    loop); other delays there (join jitter) keep their values. Returns False, changing nothing, when this
    torch has no such call (tests/unit/worker_runtime pins the call so an upgrade is noticed)."""
    from phalanx.worker import torch_elastic

    original = torch_elastic.sync_delay()
    if original is None:
        return False
    torch_delay = getattr(original, "phalanx_original", original)

    def delay(seconds: float | tuple[float, float]) -> None:
        torch_delay(interval if seconds == TORCH_SYNC_DELAY else seconds)

    delay.phalanx_original = torch_delay  # type: ignore[attr-defined]
    torch_elastic.set_sync_delay(delay)
    return True


# ------------------------------------------------------------------------------- departed workers

NODE_KEY_PREFIX = "phalanx/rendezvous-node/"
"""`<prefix><pod uid>` (or pod name) in the store: that pod's node in torch's rendezvous (`addr pid local_id`)."""
EXPIRED = datetime(1970, 1, 1, tzinfo=UTC)
"""A keep-alive older than any timeout: torch's next read of the state removes the node."""


def publish_node(store: dist.Store, pod_key: str, node: Any) -> None:
    """Record which rendezvous node (torch's `_NodeDesc`) this pod's launcher is, for `forget_departed`, under
    its pod's UID (its name where it runs without one)."""
    if pod_key:
        store.set(NODE_KEY_PREFIX + pod_key, f"{node.addr} {node.pid} {node.local_id}")


Node = tuple[str, int, int]
"""A rendezvous node as torch names it: its address, its launcher's pid and its local id."""


def node_key(node: Any) -> Node:
    """The (addr, pid, local_id) of torch's `_NodeDesc`."""
    return (node.addr, node.pid, node.local_id)


def departed_nodes(store: dist.Store, pod_keys: Sequence[str]) -> set[Node]:
    """The rendezvous nodes the named pods' launchers published (pods that never published are skipped)."""
    found = set()
    for pod_key in pod_keys:
        key = NODE_KEY_PREFIX + pod_key
        if not store.check([key]):
            continue
        addr, pid, local_id = store.get(key).decode().split()
        found.add((addr, int(pid), int(local_id)))
    return found


def group_includes(
    store: dist.Store, members: frozenset[Node] | None, pod_keys: Sequence[str]
) -> bool | None:
    """Whether the group of rendezvous nodes `members` includes a node that one of the named pods' launchers
    published (None: not known, the members are not or none of the pods published a node)."""
    if members is None or not pod_keys:
        return None
    departed = departed_nodes(store, pod_keys)
    return bool(departed & members) if departed else None


def forget_departed(store: dist.Store, backend: Any, pod_keys: Sequence[str], attempts: int = 5) -> list[str]:
    """Expire, in torch's rendezvous state, the keep-alives of the departed pods' nodes.

    A node that died without leaving stays a participant of the finished round until its keep-alive
    expires (keep-alive interval x attempts: seconds), and no new round can form before: that wait was
    most of a recovery. The operator names the failed pods in its regroup request, by UID, so their nodes
    are expired at once (compare-and-set of the state, `attempts` tries) and torch's next read of the state
    removes them. Whatever a departed node sent last does not save it: a pod UID is never reused, so the node
    is the failed pod's own launcher, on its way out (a frozen one thawed to be killed still sends one
    keep-alive). Returns the addresses of the nodes expired."""
    wanted = departed_nodes(store, pod_keys)
    if not wanted:
        return []
    for _ in range(attempts):
        current = backend.get_state()
        if current is None:
            return []
        bits, token = current
        state = safepickle.loads(bits, safepickle.RENDEZVOUS_STATE)
        stale = [
            node
            for node, beat in state.last_heartbeats.items()
            if node_key(node) in wanted and beat > EXPIRED
        ]
        if not stale:
            return []
        for node in stale:
            state.last_heartbeats[node] = EXPIRED
        written = backend.set_state(pickle.dumps(state), token)
        if written is not None and written[2]:
            return [f"{node.addr}/{node.pid}" for node in stale]
    return []


# ------------------------------------------------------------------------------- the freshest state

# torch fills a round with whichever nodes add themselves first and knows nothing of what they hold. When a
# group re-forms with more candidates than places (a survivor and two new spares after two failures in a
# row, or every launcher at once after a store loss), the one node holding the newest in-memory snapshot
# can lose the race: the group then restores an older state (a durable checkpoint), and the freshest one
# stands by unused. So every launcher holding a snapshot names itself in the store before it rendezvous,
# when it holds a newer state than the one named, and a node holding older state (a new pod holds none)
# leaves that node the last place of a round being formed. The restore then takes the newest state any
# member holds (worker/checkpoint/checkpointer.py), which is the newest anywhere.


@dataclass(frozen=True)
class FreshestClaim:
    """The node named as holding the newest state (`phalanx/freshest`), and the round it is joining."""

    step: int
    """The newest step of which the node holds an in-memory snapshot."""
    round: int
    """The round the node was about to join when it claimed (the current one if still being formed, else the
    next)."""
    node: Node

    def encode(self) -> str:
        addr, pid, local_id = self.node
        return f"{self.step} {self.round} {addr} {pid} {local_id}"

    @classmethod
    def parse(cls, raw: str) -> FreshestClaim | None:
        parts = raw.split()
        if len(parts) != 5:
            return None
        step, round_, addr, pid, local_id = parts
        try:
            return cls(int(step), int(round_), (addr, int(pid), int(local_id)))
        except ValueError:
            return None


def replaces(new: FreshestClaim, current: FreshestClaim) -> bool:
    """Whether `new` takes the place of the claim in force: the same node's; a claim older than the previous
    round (its group formed long since); a newer step; or the same step for a later round (the holder of that
    step that is re-forming now, rather than one that may since have gone)."""
    return (
        new.node == current.node
        or current.round < new.round - 1
        or new.step > current.step
        or (new.step == current.step and new.round > current.round)
    )


def read_claim(store: dist.Store) -> FreshestClaim | None:
    """The claim in force (None: none yet)."""
    if not store.check([FRESHEST_KEY]):
        return None
    return FreshestClaim.parse(store.get(FRESHEST_KEY).decode())


def claim_freshest(store: dist.Store, claim: FreshestClaim, attempts: int = 5) -> FreshestClaim | None:
    """Name `claim`'s node as the holder of the newest state where it `replaces` the claim in force
    (compare-and-set; of launchers claiming together the freshest wins); returns the claim in force after."""
    mine = claim.encode()
    raw = store.compare_set(FRESHEST_KEY, "", mine).decode()
    for _ in range(attempts):
        if raw == mine:
            return claim
        current = FreshestClaim.parse(raw)
        if current is not None and not replaces(claim, current):
            return current
        raw = store.compare_set(FRESHEST_KEY, raw, mine).decode()
    return FreshestClaim.parse(raw)


def target_round(current_round: int, complete: bool) -> int:
    """The round a node that starts a rendezvous now joins: the one being formed, else the next one."""
    return current_round + 1 if complete else current_round


def must_leave_last_place(
    claim: FreshestClaim | None,
    me: Node,
    my_step: int,
    state_round: int,
    participants: set[Node],
    present: set[Node],
    places_left: int,
) -> bool:
    """Whether this node, about to add itself to the round `state_round` being formed, must leave the place to
    the claimed holder of a newer state than its own: only the last place, and only while the holder is on its
    way (it claimed for this round, so it is between leaving the last one and joining this one, or it claimed
    for the previous round and still waits in the rendezvous: `present`)."""
    if claim is None or claim.node == me or claim.step <= my_step:
        return False
    if claim.node in participants or places_left > 1:
        return False
    if claim.round == state_round:
        return True
    return claim.round == state_round - 1 and claim.node in present


class FreshnessGuard:
    """One launcher's side of the freshest-state rule: it claims before each rendezvous (`offer`) and, asked by
    torch's join (`torch_elastic.guard_joins`), holds this node back from the last place of a round while the
    holder of a newer state is on its way, for at most `patience` seconds per round and holder (a holder that
    died on its way is dropped by torch once its keep-alive lapses; this bound keeps the round from waiting
    longer than that)."""

    def __init__(
        self,
        store: Callable[[], dist.Store],
        node: Node,
        patience: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.node = node
        self.patience = patience
        self._clock = clock
        self.held = -1
        """The newest step this pod holds a snapshot of, as offered at the last rendezvous (-1: none)."""
        self._waiting_for: tuple[int, FreshestClaim] | None = None
        self._since = 0.0

    def offer(self, held: int, current_round: int, complete: bool) -> FreshestClaim | None:
        """Before a rendezvous: remember what this pod holds and, when it holds a snapshot, claim it for the
        round it joins. Returns the claim in force."""
        self.held = held
        if held < 0:
            return None
        claim = FreshestClaim(held, target_round(current_round, complete), self.node)
        return claim_freshest(self._store(), claim)

    def must_wait(self, state: Any, max_nodes: int) -> bool:
        """Whether this node must not add itself yet to the round that `state` (torch's rendezvous state) forms."""
        try:
            claim = read_claim(self._store())
        except Exception:  # the store's trouble is the rendezvous's to handle, not this rule's
            return False
        participants = {node_key(node) for node in state.participants}
        present = participants | {node_key(node) for node in (*state.wait_list, *state.redundancy_list)}
        places_left = max_nodes - len(state.participants)
        if not must_leave_last_place(
            claim, self.node, self.held, state.round, participants, present, places_left
        ):
            self._waiting_for = None
            return False
        assert claim is not None
        waiting_for = (state.round, claim)
        now = self._clock()
        if self._waiting_for != waiting_for:
            self._waiting_for, self._since = waiting_for, now
            addr, pid, _ = claim.node
            logger.info(
                "leaving the last place of round %d to %s/%s, which holds step %d (this node holds %s)",
                state.round,
                addr,
                pid,
                claim.step,
                self.held if self.held >= 0 else "none",
            )
        if now - self._since < self.patience:
            return True
        if self._since >= 0:
            self._since = -math.inf  # said once per round and holder
            logger.warning(
                "round %d: the holder of step %d did not join within %gs; taking the place",
                state.round,
                claim.step,
                self.patience,
            )
        return False
