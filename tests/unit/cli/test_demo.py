"""`phalanx demo`'s pure parts: its arguments, how it kills the victim on each kind of node, the container it
kills on a real node, and the one line it stops with before a real-node demo starts anything."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from phalanx import demo
from phalanx.cli import build_parser, main
from phalanx.devcluster import controlplane
from phalanx.devcluster.realnode import host
from phalanx.devcluster.realnode import node as real_node
from phalanx.errors import UserFacingError
from phalanx.images import containerd

ROOT = Path(__file__).resolve().parents[3]
CONTAINER = "4f" * 32


def pod(node: str = real_node.NODE_NAME, statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "tinygpt-worker-1"},
        "spec": {"nodeName": node, "containers": [{"name": "sidecar"}, {"name": "trainer"}]},
        "status": {
            "containerStatuses": statuses
            if statuses is not None
            else [
                {"name": "sidecar", "containerID": "containerd://" + "0" * 64},
                {"name": "trainer", "containerID": f"containerd://{CONTAINER}"},
            ]
        },
    }


def config(real_nodes: int) -> controlplane.ClusterConfig:
    return controlplane.ClusterConfig(
        nodes=4 if not real_nodes else 0,
        simulated_nodes=0,
        gpus_per_node=0,
        cluster_octet=100,
        etcd_port=1,
        etcd_peer_port=2,
        api_port=3,
        scheduler_port=4,
        controller_manager_port=5,
        real_nodes=real_nodes,
    )


def test_the_real_node_mode_is_opt_in_and_puts_every_pod_on_the_real_node() -> None:
    parse = build_parser().parse_args
    default = parse(["demo"])
    assert default.real_nodes is False and demo.agent_nodes(default) == 4
    real = parse(["demo", "--real-nodes"])
    assert real.real_nodes is True and demo.agent_nodes(real) == 0
    assert demo.agent_nodes(parse(["demo", "--real-nodes", "--nodes", "2"])) == 2
    assert demo.agent_nodes(parse(["demo", "--nodes", "1"])) == 1


def test_a_pod_on_the_real_node_is_killed_through_containerd_one_elsewhere_by_the_agent() -> None:
    assert demo.kill_method(pod()) == demo.CONTAINER_KILL
    assert demo.kill_method(pod(node="node-0")) == demo.AGENT_KILL
    assert demo.kill_method({"metadata": {"name": "unscheduled"}, "spec": {}}) == demo.AGENT_KILL


def test_the_container_killed_is_the_trainer_named_in_the_pods_status() -> None:
    assert demo.container_id(pod()) == CONTAINER
    with pytest.raises(UserFacingError, match="no containerd container 'trainer'"):
        demo.container_id(pod(statuses=[]))  # not started yet
    with pytest.raises(UserFacingError, match="status: docker"):
        demo.container_id(pod(statuses=[{"name": "trainer", "containerID": "docker://abc"}]))
    # A job whose `spec.trainerContainer` names another container: that one is killed, not the sidecar.
    chosen = pod(statuses=[{"name": "sidecar", "containerID": f"containerd://{CONTAINER}"}])
    assert demo.container_id(chosen, "sidecar") == CONTAINER
    with pytest.raises(UserFacingError, match="no containerd container 'trainer'"):
        demo.container_id(chosen)


def test_the_kill_is_sigkill_to_the_task_in_the_kubelets_containerd_namespace() -> None:
    command = demo.ctr_kill_command(CONTAINER)
    assert command[0] == "ctr" and command[-1] == CONTAINER
    assert command[command.index("--address") + 1] == str(containerd.SOCKET)
    assert command[command.index("--namespace") + 1] == "k8s.io"
    assert command[command.index("--signal") + 1] == "SIGKILL"
    assert command[command.index("tasks") + 1] == "kill"


class FakeKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, **_: object) -> str:
        self.calls.append(args)
        return ""


def test_each_kill_method_does_its_own_kill_and_a_failed_ctr_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def ctr(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(demo.subprocess, "run", ctr)
    kube = FakeKube()
    assert demo.kill_worker(kube, pod(node="node-0")) == demo.Kill(demo.AGENT_KILL)  # type: ignore[arg-type]
    assert kube.calls == [
        (
            "annotate",
            "pod",
            "tinygpt-worker-1",
            "-n",
            demo.DEMO_NAMESPACE,
            "phalanx.dev/kill=demo",
            "--overwrite",
        )
    ]
    assert ran == []
    assert demo.kill_worker(kube, pod()) == demo.Kill(demo.CONTAINER_KILL, CONTAINER)  # type: ignore[arg-type]
    assert ran == [demo.ctr_kill_command(CONTAINER)] and len(kube.calls) == 1

    def refused(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ctr: task not found\n")

    monkeypatch.setattr(demo.subprocess, "run", refused)
    with pytest.raises(UserFacingError, match=r"failed: ctr: task not found$"):
        demo.kill_container(CONTAINER)

    def missing(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", "ctr")

    monkeypatch.setattr(demo.subprocess, "run", missing)
    with pytest.raises(UserFacingError, match="could not run"):
        demo.kill_container(CONTAINER)


def test_a_running_cluster_without_a_real_node_is_refused_with_what_to_do(tmp_path: Path) -> None:
    assert demo.real_node_conflict(None, False, tmp_path) is None
    assert demo.real_node_conflict(config(real_nodes=1), True, tmp_path) is None
    assert demo.real_node_conflict(config(real_nodes=0), False, tmp_path) is None  # stopped: `up` resizes it
    reason = demo.real_node_conflict(config(real_nodes=0), True, tmp_path) or ""
    assert f"phalanx dev down --state-dir {tmp_path}" in reason


def test_the_report_says_how_the_worker_was_killed(tmp_path: Path) -> None:
    summary: dict[str, Any] = {
        "job": "phalanx-demo/tinygpt",
        "result": "Succeeded",
        "steps": 300,
        "training_seconds": 90.0,
        "preflight": None,
        "killed_worker": "tinygpt-worker-1",
        "killed_at_step": 105,
        "kill_method": demo.CONTAINER_KILL,
        "killed_container": CONTAINER,
        "restarts": {"total": 1, "byCause": {"Killed": 1}},
        "seconds_until_progress_after_kill": 12.5,
        "incidents": [],
        "first_loss": 4.2,
        "final_loss": 2.1,
        "loss_plot": None,
        "cluster_logs": "/logs",
        "demo_seconds": 200.0,
    }
    layout = controlplane.Layout(tmp_path)
    text = demo._format_summary(summary, layout)
    assert "killed tinygpt-worker-1 at step 105 (SIGKILL to its container's task through ctr)" in text
    summary["kill_method"] = demo.AGENT_KILL
    assert "(its processes killed by the node agent's fault injection)" in demo._format_summary(
        summary, layout
    )


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("bad input must stop the demo before anything starts or builds")

    monkeypatch.setattr(controlplane, "up", never)
    monkeypatch.setattr(demo.images_cli, "build_images", never)


def demo_real(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["demo", "--real-nodes", "--state-dir", str(tmp_path / "state"), "--wheels", str(tmp_path)])
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.usefixtures("nothing_starts")
def test_bad_input_for_a_real_node_is_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    monkeypatch.chdir(ROOT)
    code, err = demo_real(tmp_path, capsys)
    assert code == 2 and len(err) == 1 and err[0].endswith("as root: run as root"), err

    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    monkeypatch.chdir(tmp_path)
    code, err = demo_real(tmp_path, capsys)
    assert code == 2 and len(err) == 1 and "no Phalanx checkout here" in err[0]

    # Root, but no apt-get to install what a real node needs.
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(host, "missing_packages", lambda: ["containerd", "runc"])
    which = shutil.which
    monkeypatch.setattr(host.shutil, "which", lambda name: None if name == "apt-get" else which(name))
    assert demo_real(tmp_path, capsys) == (
        2,
        ["phalanx: a real node needs these Debian packages: `apt-get install containerd runc`"],
    )


def test_the_kill_step_is_the_killed_groups_own_from_its_incident() -> None:
    """The job's status lags the heartbeats (it said 156 when the group was at 191): the report and the plot
    mark the incident's `detectedStep`; without an incident for the victim, the status's step."""
    job = {
        "status": {
            "step": 300,
            "incidents": [
                {"worker": "tinygpt-worker-0", "detectedStep": 40},
                {"worker": "tinygpt-worker-1", "detectedStep": 191, "resumeStep": 191, "resumedAt": "t"},
            ],
        }
    }
    incident = demo.kill_incident(job, "tinygpt-worker-1")
    assert incident is not None and demo.killed_step(incident, 156) == 191
    assert demo.kill_incident(job, "tinygpt-worker-2") is None
    assert demo.killed_step(None, 156) == 156
    assert demo.killed_step({"worker": "tinygpt-worker-1"}, 156) == 156
    assert demo.kill_incident({"status": {}}, "tinygpt-worker-1") is None


class LeaseListing(demo.Kube):
    """`kubectl get leases -o json` answered from memory."""

    def __init__(self, leases: list[dict[str, Any]]) -> None:
        self.leases = leases

    def json(self, *args: str) -> dict[str, Any]:
        assert args[0] == "leases"
        return {"items": self.leases}


def heartbeat_lease(rank: str, step: str, loss: str = "0.5") -> dict[str, Any]:
    annotations = {"phalanx.dev/rank": rank, "phalanx.dev/step": step, "phalanx.dev/loss": loss}
    return {"metadata": {"name": f"lease-{rank}-{step}", "annotations": annotations}}


def test_the_kill_waits_on_the_live_step_rank_0s_heartbeat_lease_carries() -> None:
    """The job's status writes a step that moved alone only every `stepReportSeconds` (30 s by default):
    the demo reads the step to kill at from rank 0's heartbeat Lease, which moves with every beat."""
    samples: dict[int, float] = {}
    kube = LeaseListing(
        [heartbeat_lease("0", "107", "0.25"), heartbeat_lease("1", "400"), heartbeat_lease("0", "x")]
    )
    assert demo.sample_losses(kube, samples) == 107
    assert samples == {107: 0.25}
    assert demo.sample_losses(LeaseListing([]), samples) == 0
