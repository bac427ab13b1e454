"""The node agent process: registers nodes, watches the cluster, runs pods; stops its pods on SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from phalanx.devcluster import podnetwork
from phalanx.devcluster.agent import admission, ipam
from phalanx.devcluster.agent.config import AgentConfig, parse_config
from phalanx.devcluster.agent.context import AgentContext
from phalanx.devcluster.agent.dnsserver import DnsServer, upstream_resolver
from phalanx.devcluster.agent.dnstable import DnsTable
from phalanx.devcluster.agent.kube import ApiError, Informer, KubeClient, with_retry
from phalanx.devcluster.agent.logserver import LogServer
from phalanx.devcluster.agent.nodes import (
    CRASH_ANNOTATION,
    NodeHeartbeats,
    all_nodes,
    capacity,
    machine_memory_bytes,
)
from phalanx.devcluster.agent.podworker import PodWorker
from phalanx.devcluster.agent.provisioner import Provisioner
from phalanx.devcluster.agent.runtime import kill_at_once, kill_orphans, probe_namespaces
from phalanx.devcluster.agent.simulated import SimulatedPods

log = logging.getLogger("phalanx.devcluster.agent")

SHUTDOWN_GRACE = 10.0
NODE_RETURN_SECONDS = 20.0
"""Seconds a crashed node whose Node was deleted stays away before it registers again (a replacement machine's
boot): long enough for a test to see what its deletion alone caused."""


def retry_forever(action: Callable[[], Any], what: str, stop: threading.Event) -> Any:
    """Startup calls: the apiserver may still be coming up, so keep trying (backoff up to 5 s) until stopped."""
    delay = 0.5
    while not stop.is_set():
        try:
            return action()
        except Exception as error:
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
    return None


class Agent:
    def __init__(self, config: AgentConfig, stop: threading.Event) -> None:
        self.config = config
        self.stop = stop
        self.dns = DnsTable()
        self.real_node_dns = DnsTable(cluster_ips=True)
        self.workers: dict[str, PodWorker] = {}
        self.workers_lock = threading.Lock()
        # What each node has admitted: a pod beyond a node's allocatable pods or memory never starts.
        self.admitted = admission.Ledger()
        self.refused: set[str] = set()
        self.refusals = ThreadPoolExecutor(max_workers=2, thread_name_prefix="refusals")

    def run(self) -> None:
        config = self.config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        killed = kill_orphans(config.state_dir)
        if killed:
            log.info("killed %d process groups left by a previous agent", killed)
        namespaced = probe_namespaces() if config.use_namespaces is None else config.use_namespaces
        if not namespaced:
            log.warning(
                "pods run without private mount/UTS namespaces (unshare refused, or --no-namespaces): their mount"
                " paths are rewritten to their volumes (sharedfs)"
            )
        kube = KubeClient(str(config.kubeconfig))
        specs = all_nodes(config)
        logs = LogServer(self._log_source, config.kubelet_port, config.state_dir / "kubelet-tls")
        heartbeats = NodeHeartbeats(kube, config, specs, logs.port, self.stop)
        self.ctx = AgentContext(
            kube=kube,
            config=config,
            stop=self.stop,
            nodes={spec.name: spec for spec in specs},
            heartbeats=heartbeats,
            real_ips=ipam.real_pod_pool(config.pod_network_prefix),
            dns_ip=podnetwork.dns_address(config.pod_network_prefix),
            namespaced=namespaced,
        )
        self.simulated = SimulatedPods(self.ctx, ipam.simulated_pod_pool(config.pod_network_prefix))
        dns = DnsServer(self.dns, self.ctx.dns_ip, config.dns_port)
        dns.start()
        real_node_dns = None
        if config.real_node_dns:
            real_node_dns = DnsServer(self.real_node_dns, config.real_node_dns, 53, upstream_resolver())
            real_node_dns.start()
        logs.start()
        provisioner = Provisioner(kube, config.state_dir)
        retry_forever(provisioner.ensure_storage_class, "creating the default StorageClass", self.stop)
        retry_forever(heartbeats.register, "registering nodes", self.stop)
        threading.Thread(target=heartbeats.run, name="heartbeats", daemon=True).start()
        informers = [
            Informer(kube, "/api/v1/nodes", self._on_node, self.stop),
            Informer(kube, "/api/v1/services", self._on_service, self.stop),
            Informer(kube, "/api/v1/endpoints", self._on_endpoints, self.stop),
            Informer(kube, "/api/v1/persistentvolumeclaims", provisioner.handle, self.stop),
        ]
        pods = self.pods = Informer(kube, "/api/v1/pods", self._on_pod, self.stop)
        for informer in [*informers, pods]:
            informer.start()
        threading.Thread(target=self._remove_stale_pod_dirs, args=(pods,), daemon=True).start()
        log.info(
            "node agent up: %d real + %d simulated nodes, pod network %s.0.0/16, DNS %s:%d, kubelet port %d",
            config.nodes,
            config.simulated_nodes,
            config.pod_network_prefix,
            self.ctx.dns_ip,
            dns.address[1],
            logs.port,
        )
        self.stop.wait()
        if real_node_dns is not None:
            real_node_dns.stop()
        self._shutdown(dns, logs)

    # ---- watch handlers -----------------------------------------------------------------------------------
    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        self.dns.set_pod(pod, kind != "DELETED")
        self.real_node_dns.set_pod(pod, kind != "DELETED")
        node = (pod.get("spec") or {}).get("nodeName")
        spec = self.ctx.nodes.get(node or "")
        if spec is None or node is None:
            return
        if not self._admit(kind, node, pod):
            return
        if spec.simulated:
            self.simulated.handle(kind, pod)
            return
        uid = pod["metadata"]["uid"]
        with self.workers_lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.vanish()
                    del self.workers[uid]
                return
            if worker is not None:
                worker.update(pod)
                return
            if self.stop.is_set():
                return
            worker = PodWorker(self.ctx, pod)
            self.workers[uid] = worker
        with self.ctx.registry_lock:
            self.ctx.registry[(worker.namespace, worker.name)] = worker
        worker.start()

    def _admit(self, kind: str, node: str, pod: dict[str, Any]) -> bool:
        """The kubelet's admission: False for a pod this node refused (its Failed status is on its way)."""
        uid = pod["metadata"]["uid"]
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            # An ended pod holds nothing on its node.
            self.admitted.release(node, uid)
            if kind == "DELETED":
                self.refused.discard(uid)
        if uid in self.refused:
            return False
        if kind == "DELETED" or phase in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            return True
        if phase == "Running":
            # Admitted before this agent (re)started: it holds its share, whatever the order of the listing.
            self.admitted.admit(node, uid, {}, pod["spec"])
            return True
        refused = None
        if not self.ctx.nodes[node].simulated:
            refused = admission.machine_refusal(admission.available_memory())
        if refused is None:
            allocatable = capacity(self.ctx.nodes[node], self.config)
            refused = self.admitted.admit(node, uid, allocatable, pod["spec"])
        if refused is None:
            return True
        self.refused.add(uid)
        log.warning("node %s refused pod %s: %s", node, pod["metadata"]["name"], refused.message)
        self.refusals.submit(self._refuse, pod, refused)
        return False

    def _refuse(self, pod: dict[str, Any], refused: admission.Refusal) -> None:
        meta = pod["metadata"]
        status = {"phase": "Failed", "reason": refused.reason, "message": f"Pod {refused.message}"}
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            with_retry(
                lambda: self.ctx.kube.merge_patch(path, {"status": status}),
                f"refusal of {meta['namespace']}/{meta['name']}",
                self.stop,
            )
        except ApiError as error:
            if error.status != 404:
                log.warning("refusal of %s/%s not written: %s", meta["namespace"], meta["name"], error)

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        if name not in self.ctx.nodes:
            return
        if kind == "DELETED":
            if self.ctx.heartbeats.is_crashed(name):
                # A crashed machine's Node deleted, as a cloud's controller deletes one whose machine is gone: it
                # stays away (a live node's would register again at its next status) until a machine of that
                # name boots, then registers afresh, without the crash annotation, which brings it back.
                log.warning(
                    "crashed node %s was deleted; it registers again in %.0f s", name, NODE_RETURN_SECONDS
                )
                comes_back = threading.Timer(NODE_RETURN_SECONDS, self._register_again, args=(name,))
                comes_back.daemon = True
                comes_back.start()
            return
        crashed = (node["metadata"].get("annotations") or {}).get(CRASH_ANNOTATION, "").lower() == "true"
        if self.ctx.heartbeats.set_crashed(name, crashed):
            log.warning("node %s %s", name, "crashed on request" if crashed else "is back")
            with self.workers_lock:
                workers = [w for w in self.workers.values() if w.node == name]
            if crashed:
                # From here, not from each pod's thread (which may be in a status write): one pod after another
                # left the rest running for moments, long enough for a spare to see its node's rendezvous store
                # gone and tell the operator it was joining the group.
                kill_at_once([process for worker in workers for process in worker.container_processes()])
            for worker in workers:
                worker.wake.set()
            if not crashed and self.ctx.nodes[name].simulated:
                # pods bound while it was down got no answer: handle them now
                for pod in self.pods.items():
                    if (pod.get("spec") or {}).get("nodeName") == name:
                        self.simulated.handle("MODIFIED", pod)

    def _register_again(self, name: str) -> None:
        if self.stop.is_set():
            return
        try:
            spec = self.ctx.nodes[name]
            with_retry(lambda: self.ctx.heartbeats.register_again(spec), f"registration of {name}", self.stop)
        except Exception as error:  # the agent goes on; the node stays away
            log.warning("node %s not registered again: %s", name, error)

    def _on_service(self, kind: str, service: dict[str, Any]) -> None:
        self.dns.set_service(service, kind != "DELETED")
        self.real_node_dns.set_service(service, kind != "DELETED")

    def _on_endpoints(self, kind: str, endpoints: dict[str, Any]) -> None:
        self.dns.set_endpoints(endpoints, kind != "DELETED")
        self.real_node_dns.set_endpoints(endpoints, kind != "DELETED")

    def _log_source(
        self, namespace: str, pod: str, container: str
    ) -> tuple[Path, Callable[[Path], bool]] | None:
        with self.ctx.registry_lock:
            worker = self.ctx.registry.get((namespace, pod))
        if worker is None:
            return None

        def is_live(path: Path) -> bool:
            process = worker.current_process(container)
            return process is not None and process.log_path == path and not process.log_closed.is_set()

        return worker.dir / "logs" / container, is_live

    def _remove_stale_pod_dirs(self, pods: Informer) -> None:
        """Pod folders whose pod no longer exists (deleted while the agent was down) are removed."""
        while not pods.synced.wait(1.0):
            if self.stop.is_set():
                return
        live = {p["metadata"]["uid"] for p in pods.items()}
        for folder in (self.config.state_dir / "pods").glob("*"):
            if folder.name not in live:
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed the folder of vanished pod %s", folder.name)

    # ---- shutdown -----------------------------------------------------------------------------------------
    def _shutdown(self, dns: DnsServer, logs: LogServer) -> None:
        log.info("stopping: ending every pod process")
        self.refusals.shutdown(wait=False, cancel_futures=True)
        self.simulated.shutdown()
        with self.workers_lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.wake.set()
        deadline = time.monotonic() + SHUTDOWN_GRACE
        for worker in workers:
            worker.done.wait(max(0.1, deadline - time.monotonic()))
        for worker in workers:
            for process in list(worker.processes.values()):
                process.signal(signal.SIGKILL)
        dns.stop()
        logs.stop()
        log.info("node agent stopped")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    config = parse_config(argv)
    config = config.model_copy(update={"machine_memory": machine_memory_bytes()})
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    Agent(config, stop).run()
    return 0
