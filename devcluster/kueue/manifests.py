"""What Kueue is installed with on the local cluster, as pure functions of its module's manifests.

Kueue's release runs its controller as a Deployment behind a Service and makes its own webhook certificate.
Here the controller is a host process: every webhook (admission and CRD conversion) is a `url:` to it at
https://127.0.0.1:<port>, its serving certificate is signed by the cluster's CA (the caBundle), and its
Configuration turns the internal certificate management off and points it at that certificate.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

GROUP = "kueue.x-k8s.io"
NAMESPACE = "kueue-system"
"""Kueue's namespace (the release's): its Events and the namespaces its job integrations leave alone."""
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
FRAMEWORKS = ("batch/job",)
"""Kueue's built-in job integrations that run here: batch/v1 Jobs (only those labelled with a queue)."""
EXTERNAL_FRAMEWORKS = ("TrainingJob.v1alpha1.phalanx.dev",)
"""Kinds whose controller is not Kueue's but that Kueue queues: Phalanx's operator makes their Workloads."""
FRAMEWORK_RESOURCES = {"batch/job": ("batch", "jobs")}
"""The API group and resource a built-in integration's webhooks intercept."""
NAME_PREFIX = "kueue-"
"""The release's kustomization prefixes every object's name with it."""
SYSTEM_NAMESPACES = ("kube-system", NAMESPACE)
"""Namespaces whose objects the job webhooks never see (the release's kustomization excludes them)."""
FEATURE_GATES = {
    "DisableWaitForPodsReady": True,
    "VisibilityOnDemand": False,
}
"""WaitForPodsReady is on unless disabled since v1beta2; the on-demand visibility API would be an aggregated
API server of its own (another port, an APIService), which nothing here uses."""


@dataclass(frozen=True)
class Ports:
    webhook: int
    metrics: int
    health: int


def configuration(ports: Ports, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration for the local cluster."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "leaderElection": {"leaderElect": False},
        "featureGates": dict(FEATURE_GATES),
        "integrations": {"frameworks": list(FRAMEWORKS), "externalFrameworks": list(EXTERNAL_FRAMEWORKS)},
    }


def client_config(webhook_port: int, path: str, ca_bundle: bytes) -> dict[str, Any]:
    """A webhook's clientConfig that reaches the host process instead of the release's Service."""
    return {
        "url": f"https://127.0.0.1:{webhook_port}{path}",
        "caBundle": base64.b64encode(ca_bundle).decode(),
    }


def _intercepts(webhook: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (group, resource.split("/")[0])
        for rule in webhook.get("rules", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
    }


def kept(webhook: dict[str, Any], frameworks: Iterable[str]) -> bool:
    """Kueue's own kinds' webhooks, and those of the integrations that run. The others would only answer
    "allowed" (Kueue serves a no-op for a disabled integration), and those for Pods, Deployments and
    StatefulSets would put every such object of the cluster through Kueue."""
    enabled = {FRAMEWORK_RESOURCES[name] for name in frameworks}
    intercepted = _intercepts(webhook)
    return bool(intercepted) and all(
        group == GROUP or (group, resource) in enabled for group, resource in intercepted
    )


def webhook_configurations(
    manifests_yaml: str, webhook_port: int, ca_bundle: bytes, frameworks: Iterable[str] = FRAMEWORKS
) -> list[dict[str, Any]]:
    """The module's config/components/webhook/manifests.yaml as the local cluster's webhook configurations."""
    frameworks = list(frameworks)
    result = []
    for document in yaml.safe_load_all(manifests_yaml):
        if not document:
            continue
        configuration = copy.deepcopy(document)
        configuration["metadata"]["name"] = NAME_PREFIX + document["metadata"]["name"]
        webhooks = []
        for webhook in configuration.get("webhooks", []):
            if not kept(webhook, frameworks):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = client_config(webhook_port, path, ca_bundle)
            if not all(group == GROUP for group, _ in _intercepts(webhook)):
                webhook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(SYSTEM_NAMESPACES),
                        }
                    ]
                }
            webhooks.append(webhook)
        configuration["webhooks"] = webhooks
        result.append(configuration)
    return result


def webhook_configuration_names(manifests_yaml: str) -> list[tuple[str, str]]:
    """(kind, name) of each webhook configuration the cluster gets, to remove them when Kueue stops."""
    return [
        (document["kind"], NAME_PREFIX + document["metadata"]["name"])
        for document in yaml.safe_load_all(manifests_yaml)
        if document
    ]


def conversion_patches(kustomization_yaml: str) -> list[str]:
    """The patch files the CRD kustomization applies (commented-out ones are not loaded by YAML)."""
    return [
        entry["path"] for entry in yaml.safe_load(kustomization_yaml).get("patches", []) if "path" in entry
    ]


def with_conversion(
    crd: dict[str, Any], patch: dict[str, Any] | None, webhook_port: int, ca_bundle: bytes
) -> dict[str, Any]:
    """A CRD with its conversion webhook (from the release's patch for it) pointed at the host process."""
    result = copy.deepcopy(crd)
    if patch is None:
        return result
    conversion = copy.deepcopy(patch["spec"]["conversion"])
    service = conversion["webhook"]["clientConfig"]["service"]
    conversion["webhook"]["clientConfig"] = client_config(webhook_port, service.get("path", "/"), ca_bundle)
    result["spec"]["conversion"] = conversion
    return result


def crds(crd_folder: Path, webhook_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's CRDs from the module's config/components/crd: `bases/` with the kustomization's conversion
    patches applied."""
    patches: dict[str, dict[str, Any]] = {}
    for relative in conversion_patches((crd_folder / "kustomization.yaml").read_text()):
        patch = yaml.safe_load((crd_folder / relative).read_text())
        if patch.get("spec", {}).get("conversion"):
            patches[patch["metadata"]["name"]] = patch
    result = []
    for path in sorted((crd_folder / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        result.append(with_conversion(crd, patches.get(crd["metadata"]["name"]), webhook_port, ca_bundle))
    return result
