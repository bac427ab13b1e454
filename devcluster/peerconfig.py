"""What the peers' controllers need to run as host processes of a local cluster (pure).

The peers (JobSet, Kubeflow Trainer v2) ship their CRDs, webhook configurations and runtimes as kustomize
folders inside their Go modules; `phalanx.devcluster.peers` reads them from the module cache. Here: which files
those are, the kustomize patches their webhook components apply (a JSON patch of `add`/`replace`
operations), the webhooks turned from an in-cluster Service into a `url:` of the host process (the local
cluster routes no ClusterIP), and each controller's configuration file: no leader election, no metrics
server, its health probe and webhook server on 127.0.0.1, and its own certificate management off (it would
write the serving certificate into a Secret and patch the webhooks to reach a Service); the certificate is
made locally instead (`phalanx.devcluster.pki.ensure_serving_cert`).
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any

from phalanx.devcluster.peerbuild import MODULE_BUILDS, ModuleBuild


@dataclass(frozen=True)
class WebhookPatch:
    """One kustomize patch of a webhook component: the file and the configuration it targets."""

    path: str
    kind: str
    name: str | None = None
    """The target's name; None: every configuration of `kind`."""


@dataclass(frozen=True)
class ControllerFiles:
    """Where a peer keeps its manifests inside its module, and how its release names the webhooks."""

    build: ModuleBuild
    crds: tuple[str, ...]
    webhooks: str
    webhook_patches: tuple[WebhookPatch, ...]
    name_prefix: str
    """The release's kustomize namePrefix, applied to the webhook configurations' names."""
    runtimes: tuple[str, ...] = ()
    """Objects applied once the controller (and its webhooks) serve."""


JOBSET = ControllerFiles(
    build=MODULE_BUILDS["jobset"],
    crds=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    webhooks="config/components/webhook/manifests.yaml",
    webhook_patches=(
        WebhookPatch(
            "config/components/webhook/patches/mutating-patch.yaml",
            "MutatingWebhookConfiguration",
            "mutating-webhook-configuration",
        ),
        WebhookPatch(
            "config/components/webhook/patches/validating-patch.yaml",
            "ValidatingWebhookConfiguration",
            "validating-webhook-configuration",
        ),
    ),
    name_prefix="jobset-",
)
TRAINER = ControllerFiles(
    build=MODULE_BUILDS["kubeflow-trainer"],
    crds=(
        "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
        "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    ),
    webhooks="manifests/base/webhook/manifests.yaml",
    webhook_patches=(
        WebhookPatch("manifests/base/webhook/patch_mutating.yaml", "MutatingWebhookConfiguration"),
        WebhookPatch("manifests/base/webhook/patch_validating.yaml", "ValidatingWebhookConfiguration"),
    ),
    name_prefix="",
    runtimes=("manifests/base/runtimes/torch_distributed.yaml",),
)
CONTROLLERS: dict[str, ControllerFiles] = {"jobset": JOBSET, "kubeflow-trainer": TRAINER}
TORCH_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime Kubeflow's torch TrainJobs reference (manifests/base/runtimes)."""


def module_cache_path(module: str) -> str:
    """A module path as Go's module cache spells it: each capital letter as `!` and its lower case."""
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in module)


# ---- JSON patch ---------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"not a JSON pointer: {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """`document` with the `add` and `replace` operations of an RFC 6902 patch applied (a copy)."""
    result = copy.deepcopy(document)
    for operation in operations:
        op, parts = operation["op"], _pointer(operation["path"])
        if op not in ("add", "replace"):
            raise ValueError(f"unsupported JSON patch operation {op!r}")
        parent: Any = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last, value = parts[-1], copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op == "add":
                parent.insert(index, value)
            else:
                parent[index] = value
        else:
            if op == "replace" and last not in parent:
                raise ValueError(f"replace of a missing member: {operation['path']}")
            parent[last] = value
    return result


# ---- webhooks -----------------------------------------------------------------------------------


def patches_for(
    document: dict[str, Any], patches: list[tuple[WebhookPatch, list[dict[str, Any]]]]
) -> list[dict]:
    """The operations of every patch whose target is `document`, in order."""
    operations: list[dict[str, Any]] = []
    for patch, ops in patches:
        name = document.get("metadata", {}).get("name")
        if document.get("kind") == patch.kind and patch.name in (None, name):
            operations += ops
    return operations


def host_webhooks(
    documents: list[dict[str, Any]],
    patches: list[tuple[WebhookPatch, list[dict[str, Any]]]],
    name_prefix: str,
    port: int,
    ca_bundle: bytes,
) -> list[dict[str, Any]]:
    """The release's webhook configurations (its patches applied, its name prefix added), each webhook sent
    to `https://127.0.0.1:<port><its path>` with `ca_bundle` (PEM) instead of to its Service."""
    result = []
    for document in documents:
        if document.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        patched = json_patch(document, patches_for(document, patches))
        patched["metadata"] = {"name": name_prefix + patched["metadata"]["name"]}
        for webhook in patched.get("webhooks", []):
            service = webhook["clientConfig"].get("service") or {}
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{service.get('path', '/')}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        result.append(patched)
    return result


def plain_crd(document: dict[str, Any]) -> dict[str, Any]:
    """A CRD as served here: its conversion webhook dropped (the releases add one through a kustomize patch
    for versions they do not have yet; every CRD here has one version, which needs no conversion)."""
    crd = copy.deepcopy(document)
    crd.get("spec", {}).pop("conversion", None)
    crd.get("metadata", {}).pop("annotations", None)
    return crd


# ---- the controllers' configuration files -------------------------------------------------------


def jobset_configuration(webhook_port: int, probe_port: int, cert_dir: str) -> dict[str, Any]:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1): its internal certificate management off,
    the webhook server on 127.0.0.1 with the certificate in `cert_dir` (tls.crt, tls.key)."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": cert_dir},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
    }


def trainer_configuration(webhook_port: int, probe_port: int) -> dict[str, Any]:
    """Kubeflow Trainer's Configuration (config.trainer.kubeflow.org/v1alpha1): certificate management off.
    Its webhook server has no certDir setting: it reads controller-runtime's default,
    `$TMPDIR/k8s-webhook-server/serving-certs`, so the process gets a TMPDIR of its own."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    }
