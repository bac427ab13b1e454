"""Kueue beside the local cluster: its build from the Go module."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest

from phalanx.devcluster import gobuild
from phalanx.devcluster.kueue import build


def committed(name: str) -> str:
    return resources.files("phalanx.devcluster").joinpath("gomodules", build.WRAPPER, name).read_text()


# ---- the pin and the wrapper module -------------------------------------------------------------


def test_the_committed_wrapper_builds_the_pinned_release() -> None:
    """A changed pin without `--write-module` would build one release and commit another's go.sum."""
    go_mod = committed("go.mod")
    assert gobuild.requirement(go_mod, build.MODULE) == f"v{build.VERSION}", (
        "run `python -m phalanx.devcluster.kueue.build --write-module` and commit devcluster/gomodules/kueue"
    )
    assert f"{build.MODULE} v{build.VERSION} h1:" in committed("go.sum")
    assert gobuild._directive_entries(go_mod, "tool") == [build.PACKAGE]


def test_kueue_does_not_change_what_the_kubernetes_build_depends_on() -> None:
    """The Kubernetes stamp hashes its own wrappers only: adding or bumping Kueue rebuilds no Kubernetes."""
    assert set(gobuild.wrapper_files()) == {
        f"{module}/{name}" for module in ("kubernetes", "etcd") for name in ("go.mod", "go.sum")
    } | {"etcd/main.go"}
    assert set(gobuild.wrapper_files((build.WRAPPER,))) == {"kueue/go.mod", "kueue/go.sum"}


def test_the_build_sets_the_version_as_kueues_makefile_does(tmp_path: Path) -> None:
    argv = build.build_argv("0.19.2", tmp_path, "8eab687", "2026-08-20T10:00:00Z")
    assert argv[:4] == ["go", "build", "-v", "-trimpath"]
    assert argv[4] == (
        "-ldflags=-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.2 "
        "-X sigs.k8s.io/kueue/pkg/version.GitCommit=8eab687 "
        "-X sigs.k8s.io/kueue/pkg/version.BuildDate=2026-08-20T10:00:00Z"
    )
    assert argv[5:] == [f"-o={tmp_path / 'kueue'}", "sigs.k8s.io/kueue/cmd/kueue"]
    assert build.recipe("0.19.2") != build.recipe("0.19.3")
    assert "CGO_ENABLED=0" in build.recipe("0.19.2")[-1]


def test_its_folder_is_its_own_beside_the_shared_go_caches(tmp_path: Path) -> None:
    folders = build.folders(tmp_path)
    assert folders.home == tmp_path / f"kueue-{build.VERSION}"
    assert folders.go.root == gobuild.Folders(tmp_path, "1.37.2").go.root == tmp_path / "go"


def test_a_second_build_with_an_equal_stamp_runs_no_go_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = build.folders(tmp_path)
    (folders.bin / build.MANIFESTS).mkdir(parents=True)
    (folders.bin / build.BINARY).write_text("#!/bin/sh\n")
    env = gobuild.go_env(folders.go, dict(os.environ))
    files = gobuild.wrapper_files((build.WRAPPER,))
    stamp = gobuild.build_stamp(
        {"kueue": build.VERSION}, gobuild.go_version(env), files, build.recipe(build.VERSION)
    )
    (folders.bin / gobuild.STAMP).write_text(json.dumps(stamp))
    assert build.build(tmp_path) == folders.bin
    assert f"Kueue {build.VERSION} already built" in capsys.readouterr().out
    assert not folders.log.exists()  # no go command ran: each writes the log
    assert not folders.modules.exists()


def test_a_kueue_package_that_does_not_compile_is_named_with_the_build_cache(tmp_path: Path) -> None:
    folders = build.folders(tmp_path)
    output = [
        "# sigs.k8s.io/kueue/pkg/controller/jobs/job",
        "pkg/controller/jobs/job/job_controller.go:1:1: boom",
    ]
    line = gobuild.failure_line(f"building Kueue {build.VERSION}", output, folders.go, folders.log)
    assert line.startswith(
        f"building Kueue {build.VERSION} failed: package sigs.k8s.io/kueue/pkg/controller/jobs/job did not compile"
    )
    assert f"clear {tmp_path / 'go' / 'build'}" in line


def test_the_manifests_are_copied_from_the_module_and_left_removable(tmp_path: Path) -> None:
    module = tmp_path / "module"
    (module / build.CRD_FOLDER / "bases").mkdir(parents=True)
    (module / build.CRD_FOLDER / "bases" / "a.yaml").write_text("kind: CustomResourceDefinition\n")
    (module / build.WEBHOOK_MANIFESTS).parent.mkdir(parents=True)
    (module / build.WEBHOOK_MANIFESTS).write_text("kind: MutatingWebhookConfiguration\n")
    for path in module.rglob("*"):  # as Go leaves its module cache
        path.chmod(0o555 if path.is_dir() else 0o444)
    build.copy_manifests(module, tmp_path / "out")
    assert (tmp_path / "out" / "crd" / "bases" / "a.yaml").read_text() == "kind: CustomResourceDefinition\n"
    assert (tmp_path / "out" / "webhooks.yaml").read_text() == "kind: MutatingWebhookConfiguration\n"
    assert all(os.access(path, os.W_OK) for path in (tmp_path / "out").rglob("*"))


def test_dev_install_builds_kueue_after_kubernetes_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make test` gets Kueue through `phalanx dev install --real-node`."""
    from phalanx import cli
    from phalanx.devcluster import binaries

    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path))
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(binaries, "install", lambda force, real_node: calls.append(("kubernetes", real_node)))
    monkeypatch.setattr(build, "build", lambda cache, force=False: calls.append(("kueue", cache)))
    assert cli.main(["dev", "install", "--real-node"]) == 0
    assert calls == [("kubernetes", True), ("kueue", tmp_path)]
    assert f"Kueue {build.VERSION} (the pinned release) from Go modules" in capsys.readouterr().out
