"""The only module of the worker that talks to Kubernetes: it creates and renews the pod's heartbeat Lease."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


class LeaseClient:
    """Creates the Lease on first use, then replaces its spec and annotations on each renewal."""

    def __init__(self, pod_name: str, namespace: str) -> None:
        from kubernetes import client, config

        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            config.load_kube_config()
        self._core = client.CoreV1Api()
        self._coordination = client.CoordinationV1Api()
        self._api_exception = client.ApiException
        self.pod_name = pod_name
        self.namespace = namespace
        self._pod_uid: str | None = None
        self._created = False

    @staticmethod
    def available(env: Mapping[str, str], pod_name: str, namespace: str) -> bool:
        """Heartbeats need a pod identity and a way to reach the API server."""
        reachable = bool(env.get("KUBERNETES_SERVICE_HOST") or env.get("KUBECONFIG"))
        return reachable and bool(pod_name) and bool(namespace)

    def pod_uid(self) -> str | None:
        """The owner for the Lease, read once; None if the pod cannot be read (the Lease is still renewed)."""
        if self._pod_uid is None:
            try:
                self._pod_uid = self._core.read_namespaced_pod(self.pod_name, self.namespace).metadata.uid
            except self._api_exception as error:
                logger.warning("cannot read pod %s/%s: %s", self.namespace, self.pod_name, error.reason)
        return self._pod_uid

    def renew(self, body: dict[str, Any]) -> None:
        if not self._created:
            try:
                self._coordination.create_namespaced_lease(self.namespace, body)
                self._created = True
                return
            except self._api_exception as error:
                if error.status != 409:
                    raise
                self._created = True
        patch = {"metadata": {"annotations": body["metadata"]["annotations"]}, "spec": body["spec"]}
        self._coordination.patch_namespaced_lease(self.pod_name, self.namespace, patch)
