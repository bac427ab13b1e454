"""`spec.template`'s schema is Kubernetes' PodTemplateSpec, made structural (operator/podschema.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.operator import crd, podschema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


DOCUMENT: dict[str, Any] = {
    "components": {
        "schemas": {
            podschema.POD_TEMPLATE_SPEC: {
                "type": "object",
                "properties": {
                    "metadata": {"allOf": [_ref(podschema.OBJECT_META)], "default": {}},
                    "spec": {"allOf": [_ref("Spec")], "description": "the pod", "default": {}},
                },
            },
            podschema.OBJECT_META: {"type": "object", "properties": {"uid": {"type": "string"}}},
            podschema.QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "Spec": {
                "type": "object",
                "required": ["containers"],
                "properties": {
                    "containers": {
                        "type": "array",
                        "items": _ref("Container"),
                        "x-kubernetes-list-type": "map",
                    },
                    "port": {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
                    "policy": {"type": "string", "enum": ["Always", "Never"], "default": "Always"},
                    "loop": _ref("Loop"),
                },
            },
            "Container": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "description": "its name"},
                    "limits": {"type": "object", "additionalProperties": _ref(podschema.QUANTITY)},
                },
            },
            "Loop": {"type": "object", "properties": {"again": _ref("Loop")}},
        }
    }
}


def test_references_are_inlined_and_only_the_structural_parts_kept() -> None:
    schema = podschema.structural(DOCUMENT)
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["containers"]
    container = spec["properties"]["containers"]["items"]
    assert container == {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            # Quantities as a Pod takes them: `0.5` as well as `500m`.
            "limits": {
                "type": "object",
                "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
            },
        },
    }
    assert spec["properties"]["port"] == {"x-kubernetes-int-or-string": True}
    # No enum (a value a newer Kubernetes adds is not refused), no default, no list markers.
    assert spec["properties"]["policy"] == {"type": "string"}
    assert "x-kubernetes-list-type" not in spec["properties"]["containers"]
    # A template's metadata: what a template may set, not the server's fields.
    assert set(schema["properties"]["metadata"]["properties"]) == {
        "name", "generateName", "namespace", "labels", "annotations", "finalizers",
    }  # fmt: skip
    # A type that contains itself ends in an open object.
    loop = spec["properties"]["loop"]
    assert loop["properties"]["again"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_a_node_without_a_type_is_refused() -> None:
    broken = {"components": {"schemas": {podschema.POD_TEMPLATE_SPEC: {"properties": {}, "oneOf": []}}}}
    assert podschema.structural(broken)["type"] == "object"
    broken["components"]["schemas"][podschema.POD_TEMPLATE_SPEC] = {"oneOf": [{"type": "string"}]}
    with pytest.raises(ValueError, match="without a type"):
        podschema.structural(broken)


def test_the_crd_embeds_kubernetes_pod_template_spec() -> None:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]
    assert "x-kubernetes-preserve-unknown-fields" not in template
    assert template["description"].startswith("Pod template of the workers")
    pod = template["properties"]["spec"]
    assert pod["required"] == ["containers"]
    container = pod["properties"]["containers"]["items"]
    assert container["required"] == ["name"]
    assert {"image", "command", "args", "env", "resources", "securityContext"} <= set(container["properties"])
    resources = container["properties"]["resources"]["properties"]
    assert resources["limits"]["additionalProperties"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert container["properties"]["ports"]["items"]["properties"]["containerPort"]["type"] == "integer"
    assert {"nodeSelector", "tolerations", "volumes", "serviceAccountName"} <= set(pod["properties"])
