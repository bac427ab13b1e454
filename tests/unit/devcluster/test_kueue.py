"""Kueue beside the local cluster: its build from the Go module, and what it is installed and configured with."""

from __future__ import annotations

import base64
import json
import os
from importlib import resources
from pathlib import Path

import pytest
import yaml

from phalanx.devcluster import controlplane, gobuild
from phalanx.devcluster.kueue import build, controller, manifests
from phalanx.errors import UserFacingError


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


def test_an_unbuilt_kueue_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(UserFacingError, match=r"Kueue .* is not built .*phalanx dev install"):
        controller.require_built(tmp_path)


# ---- the Configuration --------------------------------------------------------------------------


def test_the_configuration_serves_webhooks_from_the_generated_certificate() -> None:
    config = manifests.configuration(
        manifests.Ports(webhook=9001, metrics=9002, health=9003), Path("/s/pki/kueue")
    )
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["kind"] == "Configuration"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9001, "certDir": "/s/pki/kueue"}
    assert config["metrics"] == {"bindAddress": "127.0.0.1:9002"}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:9003"}
    assert config["leaderElection"] == {"leaderElect": False}


def test_the_configuration_queues_phalanx_trainingjobs_and_labelled_jobs_only() -> None:
    config = manifests.configuration(manifests.Ports(1, 2, 3), Path("/c"))
    assert config["integrations"] == {
        "frameworks": ["batch/job"],
        "externalFrameworks": ["TrainingJob.v1alpha1.phalanx.dev"],
    }
    assert config["manageJobsWithoutQueueName"] is False
    # v1beta2 has WaitForPodsReady on unless its feature gate turns it off.
    assert "waitForPodsReady" not in config
    assert config["featureGates"]["DisableWaitForPodsReady"] is True
    assert config["featureGates"]["VisibilityOnDemand"] is False


# ---- webhooks and CRDs --------------------------------------------------------------------------

CA = b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"


def webhook(name: str, group: str, resources: list[str], path: str) -> dict:
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "name": name,
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": resources}
        ],
        "sideEffects": "None",
    }


WEBHOOK_MANIFESTS = yaml.safe_dump_all([
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            webhook("mappwrapper.kb.io", "workload.codeflare.dev", ["appwrappers"], "/mutate-appwrapper"),
            webhook("mclusterqueue.kb.io", "kueue.x-k8s.io", ["clusterqueues"], "/mutate-clusterqueue"),
            webhook("mjob.kb.io", "batch", ["jobs"], "/mutate-batch-v1-job"),
            webhook("mpod.kb.io", "", ["pods"], "/mutate--v1-pod"),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            webhook("vworkload.kb.io", "kueue.x-k8s.io", ["workloads", "workloads/status"], "/validate-workload"),
            webhook("vdeployment.kb.io", "apps", ["deployments"], "/validate-apps-v1-deployment"),
        ],
    },
])  # fmt: skip


def test_each_webhook_calls_the_host_process_with_the_cluster_ca() -> None:
    mutating, validating = manifests.webhook_configurations(WEBHOOK_MANIFESTS, 9443, CA)
    assert mutating["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert validating["metadata"]["name"] == "kueue-validating-webhook-configuration"
    for each in (*mutating["webhooks"], *validating["webhooks"]):
        assert set(each["clientConfig"]) == {"url", "caBundle"}
        assert base64.b64decode(each["clientConfig"]["caBundle"]) == CA
    urls = [each["clientConfig"]["url"] for each in mutating["webhooks"]]
    assert urls == [
        "https://127.0.0.1:9443/mutate-clusterqueue",
        "https://127.0.0.1:9443/mutate-batch-v1-job",
    ]


def test_only_kueues_own_and_the_enabled_integrations_webhooks_are_kept() -> None:
    """A webhook of a disabled integration answers only "allowed"; the Pod one would put every pod through it."""
    mutating, validating = manifests.webhook_configurations(WEBHOOK_MANIFESTS, 9443, CA)
    assert [each["name"] for each in mutating["webhooks"]] == ["mclusterqueue.kb.io", "mjob.kb.io"]
    assert [each["name"] for each in validating["webhooks"]] == ["vworkload.kb.io"]
    with_pods = manifests.webhook_configurations(WEBHOOK_MANIFESTS, 9443, CA, frameworks=[])
    assert [each["name"] for each in with_pods[0]["webhooks"]] == ["mclusterqueue.kb.io"]


def test_job_webhooks_leave_the_system_namespaces_alone_as_the_release_does() -> None:
    mutating, _ = manifests.webhook_configurations(WEBHOOK_MANIFESTS, 9443, CA)
    by_name = {each["name"]: each for each in mutating["webhooks"]}
    assert "namespaceSelector" not in by_name["mclusterqueue.kb.io"]
    assert by_name["mjob.kb.io"]["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kueue-system"],
            }
        ]
    }


def test_the_webhook_configurations_to_remove_are_named_as_installed() -> None:
    assert manifests.webhook_configuration_names(WEBHOOK_MANIFESTS) == [
        ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"),
        ("ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"),
    ]


def crd(name: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"group": "kueue.x-k8s.io", "versions": [{"name": "v1beta1"}, {"name": "v1beta2"}]},
    }


def test_crds_get_the_conversion_webhooks_the_kustomization_patches_in(tmp_path: Path) -> None:
    (tmp_path / "bases").mkdir()
    (tmp_path / "patches").mkdir()
    for name in ("workloads", "resourceflavors"):
        (tmp_path / "bases" / f"kueue.x-k8s.io_{name}.yaml").write_text(
            yaml.safe_dump(crd(f"{name}.kueue.x-k8s.io"))
        )
        patch = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{name}.kueue.x-k8s.io"},
            "spec": {
                "conversion": {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {
                            "service": {"namespace": "system", "name": "webhook-service", "path": "/convert"}
                        },
                        "conversionReviewVersions": ["v1"],
                    },
                }
            },
        }
        (tmp_path / "patches" / f"webhook_in_{name}.yaml").write_text(yaml.safe_dump(patch))
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n- bases/kueue.x-k8s.io_workloads.yaml\npatches:\n- path: patches/webhook_in_workloads.yaml\n"
        "#- path: patches/webhook_in_resourceflavors.yaml\n"
    )
    flavors, workloads = manifests.crds(tmp_path, 9443, CA)
    assert "conversion" not in flavors["spec"]
    assert workloads["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {
                "url": "https://127.0.0.1:9443/convert",
                "caBundle": base64.b64encode(CA).decode(),
            },
            "conversionReviewVersions": ["v1"],
        },
    }
    assert workloads["spec"]["versions"] == crd("x")["spec"]["versions"]


# ---- the process --------------------------------------------------------------------------------


def test_the_controller_sees_its_metrics_certificate_in_an_etc_of_its_own(tmp_path: Path) -> None:
    argv = controller.private_etc_argv(
        tmp_path / "up", tmp_path / "work", ["/bin/kueue", "--config=c"], as_root=True
    )
    assert argv[:6] == ["unshare", "--mount", "--propagation", "private", "--", "sh"]
    assert argv[-4:] == [str(tmp_path / "up"), str(tmp_path / "work"), "/bin/kueue", "--config=c"]
    assert "mount -t overlay" in argv[7] and "lowerdir=/etc" in argv[7] and 'exec "$@"' in argv[7]
    unprivileged = controller.private_etc_argv(tmp_path / "up", tmp_path / "work", ["k"], as_root=False)
    assert unprivileged[:3] == ["unshare", "--user", "--map-root-user"]


def test_a_cluster_made_before_kueue_runs_without_it(tmp_path: Path) -> None:
    layout = controlplane.Layout(tmp_path)
    old = {
        "nodes": 1, "simulated_nodes": 0, "gpus_per_node": 0, "cluster_octet": 100, "etcd_port": 1,
        "etcd_peer_port": 2, "api_port": 3, "scheduler_port": 4, "controller_manager_port": 5,
    }  # fmt: skip
    layout.config_file.write_text(json.dumps(old))
    config = layout.load_config()
    assert config is not None and config.kueue is False


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


def test_dev_up_takes_kueue_on_off_or_unsaid() -> None:
    from phalanx import cli

    parser = cli.build_parser()
    assert parser.parse_args(["dev", "up", "--kueue"]).kueue is True
    assert parser.parse_args(["dev", "up", "--no-kueue"]).kueue is False
    assert parser.parse_args(["dev", "up"]).kueue is None
