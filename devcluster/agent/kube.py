"""A small JSON-over-HTTPS client for the apiserver (dicts in, dicts out) and a list+watch informer.

Credentials and TLS settings come from the kubeconfig through the `kubernetes` client's loader; requests go
straight through urllib3, which keeps objects as plain dicts (cheap at 1,000 pods) and gives full control over
patch content types and watch streams.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status = status
        self.reason = reason
        self.body = body


def is_retryable(error: Exception) -> bool:
    if isinstance(error, ApiError):
        return error.status in (429, 500, 502, 503, 504)
    return isinstance(error, urllib3.exceptions.HTTPError | OSError)


class KubeClient:
    def __init__(self, kubeconfig: str, pool_size: int = 16) -> None:
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.host = configuration.host.rstrip("/")
        self._headers: dict[str, str] = {}
        # The client's only kind of credential held in its configuration (certificates go to the SSL context).
        bearer = configuration.auth_settings().get("BearerToken")
        value = bearer.get("value") if bearer is not None else None
        if bearer is not None and bearer.get("in") == "header" and value:
            self._headers[bearer["key"]] = value
        cert_reqs = "CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE"
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            block=False,
            cert_reqs=cert_reqs,
            ca_certs=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
            assert_hostname=False if configuration.assert_hostname is False else None,
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        url = self.host + path + ("?" + urlencode(params) if params else "")
        headers = {**self._headers, "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        response = self._pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=5, read=timeout),
            retries=False,
        )
        if not 200 <= response.status < 300:
            raise ApiError(response.status, response.reason or "", response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else {}

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.request("GET", path, params=params)

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    def delete(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.request("DELETE", path, body)

    def watch(self, path: str, params: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Events of one watch request (ends when the server closes it)."""
        url = self.host + path + "?" + urlencode({**params, "watch": "true"})
        response = self._pool.request(
            "GET",
            url,
            headers={**self._headers, "Accept": "application/json"},
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=float(params.get("timeoutSeconds", 300)) + 30),
            retries=False,
        )
        try:
            if response.status != 200:
                raise ApiError(
                    response.status, response.reason or "", response.read().decode(errors="replace")
                )
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()


def with_retry(
    action: Callable[[], Any], what: str, stop: threading.Event | None = None, attempts: int = 8
) -> Any:
    """Run `action`, retrying transient API failures with capped exponential backoff (0.2 s doubling to 5 s)."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            return action()
        except Exception as error:
            if not is_retryable(error) or attempt == attempts - 1 or (stop is not None and stop.is_set()):
                raise
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            time.sleep(delay * (1 + random.random() * 0.2))
            delay = min(delay * 2, 5.0)
    return None


EventHandler = Callable[[str, dict[str, Any]], None]
"""(type, object): type is ADDED, MODIFIED or DELETED."""


class Informer:
    """List then watch one resource, keep a cache, and call `handler` for every change.

    Survives apiserver outages (reconnects with backoff) and expired resource versions (410 Gone: relist,
    synthesising DELETED for objects that vanished meanwhile and MODIFIED for the rest).
    """

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        handler: EventHandler,
        stop: threading.Event,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.handler = handler
        self.stop = stop
        self.params = dict(params or {})
        self.cache: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self._lock = threading.Lock()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.cache.get(f"{namespace}/{name}")

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.cache.values())

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name=f"informer{self.path}", daemon=True)
        thread.start()
        return thread

    def _dispatch(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                self.cache.pop(self.key(obj), None)
            else:
                self.cache[self.key(obj)] = obj
        try:
            self.handler(kind, obj)
        except Exception:
            log.exception("handler failed for %s %s", kind, self.key(obj))

    def _relist(self) -> str:
        listing = self.kube.get(self.path, self.params)
        fresh = {self.key(item): item for item in listing.get("items") or []}
        with self._lock:
            vanished = [obj for key, obj in self.cache.items() if key not in fresh]
        for obj in vanished:
            self._dispatch("DELETED", obj)
        for obj in fresh.values():
            self._dispatch("MODIFIED" if self.key(obj) in self.cache else "ADDED", obj)
        self.synced.set()
        return listing["metadata"]["resourceVersion"]

    def _run(self) -> None:
        delay = 0.5
        version: str | None = None
        while not self.stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                params = {
                    **self.params,
                    "resourceVersion": version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "240",
                }
                for event in self.kube.watch(self.path, params):
                    if self.stop.is_set():
                        return
                    kind, obj = event.get("type") or "", event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            version = None  # expired: relist
                        else:
                            log.warning("watch %s error: %s", self.path, obj.get("message"))
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind == "BOOKMARK":
                        continue
                    self._dispatch(kind, obj)
                delay = 0.5
            except ApiError as error:
                if error.status == 410:
                    version = None
                    continue
                log.warning("watch %s failed: %s; retrying in %.1fs", self.path, error, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
            except Exception as error:
                log.warning("watch %s interrupted: %s; retrying in %.1fs", self.path, error, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
