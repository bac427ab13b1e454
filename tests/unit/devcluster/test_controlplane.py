"""Pure parts of the local cluster: binary lookup, port choice, command lines, error messages."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from phalanx.devcluster import binaries, controlplane
from phalanx.devcluster.pki import ensure_pki
from phalanx.errors import UserFacingError


def make_fake_binaries(directory: Path, names: tuple[str, ...] = binaries.ALL_BINARIES) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


@pytest.fixture
def isolated_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    # 1.20.2, Debian's build: the only release whose binaries may come from PATH.
    monkeypatch.setenv(binaries.VERSION_ENV, binaries.DEBIAN_VERSION)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_missing_binaries_give_a_clear_message(isolated_search: Path) -> None:
    with pytest.raises(UserFacingError, match=r"kube-apiserver.*phalanx dev install"):
        binaries.require_binaries()


def test_kubebuilder_assets_come_before_path_and_cache(
    isolated_search: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_fake_binaries(isolated_search / "assets")
    make_fake_binaries(binaries.cached_bin_dir())
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(isolated_search / "assets"))
    found = binaries.require_binaries()
    assert found.kube_apiserver.parent == isolated_search / "assets"


def test_cache_is_the_last_resort_and_kubectl_follows_the_apiserver(
    isolated_search: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_fake_binaries(isolated_search / "path", ("etcd", "kubectl"))  # a kubectl of another version on PATH
    make_fake_binaries(binaries.cached_bin_dir())
    monkeypatch.setenv("PATH", str(isolated_search / "path"))
    found = binaries.require_binaries()
    assert found.etcd.parent == isolated_search / "path"
    assert found.kube_apiserver.parent == binaries.cached_bin_dir()
    assert found.kubectl.parent == binaries.cached_bin_dir()


def test_install_refuses_without_disk(isolated_search: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binaries, "BUILD_DISK_BYTES", 1 << 60)
    with pytest.raises(UserFacingError, match="not enough free disk"):
        binaries.install()


def fake_binaries_dict() -> dict[str, str]:
    return {name: f"/bin/{name}" for name in binaries.ALL_BINARIES}


def test_ports_are_reused_when_free_and_replaced_when_taken(tmp_path: Path) -> None:
    fake = binaries.Binaries(**{k.replace("-", "_"): Path(v) for k, v in fake_binaries_dict().items()})
    first = controlplane.choose_config(None, 2, 0, 0, fake)
    ports = [
        first.etcd_port,
        first.etcd_peer_port,
        first.api_port,
        first.scheduler_port,
        first.controller_manager_port,
    ]
    assert len(set(ports)) == 5
    again = controlplane.choose_config(first, 2, 0, 0, fake)
    assert again.api_port == first.api_port and again.cluster_octet == first.cluster_octet
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", first.api_port))
        blocker.listen()
        moved = controlplane.choose_config(first, 2, 0, 0, fake)
    assert moved.api_port != first.api_port


def test_component_command_lines(tmp_path: Path) -> None:
    layout = controlplane.Layout(tmp_path)
    pki = ensure_pki(layout.pki)
    config = controlplane.ClusterConfig(
        nodes=2, simulated_nodes=3, gpus_per_node=1, cluster_octet=123, etcd_port=1, etcd_peer_port=2, api_port=3,
        scheduler_port=4, controller_manager_port=5, binaries=fake_binaries_dict(),
    )  # fmt: skip
    apiserver = controlplane.component_argv("kube-apiserver", config, layout, pki)
    assert "--secure-port=3" in apiserver and "--etcd-servers=http://127.0.0.1:1" in apiserver
    assert "--kubelet-preferred-address-types=InternalIP" in apiserver
    manager = controlplane.component_argv("kube-controller-manager", config, layout, pki)
    assert "--node-monitor-grace-period=8s" in manager and "--port=0" in manager
    assert "--pod-eviction-timeout=30s" in manager
    assert "--port=0" in controlplane.component_argv("kube-scheduler", config, layout, pki)
    assert "--endpoint-reconciler-type=none" not in apiserver
    agent = controlplane.component_argv("node-agent", config, layout, pki)
    assert "--kubelet-version=v1.20.2" in agent
    assert agent[:3] == [sys.executable, "-m", "phalanx.devcluster.agent"]
    assert {
        "--nodes=2",
        "--simulated-nodes=3",
        "--cluster-octet=123",
        "--api-port=3",
        "--gpus-per-node=1",
    } <= set(agent)
    assert pki.admin_token() and (layout.pki / "tokens.csv").stat().st_mode & 0o777 == 0o600
    assert not any(arg.startswith("--lease-interval") for arg in agent)


def test_a_cluster_for_scale_beats_its_nodes_as_kubelets_do_and_waits_as_long_for_them(
    tmp_path: Path,
) -> None:
    """Thousands of simulated nodes at the tests' 2 s heartbeat would be the API server's main load."""
    layout = controlplane.Layout(tmp_path)
    pki = ensure_pki(layout.pki)
    config = controlplane.ClusterConfig(
        nodes=1, simulated_nodes=520, gpus_per_node=8, cluster_octet=123, etcd_port=1, etcd_peer_port=2,
        api_port=3, scheduler_port=4, controller_manager_port=5, binaries=fake_binaries_dict(),
        node_heartbeat_seconds=10,
    )  # fmt: skip
    agent = controlplane.component_argv("node-agent", config, layout, pki)
    assert {"--lease-interval=10", "--status-interval=60"} <= set(agent)
    manager = controlplane.component_argv("kube-controller-manager", config, layout, pki)
    assert "--node-monitor-grace-period=40s" in manager and "--node-monitor-period=5s" in manager
    assert "--node-monitor-grace-period=8s" not in manager


def test_a_taken_port_is_explained(tmp_path: Path) -> None:
    layout = controlplane.Layout(tmp_path)
    layout.logs.mkdir()
    layout.log_file("etcd").write_text("listen tcp 127.0.0.1:2379: bind: address already in use\n")
    assert "port it needs is taken" in controlplane._explain_failure("etcd", layout)


def test_status_without_cluster_says_so(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "dev", "status", "--state-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "no cluster in" in result.stdout


def test_zero_nodes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserFacingError, match="at least one node"):
        controlplane.up(tmp_path, nodes=0, simulated_nodes=0, quiet=True)


def test_up_on_a_state_dir_of_another_release_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its etcd data belongs to that release; a cluster.json from before the field was made by 1.20.2."""
    layout = controlplane.Layout(tmp_path)
    config = json.loads(json.dumps(controlplane.ClusterConfig(
        nodes=1, simulated_nodes=0, gpus_per_node=0, cluster_octet=123, etcd_port=1, etcd_peer_port=2, api_port=3,
        scheduler_port=4, controller_manager_port=5,
    ).__dict__))  # fmt: skip
    del config["kubernetes_version"]
    layout.config_file.write_text(json.dumps(config))
    monkeypatch.setenv(binaries.VERSION_ENV, "1.37.2")
    with pytest.raises(UserFacingError) as refused:
        controlplane.up(tmp_path, nodes=1, quiet=True)
    assert str(refused.value) == (
        f"the cluster in {tmp_path} was made with Kubernetes 1.20.2, not 1.37.2 (the release PHALANX_KUBE_VERSION "
        f"picks now): `phalanx dev down --purge --state-dir {tmp_path}` removes it with its data, or set "
        "PHALANX_KUBE_VERSION=1.20.2 to use it"
    )


def test_command_lines_of_a_newer_release(tmp_path: Path) -> None:
    """What 1.37 removed or refuses: the insecure ports, --pod-eviction-timeout, a loopback advertise address
    with endpoints reconciled."""
    layout = controlplane.Layout(tmp_path)
    pki = ensure_pki(layout.pki)
    config = controlplane.ClusterConfig(
        nodes=1, simulated_nodes=0, gpus_per_node=0, cluster_octet=123, etcd_port=1, etcd_peer_port=2, api_port=3,
        scheduler_port=4, controller_manager_port=5, binaries=fake_binaries_dict(), kubernetes_version="1.37.2",
    )  # fmt: skip
    argv = {
        name: controlplane.component_argv(name, config, layout, pki) for name in controlplane.COMPONENT_ORDER
    }
    assert not [
        flag for flag in argv["kube-controller-manager"] if flag.startswith(("--port", "--pod-eviction"))
    ]
    assert not [flag for flag in argv["kube-scheduler"] if flag.startswith("--port")]
    assert "--endpoint-reconciler-type=none" in argv["kube-apiserver"]
    assert "--kubelet-version=v1.37.2" in argv["node-agent"]
    real = controlplane.component_argv(
        "kube-apiserver", replace(config, real_nodes=1, node_ip="10.0.0.5"), layout, pki
    )
    # A real node's pods reach the apiserver through the `kubernetes` Service: its endpoint must be kept.
    assert "--endpoint-reconciler-type=none" not in real and "--advertise-address=10.0.0.5" in real


def test_a_service_account_is_ready_with_its_token_secret_on_1_20_only(tmp_path: Path) -> None:
    """1.20's admission refuses a pod until the account's token Secret exists; later releases make none."""
    assert not controlplane.service_account_ready(None, "1.20.2")
    assert controlplane.service_account_ready([{"name": "default-token-abcde"}], "1.20.2")
    assert controlplane.service_account_ready(None, "1.37.2")
    # No cluster.json: the default release; one written before the field existed: 1.20.2.
    assert controlplane.Layout(tmp_path).kubernetes_version == binaries.KUBERNETES_VERSION


def test_two_runs_started_at_once_search_for_pod_networks_from_apart() -> None:
    assert controlplane.first_cluster_octet({}) == controlplane.FIRST_CLUSTER_OCTET
    assert controlplane.first_cluster_octet({"PHALANX_DEV_FIRST_CLUSTER_OCTET": "180"}) == 180
    for bad in ("7", "300", "many"):
        with pytest.raises(UserFacingError, match="PHALANX_DEV_FIRST_CLUSTER_OCTET"):
            controlplane.first_cluster_octet({"PHALANX_DEV_FIRST_CLUSTER_OCTET": bad})


def test_clusters_start_one_at_a_time_on_a_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another process (the other of `make e2e`'s two) starting a cluster holds the host's start lock: this one
    waits until that start is over before it chooses its pod network."""
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path / "cache"))
    over = tmp_path / "the other start is over"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time\n"
            "from phalanx.devcluster import controlplane\n"
            "with controlplane.starting_alone():\n"
            "    print('holding', flush=True)\n"
            "    time.sleep(1.0)\n"
            "    pathlib.Path(sys.argv[1]).touch()\n",
            str(over),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with controlplane.starting_alone():
            assert over.exists()
    finally:
        assert holder.wait(timeout=30) == 0


def test_the_node_agent_has_longer_to_register_thousands_of_simulated_nodes() -> None:
    def config(simulated: int) -> controlplane.ClusterConfig:
        return controlplane.ClusterConfig(
            nodes=1, simulated_nodes=simulated, gpus_per_node=8, cluster_octet=123, etcd_port=1, etcd_peer_port=2,
            api_port=3, scheduler_port=4, controller_manager_port=5,
        )  # fmt: skip

    small, seeds = config(5), config(12_695)
    assert controlplane.ready_timeout("node-agent", small) == pytest.approx(180.2)
    # 12,695 nodes at 25 a second: about 8.5 minutes beyond the agent's own 3.
    assert controlplane.ready_timeout("node-agent", seeds) == pytest.approx(180 + 12_695 / 25)
    assert controlplane.ready_timeout("kube-apiserver", seeds) == 180


def test_ready_nodes_are_counted_from_the_api_servers_table() -> None:
    table = (
        "agent-0   Ready                      <none>   2m   v1.37.2\n"
        "agent-1   Ready,SchedulingDisabled   <none>   2m   v1.37.2\n"
        "sim-0     NotReady                   <none>   1m   v1.37.2\n"
        "sim-1     Unknown                    <none>   1m   v1.37.2\n"
        "\n"
    )
    assert controlplane.count_ready(table) == 2
