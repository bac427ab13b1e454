"""Builds Kueue's controller from its Go module, as gobuild.py builds Kubernetes.

devcluster/gomodules/kueue is a wrapper module that requires `sigs.k8s.io/kueue` and names its controller,
`sigs.k8s.io/kueue/cmd/kueue`, as a tool; `go build` builds that package by import path. The module and build
caches are Kubernetes' (`<cache>/go`); `<cache>/kueue-<version>/` holds the binary (`bin/kueue`), the manifests
the controller is installed with (`bin/manifests/`: its CRDs and webhook configurations, copied from the
module), the resolved wrapper module and the last build's log.

The flags follow Kueue's own Makefile: `CGO_ENABLED=0` and its version variables set through `-X`
(`sigs.k8s.io/kueue/pkg/version`), so that the controller's first log line names the release.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from phalanx.devcluster import gobuild

VERSION = "0.19.2"
"""The pin: the newest Kueue release the module proxy serves. Changing this line is all a new release takes:
`phalanx dev install` resolves the wrapper module for it; `python -m phalanx.devcluster.kueue.build
--write-module` writes it back into devcluster/gomodules/kueue, to be committed (a unit test says when they
disagree)."""

MODULE = "sigs.k8s.io/kueue"
PACKAGE = f"{MODULE}/cmd/kueue"
WRAPPER = "kueue"
"""The wrapper module's folder under devcluster/gomodules."""
BINARY = "kueue"
MANIFESTS = "manifests"
"""bin/manifests/: what the controller is installed with, from the same module version as the binary."""
CRD_FOLDER = "config/components/crd"
"""In the module: `bases/*.yaml` (the CRDs) and the kustomization whose patches give some of them a
conversion webhook."""
WEBHOOK_MANIFESTS = "config/components/webhook/manifests.yaml"
BUILT = (BINARY, MANIFESTS)
BUILD_DISK_BYTES = 3 * 1024**3
"""Free disk the first build needs beside Kubernetes': 0.4 GB of modules, 1.9 GB of build cache and the 0.1 GB
binary (measured; see docs/local-cluster.md), with room to spare."""


def folders(cache: Path, version: str = VERSION) -> gobuild.Folders:
    return gobuild.Folders(cache, version, name="kueue")


def binary(cache: Path) -> Path:
    return folders(cache).bin / BINARY


def manifests(cache: Path) -> Path:
    return folders(cache).bin / MANIFESTS


def version_ldflags(version: str, commit: str, build_date: str) -> str:
    """`-X` flags as Kueue's Makefile sets them."""
    package = f"{MODULE}/pkg/version"
    values = {"GitVersion": f"v{version}", "GitCommit": commit, "BuildDate": build_date}
    return " ".join(f"-X {package}.{name}={value}" for name, value in values.items())


def build_argv(version: str, out: Path, commit: str, build_date: str) -> list[str]:
    return [
        "go", "build", "-v", "-trimpath",
        f"-ldflags=-s -w {version_ldflags(version, commit, build_date)}",
        f"-o={out / BINARY}", PACKAGE,
    ]  # fmt: skip


def recipe(version: str) -> list[list[str]]:
    """The build's command lines with the folders, commit and date left out (the version fixes them)."""
    return [build_argv(version, gobuild.RECIPE_OUT, "COMMIT", "DATE"), gobuild.recipe_settings()]


def copy_manifests(module_dir: Path, target: Path) -> None:
    """The module's CRD folder (bases and patches, with its kustomization) and webhook configurations."""
    shutil.copytree(module_dir / CRD_FOLDER, target / "crd")
    shutil.copyfile(module_dir / WEBHOOK_MANIFESTS, target / "webhooks.yaml")
    # Go makes the module cache read-only; the copies must be removable like the rest of the cache.
    for path in (target, *target.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def build(cache: Path, version: str = VERSION, force: bool = False) -> Path:
    """Builds Kueue `version` into `<cache>/kueue-<version>/bin` unless the stamp there says it is done.
    Returns the bin folder."""
    where = folders(cache, version)
    env = gobuild.go_env(where.go, dict(os.environ))
    files = gobuild.wrapper_files((WRAPPER,))
    expected = gobuild.build_stamp({"kueue": version}, gobuild.go_version(env), files, recipe(version))
    if not force and gobuild.already_built(where.bin, BUILT, expected):
        gobuild.say(f"Kueue {version} already built in {where.bin}: nothing to do")
        return where.bin
    gobuild.require_free_disk(cache, BUILD_DISK_BYTES, f"Kueue {version}")
    started = gobuild.start_build(where)
    gobuild.copy_wrappers(where, (WRAPPER,))
    wrapper = where.modules / WRAPPER
    info = gobuild.fetch_module(MODULE, f"v{version}", wrapper, env, where)
    if gobuild.requirement((wrapper / "go.mod").read_text(), MODULE) != f"v{version}":
        gobuild.say(f"Kueue {version} is not the pinned {VERSION}: resolving its modules (go mod tidy)")
        _resolve(wrapper, version, env, where)
    total = len(gobuild.list_packages([PACKAGE], None, wrapper, env, where))
    gobuild.say(
        f"building Kueue {version} from Go modules: up to {total} packages (about 4 minutes on 2 cores the "
        f"first time, after Kubernetes' build; cached ones are skipped; log: {where.log})"
    )
    staged = gobuild.staging_folder(where)
    commit = str((info.get("Origin") or {}).get("Hash", "unknown"))
    on_package = gobuild.package_counter(gobuild.Progress("compiling packages", total=total))
    argv = build_argv(version, staged, commit, gobuild.release_time(info))
    gobuild.run_go(argv, wrapper, env, f"building Kueue {version}", where, on_package)
    copy_manifests(Path(info["Dir"]), staged / MANIFESTS)
    gobuild.install_staged(staged, where.bin, BUILT, expected)
    minutes = (time.monotonic() - started) / 60
    gobuild.say(
        f"built Kueue {version} in {minutes:.1f} min into {where.bin} "
        f"({gobuild.size(where.bin) / 1024**2:.0f} MiB; Go's caches in {where.go.root}: "
        f"{gobuild.size(where.go.root) / 1024**3:.1f} GiB)"
    )
    return where.bin


def _resolve(wrapper: Path, version: str, env: dict[str, str], where: gobuild.Folders) -> None:
    """Point the wrapper module at Kueue `version` and resolve the rest of its modules (go mod tidy)."""
    edit = [
        "go",
        "mod",
        "edit",
        *gobuild.pin_edit_args((wrapper / "go.mod").read_text(), MODULE, f"v{version}"),
    ]
    gobuild.run_go(edit, wrapper, env, "editing the Kueue wrapper module", where)
    gobuild.tidy(wrapper, env, "resolving Kueue's modules", where)


def write_module(cache: Path) -> None:
    """Resolves the wrapper module for the pin and writes it back into the source tree, to be committed."""
    where = folders(cache)
    env = gobuild.go_env(where.go, dict(os.environ))
    gobuild.start_build(where)
    gobuild.copy_wrappers(where, (WRAPPER,))
    _resolve(where.modules / WRAPPER, VERSION, env, where)
    source = gobuild.write_back(where, (WRAPPER,))
    gobuild.say(f"wrote {source / WRAPPER} for Kueue {VERSION}")


if __name__ == "__main__":
    from phalanx.devcluster.binaries import cache_dir

    if "--write-module" in sys.argv:
        write_module(cache_dir())
    else:
        print(build(cache_dir(), force="--force" in sys.argv))
