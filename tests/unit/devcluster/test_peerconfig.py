"""The peers' controllers: their pins agree with the wrapper modules, their manifests made fit for host processes."""

from __future__ import annotations

import base64
from importlib import resources
from pathlib import Path

import pytest

from phalanx.devcluster import gobuild, peerbuild, peerconfig
from phalanx.devcluster.peerconfig import WebhookPatch
from phalanx.errors import UserFacingError


def committed(module: str, name: str) -> str:
    return resources.files("phalanx.devcluster").joinpath("gomodules", module, name).read_text()


@pytest.mark.parametrize("name", sorted(peerbuild.MODULE_BUILDS))
def test_each_wrapper_module_builds_its_pin(name: str) -> None:
    build = peerbuild.MODULE_BUILDS[name]
    assert peerbuild.mismatches(committed(name, "go.mod"), build) == [], (
        f"run `python -m phalanx.devcluster.peerbuild --write-module {name}` and commit devcluster/gomodules/{name}"
    )
    assert f"{build.module} {build.version}/go.mod h1:" in committed(name, "go.sum")


def test_the_trainer_runs_on_the_pinned_jobset() -> None:
    """Kubeflow Trainer's own go.mod requires the JobSet it creates; its wrapper resolves the pinned one."""
    jobset = peerbuild.MODULE_BUILDS["jobset"]
    assert gobuild.requirement(committed("kubeflow-trainer", "go.mod"), jobset.module) == jobset.version


def test_a_mismatched_wrapper_says_how() -> None:
    build = peerbuild.MODULE_BUILDS["jobset"]
    go_mod = "module x\n\ngo 1.26.0\n\nrequire sigs.k8s.io/jobset v0.11.0\n"
    assert peerbuild.mismatches(go_mod, build) == [
        "requires sigs.k8s.io/jobset v0.11.0, not v0.12.0",
        "has no `tool sigs.k8s.io/jobset` directive",
    ]


def test_build_command_and_cache_folder() -> None:
    build = peerbuild.MODULE_BUILDS["kubeflow-trainer"]
    assert build.argv(Path("/o/x")) == [
        "go", "build", "-v", "-trimpath", "-ldflags=-s -w", "-o=/o/x",
        "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    ]  # fmt: skip
    folders = peerbuild.folders(build, Path("/c"))
    assert folders.home == Path("/c/kubeflow-trainer-2.3.0")
    assert folders.go.root == Path("/c/go")  # shared with Kubernetes' build
    assert gobuild.Folders(Path("/c"), "1.37.2").home == Path("/c/k8s-1.37.2")


def test_a_failed_controller_build_names_the_command_to_run_again() -> None:
    line = gobuild.failure_line(
        "building sigs.k8s.io/jobset v0.12.0",
        ["go: sigs.k8s.io/jobset@v0.12.0: reading https://proxy/...: 404 Not Found"],
        gobuild.GoPaths(Path("/c/go")),
        Path("/c/jobset-0.12.0/build.log"),
    )
    said = str(peerbuild._again(UserFacingError(line)))
    assert "module sigs.k8s.io/jobset@v0.12.0 could not be fetched" in said
    assert "clear /c/go/mod" in said and "run `phalanx bench` again" in said
    assert "phalanx dev install" not in said


def test_module_cache_paths_escape_capitals() -> None:
    assert peerconfig.module_cache_path("github.com/Azure/go-ansiterm") == "github.com/!azure/go-ansiterm"
    assert peerconfig.module_cache_path("sigs.k8s.io/jobset") == "sigs.k8s.io/jobset"


def test_json_patch_adds_and_replaces() -> None:
    document = {"metadata": {"name": "a"}, "webhooks": [{"name": "w0"}, {"name": "w1"}]}
    patched = peerconfig.json_patch(
        document,
        [
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "replace", "path": "/webhooks/1", "value": {"name": "w1", "objectSelector": {}}},
            {"op": "add", "path": "/webhooks/0/objectSelector", "value": {"matchLabels": {"x": "y"}}},
        ],
    )
    assert patched == {
        "metadata": {"name": "b"},
        "webhooks": [
            {"name": "w0", "objectSelector": {"matchLabels": {"x": "y"}}},
            {"name": "w1", "objectSelector": {}},
        ],
    }
    assert document["metadata"]["name"] == "a"  # a copy
    with pytest.raises(ValueError, match="unsupported"):
        peerconfig.json_patch(document, [{"op": "remove", "path": "/metadata"}])
    with pytest.raises(ValueError, match="missing"):
        peerconfig.json_patch(document, [{"op": "replace", "path": "/spec", "value": 1}])


WEBHOOKS = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            {
                "name": "mpod.kb.io",
                "clientConfig": {
                    "service": {"name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}
                },
                "failurePolicy": "Fail",
            }
        ],
    },
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook-service"}},
]


def test_webhooks_go_to_the_host_process_with_the_release_patches() -> None:
    patch = WebhookPatch("p.yaml", "MutatingWebhookConfiguration", "mutating-webhook-configuration")
    selector = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    ops = [{"op": "add", "path": "/webhooks/0/objectSelector", "value": selector}]
    other = WebhookPatch("q.yaml", "ValidatingWebhookConfiguration")
    found = peerconfig.host_webhooks(
        WEBHOOKS, [(patch, ops), (other, [{"op": "remove", "path": "/"}])], "jobset-", 9443, b"PEM"
    )
    assert len(found) == 1  # the Service is not a webhook configuration
    config = found[0]
    assert config["metadata"] == {"name": "jobset-mutating-webhook-configuration"}
    webhook = config["webhooks"][0]
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert webhook["objectSelector"] == selector
    assert webhook["failurePolicy"] == "Fail"


def test_the_controllers_own_certificate_management_is_off() -> None:
    jobset = peerconfig.jobset_configuration(9443, 8081, "/certs")
    assert jobset["internalCertManagement"] == {"enable": False}
    assert jobset["webhook"] == {"port": 9443, "host": "127.0.0.1", "certDir": "/certs"}
    assert jobset["leaderElection"] == {"leaderElect": False}
    trainer = peerconfig.trainer_configuration(9444, 8082)
    assert trainer["certManagement"] == {"enable": False}
    assert trainer["webhook"] == {"port": 9444, "host": "127.0.0.1"}
    assert trainer["health"]["healthProbeBindAddress"] == "127.0.0.1:8082"


def test_crds_lose_their_conversion_webhook() -> None:
    crd = {
        "metadata": {"name": "x", "annotations": {"a": "b"}},
        "spec": {"conversion": {"strategy": "Webhook"}, "group": "g"},
    }
    assert peerconfig.plain_crd(crd) == {"metadata": {"name": "x"}, "spec": {"group": "g"}}
