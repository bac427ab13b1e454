"""The CRD is generated from the pydantic model, matches it field for field, and is structural."""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from phalanx.operator import api, crd, formats, names, validation
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


def test_schema_is_structural() -> None:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        untyped = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        assert "type" in node or untyped, f"{path} has no type"
        for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "nullable", "title"):
            assert forbidden not in node, f"{path} uses {forbidden}"
        for rule in node.get("x-kubernetes-validations", []):
            assert set(rule) == {"rule", "message", "fieldPath", "reason"}, (path, rule)
            assert rule["fieldPath"].startswith("."), (path, rule)
            # The field it names is declared where the rule sits (the API server refuses the CRD otherwise).
            assert rule["fieldPath"].split(".")[1] in node["properties"], (path, rule)


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
    # A count that can never be valid is refused at apply time by its range, a bad combination by CEL.
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


# ------------------------------------------------------------------ the CRD refuses what the model refuses


def _kube_accepts_number(node: dict[str, Any], value: int | float) -> bool:
    """A number against a schema node as Kubernetes 1.20 judges it (kube-openapi's numberValidator): an
    integer value meets `minimum` and `maximum` truncated to integers (MinimumNativeType's `int64(min)`),
    a fractional one meets them as they are."""
    if node.get("type") == "integer" and not isinstance(value, int):
        return False
    for key, above in (("minimum", True), ("maximum", False)):
        if key not in node:
            continue
        bound = node[key]
        if isinstance(value, int):
            bound = int(bound)  # truncation toward 0, as Go's conversion
        exclusive = node.get("exclusiveMinimum" if above else "exclusiveMaximum", False)
        if above and not (value > bound if exclusive else value >= bound):
            return False
        if not above and not (value < bound if exclusive else value <= bound):
            return False
    return True


def _model_accepts(model: type[BaseModel], name: str, alias: str, value: Any) -> bool:
    try:
        model.model_validate({alias: value})
    except ValidationError as error:
        return not any(item["loc"][:1] in ((alias,), (name,)) for item in error.errors())
    return True


def _probes(node: dict[str, Any]) -> list[int | float]:
    values: set[int | float] = set()
    for key in ("minimum", "maximum"):
        if key not in node:
            continue
        bound = node[key]
        values |= {math.floor(bound) + step for step in (-1, 0, 1, 2)}
        if node.get("type") == "number":
            values |= {bound, math.nextafter(bound, -math.inf), math.nextafter(bound, math.inf)}
            values |= {bound - 0.5, bound + 0.5, bound - 0.1, bound + 0.1}
    # A float with an integral value reaches the API server as an integer: probe it as one.
    return sorted({int(v) if isinstance(v, float) and v.is_integer() else v for v in values}, key=float)


def _numeric_fields(
    model: type[BaseModel], schema: dict[str, Any], path: str
) -> list[tuple[str, type[BaseModel], str, str, dict[str, Any]]]:
    found = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        node = schema["properties"][alias]
        nested = _nested_model(field.annotation)
        if nested is not None:
            found += _numeric_fields(nested, node.get("items", node), f"{path}.{alias}")
        elif "minimum" in node or "maximum" in node:
            found.append((f"{path}.{alias}", model, name, alias, node))
        elif "minimum" in node.get("items", {}) or "maximum" in node.get("items", {}):
            found.append((f"{path}.{alias}[]", model, name, alias, node))
    return found


def _every_bounded_number() -> list[tuple[str, type[BaseModel], str, str, dict[str, Any]]]:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return _numeric_fields(api.TrainingJobSpec, schema["spec"], "spec") + _numeric_fields(
        api.TrainingJobStatus, schema["status"], "status"
    )


def test_every_bound_of_the_model_is_in_the_crd_as_kubernetes_applies_it() -> None:
    """Each number the model refuses for its range, the API server refuses too (and the reverse), integers
    included: `heartbeat.intervalSeconds: 0` may not pass the CRD and wait for a reconcile to be refused."""
    fields = _every_bounded_number()
    paths = {path for path, *_ in fields}
    assert {"spec.heartbeat.intervalSeconds", "spec.replicas", "spec.checkpoint.intervalSteps"} <= paths
    assert "spec.failurePolicy.rules.match.exitCodes[]" in paths
    disagreements = []
    for path, model, name, alias, node in fields:
        listed = path.endswith("[]")
        leaf = node["items"] if listed else node
        for value in _probes(leaf):
            kube = _kube_accepts_number(leaf, value)
            ours = _model_accepts(model, name, alias, [value] if listed else value)
            if kube != ours:
                disagreements.append(f"{path} = {value!r}: the CRD {'accepts' if kube else 'refuses'} it")
    assert disagreements == []


def test_a_fractional_minimum_refuses_the_integer_below_it() -> None:
    interval = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["heartbeat"]["properties"]["intervalSeconds"]
    assert interval.get("exclusiveMinimum") is True and int(interval["minimum"]) == 0
    assert interval["minimum"] < 0.2 and math.nextafter(interval["minimum"], math.inf) == 0.2
    assert not _kube_accepts_number(interval, 0) and not _kube_accepts_number(interval, 0.1)
    assert _kube_accepts_number(interval, 0.2) and _kube_accepts_number(interval, 1)


QUANTITIES_OK = ["8Gi", "512Mi", "1.5G", "500m", "2", "0", "1.", ".5", "+1Ki", "1e9", "1E-3", "2e+2", "100n"]
QUANTITIES_BAD = ["lots", "", "-1Gi", "1e1.5", "1 Gi", "1Ki ", "1ki", ".", "Gi", "1GiB", "1e", "0x10", "1,5G"]
PATHS_OK = ["/checkpoints", "/data/ckpt", "/mnt/.hidden", "/a/..b/...", "/c p", "/x.y"]
PATHS_BAD = ["../../etc", "", "/", "ckpt", "/a/../b", "/a/./b", "/a//b", "/a/", "/..", "/.", "//a", "/a/.."]


@pytest.mark.parametrize(
    ("path", "good", "bad"),
    [
        ("sharedMemory.sizeLimit", QUANTITIES_OK, QUANTITIES_BAD),
        ("checkpoint.localTier.sizeLimit", QUANTITIES_OK, QUANTITIES_BAD),
        ("checkpoint.path", PATHS_OK, PATHS_BAD),
        ("checkpoint.localTier.path", PATHS_OK, PATHS_BAD),
        ("checkpoint.localTier.hostPath", PATHS_OK, PATHS_BAD),
    ],
)
def test_the_crds_pattern_and_the_model_agree(path: str, good: list[str], bad: list[str]) -> None:
    node = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for key in path.split("."):
        node = node["properties"][key]
    *parents, leaf = path.split(".")
    for value in good + bad:
        raw: dict[str, Any] = {leaf: value}
        for key in reversed(parents):
            raw = {key: raw}
        try:
            api.TrainingJobSpec.model_validate({"template": {}, **raw})
            ours = True
        except ValidationError:
            ours = False
        kube = re.fullmatch(node["pattern"], value) is not None
        assert (kube, ours) == (value in good, value in good), f"{path} = {value!r}"


def test_quantities_are_int_or_string_as_in_a_pod() -> None:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    size = spec["properties"]["sharedMemory"]["properties"]["sizeLimit"]
    assert size["x-kubernetes-int-or-string"] is True and "type" not in size
    assert size["pattern"] == formats.QUANTITY_PATTERN
    assert api.SharedMemorySpec.model_validate({"sizeLimit": 1024}).size_limit == "1024"


def test_the_trainer_container_is_a_container_name_defaulting_to_trainer() -> None:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node = spec["properties"]["trainerContainer"]
    assert node["default"] == "trainer" and node["maxLength"] == 63
    assert re.fullmatch(node["pattern"], "main") and not re.fullmatch(node["pattern"], "Main_1")


def test_a_bound_kubernetes_cannot_apply_exactly_is_refused_by_the_generator() -> None:
    # Integers meet `int64(minimum)`: -0.5 would become 0 and refuse the integer 0 the model accepts.
    with pytest.raises(TypeError, match="no exact structural form"):
        crd._kube_minimum(-0.5, exclusive=False)
    with pytest.raises(TypeError, match="no exact structural form"):
        crd._kube_maximum(-0.5)
    assert crd._kube_minimum(0.5, exclusive=True) == (0.5, True)
    assert crd._kube_minimum(2, exclusive=False) == (2, False)


TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "i", "command": ["python"]}]}}


def test_every_cel_rule_is_the_operators_own_check_too() -> None:
    """What `kubectl apply` refuses by a CEL rule, the operator refuses as well, naming the same field (for
    objects stored before the rule, or on a release without CEL): each rule's example breaks both."""
    rules = [rule for rule in api.all_cel_rules() if not rule.transition]
    assert len(rules) == 11 and validation.check({"template": TEMPLATE})[1] == []
    for rule in rules:
        spec, issues = validation.check({"template": TEMPLATE, **rule.example})
        assert spec is None, rule
        assert any(issue.field.endswith(rule.field_path) for issue in issues), (rule, issues)


def test_the_name_a_pod_could_not_take_is_refused_by_the_schema() -> None:
    name = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]
    rule = name["properties"]["name"]
    assert rule["maxLength"] == names.MAX_HOSTNAME - names.WORKER_SUFFIX_ROOM
    pattern = re.compile(rule["pattern"])
    assert (
        pattern.fullmatch("llama-70b") and not pattern.fullmatch("Llama") and not pattern.fullmatch("run.1")
    )
    for bad in ("run.1", "x" * (rule["maxLength"] + 1)):
        assert [issue.field for issue in validation.check({"template": TEMPLATE}, job_name=bad)[1]] == [
            "metadata.name"
        ], bad


def test_managed_by_is_a_domain_prefixed_path_and_phalanx_runs_only_its_own() -> None:
    assert (
        api.managed_here(None)
        and api.managed_here({})
        and api.managed_here({"managedBy": api.CONTROLLER_NAME})
    )
    assert not api.managed_here({"managedBy": "kueue.x-k8s.io/multikueue"})
    spec = {"template": TEMPLATE}
    assert validation.check({**spec, "managedBy": "kueue.x-k8s.io/multikueue"})[1] == []
    for bad in ("multikueue", "Kueue.io/x", "x" * 60 + ".io/y"):
        assert [issue.field for issue in validation.check({**spec, "managedBy": bad})[1]] == [
            "spec.managedBy"
        ]
    (immutable,) = [rule for rule in api.all_cel_rules() if rule.transition]
    assert immutable.field_path == ".managedBy" and "oldSelf" in immutable.rule


def test_every_status_string_has_a_max_length_and_the_operator_writes_within_it() -> None:
    status = crd.open_api_schema()["properties"]["status"]
    strings = [(path, node) for path, node in _walk(status, "status") if node.get("type") == "string"]
    assert len(strings) > 40
    assert [path for path, node in strings if "maxLength" not in node] == []
    long = "x" * 300_000
    written = api.TrainingJobStatus.model_validate(
        {
            "state": "Running",
            "conditions": [{"type": "Running", "status": "True", "reason": "Training", "message": long}],
            "incidents": [{"cause": "ExitCode", "message": long}],
            "regroup": {"before": "2026-01-01T12:00:00Z", "epoch": 1, "departed": [long]},
        }
    ).to_wire()
    assert len(written["conditions"][0]["message"]) == api.STATUS_TEXT_LIMIT
    assert written["conditions"][0]["message"].endswith("...")
    assert len(written["incidents"][0]["message"]) == api.STATUS_TEXT_LIMIT
    assert len(written["regroup"]["departed"][0]) == api.STATUS_TEXT_LIMIT
    assert written["state"] == "Running"
