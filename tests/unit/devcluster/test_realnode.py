"""The real node's configuration and host clean-up (pure parts)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from phalanx.devcluster import binaries, controlplane
from phalanx.devcluster.pki import Pki, ensure_pki
from phalanx.devcluster.realnode import config, host, images, node
from phalanx.errors import UserFacingError


def settings(tmp_path: Path) -> config.NodeSettings:
    return config.NodeSettings(
        name="real-node-0", node_ip="10.1.2.3", state_dir=tmp_path, kubernetes_version=binaries.DEBIAN_VERSION
    )


def test_containerd_uses_cgroupfs_the_local_pause_image_and_debians_cni_plugins() -> None:
    text = config.containerd_toml()
    assert 'sandbox_image = "localhost/pause:3.2"' in text
    assert "SystemdCgroup = false" in text
    assert 'bin_dir = "/usr/lib/cni"' in text
    assert "restrict_oom_score_adj = true" in text


def test_cni_bridge_has_hairpin_and_the_pod_range() -> None:
    conflist = json.loads(config.cni_conflist())
    bridge = conflist["plugins"][0]
    assert bridge["hairpinMode"] is True and bridge["bridge"] == "cni0"
    assert bridge["ipam"]["ranges"] == [[{"subnet": config.POD_CIDR}]]


def test_kubelet_trusts_only_the_clusters_client_certificates(tmp_path: Path) -> None:
    kubelet = yaml.safe_load(config.kubelet_yaml(tmp_path / "ca.crt", "10.1.2.3", binaries.DEBIAN_VERSION))
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert kubelet["authorization"]["mode"] == "Webhook"
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["clusterDNS"] == ["10.1.2.3"]
    # /dev/shm volumes are tmpfs of their sizeLimit, as on Kubernetes 1.22 and later.
    assert kubelet["featureGates"] == {"SizeMemoryBackedVolumes": True}
    argv = config.kubelet_argv("/bin/kubelet", settings(tmp_path))
    assert "--node-ip=10.1.2.3" in argv and "--hostname-override=real-node-0" in argv
    assert "--container-runtime=remote" in argv and "--pod-infra-container-image=localhost/pause:3.2" in argv
    assert "failCgroupV1" not in kubelet and "containerRuntimeEndpoint" not in kubelet


def test_a_newer_kubelet_gets_its_runtime_in_the_config_and_runs_on_cgroup_v1(tmp_path: Path) -> None:
    """1.37's kubelet has no --container-runtime or --pod-infra-container-image (it exits on an unknown
    flag), no SizeMemoryBackedVolumes gate (it exits on an unknown gate), and refuses a cgroup v1 host unless
    failCgroupV1 is false."""
    kubelet = yaml.safe_load(config.kubelet_yaml(tmp_path / "ca.crt", "10.1.2.3", "1.37.2"))
    assert "featureGates" not in kubelet
    assert kubelet["failCgroupV1"] is False
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{config.CONTAINERD_SOCKET}"
    assert kubelet["cgroupDriver"] == "cgroupfs"
    newer = config.NodeSettings(
        name="real-node-0", node_ip="10.1.2.3", state_dir=tmp_path, kubernetes_version="1.37.2"
    )
    argv = config.kubelet_argv("/bin/kubelet", newer)
    assert not [arg for arg in argv if arg.startswith(("--container-runtime", "--pod-infra-container-image"))]
    assert "--node-ip=10.1.2.3" in argv and f"--config={newer.kubelet_config}" in argv


def test_containerd_names_the_sandbox_image_of_the_release() -> None:
    assert 'sandbox_image = "localhost/pause:3.10.2"' in config.containerd_toml(config.pause_image("3.10.2"))


def test_the_pause_release_is_read_from_the_release_sources(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert images.makefile_tag("# comment\nTAG ?= 3.10.2\nREV = $(shell git describe)\n") == "3.10.2"
    with pytest.raises(UserFacingError, match="names no TAG"):
        images.makefile_tag("REV = 1\n")
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path))
    assert images.pause_version("1.20.2") == "3.2"
    with pytest.raises(UserFacingError, match=re.escape("PHALANX_KUBE_VERSION=1.36.3 phalanx dev install")):
        images.pause_version("1.36.3")
    pause = images.module_pause_dir("1.37.2")
    assert pause == tmp_path / "go" / "mod" / "k8s.io" / "kubernetes@v1.37.2" / "build" / "pause"
    pause.mkdir(parents=True)
    (pause / "Makefile").write_text("TAG ?= 3.10.2\n")
    assert images.pause_reference("1.37.2") == "localhost/pause:3.10.2"


def test_kube_proxy_runs_iptables_mode_on_the_node_address(tmp_path: Path) -> None:
    proxy = yaml.safe_load(config.kube_proxy_yaml(settings(tmp_path)))
    assert proxy["mode"] == "iptables"
    assert proxy["bindAddress"] == "10.1.2.3"
    assert proxy["clusterCIDR"] == config.CLUSTER_CIDR
    assert proxy["clientConnection"]["kubeconfig"] == str(settings(tmp_path).proxy_kubeconfig)


def test_node_mounts_are_unmounted_deepest_first_and_others_left_alone() -> None:
    mounts = "\n".join(
        [
            "overlay / overlay rw 0 0",
            "tmpfs /var/lib/kubelet/pods/abc/volumes/kubernetes.io~empty-dir/shm tmpfs rw 0 0",
            "/dev/vda /var/lib/kubelet /dev/vda rw 0 0",
            "nsfs /run/netns/cni-1 nsfs rw 0 0",
            "shm /run/containerd/io.containerd.grpc.v1.cri/sandboxes/x/shm tmpfs rw 0 0",
            "tmpfs /var/lib/kubeletother tmpfs rw 0 0",
            "tmpfs /run/user/0 tmpfs rw 0 0",
        ]
    )
    points = host.node_mounts(mounts)
    assert points[0].startswith("/run/containerd/io.containerd") or points[0].startswith(
        "/var/lib/kubelet/pods"
    )
    assert points[-1] == "/var/lib/kubelet"
    assert "/var/lib/kubeletother" not in points and "/run/user/0" not in points and "/" not in points
    assert "/run/netns/cni-1" in points


def test_only_the_nodes_iptables_chains_are_removed() -> None:
    saved = "\n".join(
        [
            "*nat",
            ":PREROUTING ACCEPT [0:0]",
            ":KUBE-SERVICES - [0:0]",
            ":CNI-abc - [0:0]",
            ":DOCKER - [0:0]",
            "-A PREROUTING -j KUBE-SERVICES",
            "-A POSTROUTING -s 10.244.0.2/32 -j CNI-abc",
            "-A PREROUTING -j DOCKER",
            "COMMIT",
        ]
    )
    kept = host.without_node_chains(saved)
    assert "KUBE-" not in kept and "CNI-" not in kept
    assert ":DOCKER - [0:0]" in kept and "-A PREROUTING -j DOCKER" in kept and "COMMIT" in kept


def test_sysctls_are_saved_once_and_restored(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    values = {"vm.overcommit_memory": "0", "kernel.panic": "0"}
    monkeypatch.setattr(host, "read_sysctl", lambda name: values.get(name))
    monkeypatch.setattr(host, "write_sysctl", lambda name, value: values.__setitem__(name, value))
    saved = tmp_path / "sysctl.json"
    host.save_sysctls(saved)
    values["vm.overcommit_memory"] = "1"  # what kubelet sets
    host.save_sysctls(saved)  # a second `up` must keep the host's original values
    host.restore_sysctls(saved)
    assert values == {"vm.overcommit_memory": "0", "kernel.panic": "0"}
    assert not saved.exists()


def test_the_pause_archive_is_a_docker_archive_with_one_layer() -> None:
    archive = images.docker_archive(
        "localhost/pause:3.2", {"pause": (b"\x7fELF", 0o755)}, ["/pause"], "65535:65535"
    )
    with tarfile.open(fileobj=io.BytesIO(archive)) as outer:
        manifest = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest[0]["RepoTags"] == ["localhost/pause:3.2"]
        image_config = json.loads(outer.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        assert image_config["config"]["Entrypoint"] == ["/pause"]
        layer = outer.extractfile(manifest[0]["Layers"][0]).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(layer)) as inner:
        member = inner.getmember("pause")
        assert member.mode == 0o755 and inner.extractfile(member).read() == b"\x7fELF"  # type: ignore[union-attr]
    assert archive == images.docker_archive(
        "localhost/pause:3.2", {"pause": (b"\x7fELF", 0o755)}, ["/pause"], "65535:65535"
    )  # deterministic: the same inputs give the same image


def test_the_apiserver_listens_on_the_host_address_only_with_a_real_node(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    base = dict(
        nodes=1, simulated_nodes=0, gpus_per_node=0, cluster_octet=100, etcd_port=1, etcd_peer_port=2,
        api_port=3, scheduler_port=4, controller_manager_port=5, binaries={"kube-apiserver": "kas"},
    )  # fmt: skip
    layout = controlplane.Layout(tmp_path)
    plain = controlplane.component_argv("kube-apiserver", controlplane.ClusterConfig(**base), layout, pki)  # type: ignore[arg-type]
    assert "--bind-address=127.0.0.1" in plain and not any("kubelet-client" in arg for arg in plain)
    real = controlplane.ClusterConfig(**base, real_nodes=1, node_ip="10.1.2.3")  # type: ignore[arg-type]
    argv = controlplane.component_argv("kube-apiserver", real, layout, pki)
    assert "--bind-address=0.0.0.0" in argv and "--advertise-address=10.1.2.3" in argv
    assert f"--kubelet-client-certificate={pki.kubelet_client_cert}" in argv


def test_node_credentials_are_made_once_and_chain_to_the_cluster_ca(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    admin = pki.admin_token()
    node.prepare_credentials(pki)
    first = pki.token_of(node.NODE_USER)
    node.prepare_credentials(pki)
    assert first is not None and pki.token_of(node.NODE_USER) == first
    assert pki.admin_token() == admin  # the admin's line stays first
    lines = pki.token_file.read_text().splitlines()
    assert f'{first},{node.NODE_USER},{node.NODE_NAME},"system:nodes"' in lines
    assert len(lines) == 3
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(pki.apiserver_cert), str(pki.kubelet_client_cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr


def test_the_kubelet_keeps_the_images_imported_offline_on_a_full_shared_disk(tmp_path: Path) -> None:
    """The node's images cannot be pulled again: at 91% disk usage the kubelet's image GC deleted the pause
    image between two pods, and no pod started after it. Evictions start only gigabytes from a full disk."""
    kubelet = yaml.safe_load(config.kubelet_yaml(tmp_path / "ca.crt", "10.1.2.3", "1.37.2"))
    assert kubelet["imageGCHighThresholdPercent"] == 100
    assert kubelet["evictionHard"] == {
        "memory.available": "100Mi",
        "nodefs.available": "2Gi",
        "imagefs.available": "2Gi",
    }
