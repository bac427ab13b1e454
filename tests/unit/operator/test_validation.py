"""Cross-field rules: each problem names the field to fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phalanx.operator.validation import check

MakeJob = Callable[..., dict[str, Any]]


def _fields(job: dict[str, Any]) -> dict[str, str]:
    spec, issues = check(job["spec"], job["metadata"]["name"])
    assert (spec is None) == bool(issues)
    return {issue.field: issue.message for issue in issues}


def test_a_good_spec_passes(make_job: MakeJob) -> None:
    spec, issues = check(make_job()["spec"], "demo")
    assert issues == [] and spec is not None and spec.replicas == 2


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas", "greater than maxReplicas"),
        ({"replicas": 5, "maxReplicas": 4}, "spec.replicas", "outside"),
        ({"replicas": 1, "minReplicas": 2, "maxReplicas": 4}, "spec.replicas", "outside"),
        # An object that bypassed the CRD's ranges is refused by the same model, naming the field.
        ({"spares": -1}, "spec.spares", "greater than or equal to 0"),
        ({"replicas": 0, "minReplicas": 1}, "spec.replicas", "greater than or equal to 1"),
        (
            {"checkpoint": {"claimName": "ckpt", "volume": {"emptyDir": {}}}},
            "spec.checkpoint.volume",
            "either",
        ),
        (
            {"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 5}},
            "spec.heartbeat.timeoutSeconds",
            "greater",
        ),
        ({"gang": {"podGroup": "Kueue"}}, "spec.gang.queueName", "LocalQueue"),
        (
            {"checkpoint": {"path": "/ckpt", "localTier": {"enabled": True, "path": "/ckpt/"}}},
            "spec.checkpoint.localTier.path",
            "differ",
        ),
        (
            {"checkpoint": {"objectStore": {"url": "bucket/run"}}},
            "spec.checkpoint.objectStore.url",
            "pattern",
        ),
        (
            {"failurePolicy": {"rules": [{"action": "FailJob"}]}},
            "spec.failurePolicy.rules[0].match",
            "nothing",
        ),
    ],
)
def test_cross_field_problems_name_the_field(
    make_job: MakeJob, overrides: dict, field: str, words: str
) -> None:
    problems = _fields(make_job(**overrides))
    assert field in problems, problems
    assert words in problems[field]


def test_missing_command_names_the_trainer_container(make_job: MakeJob) -> None:
    job = make_job()
    del job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "command" in _fields(job)["spec.template.spec.containers[0].command"]


def test_the_container_named_trainer_is_the_one_checked(make_job: MakeJob) -> None:
    job = make_job()
    containers = job["spec"]["template"]["spec"]["containers"]
    containers.insert(0, {"name": "sidecar", "image": "busybox"})
    assert _fields(job) == {}
    containers[1]["name"] = "main"  # now the sidecar (first container) is the trainer, and it has no command
    assert "spec.template.spec.containers[0].command" in _fields(job)


def test_no_containers(make_job: MakeJob) -> None:
    job = make_job(template={"spec": {"containers": []}})
    assert "spec.template.spec.containers" in _fields(job)


def test_wrong_types_that_bypassed_the_schema_are_reported_with_their_path(make_job: MakeJob) -> None:
    problems = _fields(make_job(replicas="many", heartbeat={"intervalSeconds": "soon"}))
    assert "spec.replicas" in problems
    assert "spec.heartbeat.intervalSeconds" in problems


def test_long_job_names_are_refused_because_pods_use_them_as_hostnames(make_job: MakeJob) -> None:
    _, issues = check(make_job()["spec"], "x" * 60)
    assert [issue.field for issue in issues] == ["metadata.name"]


def test_job_names_its_services_and_hostnames_cannot_carry_are_refused(make_job: MakeJob) -> None:
    for name in ("train.v2", "2nd-run"):
        _, issues = check(make_job()["spec"], name)
        assert [issue.field for issue in issues] == ["metadata.name"], name
        assert "starting with a letter" in issues[0].message
    assert check(make_job()["spec"], "run-2")[1] == []
