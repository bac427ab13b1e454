"""One rank of a 2-process gloo group in which rank 1 stops taking part before an all_reduce.

Run with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
PHALANX_COLLECTIVE_TIMEOUT. Rank 0 enters the all_reduce under the collective watchdog, which must end it
long before gloo gives up; rank 1 sleeps until the test kills it.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

from phalanx.worker.guards import CollectiveWatchdog, process_group_timeout


def main() -> int:
    dist.init_process_group("gloo", timeout=process_group_timeout())
    watchdog = CollectiveWatchdog().start()
    if dist.get_rank() == 1:
        print("rank 1 stops taking part", flush=True)
        time.sleep(3600)
        return 0
    tensor = torch.ones(1)
    print("rank 0 enters all_reduce", flush=True)
    with watchdog.watch("all_reduce"):
        dist.all_reduce(tensor)
    print("all_reduce returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
