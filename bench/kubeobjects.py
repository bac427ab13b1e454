"""Fields of the kubernetes client's models, read from objects the API server returned.

The client types every field optional because its OpenAPI schema does, though the server always fills in
an object's metadata (name, uid) and a pod's spec; a pod's status and node, and a node's status, may still
be missing (a pod just created, not scheduled yet). These readers say which is which once.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import V1ObjectMeta, V1Pod


def meta(obj: Any) -> V1ObjectMeta:
    """The metadata of an object read from the API server (never absent there)."""
    metadata: V1ObjectMeta | None = obj.metadata
    if metadata is None:
        raise ValueError(f"a {type(obj).__name__} without metadata")
    return metadata


def name_of(obj: Any) -> str:
    name = meta(obj).name
    if name is None:
        raise ValueError(f"a {type(obj).__name__} without a name")
    return name


def uid_of(obj: Any) -> str:
    uid = meta(obj).uid
    if uid is None:
        raise ValueError(f"a {type(obj).__name__} without a uid")
    return uid


def labels_of(obj: Any) -> dict[str, str]:
    return meta(obj).labels or {}


def is_terminating(obj: Any) -> bool:
    """Deleted, and on its way out (a deletion timestamp is set)."""
    return meta(obj).deletion_timestamp is not None


def phase_of(pod: V1Pod) -> str | None:
    """The pod's phase; None before the pod has a status."""
    return pod.status.phase if pod.status is not None else None


def pod_ip_of(pod: V1Pod) -> str | None:
    return pod.status.pod_ip if pod.status is not None else None


def node_of(pod: V1Pod) -> str | None:
    """The node the pod is bound to; None while it is not scheduled."""
    return pod.spec.node_name if pod.spec is not None else None


def custom_object(found: object) -> dict[str, Any]:
    """A custom object as the client returns it: parsed JSON, which the client types as `object`."""
    if not isinstance(found, dict):
        raise TypeError(f"expected a custom object, got {type(found).__name__}")
    return found
