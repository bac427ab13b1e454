"""Finds the control-plane binaries (and a real node's kubelet and kube-proxy), or builds them once into the cache.

The release is the newest pinned one (`gobuild.NEWEST`), built from the Go module proxy (gobuild.py), unless
`$PHALANX_KUBE_VERSION` names another: any release the proxy serves, built the same way, or 1.20.2, the one
release built from Debian's source package (build_kubernetes.sh).

Search order for each binary: `$KUBEBUILDER_ASSETS` (the envtest convention), then `PATH`, then Phalanx's
cache (`~/.cache/phalanx/k8s-<version>/bin`). A release chosen with `$PHALANX_KUBE_VERSION` skips `PATH`,
whose binaries are of no known version. Building is the last resort.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from phalanx.devcluster import aptsources, gobuild
from phalanx.errors import UserFacingError

KUBERNETES_VERSION: str = gobuild.NEWEST.kubernetes
"""The default release: the newest pinned one, built from Go modules (gobuild.py)."""
DEBIAN_VERSION = "1.20.2"
"""The release built from Debian's source package (build_kubernetes.sh) when `$PHALANX_KUBE_VERSION` names it;
state dirs made before the cluster recorded its release were made by it."""
VERSION_ENV = "PHALANX_KUBE_VERSION"
"""Names another release, e.g. `PHALANX_KUBE_VERSION=1.35.8` (from Go modules) or `1.20.2` (from Debian)."""
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


def kube_version() -> str:
    """The release the local cluster runs: `$PHALANX_KUBE_VERSION`, else the default."""
    chosen = os.environ.get(VERSION_ENV, "").strip()
    return ".".join(str(part) for part in gobuild.parse_version(chosen)) if chosen else KUBERNETES_VERSION


def from_go_modules(version: str) -> bool:
    return version != DEBIAN_VERSION


def is_legacy(kubernetes_version: str) -> bool:
    """Kubernetes 1.20, built from Debian: the flags and behaviours it alone has. Every other release the
    local cluster runs is one the Go module proxy serves (1.34 and newer)."""
    return kubernetes_version.split(".")[:2] == ["1", "20"]


def cached_bin_dir() -> Path:
    return cache_dir() / f"k8s-{kube_version()}" / "bin"


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
    if not from_go_modules(kube_version()):
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


def install_command(version: str) -> str:
    """The command that builds `version`: the default release needs no variable."""
    chosen = "" if version == KUBERNETES_VERSION else f"{VERSION_ENV}={version} "
    return f"{chosen}phalanx dev install"


def node_install_hint(version: str) -> str:
    """How to get a real node's kubelet and kube-proxy for this release: 1.20's come from a second build on
    request, a release from Go modules builds them with everything else."""
    if from_go_modules(version):
        return f"run `{install_command(version)}` once (about 10 minutes on 2 cores)"
    return f"run `{install_command(version)} --real-node` once (about 12 minutes)"


def require_binaries() -> Binaries:
    binaries, missing = find_binaries()
    if binaries is None:
        version = kube_version()
        command = install_command(version)
        if from_go_modules(version):
            where, duration = "$KUBEBUILDER_ASSETS", "about 10 minutes on 2 cores"
        else:
            where, duration = "$KUBEBUILDER_ASSETS, PATH", "7-10 minutes"
        raise UserFacingError(
            f"Kubernetes {version} binaries not found: {', '.join(missing)} "
            f"(looked in {where} and {cached_bin_dir()}). Run `{command}` to build them once ({duration})."
        )
    return binaries


def install(force: bool = False, real_node: bool = False) -> Binaries:
    """Builds the binaries into the cache unless they are already found (with `real_node`, kubelet and
    kube-proxy too), all in one build."""
    version = kube_version()
    if from_go_modules(version):
        return _install_from_go_modules(version, force)
    print(
        f"[phalanx install] Kubernetes {version} from Debian's source package "
        f"(without {VERSION_ENV}, the newest pinned release, {KUBERNETES_VERSION}, is built from Go modules)",
        flush=True,
    )
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


def _install_from_go_modules(version: str, force: bool) -> Binaries:
    """Every binary, a real node's too, comes from one build: nothing to choose."""
    release = gobuild.release_for(version)
    etcd = f"etcd {release.etcd}" if release.etcd else "the etcd its build/dependencies.yaml names"
    pinned = " (the newest pinned release)" if release == gobuild.NEWEST else ""
    print(f"[phalanx install] Kubernetes {version}{pinned} from Go modules, with {etcd}", flush=True)
    binaries, _ = find_binaries()
    _, node_missing = find_node_binaries()
    if (
        not force
        and binaries is not None
        and not node_missing
        and binaries.kube_apiserver.parent != cached_bin_dir()
    ):
        print(f"[phalanx install] found in $KUBEBUILDER_ASSETS: {binaries.kube_apiserver.parent}", flush=True)
        return binaries
    gobuild.build(version, cache_dir(), force=force)
    return require_binaries()


def _build(names: list[str]) -> None:
    cache = cache_dir()
    gobuild.require_free_disk(cache, BUILD_DISK_BYTES, ", ".join(names))
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
