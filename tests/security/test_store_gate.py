"""The rendezvous store requires the job's secret: a client without it reads and writes nothing, a client with a
wrong one is told so, a squatter's store is not taken for the job's, and launchers train through the gate.
"""

from __future__ import annotations

import asyncio
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from localjob import running_job, wait_for

from phalanx.worker import rendezvous, storegate
from phalanx.worker.env import RESTART_EPOCH_KEY

SECRET = b"s" * 43
OTHER_SECRET = b"o" * 43


@pytest.fixture
def gated() -> Iterator[rendezvous.GatedServer]:
    server = rendezvous.serve_gated("127.0.0.1", 0, SECRET)
    yield server
    server.gate.close()


def test_a_client_with_the_secret_reads_and_writes_through_the_gate(gated: rendezvous.GatedServer) -> None:
    first = rendezvous.connect("127.0.0.1", gated.port, 10, SECRET)
    second = rendezvous.connect("127.0.0.1", gated.port, 10, SECRET)
    first.set("key", b"value")
    assert second.get("key") == b"value"
    assert rendezvous.request_restart(second) == 1
    assert gated.store.get(RESTART_EPOCH_KEY) == b"1"  # the store behind the gate holds what they wrote


def test_torch_s_own_client_without_the_secret_gets_nothing_and_changes_nothing(
    gated: rendezvous.GatedServer,
) -> None:
    gated.store.set("phalanx/max-nodes", b"2")
    with pytest.raises((RuntimeError, dist.DistError)):
        client = dist.TCPStore(
            "127.0.0.1", gated.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3)
        )
        client.add(RESTART_EPOCH_KEY, 1)
        client.set("phalanx/max-nodes", b"1")
    assert not gated.store.check([RESTART_EPOCH_KEY])
    assert gated.store.get("phalanx/max-nodes") == b"2"
    assert gated.gate.refused >= 1


def test_raw_bytes_sent_to_the_gate_reach_no_store(gated: rendezvous.GatedServer) -> None:
    """Whatever a stranger writes before proving itself is read as a (wrong) proof, never as a store request."""
    with socket.create_connection(("127.0.0.1", gated.port), timeout=5) as sock:
        challenge = sock.recv(64)
        assert challenge.startswith(storegate.MAGIC)
        sock.sendall(b"\x00" * (storegate.NONCE_BYTES + storegate.MAC_BYTES) + b"more bytes for the store")
        assert sock.recv(64) == b""  # dropped
    assert gated.gate.refused == 1


def test_a_wrong_secret_is_said_as_such(gated: rendezvous.GatedServer) -> None:
    with pytest.raises(storegate.GateRefused, match="secret does not match"):
        rendezvous.connect("127.0.0.1", gated.port, 5, OTHER_SECRET)


def test_a_squatter_s_gate_is_not_taken_for_the_job_s_store() -> None:
    """A store that does not know the job's secret (a squatted Service) cannot pose as the job's: it cannot
    answer the client's half of the challenge, whatever it lets through."""
    squatter = rendezvous.serve_gated("127.0.0.1", 0, OTHER_SECRET)
    try:
        challenge = b""
        with socket.create_connection(("127.0.0.1", squatter.port), timeout=5) as sock:
            challenge = sock.recv(len(storegate.MAGIC) + storegate.NONCE_BYTES)
        proof = storegate.client_proof(SECRET, challenge, b"n" * storegate.NONCE_BYTES)
        forged_answer = storegate.check_client(OTHER_SECRET, challenge[len(storegate.MAGIC) :], proof)
        assert forged_answer is None  # it cannot even tell the job's proof from a stranger's
        with pytest.raises(storegate.GateRefused, match="not this job's store"):
            storegate.check_gate(SECRET, challenge, proof, b"\x00" * storegate.MAC_BYTES)
    finally:
        squatter.gate.close()


def test_a_peer_that_is_no_gate_is_refused_before_any_store_request() -> None:
    plain = rendezvous.serve("127.0.0.1", 0)  # a store without a gate: it does not open with a challenge
    with pytest.raises((storegate.GateRefused, OSError, RuntimeError)):
        rendezvous.connect("127.0.0.1", plain.port, 3, SECRET)
    assert not plain.check([RESTART_EPOCH_KEY])


def test_a_silent_connection_is_dropped_after_the_handshake_timeout(
    gated: rendezvous.GatedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storegate, "HANDSHAKE_TIMEOUT", 0.5)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gated.port), timeout=10) as sock:
        sock.recv(64)
        assert sock.recv(64) == b""
    assert time.monotonic() - started < 5


def test_the_forwarder_serves_only_its_own_process(gated: rendezvous.GatedServer) -> None:
    """On a host whose pods share one loopback, another process must not borrow a launcher's forwarder."""
    mine = rendezvous.connect("127.0.0.1", gated.port, 10, SECRET)
    mine.set("mine", b"1")
    forwarder = storegate.forwarder_for("127.0.0.1", gated.port, SECRET)
    code = (
        "import sys, datetime, torch.distributed as dist\n"
        f"s = dist.TCPStore('127.0.0.1', {forwarder.port}, is_master=False, wait_for_workers=False,"
        " timeout=datetime.timedelta(seconds=3))\n"
        "s.set('borrowed', b'1')\n"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0, other.stdout + other.stderr
    assert not gated.store.check(["borrowed"])
    assert mine.get("mine") == b"1"  # the launcher's own connections go on


def test_one_look_tells_which_of_many_connections_are_this_process_s() -> None:
    """The forwarder answers for all the connections waiting at once: one read of the TCP tables and of the open
    files tells them apart, a stranger's among this process's own."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    code = (
        "import socket, sys, time\n"
        f"s = socket.create_connection(('127.0.0.1', {port}))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "time.sleep(60)\n"
    )
    stranger = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    mine = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        assert stranger.stdout is not None
        strangers_port = int(stranger.stdout.readline())
        ports = [mine[0].getsockname()[1], strangers_port, *(sock.getsockname()[1] for sock in mine[1:])]
        assert storegate.own_connections(ports, port) == [True, False, True, True]
        assert storegate.own_connections(ports, port, or_descendants=True) == [True] * 4
        assert storegate.own_connections([strangers_port], port + 1) == [False]  # not to this port
    finally:
        stranger.kill()
        stranger.wait()
        for sock in mine:
            sock.close()
        listener.close()


def test_many_connections_at_once_all_pass_the_forwarder(gated: rendezvous.GatedServer) -> None:
    """Connections that arrive while the forwarder looks whose they are share its next look: each gets its
    answer, none is refused or left waiting."""
    forwarder = storegate.forwarder_for("127.0.0.1", gated.port, SECRET)
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            store = dist.TCPStore(
                "127.0.0.1",
                forwarder.port,
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )
            store.add(f"client/{index}", 1)  # answered: the store has it once this returns
        except BaseException as error:
            errors.append(error)

    clients = [threading.Thread(target=client, args=(index,)) for index in range(40)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(90)
    assert not errors, errors
    assert gated.store.check([f"client/{index}" for index in range(40)])


def test_a_whole_gang_proving_itself_at_once_is_admitted(
    gated: rendezvous.GatedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launchers of a big gang connect at the same moment: every one still proving itself is waited for, none is
    dropped for the crowd (a flood of strangers is bounded by the handshake timeout instead)."""
    # This one process answers all 600 challenges in turn: on a loaded machine that took longer than the 5 s a
    # real launcher gets, and the gate rightly dropped the first ones. The crowd, not the clock, is under test.
    monkeypatch.setattr(storegate, "HANDSHAKE_TIMEOUT", 120.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    members = 600  # over the old bound of 256 at once; 3 files each here (client, gate side, store side)
    if hard != resource.RLIM_INFINITY and hard < 4 * members:
        pytest.skip(f"this machine's open-files limit ({hard}) holds fewer connections than the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8 * members)), hard))
    sockets = []
    try:
        for _ in range(
            members
        ):  # every connection waits at the challenge: all are proving themselves at once
            sock = socket.create_connection(("127.0.0.1", gated.port), timeout=20)
            sockets.append(sock)
        challenges = [sock.recv(len(storegate.MAGIC) + storegate.NONCE_BYTES) for sock in sockets]
        proofs = []
        for sock, challenge in zip(sockets, challenges, strict=True):
            proof = storegate.client_proof(SECRET, challenge, bytes(storegate.NONCE_BYTES))
            sock.sendall(proof)
            proofs.append(proof)
        for sock, challenge, proof in zip(sockets, challenges, proofs, strict=True):
            storegate.check_gate(SECRET, challenge, proof, sock.recv(storegate.MAC_BYTES))
        assert gated.gate.refused == 0
    finally:
        for sock in sockets:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_gates_and_forwarders_close_on_their_loop_s_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's Server is not thread-safe: closed from the caller's thread while a relayed connection ended
    on the loop, it raised from inside asyncio (about once in 300 closes)."""
    closed_on: list[str] = []
    real_close = asyncio.Server.close

    def recording_close(server: asyncio.Server) -> None:
        closed_on.append(threading.current_thread().name)
        real_close(server)

    monkeypatch.setattr(asyncio.Server, "close", recording_close)
    server = rendezvous.serve_gated("127.0.0.1", 0, SECRET)
    forwarder = storegate.Forwarder("127.0.0.1", server.port, SECRET)
    forwarder.close()
    server.gate.close()
    assert closed_on == ["phalanx-store-gate", "phalanx-store-gate"]


def test_the_rendezvous_server_reads_its_secret_and_refuses_a_short_one(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.worker.rendezvous", "--host", "127.0.0.1", "--port", "0"],
        env={"PHALANX_STORE_SECRET_FILE": str(short), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "holds 3 bytes; at least 16" in result.stderr


def test_launchers_train_through_the_gate_and_a_stranger_cannot_restart_them(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with running_job(tmp_path, request.node.name, secret=SECRET) as job:
        with pytest.raises((RuntimeError, dist.DistError)):
            stranger = dist.TCPStore(
                "127.0.0.1", job.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3)
            )
            stranger.add(RESTART_EPOCH_KEY, 1)
        job.start_node("a", ["--steps", "20"])
        job.start_node("b", ["--steps", "20"])
        assert job.wait_node("a", 180) == 0, job.node_output("a")
        assert job.wait_node("b", 180) == 0, job.node_output("b")
        assert job.last_step() == 20


GATED_STEPS = 300


def test_the_training_processes_store_admits_only_the_job_s_launchers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The store that training processes bootstrap gloo through (env://, MASTER_ADDR) stands behind the gate
    too: neither torch's own client at the pod's address nor another process at a launcher's forwarder gets
    in, and the training runs on."""
    with running_job(tmp_path, request.node.name, secret=SECRET) as job:
        # Long enough that the strangers' attempts (3 s each) end while it trains, on a loaded machine too.
        job.start_node("a", ["--steps", str(GATED_STEPS), "--step-delay", "0.1"])
        job.start_node("b", ["--steps", str(GATED_STEPS), "--step-delay", "0.1"])
        wait_for(lambda: job.steps(), 120, "a first step")
        outputs = job.node_output("a") + job.node_output("b")
        hosted = re.search(r"store: behind the gate at ([\d.]+):(\d+) \(hosted here\)", outputs)
        forwarders = [
            int(port) for port in re.findall(r"store: behind the gate at .*?through 127.0.0.1:(\d+)", outputs)
        ]
        assert hosted is not None and len(forwarders) == 2, outputs
        # Each node's training process holds its store connection through its own launcher's forwarder.
        for name in ("a", "b"):
            peers = {
                connection.raddr.port  # torch's client speaks IPv4-mapped IPv6: ::ffff:127.0.0.1
                for trainer in job.trainers(name)
                for connection in trainer.net_connections("tcp")
                if connection.raddr and connection.raddr.ip.endswith("127.0.0.1")
            }
            assert peers & set(forwarders), (name, peers, forwarders)
        for host, port in [(hosted[1], int(hosted[2])), *(("127.0.0.1", port) for port in forwarders)]:
            with pytest.raises((RuntimeError, dist.DistError)):
                stranger = dist.TCPStore(
                    host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3)
                )
                stranger.set("phalanx-stranger", b"1")
        # Refused by live gates and forwarders, not by a job that had ended.
        assert job.last_step() < GATED_STEPS and all(node.poll() is None for node in job.nodes.values())
        assert job.wait_node("a", 240) == 0, job.node_output("a")
        assert job.wait_node("b", 240) == 0, job.node_output("b")
        assert job.last_step() == GATED_STEPS


TREE = """
import subprocess, sys
from phalanx.worker import rendezvous, storegate
server = rendezvous.serve_gated("127.0.0.1", 0, SECRET)
forwarder = storegate.Forwarder("127.0.0.1", server.port, SECRET, serve_descendants=True)
client = (
    "import datetime, torch.distributed as d; "
    f"s = d.TCPStore('127.0.0.1', {forwarder.port}, is_master=False, wait_for_workers=False,"
    " timeout=datetime.timedelta(seconds=5)); s.set('grandchild', b'1')"
)
# A training process is the launcher's grandchild when a warm interpreter runs it (launcher, fork server, it).
starter = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {client!r}]).returncode)"
code = subprocess.run([sys.executable, "-c", starter], timeout=60).returncode
print("grandchild", code, server.store.check(["grandchild"]))
"""


def test_the_training_processes_forwarder_serves_what_its_launcher_started_as_pid_1_without_capabilities() -> (
    None
):
    """As in a pod's container: the launcher is PID 1 of its own PID namespace and holds no capabilities; the
    forwarder still finds its training processes' sockets among its descendants' files."""
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {probe.stderr.decode().strip()}")
    script = f"SECRET = {SECRET!r}\n{TREE}"
    argv = [
        "setpriv",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        sys.executable,
        "-c",
        script,
    ]
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *argv], capture_output=True, text=True, timeout=120
    )
    assert "grandchild 0 True" in result.stdout, result.stdout + result.stderr


def test_on_a_torch_without_libuv_the_training_processes_store_is_torch_s_own_and_the_job_trains(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """torch's client of a store hosted for the training processes asks for libuv, so a torch built without it
    (USE_LIBUV=0, Debian's) keeps training rank 0's store, says so, and trains."""
    with running_job(tmp_path, request.node.name, secret=SECRET) as job:
        for name in ("a", "b"):
            job.start_node(name, ["--steps", "10"], env={"USE_LIBUV": "0"})
        for name in ("a", "b"):
            assert job.wait_node(name, 180) == 0, job.node_output(name)
            assert "this torch has no libuv (USE_LIBUV=0)" in job.node_output(name)
            assert "store: behind the gate" not in job.node_output(name)
        assert job.last_step() == 10


def test_a_launcher_with_the_wrong_secret_never_joins(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with running_job(tmp_path, request.node.name, secret=SECRET) as job:
        wrong = tmp_path / "wrong-secret"
        wrong.write_bytes(OTHER_SECRET)
        job.start_node(
            "a",
            ["--steps", "5"],
            nnodes="1",
            launcher_args=["--join-timeout", "4"],
            env={"PHALANX_STORE_SECRET_FILE": str(wrong)},
        )
        assert job.wait_node("a", 90) == 3, job.node_output("a")
        assert "secret does not match" in job.node_output("a")
        assert not job.steps()


def test_a_launcher_whose_secret_file_is_missing_stops_with_a_configuration_error(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with running_job(tmp_path, request.node.name, secret=SECRET) as job:
        job.start_node("a", ["--steps", "5"], nnodes="1", env={"PHALANX_STORE_SECRET_FILE": "/nonexistent"})
        assert job.wait_node("a", 90) == 2, job.node_output("a")
        assert "cannot read the job's store secret /nonexistent" in job.node_output("a")


def test_the_rendezvous_server_raises_its_open_files_limit_to_the_hard_one() -> None:
    """Each launcher costs the rendezvous pod 9 open files; a runtime may start it at a soft limit of 1,024."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = "from phalanx.worker import rendezvous; print(rendezvous.raise_open_files_limit())"
    result = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(result.stdout) == hard
