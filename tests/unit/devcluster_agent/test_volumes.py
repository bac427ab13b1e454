"""Volume contents and layout, pod /etc files."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

from phalanx.devcluster.agent import volumes
from phalanx.devcluster.agent.envresolve import ContainerConfigError
from phalanx.devcluster.agent.podworker import volume_env_name
from phalanx.devcluster.agent.volumes import (
    Mount,
    PodVolumeContext,
    container_mounts,
    materialize,
    persistent_path,
    render_hosts,
    render_resolv,
    volume_files,
)

POD = {
    "metadata": {"name": "w-0", "namespace": "ns", "uid": "uid-1", "labels": {"a": "b"}},
    "spec": {"containers": [{"name": "main"}]},
}
CONFIG_MAPS = {("ns", "cfg"): {"data": {"a.yaml": "x: 1", "b": "2"}}}
SECRETS = {("ns", "token"): {"data": {"token": base64.b64encode(b"tok").decode(), "ca.crt": "Y2E="}}}


def lookup(table: dict):
    return lambda namespace, name: table.get((namespace, name))


def files_of(volume: dict) -> dict[str, tuple[bytes, int]]:
    files = volume_files(POD, volume, lookup(CONFIG_MAPS), lookup(SECRETS), "127.1.0.2", "127.0.0.1")
    assert files is not None
    return {f.path: (f.content, f.mode) for f in files}


def test_config_map_volume_writes_every_key_or_the_listed_items() -> None:
    assert files_of({"configMap": {"name": "cfg"}}) == {"a.yaml": (b"x: 1", 0o644), "b": (b"2", 0o644)}
    items = {"configMap": {"name": "cfg", "items": [{"key": "b", "path": "sub/two", "mode": 0o600}]}}
    assert files_of(items) == {"sub/two": (b"2", 0o600)}


def test_secret_volume_decodes_values() -> None:
    files = files_of({"secret": {"secretName": "token", "defaultMode": 0o400}})
    assert files == {"token": (b"tok", 0o400), "ca.crt": (b"ca", 0o400)}


def test_missing_sources_retry_unless_optional() -> None:
    with pytest.raises(ContainerConfigError, match='configmap "nope" not found'):
        files_of({"configMap": {"name": "nope"}})
    assert files_of({"secret": {"secretName": "nope", "optional": True}}) == {}
    assert volume_files(POD, {"emptyDir": {}}, lookup({}), lookup({}), "", "") is None


def test_downward_api_and_projected_volumes() -> None:
    downward = {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}
    assert files_of(downward) == {"name": (b"w-0", 0o644)}
    projected = {
        "projected": {
            "sources": [
                {"secret": {"name": "token", "items": [{"key": "token", "path": "token"}]}},
                {"configMap": {"name": "cfg", "items": [{"key": "b", "path": "b"}]}},
            ]
        }
    }
    assert files_of(projected) == {"token": (b"tok", 0o644), "b": (b"2", 0o644)}


def test_mounts_follow_spec_order_and_sub_paths() -> None:
    container = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/data", "subPath": "run1"},
            {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True},
        ]
    }
    assert container_mounts(container, {"data": "/v/data", "cfg": "/v/cfg"}) == [
        Mount("/v/data/run1", "/data", False),
        Mount("/v/cfg", "/etc/cfg", True),
    ]
    with pytest.raises(ContainerConfigError):
        container_mounts({"volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})


def test_hosts_file_names_the_pod_like_the_kubelet() -> None:
    pod = {
        **POD,
        "spec": {
            "hostname": "w0",
            "subdomain": "grp",
            "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["a"]}],
        },
    }
    hosts = render_hosts(pod, "127.1.0.2")
    assert "127.0.0.1\tlocalhost" in hosts
    assert "127.1.0.2\tw0.grp.ns.svc.cluster.local\tw0" in hosts
    assert "1.2.3.4\ta" in hosts
    assert render_hosts(POD, "127.1.0.9").splitlines()[-1] == "127.1.0.9\tw-0"


def test_resolv_conf_points_at_cluster_dns_with_search_path() -> None:
    assert render_resolv("ns", "127.4.0.1").splitlines() == [
        "nameserver 127.4.0.1",
        "search ns.svc.cluster.local svc.cluster.local cluster.local",
        "options ndots:5",
    ]


def test_materialize_lays_out_private_and_host_volumes(tmp_path: Path) -> None:
    host = tmp_path / "host" / "made"
    pod = {
        **POD,
        "spec": {
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "host", "hostPath": {"path": str(host), "type": "DirectoryOrCreate"}},
            ]
        },
    }
    ctx = PodVolumeContext(tmp_path / "state", lookup(CONFIG_MAPS), lookup(SECRETS), lookup({}), lookup({}))
    paths = materialize(pod, ctx, "127.1.0.2", "127.0.0.1")
    pod_volumes = tmp_path / "state" / "pods" / "uid-1" / "volumes"
    assert paths == {
        "scratch": str(pod_volumes / "scratch"),
        "cfg": str(pod_volumes / "cfg"),
        "host": str(host),
    }
    assert (pod_volumes / "cfg" / "a.yaml").read_text() == "x: 1"
    assert oct(os.stat(pod_volumes / "cfg" / "b").st_mode & 0o777) == "0o644"
    assert host.is_dir()


def test_memory_backed_empty_dirs_live_in_memory_beside_the_pods_shm(tmp_path: Path) -> None:
    pod = {**POD, "spec": {"volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}
    state = tmp_path / "state"
    ctx = PodVolumeContext(state, lookup(CONFIG_MAPS), lookup(SECRETS), lookup({}), lookup({}))
    try:
        paths = materialize(pod, ctx, "127.1.0.2", "127.0.0.1")
        assert paths == {"shm": str(volumes.memory_volume_dir(state, "uid-1", "shm"))}
        assert volumes.memory_volume_dirs(state, "uid-1") == [Path(paths["shm"])]
        assert Path(paths["shm"]).parent == volumes.shm_root(state)
    finally:
        shutil.rmtree(volumes.shm_root(state), ignore_errors=True)  # the machine's /dev/shm


def test_persistent_claims_need_a_bound_volume(tmp_path: Path) -> None:
    claims = {
        ("ns", "pending"): {"spec": {}, "status": {"phase": "Pending"}},
        ("ns", "bound"): {"spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}},
    }
    volumes = {("", "pv1"): {"spec": {"hostPath": {"path": str(tmp_path / "pv1")}}}}
    with pytest.raises(ContainerConfigError, match="not bound"):
        persistent_path("ns", "pending", lookup(claims), lookup(volumes))
    with pytest.raises(ContainerConfigError, match="not found"):
        persistent_path("ns", "missing", lookup(claims), lookup(volumes))
    assert persistent_path("ns", "bound", lookup(claims), lookup(volumes)) == str(tmp_path / "pv1")
    assert (tmp_path / "pv1").is_dir()


def test_volume_env_names() -> None:
    assert volume_env_name("ckpt-data.v1") == "PHALANX_VOLUME_CKPT_DATA_V1"
