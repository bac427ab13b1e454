"""Builds the controllers `phalanx bench` measures beside Phalanx (JobSet, Kubeflow Trainer v2) from their Go
modules, as gobuild.py builds Kubernetes.

Each has a wrapper module, devcluster/gomodules/<name>, that requires the published module and names the
controller's main package as a `tool` (so `go mod tidy` keeps its requirements); `go build` builds that package
by import path. The module and build caches are Kubernetes' (`<cache>/go`); `<cache>/<name>-<version>/` holds
the binary (`bin/`), the resolved wrapper module and the last build's log. The manifests the controllers are
installed with are read from the same module version in Go's module cache (`devcluster/peers.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from phalanx.devcluster import gobuild
from phalanx.errors import UserFacingError

AGAIN = "phalanx bench"
"""What to run again after a failed build (gobuild's failure lines name `phalanx dev install`)."""


@dataclass(frozen=True)
class ModuleBuild:
    """One controller built from its published Go module through the wrapper module gomodules/<name>."""

    name: str
    """The wrapper module's folder under gomodules/, and the cache folder's prefix (`<name>-<version>`)."""
    module: str
    """The published module."""
    version: str
    """Its version, with the `v`."""
    package: str
    """The controller's main package."""
    binary: str
    """The built file's name in `<cache>/<name>-<version>/bin`."""
    ldflags: str = "-s -w"
    """Linker flags: stripped, plus the `-X` version variables the project's own release build sets."""

    @property
    def folder_version(self) -> str:
        return self.version.removeprefix("v")

    def argv(self, out: Path) -> list[str]:
        return ["go", "build", "-v", "-trimpath", f"-ldflags={self.ldflags}", f"-o={out}", self.package]


MODULE_BUILDS: dict[str, ModuleBuild] = {
    build.name: build
    for build in (
        # JobSet's Makefile builds main.go at the module root and stamps pkg/version.GitVersion.
        ModuleBuild(
            name="jobset",
            module="sigs.k8s.io/jobset",
            version="v0.12.0",
            package="sigs.k8s.io/jobset",
            binary="jobset-controller-manager",
            ldflags="-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=v0.12.0",
        ),
        # Kubeflow Trainer v2 (TrainJob, runs on JobSet; its go.mod requires sigs.k8s.io/jobset v0.12.0, the same
        # as above). Its Dockerfile builds cmd/trainer-controller-manager with no version flags.
        ModuleBuild(
            name="kubeflow-trainer",
            module="github.com/kubeflow/trainer/v2",
            version="v2.3.0",
            package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
            binary="trainer-controller-manager",
        ),
    )
}
"""The pins: the newest releases the module proxy serves. Changing a version here and running `python -m
phalanx.devcluster.peerbuild --write-module NAME` rewrites that wrapper module (a unit test says when they
disagree)."""

BUILD_DISK_BYTES = 3 * 1024**3
"""Free disk a first controller build needs: about 0.3 GB of modules, 1.5 GB of build cache, 0.1 GB of binary."""


def tool_packages(go_mod: str) -> list[str]:
    """The packages a go.mod's `tool` directives name."""
    return gobuild._directive_entries(go_mod, "tool")


def mismatches(go_mod: str, build: ModuleBuild) -> list[str]:
    """How a controller's wrapper module differs from its pin; empty when it builds the pin."""
    problems = []
    required = gobuild.requirement(go_mod, build.module)
    if required != build.version:
        problems.append(f"requires {build.module} {required}, not {build.version}")
    if build.package not in tool_packages(go_mod):
        problems.append(f"has no `tool {build.package}` directive")
    return problems


def stamp(build: ModuleBuild, go_version: str, files: dict[str, bytes]) -> dict:
    """What a build's result depends on (as gobuild's stamp): the pin, the Go, the wrapper, the command."""
    digest = hashlib.sha256()
    for name, content in sorted(files.items()):
        digest.update(name.encode() + b"\0" + content + b"\0")
    env = gobuild.go_env(gobuild.GoPaths(Path("OUT")), {})
    settings = [f"{name}={env[name]}" for name in ("CGO_ENABLED", "GOFLAGS", "GOWORK")]
    return {
        "module": build.module,
        "version": build.version,
        "go": go_version,
        "wrapper_modules_sha256": digest.hexdigest(),
        "commands": [build.argv(Path("OUT")), settings],
    }


def folders(build: ModuleBuild, cache: Path) -> gobuild.Folders:
    return gobuild.Folders(cache, build.folder_version, name=build.name)


def _again(error: UserFacingError) -> UserFacingError:
    return UserFacingError(str(error).replace("`phalanx dev install`", f"`{AGAIN}`"))


def build_module(build: ModuleBuild, cache: Path, force: bool = False) -> Path:
    """Builds `build` into `<cache>/<name>-<version>/bin` unless the stamp there says it is done. Returns the
    binary. A failure ends with one line naming the module and the folder to clear."""
    try:
        return _build(build, cache, force)
    except UserFacingError as error:
        raise _again(error) from None


def _build(build: ModuleBuild, cache: Path, force: bool) -> Path:
    where = folders(build, cache)
    env = gobuild.go_env(where.go, dict(os.environ))
    files = gobuild.wrapper_files((build.name,))
    expected = stamp(build, gobuild.go_version(env), files)
    binary, stamp_file = where.bin / build.binary, where.bin / gobuild.STAMP
    if (
        not force
        and binary.is_file()
        and stamp_file.is_file()
        and json.loads(stamp_file.read_text()) == expected
    ):
        return binary
    gobuild.require_free_disk(cache, BUILD_DISK_BYTES, f"{build.module} {build.version}")
    where.home.mkdir(parents=True, exist_ok=True)
    where.log.write_text("")
    started = time.monotonic()
    for name, content in files.items():
        target = where.modules / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    cwd = where.modules / build.name
    total = len(gobuild.list_packages([build.package], None, cwd, env, where))
    gobuild.say(
        f"building {build.module} {build.version} from Go modules: up to {total} packages (log: {where.log})"
    )
    compiling = gobuild.Progress("compiling packages", total=total)

    def on_package(line: str) -> str | None:
        package = gobuild.built_package(line)
        return compiling.count(package) if package else None

    staged = where.home / f"{build.binary}.partial"
    gobuild.run_go(
        build.argv(staged), cwd, env, f"building {build.module} {build.version}", where, on_package
    )
    where.bin.mkdir(parents=True, exist_ok=True)
    stamp_file.unlink(missing_ok=True)
    staged.replace(binary)
    stamp_file.write_text(json.dumps(expected, indent=2) + "\n")
    gobuild.say(
        f"built {build.module} {build.version} in {(time.monotonic() - started) / 60:.1f} min into {binary}"
    )
    return binary


def write_module(build: ModuleBuild, cache: Path) -> None:
    """Resolves a controller's wrapper module for its pin and writes it back into the source tree."""
    where = folders(build, cache)
    env = {**gobuild.go_env(where.go, dict(os.environ)), "GOFLAGS": "-mod=mod -modcacherw"}
    where.home.mkdir(parents=True, exist_ok=True)
    where.log.write_text("")
    cwd = where.modules / build.name
    cwd.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve().parent / "gomodules" / build.name
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(source / name, cwd / name)
    edit = ["go", "mod", "edit", f"-require={build.module}@{build.version}", f"-tool={build.package}"]
    gobuild.run_go(edit, cwd, env, f"editing the {build.name} wrapper module", where)
    gobuild.run_go(["go", "mod", "tidy"], cwd, env, f"resolving {build.module}'s modules", where)
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(cwd / name, source / name)
    gobuild.say(f"wrote {source} for {build.module} {build.version}")


if __name__ == "__main__":
    from phalanx.devcluster.binaries import cache_dir

    chosen = MODULE_BUILDS[sys.argv[-1]]
    if "--write-module" in sys.argv:
        write_module(chosen, cache_dir())
    else:
        print(build_module(chosen, cache_dir(), "--force" in sys.argv))
