"""What every part of the running agent shares: client, settings, address pools, node state, pod registry."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent.config import AgentConfig
from phalanx.devcluster.agent.envresolve import decode_secret
from phalanx.devcluster.agent.ipam import IpPool
from phalanx.devcluster.agent.kube import KubeClient
from phalanx.devcluster.agent.nodes import NodeHeartbeats, NodeSpec

KILL_ANNOTATION = "phalanx.dev/kill"
FREEZE_ANNOTATION = "phalanx.dev/freeze"


@dataclass
class AgentContext:
    kube: KubeClient
    config: AgentConfig
    stop: threading.Event
    nodes: dict[str, NodeSpec]
    heartbeats: NodeHeartbeats
    real_ips: IpPool
    dns_ip: str
    namespaced: bool
    registry: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(namespace, pod name) -> the PodWorker (for the log server)."""
    registry_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def base_environment(self) -> dict[str, str]:
        """The 'image' environment of every container: the agent's PATH with its Python env's bin first."""
        python_bin = os.path.dirname(sys.executable)
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env = {
            "PATH": python_bin + os.pathsep + path,
            "HOME": os.environ.get("HOME", "/root"),
            "PYTHONUNBUFFERED": "1",  # logs reach `kubectl logs` as they are written
        }
        for name in ("LANG", "LC_ALL", "TZ"):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def service_environment(self) -> dict[str, str]:
        """Only the `kubernetes` service, pointing at the real apiserver (ClusterIPs are not routed here)."""
        port = str(self.config.api_port)
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
        }

    def read_object(self, path: str) -> dict[str, Any] | None:
        return self.kube.get_or_none(path)

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.read_object(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.read_object(f"/api/v1/namespaces/{namespace}/secrets/{name}")

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.read_object(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")

    def persistent_volume(self, _namespace: str, name: str) -> dict[str, Any] | None:
        return self.read_object(f"/api/v1/persistentvolumes/{name}")

    def config_map_data(self, namespace: str, name: str) -> Mapping[str, str] | None:
        obj = self.config_map(namespace, name)
        return None if obj is None else dict(obj.get("data") or {})

    def secret_data(self, namespace: str, name: str) -> Mapping[str, str] | None:
        obj = self.secret(namespace, name)
        return None if obj is None else decode_secret(obj.get("data"))

    def service_account_token(self, pod: Mapping[str, Any], request: Mapping[str, Any]) -> str:
        namespace = pod["metadata"]["namespace"]
        account = pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [request["audience"]] if request.get("audience") else [],
                "expirationSeconds": request.get("expirationSeconds", 3600),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        response = self.kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body)
        return response["status"]["token"]
