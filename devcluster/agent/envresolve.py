"""A container's environment and command line, resolved the way the kubelet does (pure functions).

Order (kubelet `makeEnvironmentVariables`): `envFrom` sources first, then `env` entries in order, each `value`
expanded with `$(VAR)` against the variables defined so far plus the service variables; service variables only
fill names not set by the pod. Command and args are expanded against the final environment.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Lookup = Callable[[str, str], Mapping[str, str] | None]
"""(namespace, name) -> the data of a ConfigMap or Secret (Secret values already decoded), None if missing."""

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ContainerConfigError(Exception):
    """The container cannot be configured yet (e.g. a missing Secret); the kubelet retries these."""


class InvalidSpecError(Exception):
    """The container can never run as specified (e.g. no command, since images are not pulled)."""


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, others stay verbatim."""
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "$" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2 : close]
                    out.append(variables.get(name, f"$({name})"))
                    i = close + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append(ch + nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("100m", "1Gi", "2") as a Decimal."""
    text = str(value).strip()
    suffixes: dict[str, int | Decimal] = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "Pi": 2**50,
        "Ei": 2**60,
        "n": Decimal("1e-9"),
        "u": Decimal("1e-6"),
        "m": Decimal("1e-3"),
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "P": 10**15,
        "E": 10**18,
    }
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * Decimal(suffixes[suffix])
    return Decimal(text)


def field_ref_value(pod: Mapping[str, Any], field_path: str, pod_ip: str, host_ip: str) -> str:
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    match = _SUBSCRIPT.match(field_path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    if field_path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(field_path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise InvalidSpecError(f"unsupported fieldRef {field_path!r}")


def resource_field_value(
    container: Mapping[str, Any], ref: Mapping[str, Any], node_allocatable: Mapping[str, str]
) -> str:
    """`resourceFieldRef`: the limit (or request) divided by the divisor, rounded up; limits default to the node."""
    resource = ref["resource"]
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    amount = (resources.get(kind) or {}).get(name)
    if amount is None and kind == "limits":
        amount = node_allocatable.get(name)
    if amount is None:
        amount = "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    if divisor == 0:
        divisor = Decimal(1)
    return str(math.ceil(parse_quantity(amount) / divisor))


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (data or {}).items()}


@dataclass(frozen=True)
class EnvContext:
    """What a container's environment may draw from."""

    pod: Mapping[str, Any]
    pod_ip: str
    host_ip: str
    config_maps: Lookup
    secrets: Lookup
    node_allocatable: Mapping[str, str]
    service_env: Mapping[str, str]
    """Variables the kubelet adds for services (here: KUBERNETES_SERVICE_HOST/PORT); the pod's own win."""


def _key_ref(ctx: EnvContext, ref: Mapping[str, Any], lookup: Lookup, kind: str) -> str | None:
    namespace = ctx.pod["metadata"]["namespace"]
    data = lookup(namespace, ref.get("name", ""))
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return None
        raise ContainerConfigError(f'{kind} "{ref.get("name")}" not found')
    if ref["key"] not in data:
        if optional:
            return None
        raise ContainerConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref.get('name')}")
    return data[ref["key"]]


def resolve_env(container: Mapping[str, Any], ctx: EnvContext) -> dict[str, str]:
    """The container's final environment (service variables included)."""
    env: dict[str, str] = {}
    namespace = ctx.pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if "configMapRef" in source:
            ref, lookup, kind = source["configMapRef"], ctx.config_maps, "configmap"
        elif "secretRef" in source:
            ref, lookup, kind = source["secretRef"], ctx.secrets, "secret"
        else:
            continue
        data = lookup(namespace, ref.get("name", ""))
        if data is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f'{kind} "{ref.get("name")}" not found')
        for key, value in data.items():
            name = prefix + key
            if _ENV_NAME.match(name):  # the kubelet skips invalid names (with an event)
                env[name] = value
    for entry in container.get("env") or []:
        name = entry["name"]
        value_from = entry.get("valueFrom")
        if entry.get("value"):
            env[name] = expand(entry["value"], {**ctx.service_env, **env})
        elif value_from:
            resolved = _value_from(container, value_from, ctx)
            if resolved is None:
                continue
            env[name] = resolved
        else:
            env[name] = ""
    return {**ctx.service_env, **env}


def _value_from(container: Mapping[str, Any], value_from: Mapping[str, Any], ctx: EnvContext) -> str | None:
    if "fieldRef" in value_from:
        return field_ref_value(ctx.pod, value_from["fieldRef"]["fieldPath"], ctx.pod_ip, ctx.host_ip)
    if "resourceFieldRef" in value_from:
        ref = value_from["resourceFieldRef"]
        target = container
        if ref.get("containerName"):
            all_containers = ctx.pod["spec"].get("containers", []) + ctx.pod["spec"].get("initContainers", [])
            target = next((c for c in all_containers if c["name"] == ref["containerName"]), container)
        return resource_field_value(target, ref, ctx.node_allocatable)
    if "configMapKeyRef" in value_from:
        return _key_ref(ctx, value_from["configMapKeyRef"], ctx.config_maps, "configmap")
    if "secretKeyRef" in value_from:
        return _key_ref(ctx, value_from["secretKeyRef"], ctx.secrets, "secret")
    raise InvalidSpecError(f"unsupported valueFrom {sorted(value_from)}")


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded. Images are not pulled, so there is no image entrypoint to fall
    back on: without `command`, `args` alone is the command line; with neither the spec is invalid."""
    command = [expand(part, env) for part in container.get("command") or []]
    args = [expand(part, env) for part in container.get("args") or []]
    argv = command + args
    if not argv:
        raise InvalidSpecError(
            f'container "{container["name"]}" has no command: images are not pulled by the local node agent, '
            "so spec.containers[].command (or args) must name the program to run"
        )
    return argv
