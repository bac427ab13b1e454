"""Builds a Kubernetes release, and the etcd release it is tested with, from the Go module proxy.

The repository holds only two wrapper modules (devcluster/gomodules/): `kubernetes` requires
`k8s.io/kubernetes` and maps each of its staging modules (`k8s.io/api`, ... which its own go.mod replaces with
`./staging/src/...`) to the published `v0.<minor>.<patch>`; `etcd` requires `go.etcd.io/etcd/server/v3` and
calls its `etcdmain`, as etcd's own main package does. Everything else, the module cache, Go's build cache and
the binaries, lives under the cache folder (`binaries.cache_dir()`): `go/` is shared by every version,
`k8s-<version>/` holds one version's binaries, its resolved wrapper modules and the last build's log.

The flags follow Kubernetes' own release build (hack/lib/golang.sh, hack/lib/version.sh): `-trimpath`,
`-s -w`, the tags `selinux,notest,grpcnotrace`, `CGO_ENABLED=0`, and the version variables set through
`-X`, so that `kubectl version` and the apiserver's /version report the release. Their kubelet is the one
binary they build with cgo; here it is static like the rest, as the Debian-built 1.20.2 always was.

Kueue's controller is built with the same steps and caches from a third wrapper module (devcluster/kueue/build.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from phalanx.errors import UserFacingError
from phalanx.progress import SilenceReporter


@dataclass(frozen=True)
class Release:
    kubernetes: str
    """The Kubernetes release, `MAJOR.MINOR.PATCH` without the `v`."""
    etcd: str | None
    """The etcd release; None takes the one the Kubernetes release's build/dependencies.yaml names."""

    @property
    def staging_version(self) -> str:
        """The version its staging modules are published under: `1.37.2` -> `v0.37.2`."""
        _, minor, patch = parse_version(self.kubernetes)
        return f"v0.{minor}.{patch}"


NEWEST: Release = Release(kubernetes="1.37.2", etcd="3.7.3")
"""The pin: the newest stable release the module proxy serves, and the newest patch of the etcd minor it tests
with (3.7.0 in its build/dependencies.yaml). Changing this line is all a new release takes: `phalanx dev
install` resolves the wrapper modules for it; `python -m phalanx.devcluster.gobuild --write-modules` writes
them back into devcluster/gomodules, to be committed (a unit test says when they disagree)."""

KUBERNETES_COMMANDS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
)
BUILT = (*KUBERNETES_COMMANDS, "etcd")
BUILD_TAGS = "selinux,notest,grpcnotrace"
"""Kubernetes' release tags: SELinux support, no test hooks, gRPC without x/net/trace."""
KUBERNETES_MODULE = "k8s.io/kubernetes"
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
PROGRESS_SECONDS = 10.0
"""How often the build reports progress: it compiles about 2,800 packages."""
BUILD_DISK_BYTES = 7 * 1024**3
"""Free disk the first build needs: about 1 GB of modules, the build cache and the binaries (measured; see
the README): 1.0 GB of modules, 4.2 GB of build cache, 0.4 GB of binaries, with room to spare."""
STAMP = ".phalanx-build.json"
"""Written into the bin folder after a build: what was built from what. Equal stamp, nothing to build."""
PREFIX = "[phalanx install]"


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", text.strip())
    if match is None:
        raise UserFacingError(f"not a Kubernetes release: {text!r} (expected MAJOR.MINOR.PATCH, e.g. 1.37.2)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def release_for(version: str) -> Release:
    """The pinned release for its own version; any other one takes the etcd its dependencies.yaml names."""
    normalized = ".".join(str(part) for part in parse_version(version))
    return NEWEST if normalized == NEWEST.kubernetes else Release(kubernetes=normalized, etcd=None)


# ---- go.mod -------------------------------------------------------------------------------------


def _directive_entries(go_mod: str, directive: str) -> list[str]:
    """The entries of one directive, written either as single lines or as a block, comments dropped."""
    entries: list[str] = []
    in_block = False
    for raw in go_mod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if in_block:
            if line == ")":
                in_block = False
            elif line:
                entries.append(line)
        elif line == f"{directive} (":
            in_block = True
        elif line.startswith(f"{directive} "):
            entries.append(line[len(directive) + 1 :].strip())
    return entries


def replaces(go_mod: str) -> dict[str, str]:
    """`replace` directives: module (without version) -> its target (`path` or `path version`)."""
    result: dict[str, str] = {}
    for entry in _directive_entries(go_mod, "replace"):
        old, _, new = entry.partition("=>")
        result[old.split()[0]] = " ".join(new.split())
    return result


def requirement(go_mod: str, module: str) -> str | None:
    for entry in _directive_entries(go_mod, "require"):
        parts = entry.split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    return None


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The modules that k8s.io/kubernetes' own go.mod takes from its staging folder."""
    return sorted(m for m, target in replaces(kubernetes_go_mod).items() if target.startswith("./staging/"))


def expected_replaces(release: Release, staging: Iterable[str]) -> dict[str, str]:
    return {module: f"{module} {release.staging_version}" for module in staging}


def wrapper_mismatches(wrapper_go_mod: str, release: Release, staging: Iterable[str]) -> list[str]:
    """How the Kubernetes wrapper module differs from what `release` needs; empty when it is ready."""
    problems: list[str] = []
    required = requirement(wrapper_go_mod, KUBERNETES_MODULE)
    if required != f"v{release.kubernetes}":
        problems.append(f"requires {KUBERNETES_MODULE} {required}, not v{release.kubernetes}")
    have, want = replaces(wrapper_go_mod), expected_replaces(release, staging)
    for module in sorted(set(have) | set(want)):
        if have.get(module) != want.get(module):
            problems.append(f"replaces {module} with {have.get(module)}, not {want.get(module)}")
    return problems


def required_modules(go_mod: str) -> list[str]:
    """Every module a go.mod requires (direct and indirect), without versions."""
    return [parts[0] for entry in _directive_entries(go_mod, "require") if len(parts := entry.split()) >= 2]


def drop_requirements_but(wrapper_go_mod: str, kept: str) -> list[str]:
    """`go mod edit` arguments that drop every requirement of a wrapper module but `kept`."""
    return [f"-droprequire={module}" for module in required_modules(wrapper_go_mod) if module != kept]


def kubernetes_edit_args(wrapper_go_mod: str, release: Release, staging: Iterable[str]) -> list[str]:
    """`go mod edit` arguments that make the wrapper module build `release`. Every requirement but
    k8s.io/kubernetes goes: the pin's would hold another release's dependencies at their versions (and its
    staging modules at none), so `go mod tidy` resolves them again from the release's own go.mod."""
    args = drop_requirements_but(wrapper_go_mod, KUBERNETES_MODULE)
    args.append(f"-require={KUBERNETES_MODULE}@v{release.kubernetes}")
    args += [f"-dropreplace={module}" for module in sorted(replaces(wrapper_go_mod))]
    args += [f"-replace={module}={module}@{release.staging_version}" for module in sorted(staging)]
    return args


def pin_edit_args(wrapper_go_mod: str, module: str, version: str) -> list[str]:
    """`go mod edit` arguments that make a wrapper module build `module` at `version` (`v` included): as for
    Kubernetes, the pin's other requirements go (the pin's raft would not build with an older etcd server)."""
    return [*drop_requirements_but(wrapper_go_mod, module), f"-require={module}@{version}"]


def etcd_edit_args(wrapper_go_mod: str, etcd: str) -> list[str]:
    """`go mod edit` arguments that make the etcd wrapper module build etcd `etcd`."""
    return pin_edit_args(wrapper_go_mod, ETCD_MODULE, f"v{etcd}")


def etcd_version_from_dependencies(dependencies_yaml: str) -> str:
    """The etcd version in Kubernetes' build/dependencies.yaml: the one its CI tests against."""
    for dependency in yaml.safe_load(dependencies_yaml).get("dependencies", []):
        if dependency.get("name") == "etcd":
            return str(dependency["version"]).lstrip("v")
    raise UserFacingError("build/dependencies.yaml of this Kubernetes release names no etcd version")


# ---- command lines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoPaths:
    """Go's caches, all under Phalanx's cache folder and shared by every version built."""

    root: Path

    @property
    def modules(self) -> Path:
        return self.root / "mod"

    @property
    def build_cache(self) -> Path:
        return self.root / "build"

    @property
    def gopath(self) -> Path:
        return self.root / "path"


def go_env(paths: GoPaths, base: dict[str, str]) -> dict[str, str]:
    """The build's environment: the caches under Phalanx's, static binaries, go.mod never rewritten by a
    build, and a module cache that `rm -rf` can clear (Go makes it read-only otherwise)."""
    return {
        **base,
        "GOMODCACHE": str(paths.modules),
        "GOCACHE": str(paths.build_cache),
        "GOPATH": str(paths.gopath),
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=readonly -modcacherw",
        "GOWORK": "off",
    }


def version_ldflags(kubernetes: str, build_date: str) -> str:
    """`-X` flags as hack/lib/version.sh sets them, for both packages that report the version."""
    _, minor, _ = parse_version(kubernetes)
    values = {
        "gitVersion": f"v{kubernetes}",
        "gitMajor": "1",
        "gitMinor": str(minor),
        "buildDate": build_date,
    }
    return " ".join(
        f"-X {package}.{name}={value}"
        for name, value in values.items()
        for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
    )


def kubernetes_packages() -> list[str]:
    return [f"{KUBERNETES_MODULE}/cmd/{command}" for command in KUBERNETES_COMMANDS]


def kubernetes_build_argv(release: Release, out_dir: Path, build_date: str) -> list[str]:
    return [
        "go", "build", "-v", "-trimpath", f"-tags={BUILD_TAGS}",
        f"-ldflags=-s -w {version_ldflags(release.kubernetes, build_date)}",
        f"-o={out_dir}{os.sep}", *kubernetes_packages(),
    ]  # fmt: skip


def etcd_build_argv(out_dir: Path) -> list[str]:
    return ["go", "build", "-v", "-trimpath", "-ldflags=-s -w", f"-o={out_dir / 'etcd'}", "."]


def list_deps_argv(packages: list[str], tags: str | None) -> list[str]:
    """Every package a build compiles (the standard library's too: a fresh build cache compiles it), one line
    each with its module's version: a package that two builds take at different versions compiles twice."""
    listing = "-f={{.ImportPath}} {{with .Module}}{{.Version}}{{end}}"
    return ["go", "list", "-deps", listing, *([f"-tags={tags}"] if tags else []), *packages]


# ---- progress and failures ----------------------------------------------------------------------


def built_package(line: str) -> str | None:
    """The package a line of `go build -v` names, if it names one."""
    text = line.strip()
    if not text or text != line.rstrip("\n") or text.startswith(("go:", "#")) or " " in text or ":" in text:
        return None
    return text


def downloaded_module(line: str) -> str | None:
    match = re.match(r"go: downloading (\S+ \S+)$", line.strip())
    return match.group(1) if match else None


@dataclass
class Progress:
    """Counts what a step reports line by line and says so at most every `interval` seconds."""

    label: str
    total: int | None = None
    interval: float = PROGRESS_SECONDS
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    started: float = field(default=math.nan)
    _last_report: float = -math.inf

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def count(self, item: str) -> str | None:
        """Counts one item; returns the line to print when one is due."""
        self.done += 1
        now = self.clock()
        if now - self._last_report < self.interval:
            return None
        self._last_report = now
        return self.line(item)

    def line(self, item: str = "") -> str:
        shown = min(self.done, self.total) if self.total else self.done
        amount = f"{shown}/{self.total}" if self.total else f"{shown}"
        elapsed = int(self.clock() - self.started)
        last = f" ({item})" if item else ""
        return f"{PREFIX} {self.label}: {amount}, {elapsed // 60} min {elapsed % 60:02d} s{last}"


_MODULE_ERROR = re.compile(r"([\w.~-]+(?:/[\w.~+-]+)+)@(v[\w.+-]+): (.+)")
_GO_VERSION_ERROR = re.compile(r"requires go >= ?([\d.]+)")
_PACKAGE_HEADER = re.compile(r"^# (\S+)")


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure_line(what: str, output: list[str], paths: GoPaths, log: Path) -> str:
    """The one line a failed `go` command ends `phalanx dev install` with: which module or package, and what
    to clear before trying again."""
    for line in output:
        match = _GO_VERSION_ERROR.search(line)
        if match:
            return (
                f"{what} failed: it needs Go >= {match.group(1)}, newer than this machine's; set GOTOOLCHAIN "
                f"to a Go release the module proxy serves (e.g. GOTOOLCHAIN=go{match.group(1)}.0 or newer) "
                f"and run `phalanx dev install` again (full output: {log})"
            )
    for line in output:
        match = _MODULE_ERROR.search(line)
        if match and not line.startswith("go: downloading"):
            module, version, reason = match.groups()
            return (
                f"{what} failed: module {module}@{version} could not be fetched ({_clip(reason)}); check the "
                f"network and GOPROXY, or if its download is broken clear {paths.modules}, then run "
                f"`phalanx dev install` again (full output: {log})"
            )
    for index, line in enumerate(output):
        match = _PACKAGE_HEADER.match(line)
        if match:
            first_error = next((e for e in output[index + 1 :] if e.strip()), "")
            return (
                f"{what} failed: package {match.group(1)} did not compile ({_clip(first_error)}); clear "
                f"{paths.build_cache} (Go's build cache) and run `phalanx dev install` again (full output: {log})"
            )
    for line in output:
        match = re.search(r"(?:package|module providing package) (\S+)", line)
        if match:
            return (
                f"{what} failed: package {match.group(1).strip(':')} could not be found ({_clip(line)}); clear "
                f"{paths.modules} and run `phalanx dev install` again (full output: {log})"
            )
    last = next((line for line in reversed(output) if line.strip()), "no output")
    return f"{what} failed: {_clip(last)}; clear {paths.root} and run `phalanx dev install` again (full output: {log})"


# ---- the stamp ----------------------------------------------------------------------------------


KUBERNETES_WRAPPERS = ("kubernetes", "etcd")
"""The wrapper modules under gomodules/ that the Kubernetes build takes (others build other programs)."""


def wrapper_files(modules: Iterable[str] = KUBERNETES_WRAPPERS) -> dict[str, bytes]:
    """The committed wrapper modules, by path under gomodules/."""
    root = resources.files("phalanx.devcluster").joinpath("gomodules")
    files: dict[str, bytes] = {}
    for module in modules:
        for entry in sorted(root.joinpath(module).iterdir(), key=lambda e: e.name):
            if entry.is_file() and (entry.name.startswith("go.") or entry.name.endswith(".go")):
                files[f"{module}/{entry.name}"] = entry.read_bytes()
    return files


def build_stamp(
    versions: dict[str, str], go_version: str, files: dict[str, bytes], recipe: list[list[str]]
) -> dict:
    """What a build's result depends on: the versions built, the Go that built them, the wrapper modules
    (go.sum pins every module's content) and the command lines."""
    digest = hashlib.sha256()
    for name, content in sorted(files.items()):
        digest.update(name.encode() + b"\0" + content + b"\0")
    return {**versions, "go": go_version, "wrapper_modules_sha256": digest.hexdigest(), "commands": recipe}


def stamp_for(release: Release, go_version: str, files: dict[str, bytes], recipe: list[list[str]]) -> dict:
    versions = {"kubernetes": release.kubernetes, "etcd": release.etcd or "build/dependencies.yaml"}
    return build_stamp(versions, go_version, files, recipe)


RECIPE_OUT = Path("OUT")
"""The output folder a recipe names: the folders do not change what is built."""


def recipe_settings() -> list[str]:
    env = go_env(GoPaths(RECIPE_OUT), {})
    return [f"{name}={env[name]}" for name in ("CGO_ENABLED", "GOFLAGS", "GOWORK")]


def recipe(release: Release) -> list[list[str]]:
    """The build's command lines with the folders left out."""
    return [
        kubernetes_build_argv(release, RECIPE_OUT, "DATE"),
        etcd_build_argv(RECIPE_OUT),
        recipe_settings(),
    ]


# ---- the build ----------------------------------------------------------------------------------


def require_free_disk(cache: Path, needed: int, what: str) -> None:
    """Refuse a build into `cache` (created if missing) that would not fit on its disk, before it starts."""
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if free < needed:
        raise UserFacingError(
            f"not enough free disk in {cache} to build {what}: {free / 1024**3:.1f} GiB free, "
            f"{needed / 1024**3:.0f} GiB needed (set PHALANX_CACHE_DIR to a larger disk)"
        )


def say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


@dataclass(frozen=True)
class Folders:
    cache: Path
    version: str
    name: str = "k8s"
    """What is built: `<name>-<version>/` is its folder in the cache."""

    @property
    def go(self) -> GoPaths:
        return GoPaths(self.cache / "go")

    @property
    def home(self) -> Path:
        return self.cache / f"{self.name}-{self.version}"

    @property
    def bin(self) -> Path:
        return self.home / "bin"

    @property
    def modules(self) -> Path:
        return self.home / "modules"

    @property
    def log(self) -> Path:
        return self.home / "build.log"


def run_go(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    what: str,
    folders: Folders,
    on_line: Callable[[str], str | None] = lambda _: None,
) -> str:
    """Runs one go command; its stderr goes to the log and, line by line, to `on_line`, whose answers are
    printed; while it prints nothing for `SILENCE_SECONDS` (a long link, a slow download), a line says it still
    runs. Returns stdout. A failure stops with one line."""
    with (
        folders.log.open("a") as log,
        tempfile.TemporaryFile("w+") as stdout_file,
        SilenceReporter(f"{PREFIX} {what}") as reporter,
    ):
        log.write(f"$ (cd {cwd} && {' '.join(argv)})\n")
        log.flush()
        # stdout to a file: `go list` prints more than a pipe holds while stderr is being read.
        with subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=stdout_file, stderr=subprocess.PIPE, text=True
        ) as process:
            assert process.stderr is not None
            lines: list[str] = []
            for line in process.stderr:
                log.write(line)
                lines.append(line.rstrip("\n"))
                report = on_line(line.rstrip("\n"))
                if report:
                    reporter.say(report)
            code = process.wait()
        stdout_file.seek(0)
        stdout = stdout_file.read()
    if code != 0:
        raise UserFacingError(failure_line(what, lines + _json_error(stdout), folders.go, folders.log))
    return stdout


def _json_error(stdout: str) -> list[str]:
    """`go mod download -json` reports its error inside the JSON on stdout."""
    try:
        error = json.loads(stdout).get("Error", "")
    except (ValueError, AttributeError):
        return []
    return [" ".join(str(error).split())] if error else []


def go_version(env: dict[str, str]) -> str:
    if shutil.which("go", path=env.get("PATH")) is None:
        raise UserFacingError(
            "building Kubernetes and Kueue from Go modules needs the go command (Debian: `apt-get install "
            "golang-go`; the releases need Go 1.26 or newer)"
        )
    result = subprocess.run(["go", "env", "GOVERSION"], env=env, capture_output=True, text=True, check=False)
    return result.stdout.strip() or "unknown"


def copy_wrappers(folders: Folders, modules: Iterable[str] = KUBERNETES_WRAPPERS) -> None:
    """Copies the committed wrapper modules into the version's folder, where the build may resolve them."""
    for name, content in wrapper_files(modules).items():
        target = folders.modules / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)


def download_counter() -> Callable[[str], str | None]:
    """An `on_line` that counts the modules a go command downloads."""
    downloads = Progress("downloading modules")

    def on_download(line: str) -> str | None:
        module = downloaded_module(line)
        return downloads.count(module) if module else None

    return on_download


def package_counter(progress: Progress) -> Callable[[str], str | None]:
    """An `on_line` that counts the packages `go build -v` compiles."""

    def on_package(line: str) -> str | None:
        package = built_package(line)
        return progress.count(package) if package else None

    return on_package


def fetch_module(module: str, version: str, cwd: Path, env: dict[str, str], folders: Folders) -> dict:
    """Downloads one module (`version` with its `v`) into the module cache; returns `go mod download -json`'s
    answer (Dir, GoMod, Info, Origin)."""
    say(f"fetching {module} {version} from the Go module proxy")
    what = f"fetching {module} {version}"
    info = json.loads(
        run_go(["go", "mod", "download", "-json", f"{module}@{version}"], cwd, env, what, folders)
    )
    if info.get("Error"):
        raise UserFacingError(
            f"{what} failed: {_clip(info['Error'])}; is it a release the module proxy serves? "
            f"(full output: {folders.log})"
        )
    return info


def tidy(cwd: Path, env: dict[str, str], what: str, folders: Folders) -> None:
    """`go mod tidy` in a wrapper module, the one step allowed to rewrite its go.mod."""
    tidy_env = {**env, "GOFLAGS": "-mod=mod -modcacherw"}
    run_go(["go", "mod", "tidy"], cwd, tidy_env, what, folders, download_counter())


def _resolve_modules(release: Release, folders: Folders, env: dict[str, str]) -> tuple[str, str]:
    """Makes the wrapper modules in the cache build `release` (the committed ones already do for the pin).
    Returns the etcd version and the release's build date."""
    kube_dir, etcd_dir = folders.modules / "kubernetes", folders.modules / "etcd"
    info = fetch_module(KUBERNETES_MODULE, f"v{release.kubernetes}", kube_dir, env, folders)
    staging = staging_modules(Path(info["GoMod"]).read_text())
    wrapper = (kube_dir / "go.mod").read_text()
    if wrapper_mismatches(wrapper, release, staging):
        say(
            f"Kubernetes {release.kubernetes} is not the pinned {NEWEST.kubernetes}: resolving its "
            f"{len(staging)} staging modules at {release.staging_version} (go mod tidy)"
        )
        edit = ["go", "mod", "edit", *kubernetes_edit_args(wrapper, release, staging)]
        run_go(edit, kube_dir, env, "editing the Kubernetes wrapper module", folders)
        tidy(kube_dir, env, "resolving Kubernetes' modules", folders)
    etcd = release.etcd or etcd_version_from_dependencies(
        (Path(info["Dir"]) / "build" / "dependencies.yaml").read_text()
    )
    if requirement((etcd_dir / "go.mod").read_text(), ETCD_MODULE) != f"v{etcd}":
        say(f"etcd {etcd} is not the pinned {NEWEST.etcd}: resolving its modules (go mod tidy)")
        edit = ["go", "mod", "edit", *etcd_edit_args((etcd_dir / "go.mod").read_text(), etcd)]
        run_go(edit, etcd_dir, env, "editing the etcd wrapper module", folders)
        tidy(etcd_dir, env, "resolving etcd's modules", folders)
    return etcd, release_time(info)


def release_time(info: dict) -> str:
    """When the module's version was published (`go mod download -json`'s Info file): its build date."""
    return str(json.loads(Path(info["Info"]).read_text()).get("Time", "1970-01-01T00:00:00Z"))


def list_packages(
    packages: list[str], tags: str | None, cwd: Path, env: dict[str, str], folders: Folders
) -> set[str]:
    """Every package a build of `packages` compiles (see list_deps_argv); downloads what is missing."""
    listed = run_go(
        list_deps_argv(packages, tags), cwd, env, "listing the packages to build", folders, download_counter()
    )
    return {line.strip() for line in listed.splitlines() if line.strip()}


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def already_built(bin_dir: Path, names: Iterable[str], expected: dict) -> bool:
    """Whether every file is there and the stamp says they were built as `expected` would build them."""
    stamp_file = bin_dir / STAMP
    return (
        all((bin_dir / name).exists() for name in names)
        and stamp_file.is_file()
        and json.loads(stamp_file.read_text()) == expected
    )


def start_build(folders: Folders) -> float:
    """Makes the version's folder and starts a fresh log; returns the clock a build is timed from."""
    folders.home.mkdir(parents=True, exist_ok=True)
    folders.log.write_text("")
    return time.monotonic()


def staging_folder(folders: Folders) -> Path:
    """An empty folder beside bin/ that a build writes into: bin/ only ever holds a complete build."""
    staged = folders.home / "bin.partial"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    return staged


def install_staged(staged: Path, bin_dir: Path, names: Iterable[str], stamp: dict) -> None:
    """Moves a finished build into bin/, the stamp last (an interrupted move leaves no stamp: built again)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    stamp_file = bin_dir / STAMP
    stamp_file.unlink(missing_ok=True)
    for name in names:
        target = bin_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        (staged / name).replace(target)
    shutil.rmtree(staged)
    stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")


def build(version: str, cache: Path, force: bool = False) -> Path:
    """Builds `version` and its etcd into `<cache>/k8s-<version>/bin` unless the stamp there says it is done.
    Returns the bin folder."""
    release = release_for(version)
    folders = Folders(cache, release.kubernetes)
    env = go_env(folders.go, dict(os.environ))
    expected = stamp_for(release, go_version(env), wrapper_files(), recipe(release))
    if not force and already_built(folders.bin, BUILT, expected):
        say(f"Kubernetes {release.kubernetes} already built in {folders.bin}: nothing to do")
        return folders.bin
    require_free_disk(cache, BUILD_DISK_BYTES, f"Kubernetes {release.kubernetes}")
    started = start_build(folders)
    copy_wrappers(folders)
    etcd, build_date = _resolve_modules(release, folders, env)
    say(f"building Kubernetes {release.kubernetes} and etcd {etcd} from Go modules (log: {folders.log})")
    kube_dir, etcd_dir = folders.modules / "kubernetes", folders.modules / "etcd"
    # Both builds share the standard library and many modules: count each package once.
    total = len(
        list_packages(kubernetes_packages(), BUILD_TAGS, kube_dir, env, folders)
        | list_packages(["."], None, etcd_dir, env, folders)
    )
    say(
        f"compiling up to {total} packages (about 9 minutes on 2 cores the first time; cached ones are skipped)"
    )
    on_package = package_counter(Progress("compiling packages", total=total))
    staged = staging_folder(folders)
    run_go(
        kubernetes_build_argv(release, staged, build_date),
        kube_dir,
        env,
        f"building Kubernetes {release.kubernetes}",
        folders,
        on_package,
    )
    run_go(etcd_build_argv(staged), etcd_dir, env, f"building etcd {etcd}", folders, on_package)
    install_staged(staged, folders.bin, BUILT, expected)
    minutes = (time.monotonic() - started) / 60
    say(
        f"built Kubernetes {release.kubernetes} and etcd {etcd} in {minutes:.1f} min into {folders.bin} "
        f"({size(folders.bin) / 1024**2:.0f} MiB; Go's caches in {folders.go.root}: "
        f"{size(folders.go.root) / 1024**3:.1f} GiB)"
    )
    return folders.bin


def write_modules(cache: Path) -> None:
    """Resolves the wrapper modules for the pin and writes them back into the source tree, to be committed."""
    folders = Folders(cache, NEWEST.kubernetes)
    env = go_env(folders.go, dict(os.environ))
    start_build(folders)
    copy_wrappers(folders)
    _resolve_modules(NEWEST, folders, env)
    source = write_back(folders, KUBERNETES_WRAPPERS)
    say(f"wrote {source}/kubernetes and {source}/etcd for Kubernetes {NEWEST.kubernetes}, etcd {NEWEST.etcd}")


def write_back(folders: Folders, modules: Iterable[str]) -> Path:
    """Copies resolved wrapper modules from the cache back into the source tree; returns gomodules/."""
    source = Path(__file__).resolve().parent / "gomodules"
    for module in modules:
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(folders.modules / module / name, source / module / name)
    return source


if __name__ == "__main__":
    from phalanx.devcluster.binaries import cache_dir

    if "--write-modules" in sys.argv:
        write_modules(cache_dir())
    else:
        print(
            build(sys.argv[1] if len(sys.argv) > 1 else NEWEST.kubernetes, cache_dir(), "--force" in sys.argv)
        )
