"""A job of real launcher processes on 127.0.0.1 (gloo, CPU) around a real rendezvous store process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

PYTHON = sys.executable
FAST_RDZV = [
    "--join-timeout",
    "60",
    "--last-call-timeout",
    "1",
    "--keepalive-interval",
    "1",
    "--keepalive-timeout",
    "3",
    "--store-timeout",
    "10",
    "--monitor-interval",
    "0.2",
    "--shutdown-grace",
    "20",
]


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class LocalJob:
    """Rendezvous store + launcher "nodes", each node with its own snapshot directory (its /dev/shm)."""

    def __init__(
        self, root: Path, run_id: str = "job", secret: bytes | None = None, protocol: str = "c10d"
    ) -> None:
        self.root = root
        self.run_id = run_id
        self.protocol = protocol
        """The rendezvous protocol every node uses (`--rdzv-protocol`)."""
        self.secret_env: dict[str, str] = {}
        """The store secret's file for the store and every node, when the job has one (as the operator
        mounts it)."""
        if secret is not None:
            secret_file = root / "store-secret"
            secret_file.write_bytes(secret)
            self.secret_env["PHALANX_STORE_SECRET_FILE"] = str(secret_file)
        self.store: subprocess.Popen[str] | None = None
        self.port = 0
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.log_file = root / "steps.jsonl"
        self.checkpoint_dir = root / "checkpoints"

    # -- store ------------------------------------------------------------------------------------

    def start_store(self, port: int = 0) -> int:
        self.store = subprocess.Popen(
            [PYTHON, "-m", "phalanx.worker.rendezvous", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.secret_env},
        )
        assert self.store.stdout is not None
        line = self.store.stdout.readline()
        match = re.search(r"ready host=\S+ port=(\d+)", line)
        assert match, f"no ready line from the rendezvous store: {line!r}"
        self.port = int(match.group(1))
        return self.port

    def stop_store(self) -> None:
        if self.store is not None and self.store.poll() is None:
            self.store.send_signal(signal.SIGTERM)
            self.store.wait(timeout=10)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- nodes ------------------------------------------------------------------------------------

    def start_node(
        self,
        name: str,
        example_args: list[str],
        nnodes: str = "2",
        launcher_args: list[str] | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        node_env = dict(os.environ)
        node_env.update(
            {
                "PHALANX_SNAPSHOT_DIR": str(self.root / f"shm-{name}"),
                "POD_NAME": name,
                "PYTHONUNBUFFERED": "1",
            }
        )
        node_env.pop("KUBERNETES_SERVICE_HOST", None)
        node_env.pop("KUBECONFIG", None)
        node_env.update(self.secret_env)
        node_env.update(env or {})
        (self.root / f"shm-{name}").mkdir(parents=True, exist_ok=True)
        training = command or [
            PYTHON,
            "-m",
            "phalanx.worker.examples.tinygpt",
            "--checkpoint-dir",
            str(self.checkpoint_dir),
            "--log-file",
            str(self.log_file),
            "--summary-file",
            str(self.root / f"summary-{name}.json"),
            *example_args,
        ]
        argv = [
            PYTHON,
            "-m",
            "phalanx.worker.launch",
            "--rdzv-endpoint",
            self.endpoint,
            "--rdzv-id",
            self.run_id,
            "--rdzv-protocol",
            self.protocol,
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            "1",
            *FAST_RDZV,
            *(launcher_args or []),
            "--",
            *training,
        ]
        output = open(self.root / f"node-{name}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(argv, env=node_env, stdout=output, stderr=subprocess.STDOUT)
        output.close()
        self.nodes[name] = process
        return process

    def start_pair_with_spare(self, example_args: list[str], trained: int) -> None:
        """Nodes `a` and `b` train; `spare` stands by; training has gone on to step `trained` since.

        The three start together: a spare never takes a slot of the first group (see
        test_spare_started_first_leaves_both_slots_to_the_workers), and one started once the pair trained could
        still be importing torch on a busy machine when the pair's few seconds of training are over."""
        self.start_node("a", example_args)
        self.start_node("b", example_args)
        self.start_node("spare", example_args, launcher_args=["--role", "spare"])
        wait_for(lambda: "-> standby" in self.node_output("spare"), 90, "the spare to stand by")
        wait_for(lambda: self.last_step() >= trained, 90, "training to go on while the spare stands by")
        assert "group attempt" not in self.node_output("spare"), "the spare took a worker's slot"

    def assert_spare_finished_from_memory(self, steps: int, step_before_kill: int) -> None:
        """`a` and the spare trained to `steps` after `b` was lost; the survivor restored from its own memory,
        the spare from the survivor, nothing from disk, at most one step back."""
        assert self.wait_node("a", 120) == 0, self.node_output("a")
        assert self.wait_node("spare", 120) == 0, self.node_output("spare")
        summary = self.any_summary()
        assert summary["final_step"] == steps and summary["world_size"] == 2
        resumed = [event for event in self.restores() if event["step"] > 0]
        assert sorted(event["source"] for event in resumed) == ["memory", "peer"], resumed
        assert min(event["step"] for event in resumed) >= step_before_kill - 1

    def node_output(self, name: str) -> str:
        return (self.root / f"node-{name}.log").read_text(errors="replace")

    def trainers(self, name: str) -> list[psutil.Process]:
        launcher = psutil.Process(self.nodes[name].pid)
        return [
            child
            for child in launcher.children(recursive=True)
            if any("tinygpt" in part for part in child.cmdline())
        ]

    def kill_node(self, name: str) -> None:
        """The whole pod dies: the launcher and everything it started."""
        launcher = psutil.Process(self.nodes[name].pid)
        family = [*launcher.children(recursive=True), launcher]
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        self.nodes[name].wait(timeout=10)

    def wait_node(self, name: str, timeout: float) -> int:
        try:
            return self.nodes[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"node {name} still running after {timeout}s:\n{self.node_output(name)[-3000:]}"
            ) from None

    def close(self) -> None:
        for name, process in self.nodes.items():
            if process.poll() is None:
                self.kill_node(name)
        if self.store is not None and self.store.poll() is None:
            self.store.kill()
            self.store.wait(timeout=10)

    # -- results ----------------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        if not self.log_file.exists():
            return []
        return [json.loads(line) for line in self.log_file.read_text().splitlines() if line.strip()]

    def steps(self) -> list[dict[str, Any]]:
        return [record for record in self.records() if "event" not in record]

    def restores(self) -> list[dict[str, Any]]:
        return [record for record in self.records() if record.get("event") == "restore"]

    def last_step(self) -> int:
        steps = self.steps()
        return steps[-1]["step"] if steps else 0

    def summary(self, name: str) -> dict[str, Any] | None:
        path = self.root / f"summary-{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def any_summary(self) -> dict[str, Any]:
        for name in self.nodes:
            summary = self.summary(name)
            if summary is not None:
                return summary
        raise AssertionError("no node wrote a summary")


@contextlib.contextmanager
def running_job(
    root: Path, test_name: str, secret: bytes | None = None, protocol: str = "c10d"
) -> Iterator[LocalJob]:
    """A rendezvous store process (behind its gate when the job has a `secret`), and launcher nodes the test
    starts; everything is killed afterwards."""
    local_job = LocalJob(root, run_id=f"job-{test_name}"[:60], secret=secret, protocol=protocol)
    local_job.start_store()
    try:
        yield local_job
    finally:
        local_job.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
