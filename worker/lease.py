"""The only module of the worker that talks to Kubernetes: the pod's heartbeat Lease, and reads of its own
TrainingJob (watched by worker/jobwatch.py)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from phalanx import contract, kubecredentials

logger = logging.getLogger(__name__)

# The TrainingJob API (phalanx.contract: the worker does not import the operator).
TRAININGJOB_GROUP, TRAININGJOB_VERSION, TRAININGJOB_PLURAL = contract.GROUP, contract.VERSION, contract.PLURAL


def kubernetes_reachable(env: Mapping[str, str]) -> bool:
    """In a pod (service host set) or with a kubeconfig."""
    return bool(env.get("KUBERNETES_SERVICE_HOST") or env.get("KUBECONFIG"))


class LeaseClient:
    """Creates the Lease on first use, then replaces its spec and annotations on each renewal."""

    def __init__(self, pod_name: str, namespace: str, pod_uid: str | None = None) -> None:
        from kubernetes import client

        kubecredentials.load()
        self._core = client.CoreV1Api()
        self._coordination = client.CoordinationV1Api()
        self._api_exception = client.ApiException
        self.pod_name = pod_name
        self.namespace = namespace
        self._pod_uid: str | None = pod_uid or None
        self._created = False

    @staticmethod
    def available(env: Mapping[str, str], pod_name: str, namespace: str) -> bool:
        """Heartbeats need a pod identity and a way to reach the API server."""
        return kubernetes_reachable(env) and bool(pod_name) and bool(namespace)

    def pod_uid(self) -> str | None:
        """The owner for the Lease: the pod's uid as the operator's pods get it (`POD_UID`, from the downward
        API), else read once from the pod (outside the operator); None if neither is known (the Lease is still
        renewed)."""
        if self._pod_uid is None:
            try:
                metadata = self._core.read_namespaced_pod(self.pod_name, self.namespace).metadata
                self._pod_uid = metadata.uid if metadata is not None else None
            except self._api_exception as error:
                logger.warning("cannot read pod %s/%s: %s", self.namespace, self.pod_name, error.reason)
        return self._pod_uid

    def renew(self, body: dict[str, Any]) -> None:
        if not self._created:
            try:
                # The client serializes a dict body as it is; its annotation names only the model class.
                self._coordination.create_namespaced_lease(self.namespace, body)  # type: ignore[arg-type]
                self._created = True
                return
            except self._api_exception as error:
                if error.status != 409:
                    raise
                # A Lease of this name made before this pod (an earlier pod's, or anyone's): replaced whole,
                # owner included, so that nothing of it outlives this pod's first heartbeat.
                existing = self._coordination.read_namespaced_lease(self.pod_name, self.namespace)
                version = existing.metadata.resource_version if existing.metadata is not None else None
                replacement = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
                self._coordination.replace_namespaced_lease(self.pod_name, self.namespace, replacement)  # type: ignore[arg-type]
                self._created = True
                return
        patch = {"metadata": {"annotations": body["metadata"]["annotations"]}, "spec": body["spec"]}
        self._coordination.patch_namespaced_lease(self.pod_name, self.namespace, patch)


def desired_replicas_of(job: Mapping[str, Any]) -> int | None:
    """Active workers a TrainingJob asks for: the operator's accepted `status.replicas.desired`, else
    `spec.replicas` (before the operator's first status write); None when neither is a positive integer."""
    desired = ((job.get("status") or {}).get("replicas") or {}).get("desired")
    if isinstance(desired, int) and desired > 0:
        return desired
    replicas = (job.get("spec") or {}).get("replicas")
    return replicas if isinstance(replicas, int) and replicas > 0 else None


class TrainingJobApi:
    """The reads of the pod's own TrainingJob that `jobwatch.JobFeed` needs: get, list and watch, each
    restricted to this one job (`fieldSelector metadata.name=<job>`), so a Role naming only this job
    (`resourceNames: [<job>]`, verbs get, list, watch) allows them. API errors become
    `jobwatch.ApiStatusError`. `api_client`: a configured `kubernetes.client.ApiClient` (default: the
    pod's service account, or the kubeconfig)."""

    def __init__(self, job_name: str, namespace: str, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            kubecredentials.load()
        self._custom = client.CustomObjectsApi(api_client)
        self._api_exception = client.ApiException
        self.job_name = job_name
        self.namespace = namespace
        self._selector = f"metadata.name={job_name}"

    def _call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        from phalanx.worker.jobwatch import ApiStatusError

        try:
            return function(*args, **kwargs)
        except self._api_exception as error:
            raise ApiStatusError(int(error.status or 0), str(error.reason or "")) from None

    def get(self) -> dict[str, Any]:
        return self._call(
            self._custom.get_namespaced_custom_object,
            TRAININGJOB_GROUP,
            TRAININGJOB_VERSION,
            self.namespace,
            TRAININGJOB_PLURAL,
            self.job_name,
        )

    def list(self) -> tuple[dict[str, Any] | None, str]:
        answer = self._call(
            self._custom.list_namespaced_custom_object,
            TRAININGJOB_GROUP,
            TRAININGJOB_VERSION,
            self.namespace,
            TRAININGJOB_PLURAL,
            field_selector=self._selector,
        )
        items = answer.get("items") or []
        return (items[0] if items else None), str(answer["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        from kubernetes.watch.watch import iter_resp_lines

        from phalanx.worker.jobwatch import ApiStatusError

        response = self._call(
            self._custom.list_namespaced_custom_object,
            TRAININGJOB_GROUP,
            TRAININGJOB_VERSION,
            self.namespace,
            TRAININGJOB_PLURAL,
            field_selector=self._selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            # The server ends the watch after timeout_seconds; a read silent for longer is a dead link.
            _request_timeout=(10, timeout_seconds + 15),
        )
        try:
            status = int(getattr(response, "status", 200) or 200)
            if not 200 <= status <= 299:
                raise ApiStatusError(status, str(getattr(response, "reason", "") or ""))
            for line in iter_resp_lines(response):
                if line:
                    yield json.loads(line)
        finally:
            response.close()
            with contextlib.suppress(Exception):
                response.release_conn()
