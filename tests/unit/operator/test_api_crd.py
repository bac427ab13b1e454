"""The CRD is generated from the pydantic model, matches it field for field, and is structural."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from phalanx.operator import api, crd
from phalanx.operator.crd import _strip_optional

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("relative", crd.CRD_PATHS, ids=str)
def test_committed_crd_matches_the_model(relative: Path) -> None:
    committed = (ROOT / relative).read_text()
    assert committed == crd.render_crd(), f"{relative} is stale: run `phalanx crd --write`"


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _strip_optional(annotation)
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _compare(model: type[BaseModel], schema: dict[str, Any], path: str) -> list[str]:
    if schema.get("type") == "array":
        schema = schema["items"]
    problems = []
    properties = schema.get("properties", {})
    aliases = {field.alias or name: field for name, field in model.model_fields.items()}
    for alias in sorted(set(aliases) - set(properties)):
        problems.append(f"{path}.{alias} is in the model but not in the schema")
    for key in sorted(set(properties) - set(aliases)):
        problems.append(f"{path}.{key} is in the schema but not in the model")
    for alias, field in aliases.items():
        if alias not in properties:
            continue
        if not properties[alias].get("description"):
            problems.append(f"{path}.{alias} has no description")
        nested = _nested_model(field.annotation)
        if nested is not None:
            problems += _compare(nested, properties[alias], f"{path}.{alias}")
    return problems


def test_every_model_field_is_in_the_schema_and_back() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _compare(api.TrainingJobSpec, schema["properties"]["spec"], "spec") == []
    assert _compare(api.TrainingJobStatus, schema["properties"]["status"], "status") == []


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, schema)]
    for key, child in schema.get("properties", {}).items():
        nodes += _walk(child, f"{path}.{key}")
    if "items" in schema:
        nodes += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += _walk(schema["additionalProperties"], f"{path}{{}}")
    return nodes


def test_schema_is_structural_for_kubernetes_1_20() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        untyped = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or untyped, f"{path} has no type"
        for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "x-kubernetes-validations", "nullable", "title"):
            assert forbidden not in node, f"{path} uses {forbidden}"


def test_spec_defaults_are_the_models_defaults() -> None:
    spec_schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    properties = spec_schema["properties"]
    assert properties["replicas"]["default"] == 1
    assert properties["heartbeat"]["default"] == api.HeartbeatSpec().to_wire()
    assert properties["gang"]["properties"]["podGroup"]["default"] == "None"
    assert properties["gang"]["properties"]["podGroup"]["enum"] == [
        "None",
        "Coscheduling",
        "Volcano",
        "Kueue",
    ]
    assert properties["topology"]["properties"]["policy"]["enum"] == ["Pack", "Spread"]
    assert properties["nprocPerNode"]["minimum"] == 1
    # A count that can never be valid is refused at apply time; cross-field rules stay the operator's.
    assert properties["spares"]["minimum"] == 0
    assert properties["replicas"]["minimum"] == 1
    assert properties["minReplicas"]["minimum"] == 1 and properties["maxReplicas"]["minimum"] == 1
    assert "maximum" not in properties["replicas"]  # the operator's maxGangPods decides, with a condition
    exit_codes = properties["failurePolicy"]["properties"]["rules"]["items"]["properties"]["match"]
    assert exit_codes["properties"]["exitCodes"]["items"] == {"type": "integer", "minimum": 0, "maximum": 255}
    assert "default" not in properties["template"]
    for path, node in _walk(spec_schema):
        if "default" in node and node.get("type") == "object":
            # A structural default must itself be accepted by the model.
            assert isinstance(node["default"], dict), path


def test_interval_steps_is_a_positive_integer_or_auto() -> None:
    spec_schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    interval = spec_schema["properties"]["checkpoint"]["properties"]["intervalSteps"]
    # Kubernetes 1.20 applies `minimum` to numbers and `pattern` to strings: 0, -5, "5" and "fast" are refused.
    assert interval == {
        "x-kubernetes-int-or-string": True,
        "minimum": 1,
        "pattern": "^(auto)$",
        "description": interval["description"],
        "default": 100,
    }
    assert "type" not in interval
    assert api.CheckpointSpec().interval_steps == 100
    assert api.CheckpointSpec.model_validate({"intervalSteps": "auto"}).interval_steps == "auto"


def test_status_has_no_defaults_and_conditions_are_a_map_keyed_by_type() -> None:
    status_schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"
    ]
    assert all("default" not in node for _, node in _walk(status_schema))
    conditions = status_schema["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) >= {"type", "status"}


def test_subresources_and_printer_columns() -> None:
    version = crd.build_crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas.active",
        "labelSelectorPath": ".status.selector",
    }
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns == {
        "Ready": ".status.readyWorkers",
        "Spares": ".status.replicas.spares",
        "Step": ".status.step",
        "Restarts": ".status.restarts.total",
        "State": ".status.state",
        "Progress": ".status.progress",
        "Age": ".metadata.creationTimestamp",
    }


def test_crd_names_and_yaml_round_trip() -> None:
    loaded = yaml.safe_load(crd.render_crd())
    assert loaded["metadata"]["name"] == "trainingjobs.phalanx.dev"
    assert loaded["spec"]["names"]["shortNames"] == ["tj"]
    assert loaded["spec"]["versions"][0]["name"] == "v1alpha1"


def test_wire_format_is_camel_case() -> None:
    spec = api.TrainingJobSpec.model_validate(
        {"replicas": 3, "minReplicas": 2, "nprocPerNode": 4, "template": {}, "gang": {"podGroup": "Volcano"}}
    )
    assert (spec.min_replicas, spec.nproc_per_node, spec.gang.pod_group) == (2, 4, "Volcano")
    wire = spec.to_wire()
    assert wire["minReplicas"] == 2 and wire["failurePolicy"]["maxRestarts"] == 10
