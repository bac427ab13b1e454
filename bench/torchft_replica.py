"""One torchft replica group of `peer-torchft`: the tiny GPT trained through torchft's Manager on CPU/gloo.

Run by the benchmark as `python -m phalanx.bench.torchft_replica --replica-id ID --lighthouse ADDR`, one
process per replica group (a group of one rank, as torchft's DDP example runs with one process per group).
The setup follows torchft's own DDP example and integration tests: a TCPStore for the group, a
`ProcessGroupGloo`, a `Manager` that joins the lighthouse's quorum, the model wrapped in torchft's
`PureDistributedDataParallel` and the optimizer in its `OptimizerWrapper` (which commits a step only when every
replica in the quorum completed it). Not torchft's `DistributedDataParallel`: in torchft 0.2.0 its comm hook
asserts on the dummy future the Manager returns once an allreduce failed (`assert fut._fut` in
torchft/ddp.py), so a kill that lands during the backward pass crashed the survivors here instead of
letting the Manager discard the step; the pure wrapper sends the same allreduces through the same Manager.

Each optimizer step prints one line on stdout, which the benchmark parses (`phalanx.bench.peers.parse_step`):
`STEP <step after the attempt> <unix time> <participants> <1 committed | 0 discarded>`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from phalanx.worker.examples.tinygpt import TinyGPT

VOCAB = 65
BLOCK = 64
BATCH = 8


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica-id", required=True, help="this replica group's id in the quorum")
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's address (http://host:port)")
    parser.add_argument("--min-replicas", type=int, default=2, help="replica groups a step needs")
    parser.add_argument("--timeout", type=float, default=60.0, help="Manager timeout (collectives, commit)")
    parser.add_argument("--quorum-timeout", type=float, default=60.0, help="Manager quorum timeout")
    parser.add_argument("--connect-timeout", type=float, default=60.0, help="Manager connect timeout")
    parser.add_argument("--heartbeat-interval", type=float, default=0.1, help="Manager -> lighthouse")
    parser.add_argument("--gloo-timeout", type=float, default=60.0, help="ProcessGroupGloo timeout")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop on its own after this")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from torchft import Manager, ProcessGroupGloo
    from torchft.ddp import PureDistributedDataParallel
    from torchft.optim import OptimizerWrapper

    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every replica starts from the same weights, as DDP replicas do
    model: nn.Module = TinyGPT(VOCAB, BLOCK)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optim"])  # type: ignore[arg-type]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.gloo_timeout)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replicas,
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.connect_timeout),
        heartbeat_interval=timedelta(seconds=args.heartbeat_interval),
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        replica_id=args.replica_id,
        port=0,
    )
    wrapped = PureDistributedDataParallel(manager, model)
    ft_optimizer = OptimizerWrapper(manager, optimizer)
    criterion = nn.CrossEntropyLoss()
    deadline = time.monotonic() + args.max_seconds
    try:
        while time.monotonic() < deadline:
            tokens = torch.randint(VOCAB, (BATCH, BLOCK + 1))
            ft_optimizer.zero_grad()
            logits = wrapped(tokens[:, :-1])
            loss = criterion(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            before = manager.current_step()
            ft_optimizer.step()
            after = manager.current_step()
            committed = int(after > before)
            print(f"STEP {after} {time.time():.6f} {manager.num_participants()} {committed}", flush=True)
    finally:
        manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
