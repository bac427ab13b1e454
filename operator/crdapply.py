"""`phalanx crd --apply`: install or upgrade the CRDs Phalanx needs on a running cluster.

Helm installs a chart's `crds/` once and never upgrades them, so an upgrade of Phalanx that adds a field to the
TrainingJob CRD needs this step before `helm upgrade` (docs/UPGRADING.md). It is a server-side apply under the
field manager `phalanx` (forced: the CRD is Phalanx's own, whoever wrote it before, `kubectl apply` or Helm),
then a wait until the API server serves the new schema (`Established`), so that jobs applied right after
already use it. The stored TrainingJobs are untouched: a field the new schema adds is simply absent from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from phalanx import kubecredentials
from phalanx.errors import UserFacingError

FIELD_MANAGER = "phalanx"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ESTABLISHED_TIMEOUT_SECONDS = 60.0


def crd_documents(folder: Path) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in `folder`'s YAML files, in name order."""
    found = []
    for path in sorted(folder.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "CustomResourceDefinition":
                found.append(document)
    if not found:
        raise UserFacingError(f"no CustomResourceDefinition in {folder}")
    return found


def established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def apply(
    documents: list[dict[str, Any]],
    call: Callable[[str, str, Any, str | None], dict[str, Any]],
    timeout: float = ESTABLISHED_TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Server-side apply each CRD through `call(method, path, body, content_type)`, then wait until each is
    `Established`; returns one line per CRD."""
    said = []
    for document in documents:
        name = document["metadata"]["name"]
        path = f"{CRD_PATH}/{name}?fieldManager={FIELD_MANAGER}&force=true"
        stored = call("PATCH", path, document, "application/apply-patch+yaml")
        deadline = clock() + timeout
        while not established(stored):
            if clock() > deadline:
                raise UserFacingError(
                    f"the CRD {name} was applied but is not Established after {timeout:g} s"
                )
            sleep(0.5)
            stored = call("GET", f"{CRD_PATH}/{name}", None, None)
        versions = [v["name"] for v in stored["spec"]["versions"] if v.get("served")]
        said.append(
            f"applied {name} (serving {', '.join(versions)}; generation {stored['metadata']['generation']})"
        )
    return said


def apply_to_cluster(folder: Path) -> list[str]:
    """`apply` the CRDs of `folder` to the cluster Phalanx's credentials reach (kubecredentials)."""
    from kubernetes import client

    from phalanx.operator.kube import Kube

    kubecredentials.load()
    api = client.ApiClient()
    kube = Kube(api)

    def call(method: str, path: str, body: Any, content_type: str | None) -> dict[str, Any]:
        try:
            found: dict[str, Any] = kube.request(method, path, body, content_type or "application/json")
        except client.ApiException as error:
            raise UserFacingError(
                f"{method} {path.partition('?')[0]}: {error.status} {error.reason}: {error.body}"
            ) from None
        return found

    try:
        return apply(crd_documents(folder), call)
    finally:
        api.close()
