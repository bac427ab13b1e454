"""Building Kubernetes from Go modules: the pin, the wrapper modules, command lines, progress and failures."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest

from phalanx.devcluster import binaries, gobuild
from phalanx.errors import UserFacingError
from phalanx.progress import SilenceReporter

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
	github.com/spf13/cobra v1.10.2
	k8s.io/api v0.0.0
	k8s.io/client-go v0.0.0 // indirect
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	github.com/example/fork => github.com/example/fork v1.2.3
)

replace k8s.io/kubelet => ./staging/src/k8s.io/kubelet // a single line counts too
"""

DEPENDENCIES_YAML = """dependencies:
  - name: "coredns-kube-up"
    version: 1.12.4
  - name: "etcd"
    version: 3.7.0
    refPaths:
    - path: cluster/gce/manifests/etcd.manifest
"""

OLD = gobuild.Release(kubernetes="1.36.3", etcd=None)


def committed(module: str, name: str) -> str:
    return resources.files("phalanx.devcluster").joinpath("gomodules", module, name).read_text()


# ---- the pin and the committed wrapper modules --------------------------------------------------


def test_the_committed_kubernetes_wrapper_builds_the_pinned_release() -> None:
    """A changed pin without `--write-modules` would build one release and commit another's go.sum."""
    go_mod = committed("kubernetes", "go.mod")
    staging = sorted(gobuild.replaces(go_mod))
    assert gobuild.wrapper_mismatches(go_mod, gobuild.NEWEST, staging) == [], (
        "run `python -m phalanx.devcluster.gobuild --write-modules` and commit devcluster/gomodules"
    )
    for module in ("k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiserver", "k8s.io/client-go"):
        assert module in staging
    assert f"k8s.io/kubernetes v{gobuild.NEWEST.kubernetes} h1:" in committed("kubernetes", "go.sum")


def test_the_committed_wrapper_keeps_every_command_it_builds() -> None:
    """`go mod tidy` keeps the requirements of the `tool` directives only."""
    tools = gobuild._directive_entries(committed("kubernetes", "go.mod"), "tool")
    assert sorted(tools) == sorted(gobuild.kubernetes_packages())


def test_the_committed_etcd_wrapper_builds_the_pinned_etcd() -> None:
    assert gobuild.requirement(committed("etcd", "go.mod"), gobuild.ETCD_MODULE) == f"v{gobuild.NEWEST.etcd}"
    assert f"{gobuild.ETCD_MODULE} v{gobuild.NEWEST.etcd} h1:" in committed("etcd", "go.sum")
    assert "etcdmain.Main(os.Args)" in committed("etcd", "main.go")


def test_the_pin_is_a_release_and_its_staging_version_follows() -> None:
    assert gobuild.release_for(gobuild.NEWEST.kubernetes) is gobuild.NEWEST
    assert gobuild.release_for("v1.36.3") == OLD
    assert OLD.staging_version == "v0.36.3"
    with pytest.raises(UserFacingError, match=r"MAJOR\.MINOR\.PATCH"):
        gobuild.release_for("1.37")


# ---- go.mod -------------------------------------------------------------------------------------


def test_staging_modules_are_those_replaced_with_the_staging_folder() -> None:
    assert gobuild.staging_modules(KUBERNETES_GO_MOD) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/kubelet"]
    assert gobuild.requirement(KUBERNETES_GO_MOD, "k8s.io/client-go") == "v0.0.0"
    assert gobuild.requirement(KUBERNETES_GO_MOD, "k8s.io/kubectl") is None


def test_a_wrapper_for_another_release_is_found_wanting_and_edited() -> None:
    staging = gobuild.staging_modules(KUBERNETES_GO_MOD)
    wrapper = (
        "module phalanx/devcluster/kubernetes\n\nrequire k8s.io/kubernetes v1.37.2\n\n"
        "require (\n\tk8s.io/cri-streaming v0.0.0 // indirect\n\tgithub.com/x/y v1.2.3 // indirect\n)\n\n"
        "replace (\n\tk8s.io/api => k8s.io/api v0.37.2\n\tk8s.io/streaming => k8s.io/streaming v0.37.2\n)\n"
    )
    problems = gobuild.wrapper_mismatches(wrapper, OLD, staging)
    assert problems == [
        "requires k8s.io/kubernetes v1.37.2, not v1.36.3",
        "replaces k8s.io/api with k8s.io/api v0.37.2, not k8s.io/api v0.36.3",
        "replaces k8s.io/client-go with None, not k8s.io/client-go v0.36.3",
        "replaces k8s.io/kubelet with None, not k8s.io/kubelet v0.36.3",
        "replaces k8s.io/streaming with k8s.io/streaming v0.37.2, not None",
    ]
    # The pin's other requirements go, a staging module the older release lacks among them.
    assert gobuild.kubernetes_edit_args(wrapper, OLD, staging) == [
        "-droprequire=k8s.io/cri-streaming",
        "-droprequire=github.com/x/y",
        "-require=k8s.io/kubernetes@v1.36.3",
        "-dropreplace=k8s.io/api",
        "-dropreplace=k8s.io/streaming",
        "-replace=k8s.io/api=k8s.io/api@v0.36.3",
        "-replace=k8s.io/client-go=k8s.io/client-go@v0.36.3",
        "-replace=k8s.io/kubelet=k8s.io/kubelet@v0.36.3",
    ]


def test_another_etcd_drops_the_pins_requirements() -> None:
    wrapper = (
        "module phalanx/devcluster/etcd\n\nrequire go.etcd.io/etcd/server/v3 v3.7.3\n\n"
        "require (\n\tgo.etcd.io/raft/v3 v3.7.0 // indirect\n)\n"
    )
    assert gobuild.etcd_edit_args(wrapper, "3.6.6") == [
        "-droprequire=go.etcd.io/raft/v3",
        "-require=go.etcd.io/etcd/server/v3@v3.6.6",
    ]


def test_etcd_comes_from_the_release_s_dependencies() -> None:
    assert gobuild.etcd_version_from_dependencies(DEPENDENCIES_YAML) == "3.7.0"
    with pytest.raises(UserFacingError, match="no etcd"):
        gobuild.etcd_version_from_dependencies("dependencies: []\n")


# ---- command lines ------------------------------------------------------------------------------


def test_the_build_follows_kubernetes_release_flags(tmp_path: Path) -> None:
    argv = gobuild.kubernetes_build_argv(gobuild.NEWEST, tmp_path / "out", "2026-10-27T12:01:04Z")
    assert argv[:5] == ["go", "build", "-v", "-trimpath", "-tags=selinux,notest,grpcnotrace"]
    ldflags = next(a for a in argv if a.startswith("-ldflags="))
    assert ldflags.startswith("-ldflags=-s -w ")
    for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        assert f"-X {package}.gitVersion=v1.37.2" in ldflags
        assert f"-X {package}.gitMinor=37" in ldflags
        assert f"-X {package}.buildDate=2026-10-27T12:01:04Z" in ldflags
    assert f"-o={tmp_path / 'out'}{os.sep}" in argv
    assert argv[-6:] == [f"k8s.io/kubernetes/cmd/{c}" for c in gobuild.KUBERNETES_COMMANDS]
    assert gobuild.etcd_build_argv(tmp_path) == [
        "go", "build", "-v", "-trimpath", "-ldflags=-s -w", f"-o={tmp_path / 'etcd'}", ".",
    ]  # fmt: skip
    listing = "-f={{.ImportPath}} {{with .Module}}{{.Version}}{{end}}"
    assert gobuild.list_deps_argv(["."], None) == ["go", "list", "-deps", listing, "."]


def test_go_keeps_its_caches_under_phalanx_s_and_builds_statically(tmp_path: Path) -> None:
    env = gobuild.go_env(gobuild.GoPaths(tmp_path / "go"), {"PATH": "/usr/bin", "GOFLAGS": "-mod=vendor"})
    assert env["PATH"] == "/usr/bin"
    assert (env["GOMODCACHE"], env["GOCACHE"], env["GOPATH"]) == (
        str(tmp_path / "go" / "mod"), str(tmp_path / "go" / "build"), str(tmp_path / "go" / "path"),
    )  # fmt: skip
    assert env["CGO_ENABLED"] == "0"
    assert env["GOFLAGS"] == "-mod=readonly -modcacherw"


# ---- progress -----------------------------------------------------------------------------------


def test_go_build_lines_are_told_apart() -> None:
    assert gobuild.built_package("k8s.io/kubernetes/pkg/kubelet") == "k8s.io/kubernetes/pkg/kubelet"
    assert gobuild.built_package("runtime/internal/sys") == "runtime/internal/sys"
    for line in (
        "go: downloading k8s.io/api v0.37.2",
        "# k8s.io/x",
        "\tx.go:1:2: undefined: y",
        "pkg/a.go:3:1: x",
    ):
        assert gobuild.built_package(line) is None
    assert gobuild.downloaded_module("go: downloading k8s.io/api v0.37.2") == "k8s.io/api v0.37.2"
    assert gobuild.downloaded_module("k8s.io/api") is None


def test_progress_speaks_once_every_interval_and_never_past_the_total() -> None:
    now = [100.0]
    progress = gobuild.Progress("compiling packages", total=3, interval=10, clock=lambda: now[0])
    lines = []
    for second, package in enumerate(["a", "b", "c", "d", "e"]):
        now[0] = 100.0 + second * 6
        lines.append(progress.count(package))
    assert lines == [
        "[phalanx install] compiling packages: 1/3, 0 min 00 s (a)",
        None,
        "[phalanx install] compiling packages: 3/3, 0 min 12 s (c)",
        None,
        "[phalanx install] compiling packages: 3/3, 0 min 24 s (e)",
    ]
    downloads = gobuild.Progress("downloading modules", clock=lambda: now[0])
    assert (
        downloads.count("k8s.io/api v0.37.2")
        == "[phalanx install] downloading modules: 1, 0 min 00 s (k8s.io/api v0.37.2)"
    )


# ---- failures -----------------------------------------------------------------------------------

PATHS = gobuild.GoPaths(Path("/cache/go"))
LOG = Path("/cache/k8s-1.37.2/build.log")


def test_an_unreachable_module_is_named_with_the_module_cache() -> None:
    output = [
        "go: downloading k8s.io/api v0.37.2",
        "k8s.io/kubernetes/cmd/kubelet imports",
        '\tk8s.io/api/core/v1: k8s.io/api@v0.37.2: Get "https://proxy.example/k8s.io/api/@v/v0.37.2.zip": '
        "dial tcp: lookup proxy.example: no such host",
    ]
    line = gobuild.failure_line("building Kubernetes 1.37.2", output, PATHS, LOG)
    assert "\n" not in line
    assert line.startswith(
        "building Kubernetes 1.37.2 failed: module k8s.io/api@v0.37.2 could not be fetched (Get "
    )
    assert "clear /cache/go/mod" in line
    assert str(LOG) in line


def test_a_module_the_proxy_refuses_is_named_from_the_json_error() -> None:
    stdout = json.dumps({
        "Path": "k8s.io/kubernetes",
        "Error": "k8s.io/kubernetes@v1.99.0: reading https://proxy.example/k8s.io/kubernetes/@v/v1.99.0.info: "
        "403 Forbidden\n\tserver response: This module version is not available.",
    })  # fmt: skip
    line = gobuild.failure_line("fetching k8s.io/kubernetes v1.99.0", gobuild._json_error(stdout), PATHS, LOG)
    assert "\n" not in line
    assert "module k8s.io/kubernetes@v1.99.0 could not be fetched (reading https://" in line
    assert "403 Forbidden server response: This module version is not available.)" in line
    assert gobuild._json_error("not json") == []


def test_a_compile_error_names_the_package_and_the_build_cache() -> None:
    output = [
        "k8s.io/kubernetes/pkg/apis/core",
        "# k8s.io/kubernetes/pkg/kubelet/cm",
        "pkg/kubelet/cm/container_manager_linux.go:52:2: undefined: cgroups.Manager",
        "pkg/kubelet/cm/qos.go:3:1: too many errors",
    ]
    line = gobuild.failure_line("building Kubernetes 1.37.2", output, PATHS, LOG)
    assert line == (
        "building Kubernetes 1.37.2 failed: package k8s.io/kubernetes/pkg/kubelet/cm did not compile "
        "(pkg/kubelet/cm/container_manager_linux.go:52:2: undefined: cgroups.Manager); clear /cache/go/build "
        f"(Go's build cache) and run `phalanx dev install` again (full output: {LOG})"
    )


def test_a_release_that_needs_a_newer_go_says_how_to_get_it() -> None:
    output = ["go: k8s.io/kubernetes@v1.38.0 requires go >= 1.27.0 (running go 1.26.8; GOTOOLCHAIN=local)"]
    line = gobuild.failure_line("building Kubernetes 1.38.0", output, PATHS, LOG)
    assert "needs Go >= 1.27.0" in line
    assert "GOTOOLCHAIN" in line


def test_an_unknown_failure_names_its_last_line_and_the_whole_cache() -> None:
    line = gobuild.failure_line("building etcd 3.7.3", ["", "signal: killed", ""], PATHS, LOG)
    assert line.startswith("building etcd 3.7.3 failed: signal: killed; clear /cache/go ")


# ---- the stamp: a second install builds nothing -------------------------------------------------


def test_the_stamp_follows_the_wrapper_modules_and_the_go_version() -> None:
    files = gobuild.wrapper_files()
    stamp = gobuild.stamp_for(gobuild.NEWEST, "go1.26.8", files, gobuild.recipe(gobuild.NEWEST))
    assert stamp == gobuild.stamp_for(gobuild.NEWEST, "go1.26.8", dict(files), gobuild.recipe(gobuild.NEWEST))
    changed_sum = {**files, "kubernetes/go.sum": files["kubernetes/go.sum"] + b"x"}
    assert stamp != gobuild.stamp_for(gobuild.NEWEST, "go1.26.8", changed_sum, gobuild.recipe(gobuild.NEWEST))
    assert stamp != gobuild.stamp_for(gobuild.NEWEST, "go1.27.3", files, gobuild.recipe(gobuild.NEWEST))
    assert stamp != gobuild.stamp_for(OLD, "go1.26.8", files, gobuild.recipe(OLD))


def test_a_second_build_with_an_equal_stamp_runs_no_go_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = gobuild.Folders(tmp_path, gobuild.NEWEST.kubernetes)
    folders.bin.mkdir(parents=True)
    for name in gobuild.BUILT:
        (folders.bin / name).write_text("#!/bin/sh\n")
    env = gobuild.go_env(folders.go, dict(os.environ))
    stamp = gobuild.stamp_for(
        gobuild.NEWEST, gobuild.go_version(env), gobuild.wrapper_files(), gobuild.recipe(gobuild.NEWEST)
    )
    (folders.bin / gobuild.STAMP).write_text(json.dumps(stamp))
    assert gobuild.build(gobuild.NEWEST.kubernetes, tmp_path) == folders.bin
    assert "already built" in capsys.readouterr().out
    assert not folders.log.exists()  # no go command ran: each writes the log
    assert not folders.modules.exists()


# ---- choosing the release -----------------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.delenv(binaries.VERSION_ENV, raising=False)
    return tmp_path


def make_binaries(directory: Path, names: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)


def test_the_default_is_the_newest_pinned_release_from_go_modules(isolated: Path) -> None:
    assert binaries.kube_version() == gobuild.NEWEST.kubernetes
    assert binaries.from_go_modules(binaries.kube_version())
    assert binaries.cached_bin_dir() == isolated / "cache" / f"k8s-{gobuild.NEWEST.kubernetes}" / "bin"


def test_a_chosen_release_has_its_own_cache_folder_and_skips_path(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binaries on PATH are of no known version: Debian's etcd 3.4 must not serve Kubernetes 1.36."""
    monkeypatch.setenv(binaries.VERSION_ENV, "v1.36.3")
    make_binaries(isolated / "path", binaries.ALL_BINARIES)
    monkeypatch.setenv("PATH", str(isolated / "path"))
    assert binaries.cached_bin_dir() == isolated / "cache" / "k8s-1.36.3" / "bin"
    with pytest.raises(UserFacingError, match=r"PHALANX_KUBE_VERSION=1\.36\.3 phalanx dev install"):
        binaries.require_binaries()
    make_binaries(binaries.cached_bin_dir(), (*binaries.ALL_BINARIES, *binaries.NODE_BINARIES))
    assert binaries.require_binaries().etcd == binaries.cached_bin_dir() / "etcd"


def test_install_of_a_chosen_release_builds_from_go_modules_and_says_which(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(binaries.VERSION_ENV, "1.37.2")
    calls: list[tuple[str, Path, bool]] = []

    def build(version: str, cache: Path, force: bool = False) -> Path:
        calls.append((version, cache, force))
        make_binaries(binaries.cached_bin_dir(), gobuild.BUILT)
        return binaries.cached_bin_dir()

    monkeypatch.setattr(gobuild, "build", build)
    found = binaries.install(real_node=True)
    assert calls == [("1.37.2", isolated / "cache", False)]
    assert found.kube_apiserver == isolated / "cache" / "k8s-1.37.2" / "bin" / "kube-apiserver"
    assert (
        "Kubernetes 1.37.2 (the newest pinned release) from Go modules, with etcd 3.7.3"
        in capsys.readouterr().out
    )


def test_a_silent_step_still_says_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    with SilenceReporter("[phalanx install] building etcd", interval=1.2) as reporter:
        reporter.say("[phalanx install] compiling packages: 3/10")
        time.sleep(3.5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[phalanx install] compiling packages: 3/10"
    assert 2 <= len(lines) - 1 <= 3, lines  # at about 1.2 s and 2.4 s (and 3.6 s on a slow machine)
    assert all(
        line.startswith("[phalanx install] building etcd: still running, 0 min 0") for line in lines[1:]
    )
