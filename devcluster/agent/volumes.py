"""Pod volumes and the pod's /etc files: layout and contents are pure functions, `materialize` writes them.

Layout of a pod under the state dir: `pods/<uid>/volumes/<volume>/` (emptyDir, configMap, secret, projected,
downwardAPI; removed with the pod), `pods/<uid>/etc/{hosts,resolv.conf}`, `pods/<uid>/logs/<container>/<n>.log`,
`pods/<uid>/run/<container>.{json,pid}`. hostPath volumes are the host path itself; persistentVolumeClaim volumes
are the bound PV's path (under `volumes/` of the state dir when provisioned by the agent), which outlives pods.
ConfigMap and Secret files are written once when the pod starts (not refreshed while it runs).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.envresolve import ContainerConfigError, field_ref_value, resource_field_value

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

RawLookup = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) -> the whole ConfigMap/Secret/PVC/PV object, or None when missing."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class VolumeFile:
    path: str
    content: bytes
    mode: int


def pod_dir(state_dir: Path, uid: str) -> Path:
    return state_dir / "pods" / uid


def shm_root(state_dir: Path) -> Path:
    """Where this cluster keeps its pods' /dev/shm: memory-backed when the machine has /dev/shm."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    base = Path("/dev/shm")
    return base / f"phalanx-pods-{digest}" if base.is_dir() else state_dir / "shm"


def pod_shm_dir(state_dir: Path, uid: str) -> Path:
    return shm_root(state_dir) / uid


def private_volume_dir(state_dir: Path, uid: str, name: str) -> Path:
    return pod_dir(state_dir, uid) / "volumes" / name


def memory_volume_dir(state_dir: Path, uid: str, name: str) -> Path:
    """A memory-backed emptyDir (`medium: Memory`): beside the pod's /dev/shm, in memory as a tmpfs is."""
    return shm_root(state_dir) / f"{uid}.{name}"


def memory_volume_dirs(state_dir: Path, uid: str) -> list[Path]:
    return sorted(shm_root(state_dir).glob(f"{uid}.*"))


def _items(
    data: Mapping[str, bytes],
    items: list[Mapping[str, Any]] | None,
    default_mode: int,
    optional: bool,
    what: str,
) -> list[VolumeFile]:
    if not items:
        return [VolumeFile(key, value, default_mode) for key, value in sorted(data.items())]
    files = []
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ContainerConfigError(f"{what}: key {item['key']!r} not found")
        files.append(VolumeFile(item["path"], data[item["key"]], item.get("mode", default_mode)))
    return files


def _config_map_bytes(obj: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _secret_bytes(obj: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def _downward_files(
    pod: Mapping[str, Any], items: list[Mapping[str, Any]], default_mode: int, pod_ip: str, host_ip: str
) -> list[VolumeFile]:
    files = []
    for item in items:
        if "fieldRef" in item:
            value = field_ref_value(pod, item["fieldRef"]["fieldPath"], pod_ip, host_ip)
        else:
            ref = item["resourceFieldRef"]
            containers = pod["spec"].get("containers") or []
            target = next((c for c in containers if c["name"] == ref.get("containerName")), containers[0])
            value = resource_field_value(target, ref, {})
        files.append(VolumeFile(item["path"], value.encode(), item.get("mode", default_mode)))
    return files


def volume_files(
    pod: Mapping[str, Any],
    volume: Mapping[str, Any],
    config_maps: RawLookup,
    secrets: RawLookup,
    pod_ip: str,
    host_ip: str,
    token_for: Callable[[Mapping[str, Any]], str] | None = None,
) -> list[VolumeFile] | None:
    """The files of a configMap/secret/downwardAPI/projected volume; None for volumes that hold no files."""
    namespace = pod["metadata"]["namespace"]
    keyed_sources = (
        ("configMap", "name", "configmap", config_maps, _config_map_bytes),
        ("secret", "secretName", "secret", secrets, _secret_bytes),
    )
    for kind, name_field, label, read, contents in keyed_sources:
        if kind not in volume:
            continue
        source = volume[kind]
        obj = read(namespace, source[name_field])
        if obj is None:
            if source.get("optional"):
                return []
            raise ContainerConfigError(f'{label} "{source[name_field]}" not found')
        return _items(
            contents(obj),
            source.get("items"),
            source.get("defaultMode", 0o644),
            bool(source.get("optional")),
            f"{label} {source[name_field]}",
        )
    if "downwardAPI" in volume:
        source = volume["downwardAPI"]
        return _downward_files(
            pod, source.get("items") or [], source.get("defaultMode", 0o644), pod_ip, host_ip
        )
    if "projected" in volume:
        projected = volume["projected"]
        mode = projected.get("defaultMode", 0o644)
        files: list[VolumeFile] = []
        for source in projected.get("sources") or []:
            if "configMap" in source:
                files += (
                    volume_files(
                        pod,
                        {"configMap": {**source["configMap"], "defaultMode": mode}},
                        config_maps,
                        secrets,
                        pod_ip,
                        host_ip,
                    )
                    or []
                )
            elif "secret" in source:
                secret = {**source["secret"], "secretName": source["secret"]["name"], "defaultMode": mode}
                files += volume_files(pod, {"secret": secret}, config_maps, secrets, pod_ip, host_ip) or []
            elif "downwardAPI" in source:
                files += _downward_files(pod, source["downwardAPI"].get("items") or [], mode, pod_ip, host_ip)
            elif "serviceAccountToken" in source and token_for is not None:
                request = source["serviceAccountToken"]
                files.append(VolumeFile(request["path"], token_for(request).encode(), mode))
        return files
    return None


def container_mounts(container: Mapping[str, Any], volume_paths: Mapping[str, str]) -> list[Mount]:
    """The bind mounts of one container, in spec order (subPath honoured)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = volume_paths.get(mount["name"])
        if source is None:
            raise ContainerConfigError(f"volume {mount['name']!r} is not defined or not ready")
        if mount.get("subPath"):
            source = os.path.join(source, mount["subPath"])
        mounts.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts


def pod_hostname(pod: Mapping[str, Any]) -> str:
    return ((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def render_hosts(pod: Mapping[str, Any], pod_ip: str, cluster_domain: str = "cluster.local") -> str:
    """The kubelet's managed /etc/hosts."""
    spec = pod.get("spec") or {}
    hostname = pod_hostname(pod)
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
    ]
    if spec.get("subdomain"):
        domain = f"{spec['subdomain']}.{pod['metadata']['namespace']}.svc.{cluster_domain}"
        lines.append(f"{pod_ip}\t{hostname}.{domain}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    for alias in spec.get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []))
    return "\n".join(lines) + "\n"


def render_resolv(namespace: str, nameserver: str, cluster_domain: str = "cluster.local") -> str:
    return (
        f"nameserver {nameserver}\n"
        f"search {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\n"
        "options ndots:5\n"
    )


def write_files(directory: Path, files: list[VolumeFile]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for item in files:
        target = directory / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_bytes(item.content)
        os.chmod(temporary, item.mode)
        os.replace(temporary, target)


def prepare_host_path(volume: Mapping[str, Any]) -> str:
    source = volume["hostPath"]
    path = Path(source["path"])
    kind = source.get("type") or ""
    if kind == "FileOrCreate" and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    elif kind in ("", "DirectoryOrCreate") and not path.exists():
        path.mkdir(parents=True, exist_ok=True)
    elif kind in ("Directory", "File", "Socket") and not path.exists():
        raise ContainerConfigError(f"hostPath {path} does not exist (type {kind})")
    return str(path)


def persistent_path(namespace: str, claim_name: str, claims: RawLookup, volumes: RawLookup) -> str:
    """The host folder of a bound PVC's PV (hostPath or local)."""
    claim = claims(namespace, claim_name)
    if claim is None:
        raise ContainerConfigError(f'persistentvolumeclaim "{claim_name}" not found')
    volume_name = (claim.get("spec") or {}).get("volumeName")
    if not volume_name or (claim.get("status") or {}).get("phase") != "Bound":
        raise ContainerConfigError(f'persistentvolumeclaim "{claim_name}" is not bound yet')
    volume = volumes("", volume_name)
    if volume is None:
        raise ContainerConfigError(f'persistentvolume "{volume_name}" not found')
    spec = volume.get("spec") or {}
    path = (spec.get("hostPath") or {}).get("path") or (spec.get("local") or {}).get("path")
    if not path:
        raise ContainerConfigError(f'persistentvolume "{volume_name}" is neither hostPath nor local')
    Path(path).mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class PodVolumeContext:
    state_dir: Path
    config_maps: RawLookup
    secrets: RawLookup
    claims: RawLookup
    persistent_volumes: RawLookup
    token_for: Callable[[Mapping[str, Any], Mapping[str, Any]], str] | None = None
    """(pod, serviceAccountToken projection) -> a token (TokenRequest API)."""


def materialize(pod: Mapping[str, Any], ctx: PodVolumeContext, pod_ip: str, host_ip: str) -> dict[str, str]:
    """Create every volume of the pod; returns volume name -> host path. Raises ContainerConfigError to retry."""
    uid = pod["metadata"]["uid"]
    paths: dict[str, str] = {}
    token_source = ctx.token_for
    token_for = (lambda request: token_source(pod, request)) if token_source else None
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        if "hostPath" in volume:
            paths[name] = prepare_host_path(volume)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            paths[name] = persistent_path(
                pod["metadata"]["namespace"], claim, ctx.claims, ctx.persistent_volumes
            )
        else:
            in_memory = (volume.get("emptyDir") or {}).get("medium") == "Memory"
            directory = (memory_volume_dir if in_memory else private_volume_dir)(ctx.state_dir, uid, name)
            files = volume_files(pod, volume, ctx.config_maps, ctx.secrets, pod_ip, host_ip, token_for)
            directory.mkdir(parents=True, exist_ok=True)
            if files is not None:
                write_files(directory, files)
            paths[name] = str(directory)
    return paths
