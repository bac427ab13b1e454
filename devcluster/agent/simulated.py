"""Pods on simulated nodes: Running at once without a process, deleted at once; writes go through a small pool."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from phalanx.devcluster.agent import podstatus
from phalanx.devcluster.agent.context import AgentContext
from phalanx.devcluster.agent.ipam import IpPool
from phalanx.devcluster.agent.kube import ApiError, with_retry
from phalanx.devcluster.agent.nodes import HOST_IP

log = logging.getLogger(__name__)


def simulated_status(pod: dict[str, Any], pod_ip: str) -> dict[str, Any]:
    """Running with every container started and ready (init containers count as completed)."""
    moment = podstatus.now()
    spec = pod["spec"]
    record = podstatus.PodRecord(
        restart_policy=spec.get("restartPolicy", "Always"),
        init_containers=podstatus.records_from_spec(spec.get("initContainers") or []),
        containers=podstatus.records_from_spec(spec.get("containers") or []),
        pod_ip=pod_ip,
        host_ip=HOST_IP,
        start_time=moment,
    )
    uid = pod["metadata"]["uid"]
    for container in record.init_containers:
        container.container_id = f"phalanx-simulated://{uid}/{container.name}"
        container.terminated = podstatus.Terminated(0, "Completed", moment, moment)
    for container in record.containers:
        container.container_id = f"phalanx-simulated://{uid}/{container.name}"
        container.running_since = moment
    return podstatus.build_status(pod, record, moment)


class SimulatedPods:
    def __init__(self, ctx: AgentContext, pool: IpPool, workers: int = 8) -> None:
        self.ctx = ctx
        self.pool = pool
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="simulated")
        self._state: dict[str, str] = {}
        self._lock = threading.Lock()

    def _claim(self, uid: str, state: str) -> bool:
        """Move the pod to `state`; False when it is already there (the write is in flight or done)."""
        with self._lock:
            if self._state.get(uid) == state:
                return False
            self._state[uid] = state
            return True

    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            with self._lock:
                self._state.pop(uid, None)
            self.pool.release(uid)
            return
        if self.ctx.heartbeats.is_crashed(pod["spec"]["nodeName"]):
            return
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            if self._claim(uid, "deleting"):
                self.executor.submit(self._delete, pod)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        pod_ip = status.get("podIP")
        if status.get("phase") == "Running" and isinstance(pod_ip, str) and pod_ip in self.pool:
            self.pool.allocate(uid, preferred=status["podIP"])
            with self._lock:
                self._state.setdefault(uid, "running")
            return
        if self._claim(uid, "running"):
            self.executor.submit(self._start, pod)

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        try:
            ip = self.pool.allocate(uid)
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
            with_retry(
                lambda: self.ctx.kube.merge_patch(path, {"status": simulated_status(pod, ip)}),
                f"status of {meta['namespace']}/{meta['name']}",
                self.ctx.stop,
            )
        except Exception as error:
            if not (isinstance(error, ApiError) and error.status == 404):
                log.warning("simulated pod %s/%s: start failed: %s", meta["namespace"], meta["name"], error)
            with self._lock:
                self._state.pop(uid, None)

    def _delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            with_retry(
                lambda: self.ctx.kube.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body
                ),
                f"delete {meta['namespace']}/{meta['name']}",
                self.ctx.stop,
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning("simulated pod %s/%s: delete failed: %s", meta["namespace"], meta["name"], error)
        except Exception as error:
            log.warning("simulated pod %s/%s: delete failed: %s", meta["namespace"], meta["name"], error)
        self.pool.release(meta["uid"])

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
