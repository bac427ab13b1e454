"""The example trainer's heartbeat phases around its saves, from a real run of it (one gloo process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from localjob import free_port

# tinygpt with each durable save recording the phase its heartbeat said when the save began.
RECORD_DURABLE_SAVES = (
    "import json, os, sys\n"
    "from pathlib import Path\n"
    "from phalanx.worker import Checkpointer\n"
    "from phalanx.worker.heartbeat import read_records\n"
    "status, seen, save = Path(os.environ['PHALANX_STATUS_DIR']), [], Checkpointer.save\n"
    "def recorded(self, step, force_durable=False):\n"
    "    if force_durable:\n"
    "        seen.append([step, read_records(status)[0].phase])\n"
    "    return save(self, step, force_durable=force_durable)\n"
    "Checkpointer.save = recorded\n"
    "from phalanx.worker.examples import tinygpt\n"
    "code = tinygpt.main(sys.argv[1:])\n"
    "print('durable saves: ' + json.dumps(seen))\n"
    "sys.exit(code)\n"
)


def test_the_final_durable_save_is_published_as_a_save(tmp_path: Path) -> None:
    """The run's last durable save waits for the copy in flight (to object storage, say): the launcher's hang
    watch and the operator's progress clock count only time in `training`, so the example says `saving` first.
    Said `training`, a slow final copy on a loaded machine read as a hung last step (NoProgress)."""
    status = tmp_path / "status"
    status.mkdir()
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "OMP_NUM_THREADS": "1",
        "PHALANX_STATUS_DIR": str(status),
        "PHALANX_SNAPSHOT_DIR": str(tmp_path / "shm"),
    }
    command = [
        sys.executable, "-c", RECORD_DURABLE_SAVES, "--steps", "6", "--global-batch", "4",
        "--checkpoint-interval", "1000", "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("durable saves: ")]
    saves = json.loads(line.removeprefix("durable saves: "))
    assert saves and saves[-1] == [6, "saving"], saves
