"""Finds the control-plane binaries (and a real node's kubelet and kube-proxy), or builds them once into the cache.

Search order for each binary: `$KUBEBUILDER_ASSETS` (the envtest convention), then `PATH`, then Phalanx's
cache (`~/.cache/phalanx/k8s-1.20.2/bin`). Building from Debian's source package is the last resort.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from phalanx.devcluster import aptsources
from phalanx.errors import UserFacingError

KUBERNETES_VERSION = "1.20.2"
CONTROL_PLANE = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
ALL_BINARIES = ("etcd", *CONTROL_PLANE, "kubectl")
NODE_BINARIES = ("kubelet", "kube-proxy")
"""What a real node adds (`phalanx dev install --real-node`): built from the same sources, same version."""
BUILT = (*CONTROL_PLANE, "kubectl")
"""What the build compiles for the control plane (etcd comes from Debian's `etcd-server`)."""
BUILD_DISK_BYTES = 4 * 1024**3
"""Free disk the build needs: sources, Go cache and binaries (about 3 GB at the peak)."""


def cache_dir() -> Path:
    """Root of everything Phalanx caches outside the repository."""
    override = os.environ.get("PHALANX_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx"


def cached_bin_dir() -> Path:
    return cache_dir() / f"k8s-{KUBERNETES_VERSION}" / "bin"


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubectl: Path

    def as_dict(self) -> dict[str, str]:
        return {name: str(getattr(self, name.replace("-", "_"))) for name in ALL_BINARIES}


def _search_dirs() -> list[Path]:
    dirs: list[Path] = []
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        dirs.append(Path(assets))
    dirs.extend(Path(entry) for entry in os.environ.get("PATH", "").split(os.pathsep) if entry)
    dirs.append(cached_bin_dir())
    return dirs


def _find(name: str, dirs: list[Path]) -> Path | None:
    for directory in dirs:
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_binaries() -> tuple[Binaries | None, list[str]]:
    """Returns the binaries found, or None with the names that are missing."""
    dirs = _search_dirs()
    found = {name: _find(name, dirs) for name in ALL_BINARIES}
    # kubectl must match the apiserver's version (client skew): take the one beside kube-apiserver if any.
    apiserver = found["kube-apiserver"]
    if apiserver is not None and (apiserver.parent / "kubectl").is_file():
        found["kubectl"] = apiserver.parent / "kubectl"
    missing = [name for name, path in found.items() if path is None]
    if missing:
        return None, missing
    return Binaries(**{name.replace("-", "_"): path for name, path in found.items()}), []  # type: ignore[arg-type]


def find_node_binaries() -> tuple[dict[str, Path], list[str]]:
    """kubelet and kube-proxy: those found, and the names that are missing. They must match the control
    plane's version, so only the one beside the control plane's kube-apiserver, or the cache, counts."""
    binaries, _ = find_binaries()
    dirs = [binaries.kube_apiserver.parent] if binaries is not None else []
    dirs.append(cached_bin_dir())
    found = {name: path for name in NODE_BINARIES if (path := _find(name, dirs)) is not None}
    return found, [name for name in NODE_BINARIES if name not in found]


def require_binaries() -> Binaries:
    binaries, missing = find_binaries()
    if binaries is None:
        raise UserFacingError(
            f"control-plane binaries not found: {', '.join(missing)} "
            f"(looked in $KUBEBUILDER_ASSETS, PATH and {cached_bin_dir()}). "
            "Run `phalanx dev install` to build them once (7-10 minutes)."
        )
    return binaries


def install(force: bool = False, real_node: bool = False) -> Binaries:
    """Builds the binaries into the cache unless they are already found (with `real_node`, kubelet and
    kube-proxy too), all in one build."""
    wanted: list[str] = list(BUILT) if force else []
    if not force:
        binaries, missing = find_binaries()
        if binaries is not None:
            print(f"[phalanx install] control plane found: {binaries.kube_apiserver.parent}", flush=True)
        else:
            print(f"[phalanx install] missing: {', '.join(missing)}; building them", flush=True)
            wanted += list(BUILT)
    if real_node:
        _, node_missing = find_node_binaries()
        if force or node_missing:
            print(f"[phalanx install] building the real node's {', '.join(NODE_BINARIES)}", flush=True)
            wanted += list(NODE_BINARIES)
    if wanted:
        _build(wanted)
    return require_binaries()


def _build(names: list[str]) -> None:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if free < BUILD_DISK_BYTES:
        raise UserFacingError(
            f"not enough free disk in {cache} to build {', '.join(names)}: "
            f"{free / 1024**3:.1f} GiB free, {BUILD_DISK_BYTES / 1024**3:.0f} GiB needed "
            "(set PHALANX_CACHE_DIR to a larger disk)."
        )
    for tool in ("apt-get", "dpkg", "tar", "make"):
        if shutil.which(tool) is None:
            raise UserFacingError(
                f"cannot build {', '.join(names)}: `{tool}` is missing. Provide the binaries instead through "
                "$KUBEBUILDER_ASSETS (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, "
                "and for a real node kubelet and kube-proxy)."
            )
    mirror = aptsources.debian_mirror()
    if mirror is None:
        raise UserFacingError(
            f"cannot build {', '.join(names)}: no Debian {aptsources.SUITE} archive in apt's sources "
            f"({aptsources.SOURCES_DIR}, {aptsources.SOURCES_LIST}); add one, or set "
            f"{aptsources.MIRROR_ENV} to a mirror's URI"
        )
    script = resources.files("phalanx.devcluster").joinpath("build_kubernetes.sh")
    env = {**os.environ, aptsources.MIRROR_ENV: mirror}
    with resources.as_file(script) as script_path:
        command = ["bash", str(script_path), str(cached_bin_dir().parent), *dict.fromkeys(names)]
        result = subprocess.run(command, check=False, env=env)
    if result.returncode != 0:
        raise UserFacingError(
            f"building {', '.join(names)} failed (exit {result.returncode}); see the output above. "
            "It needs Debian bookworm's package archive (apt) and about 4 GB of disk."
        )


if __name__ == "__main__":
    print(install(force="--force" in sys.argv, real_node="--real-node" in sys.argv).as_dict())
