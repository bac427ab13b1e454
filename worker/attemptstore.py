"""The training processes' store of each group attempt, behind the job's gate.

torch's launcher gives the training processes a store of their own per attempt: what `init_process_group`'s
env:// rendezvous (MASTER_ADDR, MASTER_PORT) connects to, and what gloo and NCCL exchange their addresses and
barriers through. Left to torch, training rank 0 hosts it on a port that the whole pod network can reach, with
no authentication: whoever reaches it can read the group's addresses, rewrite them, or hold its barriers.

With the job's secret, the launcher of node rank 0 hosts it instead: a fresh store per attempt on loopback,
behind a `storegate.Gate` on the pod's address, published in the round's own keys of the rendezvous store. Every
launcher (rank 0's too) gives its training processes a loopback forwarder to that gate that serves only the
processes it started, and MASTER_ADDR/MASTER_PORT name the forwarder. The training processes connect as
clients only (torch_elastic.LauncherStoreHandler), so user code's `init_process_group()` needs no change.
"""

from __future__ import annotations

import json
import logging

import torch.distributed as dist

from phalanx.worker import rendezvous, storegate

logger = logging.getLogger("phalanx.attemptstore")

ADDRESS_KEY = "phalanx/attempt-store"
"""The gate's address ([host, port], JSON), in the round's keys (torch prefixes them with the round)."""


class AttemptStore:
    """This launcher's part in the training processes' store: hosting it on node rank 0, and a forwarder to
    it on every node. One attempt at a time: each `open` ends the previous attempt's."""

    def __init__(self, secret: bytes, bind_host: str) -> None:
        self._secret = secret
        self._bind_host = bind_host
        self._hosted: rendezvous.GatedServer | None = None
        self._forwarder: storegate.Forwarder | None = None

    def open(self, round_store: dist.Store, group_rank: int) -> tuple[str, int]:
        """Set up this attempt's store (hosted here when this node is rank 0) and return the address (host,
        port) this node's training processes reach it at. Raises the store's errors (DistError) when rank 0
        does not publish its gate within the round store's timeout."""
        self.close()
        if group_rank == 0:
            self._hosted = rendezvous.serve_gated(self._bind_host, 0, self._secret)
            round_store.set(ADDRESS_KEY, json.dumps([self._bind_host, self._hosted.port]))
        host, port = json.loads(round_store.get(ADDRESS_KEY))
        self._forwarder = storegate.Forwarder(str(host), int(port), self._secret, serve_descendants=True)
        logger.info(
            "training processes' store: behind the gate at %s:%d%s, reached through 127.0.0.1:%d",
            host,
            port,
            " (hosted here)" if self._hosted is not None else "",
            self._forwarder.port,
        )
        return "127.0.0.1", self._forwarder.port

    def close(self) -> None:
        """End the current attempt's store and forwarder (connections already relayed run on until closed)."""
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        if self._hosted is not None:
            self._hosted.gate.close()
            self._hosted = None  # the store's server stops with its last reference
