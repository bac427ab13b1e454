"""The operator's few Kubernetes API calls, as raw REST through the official client (no model classes)."""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from phalanx import kubecredentials
from phalanx.operator import api, names, queueing, spread
from phalanx.operator import status as observe
from phalanx.operator.reconcile import Event
from phalanx.operator.timeutil import format_time, now

# kind -> (API path prefix, plural) for every kind the operator creates.
_RESOURCES: dict[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}

STORE_SECRET_BYTES = 32
"""Random bytes in a job's store secret (before encoding)."""

_WORKLOADS = f"/apis/{queueing.WORKLOAD_API_VERSION}"
"""Kueue's API: Workloads, ResourceFlavors, WorkloadPriorityClasses."""


class ForeignObject(Exception):
    """An object a job needs exists under the job's name for it, and is not the job's."""

    def __init__(self, kind: str, name: str, owner: str) -> None:
        super().__init__(
            f"{kind} {name} exists and is not this job's ({owner}): delete it or give the job another name"
        )


def _check_owner(wanted: dict[str, Any], existing: dict[str, Any] | None) -> None:
    """Raise `ForeignObject` unless `existing` has the controller `wanted` names (when it names one)."""
    mine = observe.controller_reference(wanted.get("metadata") or {})
    if mine is None or existing is None:
        return
    theirs = observe.controller_reference(existing.get("metadata") or {})
    if theirs is not None and theirs.get("uid") == mine.get("uid"):
        return
    owner = f"controlled by {theirs.get('kind')} {theirs.get('name')}" if theirs else "it has no controller"
    raise ForeignObject(str(wanted.get("kind")), str(wanted["metadata"]["name"]), owner)


def with_drawn_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret the operator makes without a value (the job's store secret) gets a random one as it is
    created; anything else is returned as it is."""
    if obj.get("kind") != "Secret" or obj.get("data") or obj.get("stringData"):
        return obj
    value = base64.b64encode(secrets.token_urlsafe(STORE_SECRET_BYTES).encode()).decode()
    return {**obj, "data": {names.STORE_SECRET_KEY: value}}


def child_path(kind: str, namespace: str, name: str) -> str:
    """The API path of one object of a kind the operator makes (one of `_RESOURCES`)."""
    return f"{_collection_path({'kind': kind, 'metadata': {'namespace': namespace}})}/{name}"


def _job_of(obj: dict[str, Any]) -> tuple[str, str]:
    """(namespace, job name) of an object the operator made for a job."""
    meta = obj["metadata"]
    return meta["namespace"], (meta.get("labels") or {}).get(names.LABEL_JOB_NAME, "")


def _collection_path(obj: dict[str, Any]) -> str:
    kind = obj["kind"]
    namespace = obj["metadata"]["namespace"]
    if kind in _RESOURCES:
        prefix, plural = _RESOURCES[kind]
    else:  # PodGroups of the gang schedulers
        prefix, plural = f"/apis/{obj['apiVersion']}", kind.lower() + "s"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def load_client(connections: int = 10) -> kubernetes.client.ApiClient:
    """A client with the credentials `kubecredentials.load` chooses (KUBECONFIG, else the pod's service
    account); keeps up to `connections` connections open, so parallel requests do not queue for one."""
    kubecredentials.load()
    configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = connections
    return kubernetes.client.ApiClient(configuration)


CONNECT_TIMEOUT_SECONDS = 10.0
"""How long a watch's connection may take to open."""
DELETION_MEMORY_SECONDS = 60.0
"""How long a child's seen deletion is remembered: longer than any one check of a child takes."""
EVENT_AGGREGATION_SECONDS = 600.0
"""An Event repeated within this long of its first posting raises the first one's count (client-go's window)."""
EVENTS_REMEMBERED = 4096
"""Events remembered for aggregation, the least recently posted forgotten first."""


@dataclass(frozen=True)
class _PostedEvent:
    name: str
    first: datetime
    count: int


class Kube:
    """Create / delete / status / events for the reconcile handlers (thread-safe: one ApiClient)."""

    def __init__(self, client: kubernetes.client.ApiClient, recheck_seconds: float = 600.0) -> None:
        self.client = client
        self.recheck_seconds = recheck_seconds
        # Per job, when each of its children was last found (or made) as it should be: (kind, time) by path.
        self._verified: dict[tuple[str, str], dict[str, tuple[str, float]]] = {}
        # When a child's deletion was last seen, by path, oldest first (kept DELETION_MEMORY_SECONDS): a check
        # under way as it was deleted must not be remembered as verified.
        self._deleted: OrderedDict[str, float] = OrderedDict()
        self._events: OrderedDict[tuple[str, ...], _PostedEvent] = OrderedDict()
        self._lock = threading.Lock()
        self.fence: Callable[[], None] | None = None
        """Called before every write (`LeaderElector.fence` under leader election); raises to refuse it."""

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        *,
        fenced: bool = True,
    ) -> Any:
        """One API request (`path` may carry its query); the decoded JSON answer, an ApiException otherwise.
        A write passes `fence` first (leader election: it raises unless this replica leads); the election's own
        writes are not `fenced`."""
        if fenced and method != "GET" and self.fence is not None:
            self.fence()
        method, url, headers, payload, post = self.client.param_serialize(
            method,
            path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(method, url, headers, payload, post)
        data = response.read()
        if not 200 <= response.status < 300:
            error = ApiException(
                status=response.status, reason=response.reason, body=data.decode(errors="replace")
            )
            # A throttled answer's Retry-After tells how long to hold further requests.
            error.headers = getattr(response, "headers", None)
            raise error
        return json.loads(data) if data else None

    def stream(self, path: str, read_timeout_seconds: float) -> Iterator[dict[str, Any]]:
        """The events of a watch (`path` carries `watch=true`), each decoded as its line arrives; an
        ApiException when refused. A stream silent for `read_timeout_seconds` raises (a read timeout)."""
        method, url, headers, payload, post = self.client.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = self.client.call_api(
            method,
            url,
            headers,
            payload,
            post,
            _request_timeout=(CONNECT_TIMEOUT_SECONDS, read_timeout_seconds),
        )
        raw = response.response
        try:
            if not 200 <= response.status < 300:
                raise ApiException(
                    status=response.status, reason=response.reason, body=raw.read().decode(errors="replace")
                )
            # Each line as its chunks come (the client's own splitter): an event is taken in when it arrives.
            for line in iter_resp_lines(raw):
                if line.strip():
                    yield json.loads(line)
        finally:
            # Closed, not returned to the pool: a stream left part-read would poison the next request on it.
            raw.close()

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(f"/apis/{api.API_VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}")

    def create(self, obj: dict[str, Any]) -> bool:
        """Create `obj`; False when it already exists (deterministic names make that the idempotent case)."""
        try:
            self.request("POST", _collection_path(obj), with_drawn_secret(obj))
            return True
        except ApiException as error:
            if error.status == 409:
                return False
            raise

    def ensure(self, obj: dict[str, Any]) -> None:
        """Create `obj` if missing. Once found, it is checked again only when `unverify` says it was deleted
        (the operator watches most kinds of children), after the job created pods (`forget`), or after its own
        period (`recheck_seconds`, spread by object): the last bounds a deletion no watch reported. An object of
        that name whose controller is not `obj`'s (another job's, another controller's, or none) is never
        adopted: raises `ForeignObject`."""
        key = f"{_collection_path(obj)}/{obj['metadata']['name']}"
        job = _job_of(obj)
        started = time.monotonic()
        with self._lock:
            _, checked = self._verified.get(job, {}).get(key, ("", None))
        if checked is not None and started - checked < spread.period_of(self.recheck_seconds, key):
            return
        try:
            existing = self.request("GET", key)
        except ApiException as error:
            if error.status != 404:
                raise
            if not self.create(obj):
                existing = self.request("GET", key)  # made by someone else in between: whose is it?
                _check_owner(obj, existing)
        else:
            _check_owner(obj, existing)
        with self._lock:
            if self._deleted.get(key, -1.0) >= started:
                return  # deleted while it was checked: the next reconcile looks again
            self._verified.setdefault(job, {})[key] = (obj["kind"], time.monotonic())

    def unverify(self, kind: str, namespace: str, name: str, job_name: str) -> bool:
        """A child of the job was deleted: its next `ensure` looks again, and so does one under way now. Whether
        the job is one this operator keeps children for (the children of a job already forgotten, as its own
        deletion takes them, are no news)."""
        path = child_path(kind, namespace, name)
        seen = time.monotonic()
        with self._lock:
            self._deleted[path] = seen
            self._deleted.move_to_end(path)
            while next(iter(self._deleted.values())) < seen - DELETION_MEMORY_SECONDS:
                self._deleted.popitem(last=False)
            verified = self._verified.get((namespace, job_name))
            if verified is None:
                return False
            verified.pop(path, None)
            return True

    def forget(self, namespace: str, job_name: str, keep: Collection[str] = ()) -> None:
        """Drop what is known of a job's children but those of the kinds in `keep`: all when the job was deleted;
        those no watch covers when it created pods, which need them all (checked at its next reconcile)."""
        with self._lock:
            verified = self._verified.pop((namespace, job_name), {})
            kept = {path: entry for path, entry in verified.items() if entry[0] in keep}
            if kept:
                self._verified[(namespace, job_name)] = kept

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """Delete a pod; `grace_seconds=0` removes it at once (its node is gone, or it is frozen)."""
        body = None if grace_seconds is None else {"gracePeriodSeconds": grace_seconds}
        try:
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except ApiException as error:
            if error.status != 404:
                raise

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        """Merge `labels` into a pod's labels."""
        patch = {"metadata": {"labels": labels}}
        try:
            self.request(
                "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", patch, "application/merge-patch+json"
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def ungate_pod(self, namespace: str, name: str, gate: str) -> None:
        """Lift one scheduling gate of a pod, leaving any other (the template's own) in place."""
        patch = {"spec": {"schedulingGates": [{"$patch": "delete", "name": gate}]}}
        try:
            self.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                patch,
                "application/strategic-merge-patch+json",
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def renew_lease(self, lease: dict[str, Any]) -> None:
        """Write a Lease's spec and labels (the operator's view canary), creating it when missing."""
        meta = lease["metadata"]
        path = f"/apis/coordination.k8s.io/v1/namespaces/{meta['namespace']}/leases/{meta['name']}"
        try:
            self.request("PATCH", path, lease, "application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise
            self.request("POST", path.rsplit("/", 1)[0], lease)

    def suspend_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """Set the job's `spec.suspend` to true (a training-health `Pause`), guarded by its resourceVersion."""
        meta = job["metadata"]
        path = f"/apis/{api.API_VERSION}/namespaces/{meta['namespace']}/{api.PLURAL}/{meta['name']}"
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": {"suspend": True}}
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete_job(self, job: dict[str, Any]) -> None:
        """Delete the TrainingJob (its `ttlSecondsAfterFinished` passed), its children in the background. Only
        the object that was judged: another job created under the same name since is left alone."""
        meta = job["metadata"]
        path = f"/apis/{api.API_VERSION}/namespaces/{meta['namespace']}/{api.PLURAL}/{meta['name']}"
        body = {"propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}}
        try:
            self.request("DELETE", path, body)
        except ApiException as error:
            if error.status != 404:
                raise

    def _get_or_none(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, None when there is none (404)."""
        try:
            return self.request("GET", path)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        """The pods that carry the job's label, as the API server has them now."""
        selector = urllib.parse.quote(f"{names.LABEL_JOB_NAME}={job_name}")
        listing = self.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return list((listing or {}).get("items") or [])

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Kueue Workload (None: none, or Kueue's API is not served)."""
        return self._get_or_none(f"{_WORKLOADS}/namespaces/{namespace}/workloads/{name}")

    def get_flavor(self, name: str) -> dict[str, Any] | None:
        """A Kueue ResourceFlavor's spec."""
        flavor = self._get_or_none(f"{_WORKLOADS}/resourceflavors/{name}")
        return None if flavor is None else flavor.get("spec") or {}

    def get_workload_priority(self, name: str) -> int | None:
        """A Kueue WorkloadPriorityClass's value."""
        found = self._get_or_none(f"{_WORKLOADS}/workloadpriorityclasses/{name}")
        return None if found is None else int(found.get("value") or 0)

    def write_workload(self, op: queueing.WorkloadOp) -> None:
        """Carry out one write to an existing Workload, guarded by the resourceVersion it was planned from
        (409 when Kueue changed it meanwhile: the next reconcile plans again)."""
        meta = op.target
        path = f"{_WORKLOADS}/namespaces/{meta['namespace']}/workloads/{meta['name']}"
        guard = {"resourceVersion": meta.get("resourceVersion")}
        patch: dict[str, Any]
        if op.kind == "pod_sets":
            patch = {"metadata": guard, "spec": {"podSets": op.body["podSets"]}}
        elif op.kind in ("activate", "deactivate"):
            mark = None if op.kind == "activate" else "true"
            patch = {
                "metadata": {**guard, "annotations": {queueing.DEACTIVATED_ANNOTATION: mark}},
                "spec": {"active": op.kind == "activate"},
            }
        elif op.kind == "release_quota":
            path += "/status"
            patch = {"metadata": guard, "status": {"admission": None, "conditions": op.body["conditions"]}}
        elif op.kind == "finish":
            path += "/status"
            patch = {"metadata": guard, "status": {"conditions": op.body["conditions"]}}
        elif op.kind == "drop_finalizer":
            kept = [f for f in meta.get("finalizers") or [] if f != queueing.FINALIZER]
            patch = {"metadata": {**guard, "finalizers": kept}}
        else:
            raise ValueError(f"not a write to an existing Workload: {op.kind}")
        try:
            self.request("PATCH", path, patch, "application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise

    def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Write the whole status, guarded by the job's resourceVersion (409 if it changed meanwhile)."""
        meta = job["metadata"]
        path = f"/apis/{api.API_VERSION}/namespaces/{meta['namespace']}/{api.PLURAL}/{meta['name']}/status"
        body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta, "status": status}
        return self.request("PUT", path, body)

    def post_event(self, job: dict[str, Any], event: Event) -> None:
        """Post `event` about `job`. The same Warning again (same job, reason and message) within
        `EVENT_AGGREGATION_SECONDS` of the first raises the first one's count instead of adding an object, as
        kubelet's and the controllers' recorders do: a job refused the same way every minute costs one Event
        object, not thousands. Normal Events are the job's story (training, recovered, training again) and are
        each kept, in order: an aggregated one would move to its last time in `kubectl describe`."""
        meta = job["metadata"]
        moment = now()
        stamp = format_time(moment)
        message = event.message[:1024]
        key = (meta["namespace"], meta["uid"], event.type, event.reason, message)
        with self._lock:
            seen = self._events.get(key)
        aggregated = event.type == "Warning"
        if (
            aggregated
            and seen is not None
            and (moment - seen.first).total_seconds() < EVENT_AGGREGATION_SECONDS
        ):
            path = f"/api/v1/namespaces/{meta['namespace']}/events/{seen.name}"
            try:
                patch = {"count": seen.count + 1, "lastTimestamp": stamp}
                self.request("PATCH", path, patch, "application/merge-patch+json")
            except ApiException as error:
                if error.status != 404:
                    raise
            else:
                with self._lock:
                    self._events[key] = replace(seen, count=seen.count + 1)
                return
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": event.reason,
            "message": message,
            "type": event.type,
            "source": {"component": "phalanx-operator"},
            "reportingComponent": "phalanx-operator",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        created = self.request("POST", _collection_path(body), body)
        if not aggregated:
            return
        with self._lock:
            self._events[key] = _PostedEvent(created["metadata"]["name"], moment, 1)
            self._events.move_to_end(key)
            while len(self._events) > EVENTS_REMEMBERED:
                self._events.popitem(last=False)
