"""The schema of `spec.template`: Kubernetes' own PodTemplateSpec, embedded in the CRD as Kubeflow's and JobSet's
CRDs embed it, so that a misspelt field of the pod template is refused at apply time instead of dropped.

`podtemplatespec.json` beside this module is generated (`phalanx crd --pod-schema`) from the OpenAPI v3
document that the pinned Kubernetes release publishes (`api/openapi-spec/v3/api__v1_openapi.json` of the
`k8s.io/kubernetes` module, which `phalanx dev install` fetches into the Go module cache). It is made structural
the way a CRD needs it: references inlined; descriptions, defaults, enums, formats and the list and patch
markers left out (the CRD stays small, and a value a newer Kubernetes adds to an enum is not refused);
quantities accept what a Pod accepts (`cpu: 0.5` as well as `500m`; `validation.py` checks them); an
ObjectMeta keeps what a template may set (name, labels, annotations, ...).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMA_FILE = "podtemplatespec.json"
OPENAPI_FILE = Path("api") / "openapi-spec" / "v3" / "api__v1_openapi.json"
"""Where the `k8s.io/kubernetes` module keeps the core API's OpenAPI v3 document."""
POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"

_STRING = {"type": "string"}
TEMPLATE_META: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _STRING,
        "generateName": _STRING,
        "namespace": _STRING,
        "labels": {"type": "object", "additionalProperties": _STRING},
        "annotations": {"type": "object", "additionalProperties": _STRING},
        "finalizers": {"type": "array", "items": _STRING},
    },
}
"""An embedded ObjectMeta: what a template may set (the rest is the API server's)."""


def structural(document: dict[str, Any]) -> dict[str, Any]:
    """PodTemplateSpec's structural schema from a Kubernetes OpenAPI v3 document."""
    schemas = document["components"]["schemas"]

    def convert(node: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name == OBJECT_META:
                return json.loads(json.dumps(TEMPLATE_META))
            if name == QUANTITY:
                # A string or a number, as a Pod takes it: an int-or-string would refuse `cpu: 0.5`.
                return {"x-kubernetes-preserve-unknown-fields": True}
            if name in seen:
                # A type that contains itself has no finite structural form (none in PodSpec today).
                return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            return convert(schemas[name], (*seen, name))
        if "allOf" in node:
            (only,) = node["allOf"]
            return convert(only, seen)
        if node.get("format") == "int-or-string":
            return {"x-kubernetes-int-or-string": True}
        out: dict[str, Any] = {}
        if "type" in node:
            out["type"] = node["type"]
        if "properties" in node:
            out["type"] = "object"
            out["properties"] = {key: convert(value, seen) for key, value in node["properties"].items()}
        if "items" in node:
            out["items"] = convert(node["items"], seen)
        if isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = convert(node["additionalProperties"], seen)
        if node.get("required"):
            out["required"] = list(node["required"])
        if "type" not in out:
            raise ValueError(f"a schema node without a type: {sorted(node)}")
        return out

    return convert({"$ref": f"#/components/schemas/{POD_TEMPLATE_SPEC}"}, ())


def write(openapi: Path, out: Path) -> Path:
    """Generate `podtemplatespec.json` at `out` from the OpenAPI document `openapi`."""
    schema = structural(json.loads(openapi.read_text()))
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    return out


@cache
def load() -> dict[str, Any]:
    """The committed schema (a fresh copy per CRD build is the caller's: `json.loads(json.dumps(...))`)."""
    text = resources.files("phalanx.operator").joinpath(SCHEMA_FILE).read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema
