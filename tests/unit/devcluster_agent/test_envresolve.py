"""Environment and command-line resolution, as the kubelet does it."""

from __future__ import annotations

import base64

import pytest

from phalanx.devcluster.agent.envresolve import (
    ContainerConfigError,
    EnvContext,
    InvalidSpecError,
    command_line,
    decode_secret,
    expand,
    parse_quantity,
    resolve_env,
)

POD = {
    "metadata": {
        "name": "w-0",
        "namespace": "jobs",
        "uid": "u-1",
        "labels": {"app": "train", "rank": "0"},
        "annotations": {"note": "hi"},
    },
    "spec": {"nodeName": "node-1", "serviceAccountName": "trainer", "containers": [{"name": "main"}]},
}


def context(config_maps=None, secrets=None) -> EnvContext:
    config_maps = config_maps or {}
    secrets = secrets or {}
    return EnvContext(
        pod=POD,
        pod_ip="127.9.0.7",
        host_ip="127.0.0.1",
        config_maps=lambda ns, name: config_maps.get((ns, name)),
        secrets=lambda ns, name: secrets.get((ns, name)),
        node_allocatable={"cpu": "8", "memory": "16Gi"},
        service_env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "1"),
        ("x-$(A)-$(B)-y", "x-1-two-y"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("cost $5", "cost $5"),
        ("$", "$"),
        ("$$$(A)", "$1"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}) == expected


def test_field_refs_resolve_from_the_pod() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rank']"}}},
            {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
    }
    env = resolve_env(container, context())
    assert env["NAME"] == "w-0"
    assert env["NS"] == "jobs"
    assert env["UID"] == "u-1"
    assert env["RANK"] == "0"
    assert env["NOTE"] == "hi"
    assert env["NODE"] == "node-1"
    assert env["SA"] == "trainer"
    assert env["IP"] == "127.9.0.7"
    assert env["HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"


def test_values_expand_against_earlier_variables_only() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "LATER_REF", "value": "$(FIRST)"},
            {"name": "FIRST", "value": "a"},
            {"name": "SECOND", "value": "$(FIRST)-b-$(KUBERNETES_SERVICE_HOST)"},
        ],
    }
    env = resolve_env(container, context())
    assert env["LATER_REF"] == "$(FIRST)"
    assert env["SECOND"] == "a-b-127.0.0.1"


def test_env_overrides_env_from_and_service_variables() -> None:
    config_maps = {("jobs", "cfg"): {"MODE": "fast", "bad key": "skipped", "KUBERNETES_SERVICE_PORT": "1"}}
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cfg"}}, {"prefix": "S_", "secretRef": {"name": "sec"}}],
        "env": [{"name": "MODE", "value": "slow"}],
    }
    env = resolve_env(container, context(config_maps, {("jobs", "sec"): {"TOKEN": "t"}}))
    assert env["MODE"] == "slow"
    assert env["S_TOKEN"] == "t"
    assert "bad key" not in env
    assert env["KUBERNETES_SERVICE_PORT"] == "1"


def test_key_refs_and_optional_sources() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
            {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
        ],
    }
    env = resolve_env(container, context({("jobs", "cfg"): {"k": "v"}}, {("jobs", "sec"): {"pw": "s3"}}))
    assert (env["PW"], env["CM"]) == ("s3", "v")
    assert "OPT" not in env


def test_missing_secret_is_a_retryable_config_error() -> None:
    container = {
        "name": "main",
        "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    with pytest.raises(ContainerConfigError, match='secret "s" not found'):
        resolve_env(container, context())


def test_resource_field_refs_round_up_and_default_to_the_node() -> None:
    container = {
        "name": "main",
        "resources": {"requests": {"cpu": "250m", "memory": "100Mi"}, "limits": {"memory": "1Gi"}},
        "env": [
            {"name": "REQ_CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
            {
                "name": "REQ_MCPU",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}},
            },
            {"name": "LIM_CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "LIM_MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
        ],
    }
    env = resolve_env(container, context())
    assert env["REQ_CPU"] == "1"
    assert env["REQ_MCPU"] == "250"
    assert env["LIM_CPU"] == "8"
    assert env["LIM_MEM"] == "1024"


def test_command_and_args_are_expanded() -> None:
    container = {
        "name": "main",
        "command": ["python", "-m", "$(MOD)"],
        "args": ["--rank=$(RANK)", "$$(RANK)"],
    }
    assert command_line(container, {"MOD": "train", "RANK": "3"}) == [
        "python",
        "-m",
        "train",
        "--rank=3",
        "$(RANK)",
    ]


def test_args_alone_are_the_command_and_neither_is_invalid() -> None:
    assert command_line({"name": "c", "args": ["sleep", "1"]}, {}) == ["sleep", "1"]
    with pytest.raises(InvalidSpecError, match="has no command"):
        command_line({"name": "c"}, {})


def test_quantities_and_secret_decoding() -> None:
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("250m") * 4 == 1
    assert parse_quantity("2k") == 2000
    assert decode_secret({"a": base64.b64encode(b"xyz").decode()}) == {"a": "xyz"}


def test_unsupported_field_ref_is_invalid() -> None:
    container = {
        "name": "main",
        "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}],
    }
    with pytest.raises(InvalidSpecError):
        resolve_env(container, context())
