"""One node of a test job: torch's elastic agent with Phalanx's store-rounds handler, running `WORKER` (a
gloo all-reduce over the group) once. Usage: rounds_agent.py PORT UID NODES OUT_DIR."""

from __future__ import annotations

import sys
import tempfile
from datetime import timedelta

import torch.distributed as dist

from phalanx.worker.roundshandler import StoreRoundsHandler
from phalanx.worker.storerounds import StoreRounds
from phalanx.worker.torch_elastic import DefaultLogsSpecs, LocalElasticAgent, WorkerSpec

WORKER = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}"), "w") as out:
    out.write(f"{dist.get_world_size()} {int(total.item())} {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
dist.destroy_process_group()
"""


def main() -> int:
    port, uid, nodes, out_dir = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    handler = StoreRoundsHandler(StoreRounds(store, uid, nodes, nodes, timeout=60.0), "job", "127.0.0.1")
    spec = WorkerSpec(
        role="trainer",
        local_world_size=1,
        rdzv_handler=handler,
        entrypoint=sys.executable,
        args=("-c", WORKER, out_dir),
        max_restarts=0,
        monitor_interval=0.1,
    )
    logs = DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="phalanx-rounds-agent-"))
    result = LocalElasticAgent(spec, logs_specs=logs, start_method="spawn").run()
    return 0 if not result.is_failed() else 1


if __name__ == "__main__":
    sys.exit(main())
