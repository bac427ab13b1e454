"""Cluster DNS names -> addresses, kept from pod/service/endpoints watches (the lookup is pure).

Answered (all under `cluster.local`):
- `<svc>.<ns>.svc`: the IPs of the ready pods the service selects (all of them with publishNotReadyAddresses;
  a service without selector: its Endpoints' ready addresses), for headless and ClusterIP services alike:
  there is no kube-proxy, so ClusterIPs are never routed and naming them would give unreachable addresses.
- `<hostname>.<subdomain>.<ns>.svc`: the running pod with that hostname and subdomain (Service or not, ready or not).
- `<a-b-c-d>.<ns>.pod`: the address a.b.c.d.
- `kubernetes.default.svc`: 127.0.0.1, where the apiserver listens.
Short names (`svc`, `svc.ns`, `svc.ns.svc`) reach these through the pods' resolv.conf search path.

For the pods of a real node (`DnsTable(cluster_ips=True)`), where kube-proxy routes ClusterIPs, a service with
a ClusterIP is answered with it (as cluster DNS does), `kubernetes.default.svc` included.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class Answer:
    exists: bool
    """False: NXDOMAIN. True with no addresses: NOERROR/NODATA (the name exists, e.g. no ready endpoints)."""
    addresses: tuple[str, ...] = ()


APISERVER_IP = "127.0.0.1"
"""`kubernetes.default.svc` is the real apiserver on the host (its port is in KUBERNETES_SERVICE_PORT)."""

OUTSIDE = None
"""Returned for names outside the cluster domain (answered REFUSED: there is no upstream resolver here)."""


@dataclass(frozen=True)
class ServiceInfo:
    selector: tuple[tuple[str, str], ...] | None
    """None: a service without selector (its Endpoints object is used instead)."""
    publish_not_ready: bool
    cluster_ip: str | None = None
    """None for a headless service."""


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    labels: tuple[tuple[str, str], ...]
    ip: str
    ready: bool
    hostname: str
    subdomain: str


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or status.get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    meta = pod["metadata"]
    return PodInfo(
        namespace=meta["namespace"],
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        ip=ip,
        ready=ready and not meta.get("deletionTimestamp"),
        hostname=(spec.get("hostname") or "").lower(),
        subdomain=(spec.get("subdomain") or "").lower(),
    )


class DnsTable:
    """Thread-safe tables fed by watch events; `lookup` is the read side.

    Service members are computed here from the service's selector and the pods' Ready condition, as the
    endpoints controller would: the apiserver refuses Endpoints with loopback addresses, so for services with a
    selector the Endpoints objects stay empty in this cluster.
    """

    def __init__(self, cluster_ips: bool = False) -> None:
        self.cluster_ips = cluster_ips
        """Answer a service's ClusterIP rather than its members (kube-proxy routes ClusterIPs)."""
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str], ServiceInfo] = {}
        self._endpoints: dict[tuple[str, str], tuple[str, ...]] = {}
        self._pods: dict[str, PodInfo] = {}

    def set_service(self, service: Mapping[str, Any], present: bool) -> None:
        meta, spec = service["metadata"], service.get("spec") or {}
        key = (meta["namespace"], meta["name"])
        with self._lock:
            if not present:
                self._services.pop(key, None)
                return
            selector = spec.get("selector")
            cluster_ip = spec.get("clusterIP")
            self._services[key] = ServiceInfo(
                tuple(sorted(selector.items())) if selector else None,
                bool(spec.get("publishNotReadyAddresses")),
                cluster_ip if cluster_ip and cluster_ip != "None" else None,
            )

    def set_endpoints(self, endpoints: Mapping[str, Any], present: bool) -> None:
        key = (endpoints["metadata"]["namespace"], endpoints["metadata"]["name"])
        with self._lock:
            if present:
                self._endpoints[key] = ready_addresses(endpoints)
            else:
                self._endpoints.pop(key, None)

    def set_pod(self, pod: Mapping[str, Any], present: bool) -> None:
        uid = pod["metadata"]["uid"]
        info = pod_info(pod) if present else None
        with self._lock:
            if info is None:
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = info

    def _members(self, namespace: str, service: ServiceInfo) -> tuple[str, ...]:
        assert service.selector is not None
        wanted = set(service.selector)
        return tuple(
            sorted(
                {
                    p.ip
                    for p in self._pods.values()
                    if p.namespace == namespace
                    and wanted <= set(p.labels)
                    and (p.ready or service.publish_not_ready)
                }
            )
        )

    def lookup(self, name: str) -> Answer | None:
        """The answer for a fully qualified name (lower case, no trailing dot); None if outside the cluster."""
        suffix = "." + CLUSTER_DOMAIN
        if not name.endswith(suffix) and name != CLUSTER_DOMAIN:
            return OUTSIDE
        labels = name[: -len(suffix)].split(".") if name != CLUSTER_DOMAIN else []
        with self._lock:
            if len(labels) == 3 and labels[2] == "svc":
                svc, ns = labels[0], labels[1]
                service = self._services.get((ns, svc))
                if self.cluster_ips and service is not None and service.cluster_ip:
                    return Answer(True, (service.cluster_ip,))
                if (ns, svc) == ("default", "kubernetes") and not self.cluster_ips:
                    return Answer(True, (APISERVER_IP,))
                if service is not None and service.selector is not None:
                    return Answer(True, self._members(ns, service))
                if service is not None or (ns, svc) in self._endpoints:
                    return Answer(True, self._endpoints.get((ns, svc), ()))
                return Answer(False)
            if len(labels) == 4 and labels[3] == "svc":
                host, sub, ns = labels[0], labels[1], labels[2]
                ips = tuple(
                    sorted(
                        {
                            p.ip
                            for p in self._pods.values()
                            if (p.namespace, p.subdomain, p.hostname) == (ns, sub, host)
                        }
                    )
                )
                return Answer(bool(ips), ips)
            if len(labels) == 3 and labels[2] == "pod":
                ip = labels[0].replace("-", ".")
                parts = ip.split(".")
                if len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts):
                    return Answer(True, (ip,))
            return Answer(False)


def ready_addresses(endpoints: Mapping[str, Any]) -> tuple[str, ...]:
    ips = {
        address["ip"]
        for subset in endpoints.get("subsets") or []
        for address in subset.get("addresses") or []
    }
    return tuple(sorted(ips))
