"""`phalanx dev install` builds only what is missing, in one build, and a real node's binaries on request."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from phalanx.devcluster import binaries


def executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    # 1.20.2, Debian's build: the control plane, and a real node's binaries on request, each built when missing.
    monkeypatch.setenv(binaries.VERSION_ENV, binaries.DEBIAN_VERSION)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    return binaries.cached_bin_dir()


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch, cache: Path) -> list[list[str]]:
    """Records each build and makes what it was asked for, as the script would."""
    done: list[list[str]] = []

    def build(names: list[str]) -> None:
        done.append(list(names))
        for name in ("etcd", *names):
            executable(cache / name)

    monkeypatch.setattr(binaries, "_build", build)
    return done


def test_nothing_is_built_when_everything_is_there(cache: Path, builds: list[list[str]]) -> None:
    for name in (*binaries.ALL_BINARIES, *binaries.NODE_BINARIES):
        executable(cache / name)
    binaries.install(real_node=True)
    assert builds == []


def test_control_plane_and_node_are_built_in_one_build(cache: Path, builds: list[list[str]]) -> None:
    found = binaries.install(real_node=True)
    assert builds == [[*binaries.BUILT, *binaries.NODE_BINARIES]]
    assert found.kube_apiserver == cache / "kube-apiserver"
    assert binaries.find_node_binaries() == ({name: cache / name for name in binaries.NODE_BINARIES}, [])


def test_only_the_node_binaries_when_the_control_plane_is_there(cache: Path, builds: list[list[str]]) -> None:
    for name in binaries.ALL_BINARIES:
        executable(cache / name)
    binaries.install()
    assert builds == []
    binaries.install(real_node=True)
    assert builds == [list(binaries.NODE_BINARIES)]


def test_a_kubelet_elsewhere_on_the_path_does_not_count(
    cache: Path, builds: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet of another version on PATH would skew against this control plane."""
    for name in binaries.ALL_BINARIES:
        executable(cache / name)
    executable(tmp_path / "elsewhere" / "kubelet")
    monkeypatch.setenv("PATH", f"{tmp_path / 'elsewhere'}{os.pathsep}{os.environ['PATH']}")
    assert binaries.find_node_binaries()[1] == list(binaries.NODE_BINARIES)


def test_a_missing_kubelet_names_the_install_that_builds_it_for_the_release() -> None:
    assert "PHALANX_KUBE_VERSION=1.20.2 phalanx dev install --real-node" in binaries.node_install_hint(
        "1.20.2"
    )
    hint = binaries.node_install_hint(binaries.KUBERNETES_VERSION)
    assert "run `phalanx dev install`" in hint and "--real-node" not in hint
    assert "`PHALANX_KUBE_VERSION=1.35.8 phalanx dev install`" in binaries.node_install_hint("1.35.8")
