"""The local cluster a benchmark runs against: started in a scratch state dir (or reused), the operator
installed with Helm as the end-to-end tests do, and the probes the benchmarks read (apiserver metrics,
the operator's process and metrics endpoint)."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from kubernetes import client, config

from phalanx import assets, helmsdk
from phalanx.bench.kubeobjects import custom_object, is_terminating, labels_of, name_of, uid_of
from phalanx.devcluster import controlplane
from phalanx.helmsdk import Helm

REAL_NODES = 3
"""Agent nodes that run pods as processes (the operator, rendezvous stores, real training)."""
SIMULATED_NODES = 5
"""Simulated nodes hold 250 pods each: room for the 1,000-worker gang and its spares."""
OPERATOR_NAMESPACE = "phalanx-system"
OPERATOR_RELEASE = "phalanx"
LEADER_LEASE = f"{OPERATOR_RELEASE}-leader"
"""The Lease the operator's replicas compete for (the chart's `<fullname>-leader`): its holder is the one acting."""
OPERATOR_SELECTOR = "app.kubernetes.io/name=phalanx"
OPERATOR_CONTAINER = "operator"
OPERATOR_VALUES: dict[str, Any] = {"logLevel": "INFO"}
"""Chart values the harness installs with; everything else keeps the chart's defaults (what users get)."""
SIMULATED_LABEL = "phalanx.dev/simulated"
SIMULATED_TOLERATION = {"key": SIMULATED_LABEL, "operator": "Exists", "effect": "NoSchedule"}


class BenchError(Exception):
    """A benchmark could not do what it needs (the cluster is missing something, a wait timed out)."""


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.5, message: str = "") -> Any:
    """Poll until `predicate` returns something truthy; BenchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as error:  # the object may not exist yet
            last_error = error
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise BenchError(
        f"timed out after {timeout:.0f} s waiting for {message or predicate}"
        + (f" (last error: {last_error})" if last_error else "")
    )


def is_ready(pod: client.V1Pod) -> bool:
    return (
        pod.status is not None
        and pod.status.phase == "Running"
        and not is_terminating(pod)
        and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    )


def request_milli(value: str | None) -> int:
    """A CPU quantity in millicores ("250m", "2", "0.5")."""
    if not value:
        return 0
    if value.endswith("m"):
        return int(float(value[:-1]))
    return int(float(value) * 1000)


_MEMORY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def memory_bytes(value: str | None) -> int:
    """A memory quantity in bytes ("64Mi", "16Gi", "1000")."""
    if not value:
        return 0
    for suffix, factor in sorted(_MEMORY_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * factor)
    return int(float(value))


@dataclass(frozen=True)
class Cleanup:
    """How deleting a benchmark's namespace went."""

    seconds: float
    forced: int
    """TrainingJobs whose finalizer the harness removed because the operator had not after the timeout."""

    def note(self, what: str) -> str | None:
        if not self.forced:
            return None
        return (
            f"{what}: the operator had not released the finalizer of {self.forced} TrainingJobs when the "
            f"cleanup timed out; the harness removed them ({self.seconds:.0f} s in all)."
        )


@dataclass
class OperatorInfo:
    """The operator pod the benchmarks measure."""

    pod: str
    uid: str
    ip: str
    settings: dict[str, str]
    """The operator container's plain environment values (its settings in force)."""
    installed_here: bool
    """Whether this harness installed it (and so removes it from a reused cluster afterwards)."""

    @property
    def metrics_port(self) -> int:
        return int(self.settings.get("PHALANX_OPERATOR_METRICS_PORT", "8080") or 0)

    @property
    def reconcile_interval(self) -> float:
        return float(self.settings.get("PHALANX_OPERATOR_RECONCILE_INTERVAL_SECONDS", "5") or 5)


@dataclass
class BenchCluster:
    """A running local cluster plus the clients and probes the benchmarks use."""

    state_dir: Path
    kubeconfig: Path
    owned: bool
    """Started by this harness (stopped and removed at the end) rather than given with --state-dir."""
    log: Callable[[str], None]
    api: client.ApiClient = field(init=False)
    operator: OperatorInfo | None = None

    def __post_init__(self) -> None:
        self.api = self.new_api_client()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        state_dir: Path | None,
        scratch: Path,
        log: Callable[[str], None],
        nodes: int = REAL_NODES,
        simulated_nodes: int = SIMULATED_NODES,
        gpus_per_node: int = 0,
        node_heartbeat_seconds: float = 0.0,
    ) -> BenchCluster:
        """Start a cluster in `scratch` (or reuse/start the one in `state_dir`, which is left running)."""
        owned = state_dir is None
        root = scratch / "cluster" if state_dir is None else state_dir
        log(f"local cluster in {root} ({nodes} nodes, {simulated_nodes} simulated)")
        started = time.monotonic()
        layout = controlplane.up(
            root,
            nodes=nodes,
            simulated_nodes=simulated_nodes,
            gpus_per_node=gpus_per_node,
            quiet=True,
            node_heartbeat_seconds=node_heartbeat_seconds,
        )
        log(f"local cluster ready in {time.monotonic() - started:.0f} s")
        return cls(state_dir=layout.root, kubeconfig=layout.kubeconfig, owned=owned, log=log)

    def new_api_client(self) -> client.ApiClient:
        """A client of its own (one per thread that streams a watch)."""
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        return api

    def close(self) -> None:
        if self.operator is not None and self.operator.installed_here and not self.owned:
            self.log("removing the operator release this harness installed")
            with contextlib.suppress(Exception):
                self._helm().uninstall(OPERATOR_RELEASE, ignore_not_found=True, wait="watcher")
        self.api.close()
        if self.owned:
            self.log("stopping the local cluster")
            controlplane.down(self.state_dir, purge=True, quiet=True)

    def describe(self) -> dict[str, Any]:
        """What the report says about the cluster."""
        nodes = self.core.list_node().items
        simulated = [n for n in nodes if labels_of(n).get(SIMULATED_LABEL) == "true"]
        facts: dict[str, Any] = {
            "state dir": str(self.state_dir) + (" (started for this run)" if self.owned else " (reused)"),
            "nodes": f"{len(nodes) - len(simulated)} agent nodes (pods run as processes), "
            f"{len(simulated)} simulated nodes (pods only pretend to run)",
            "control plane": f"Kubernetes {self.server_version()} (etcd, kube-apiserver, controller-manager, "
            "scheduler) and the Phalanx node agent, all on this machine",
        }
        if self.operator is not None:
            settings = ", ".join(f"{key}={value}" for key, value in sorted(self.operator.settings.items()))
            facts["operator"] = f"pod {self.operator.pod} ({settings})"
        return facts

    # ------------------------------------------------------------------ clients
    def server_version(self) -> str:
        """The API server's own word on its release, e.g. `v1.37.2`."""
        return str(client.VersionApi(self.api).get_code().git_version)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.api)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.state_dir / "bin" / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise BenchError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def apply(self, manifests: list[dict[str, Any]], namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(manifests), timeout=600)

    def raw_get(self, path: str) -> str:
        """GET an apiserver path (e.g. /metrics) as text, with the admin credentials."""
        method, url, headers, body, post = self.api.param_serialize(
            "GET", path, header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, headers, body, post)
        data = response.read()
        if response.status != 200:
            raise BenchError(f"GET {path}: {response.status} {response.reason}")
        return data.decode()

    def apiserver_metrics(self) -> str:
        return self.raw_get("/metrics")

    # ------------------------------------------------------------------ namespaces
    def create_namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:5]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        version = controlplane.Layout(self.state_dir).kubernetes_version
        wait_for(
            lambda: controlplane.service_account_ready(
                self.core.read_namespaced_service_account("default", name).secrets, version
            ),
            timeout=120,
            message=f"the default ServiceAccount of namespace {name}",
        )
        return name

    def delete_namespace(self, name: str, wait: bool = True, timeout: float = 600) -> Cleanup:
        """Delete a namespace and (with `wait`) wait until it is gone. TrainingJobs whose finalizer the
        operator has not released after `timeout` get it removed, so a slow operator never leaves the cluster
        dirty; the returned `Cleanup` says so. Never raises: a benchmark's measurements outlive its cleanup."""
        started = time.monotonic()
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespace(name)
        if not wait:
            return Cleanup(0.0, forced=0)

        def gone() -> bool:
            try:
                self.core.read_namespace(name)
            except client.ApiException as error:
                return error.status == 404
            return False

        try:
            wait_for(gone, timeout, interval=1.0, message=f"namespace {name} to be deleted")
            return Cleanup(time.monotonic() - started, forced=0)
        except BenchError:
            pass
        forced = self.release_finalizers(name)
        self.log(f"namespace {name}: removed the finalizer of {forced} TrainingJobs after {timeout:.0f} s")
        try:
            wait_for(gone, 300, interval=1.0, message=f"namespace {name} to be deleted")
        except BenchError as error:
            self.log(str(error))
        return Cleanup(time.monotonic() - started, forced=forced)

    def release_finalizers(self, namespace: str) -> int:
        released = 0
        try:
            jobs = custom_object(
                self.custom.list_namespaced_custom_object(
                    "phalanx.dev", "v1alpha1", namespace, "trainingjobs"
                )
            )
        except client.ApiException:
            return 0
        for job in jobs.get("items") or []:
            with contextlib.suppress(client.ApiException):
                self.custom.patch_namespaced_custom_object(
                    "phalanx.dev", "v1alpha1", namespace, "trainingjobs", job["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
                released += 1
        return released

    def simulated_nodes(self) -> list[client.V1Node]:
        return self.core.list_node(label_selector=f"{SIMULATED_LABEL}=true").items

    # ------------------------------------------------------------------ the operator
    def _helm(self) -> Helm:
        return Helm(self.kubeconfig, OPERATOR_NAMESPACE)

    def operator_pods(self) -> list[client.V1Pod]:
        return [
            pod
            for pod in self.core.list_namespaced_pod(
                OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR
            ).items
            if not is_terminating(pod)
        ]

    def leader_pod(self) -> client.V1Pod | None:
        """The Ready operator pod that acts: the holder of the operator's Lease, or without leader election (no
        Lease) the one Ready pod. None while that is not known yet."""
        ready = [pod for pod in self.operator_pods() if is_ready(pod)]
        try:
            spec = self.coordination.read_namespaced_lease(LEADER_LEASE, OPERATOR_NAMESPACE).spec
            holder = spec.holder_identity if spec is not None else None
        except client.ApiException as error:
            if error.status != 404:
                raise
            return ready[0] if len(ready) == 1 else None
        return next((pod for pod in ready if name_of(pod) == holder), None)

    def ensure_operator(self, values: dict[str, Any] | None = None) -> OperatorInfo:
        """The running operator; installed from the chart with Helm's SDK when none runs, with `values` beside
        `OPERATOR_VALUES`."""
        leader = self.leader_pod()
        if self.operator is not None and leader is not None and uid_of(leader) == self.operator.uid:
            return self.operator
        installed_here = False
        if not any(is_ready(pod) for pod in self.operator_pods()):
            chart = assets.chart_dir()
            chosen = {**OPERATOR_VALUES, **(values or {})}
            self.log(f"installing the operator with Helm (values {chosen})")
            helm = self._helm()
            with contextlib.suppress(helmsdk.sdk().HelmError):
                helm.uninstall(OPERATOR_RELEASE, ignore_not_found=True, wait="watcher")
            helm.install(
                str(chart),
                OPERATOR_RELEASE,
                values=chosen,
                create_namespace=True,
            )
            installed_here = True
        pod = wait_for(self.leader_pod, 180, message="the operator's acting pod to be Ready")
        container = next(c for c in pod.spec.containers if c.name == OPERATOR_CONTAINER)
        settings = {env.name: env.value for env in container.env or [] if env.value is not None}
        settings = {key: value for key, value in settings.items() if key.startswith("PHALANX_OPERATOR_")}
        self.operator = OperatorInfo(
            pod=pod.metadata.name,
            uid=pod.metadata.uid,
            ip=pod.status.pod_ip,
            settings=settings,
            installed_here=installed_here,
        )
        if self.operator.metrics_port:
            # Ready means started (the agent runs no probes): wait until the operator serves its metrics.
            wait_for(self.operator_metrics, 120, message="the operator's metrics endpoint")
        return self.operator

    def upgrade_operator(self, values: dict[str, Any], settings: dict[str, str] | None = None) -> None:
        """`helm upgrade` of the installed release with `values`, its other values kept; with `settings`
        (`PHALANX_OPERATOR_*` variables), wait until the operator acting holds them."""
        self.ensure_operator()
        self.log(f"upgrading the operator with Helm (values {values})")
        self._helm().upgrade(assets.chart_dir(), OPERATOR_RELEASE, values, reuse_values=True)
        if not settings:
            return

        def holds_them() -> bool:
            self.operator = None
            return settings.items() <= self.ensure_operator().settings.items()

        wait_for(holds_them, 300, message=f"the operator acting with {settings}")

    def scale_operator(self, replicas: int) -> None:
        """Run `replicas` operator replicas (`helm upgrade` of the installed release, its other values kept), and
        wait until that many run, one of them holding the operator's Lease."""
        self.upgrade_operator({"replicaCount": replicas})
        wait_for(
            lambda: (
                len([p for p in self.operator_pods() if is_ready(p)]) == len(self.operator_pods()) == replicas
                and self.leader_pod() is not None
            ),
            240,
            message=f"{replicas} operator replicas, one holding the Lease",
        )
        self.operator = None
        self.ensure_operator()

    def operator_process(self) -> psutil.Process:
        """The operator's process on this machine (the node agent runs pods as local processes)."""
        operator = self.ensure_operator()
        pid_file = self.state_dir / "pods" / operator.uid / "run" / f"{OPERATOR_CONTAINER}.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
            return psutil.Process(pid)
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess) as error:
            raise BenchError(f"cannot find the operator's process from {pid_file}: {error}") from error

    def operator_metrics(self) -> str:
        operator = self.operator or self.ensure_operator()
        if not operator.metrics_port:
            raise BenchError("the operator's metrics endpoint is off (metrics.enabled=false)")
        url = f"http://{operator.ip}:{operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def operator_log_lines(self, since: float) -> list[str]:
        """The operator's log lines written since `since` (a time.time() value)."""
        operator = self.operator or self.ensure_operator()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        result = self.kubectl(
            "logs", "-n", OPERATOR_NAMESPACE, operator.pod, "-c", OPERATOR_CONTAINER, f"--since-time={stamp}",
            check=False, timeout=60,
        )  # fmt: skip
        return [line for line in result.stdout.splitlines() if (log_time(line) or since) >= since]


def log_time(line: str) -> float | None:
    """The time of a Python log line (`2024-06-01 12:00:00,123 LEVEL ...`, local time), if it has one."""
    try:
        moment = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
        return time.mktime(moment) + int(line[20:23]) / 1000
    except (ValueError, IndexError):
        return None


PROBLEM_LEVELS = ("WARNING", "ERROR", "CRITICAL")


def log_level(line: str) -> str:
    """The level of a Python log line (`2024-06-01 12:00:00,123 LEVEL name: message`), else ""."""
    parts = line.split(" ", 3)
    return parts[2] if len(parts) > 3 and log_time(line) is not None else ""


def problem_lines(lines: list[str]) -> list[str]:
    """The WARNING, ERROR and CRITICAL lines."""
    return [line for line in lines if log_level(line) in PROBLEM_LEVELS]


def warning_summary(lines: list[str], limit: int = 5) -> list[str]:
    """The most frequent WARNING/ERROR messages (timestamps stripped), with their counts."""
    counts: dict[str, int] = {}
    for line in problem_lines(lines):
        message = line.split(" ", 2)[2].strip()[:160]
        counts[message] = counts.get(message, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [f"{count} x {message}" for message, count in ranked[:limit]]


def process_tree_figures(process: psutil.Process) -> tuple[float, float]:
    """(resident MB, CPU seconds) of a process and its children."""
    members = [process]
    with contextlib.suppress(psutil.Error):
        members += process.children(recursive=True)
    rss, cpu = 0.0, 0.0
    for member in members:
        with contextlib.suppress(psutil.Error):
            rss += member.memory_info().rss
            times = member.cpu_times()
            cpu += times.user + times.system
    return rss / 2**20, cpu
