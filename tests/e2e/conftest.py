"""The local cluster's test helpers: the `Cluster` handle, waiting, the operator's install and the shared checks (the
session's cluster and operator fixtures live in tests/conftest.py, shared with the chaos suite)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from phalanx.helmsdk import Helm

REAL_NODES = 4
SIMULATED_NODES = 5
"""Simulated nodes hold 250 pods each: enough for the 1,000-pod gang tests."""


@dataclass
class Cluster:
    state_dir: Path
    kubeconfig: Path
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def kubectl_path(self) -> Path:
        return self.state_dir / "bin" / "kubectl"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
            )
        return result

    def apply(
        self, manifest: dict[str, Any] | list[dict[str, Any]] | str, namespace: str | None = None
    ) -> None:
        text = (
            manifest
            if isinstance(manifest, str)
            else yaml.safe_dump_all(manifest if isinstance(manifest, list) else [manifest])
        )
        self.kubectl("apply", *(["-n", namespace] if namespace else []), "-f", "-", input=text)

    def get_json(self, *args: str) -> dict[str, Any]:
        """`kubectl get ARGS -o json`. The reads tests poll most (one TrainingJob or Lease by name) go through
        this process's API client instead: a kubectl process costs about 80 ms of CPU, and a test polling twice a
        second took that from the pods it watched start on CI's two cores."""
        polled = _polled_object(args)
        if polled is None:
            return json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        (group, version, plural), namespace, name = polled
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=60
            )
        except client.ApiException as error:
            raise AssertionError(
                f"kubectl get {' '.join(args)} failed ({error.status}): {error.reason}"
            ) from error
        return found

    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def node_healthy(self, node: str) -> bool:
        """Ready and free of the node controller's not-ready/unreachable taints."""
        found = self.core.read_node(node)
        ready = any(c.type == "Ready" and c.status == "True" for c in found.status.conditions or [])
        tainted = any(t.key in NODE_TROUBLE_TAINTS for t in found.spec.taints or [])
        return ready and not tainted

    def wait_node_healthy(self, node: str, timeout: float = 90) -> None:
        """After a crash test: later tests must not get pods onto a node still tainted from it."""
        wait_for(lambda: self.node_healthy(node), timeout, message=f"{node} to be Ready and untainted again")


NODE_TROUBLE_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")

_POLLED_KINDS = {
    **dict.fromkeys(("trainingjob", "trainingjobs", "tj"), ("phalanx.dev", "v1alpha1", "trainingjobs")),
    **dict.fromkeys(("lease", "leases"), ("coordination.k8s.io", "v1", "leases")),
}
"""Kinds tests poll by name, with their API group, version and resource (the custom-objects client reads any of
them as the JSON the API server sent)."""


def _polled_object(args: tuple[str, ...]) -> tuple[tuple[str, str, str], str, str] | None:
    """(group, version, resource), namespace and name of `get KIND NAME -n NAMESPACE` for a kind tests poll; None
    for any other arguments."""
    if len(args) != 4 or args[2] not in ("-n", "--namespace") or args[0] not in _POLLED_KINDS:
        return None
    return _POLLED_KINDS[args[0]], args[3], args[1]


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    interval: float = 0.5,
    message: str | Callable[[], str] = "",
) -> Any:
    """Polls until `predicate` returns something truthy; fails the test with `message` after `timeout` seconds.

    A callable `message` is called only then, so that it can say what was last seen.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as error:  # the object may not exist yet
            last_error = error
        time.sleep(interval)
    if callable(message):
        message = message()
    raise AssertionError(
        f"timed out after {timeout} s waiting for {message or predicate}"
        + (f" (last error: {last_error})" if last_error else "")
    )


BENCH_SMOKE_TIMEOUT = 1700
"""Seconds a `phalanx bench --quick` run may take in a test (CI machines run them several times slower)."""


def assert_demo_succeeded(result: subprocess.CompletedProcess[str], report: Path) -> dict[str, Any]:
    """`phalanx demo` trained the tiny GPT to the end through its injected failure and wrote its report; the
    summary it wrote."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary: dict[str, Any] = json.loads((report / "summary.json").read_text())
    assert summary["result"] == "Succeeded"
    assert summary["steps"] == 300
    assert summary["preflight"]["state"] == "Passed", summary["preflight"]
    assert summary["killed_worker"].startswith("tinygpt-worker-")
    # The kill is reported (and marked on the plot) at the killed group's own step, the incident's.
    (incident, *_) = [i for i in summary["incidents"] if i.get("worker") == summary["killed_worker"]]
    assert summary["killed_at_step"] == incident["detectedStep"], (summary["killed_at_step"], incident)
    assert summary["final_loss"] < summary["first_loss"]
    assert (report / "loss.png").stat().st_size > 0
    assert "=== Phalanx demo ===" in result.stdout
    return summary


def run_bench_smoke(
    cluster: Cluster, benchmarks: list[str], out: Path
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """`phalanx bench --quick --only <benchmarks>` on the session's cluster: the run (results.json) and its
    results by name. A run that
    fails or runs out of time fails the test with the end of what the bench printed (its progress log)."""
    command = [
        sys.executable, "-m", "phalanx.cli", "bench", "--quick", "--only", *benchmarks,
        "--state-dir", str(cluster.state_dir), "--out", str(out),
    ]  # fmt: skip
    try:
        process = subprocess.run(
            command, capture_output=True, text=True, timeout=BENCH_SMOKE_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as expired:
        printed = expired.stderr or b""
        text = printed.decode(errors="replace") if isinstance(printed, bytes) else printed
        pytest.fail(f"phalanx bench ran past {BENCH_SMOKE_TIMEOUT} s; it last printed:\n{text[-6000:]}")
    assert process.returncode == 0, process.stderr[-6000:]
    run = json.loads((out / "results.json").read_text())
    results = {result["name"]: result for result in run["results"]}
    assert list(results) == benchmarks
    return run, results


POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
DEFAULT_POD_SECURITY = "restricted"
"""The Pod Security level the test namespaces enforce unless a test's `pod_security` marker says why not."""
RESTRICTED_CONTAINER: dict[str, Any] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
"""A container securityContext that meets `restricted` on its own (for the pods tests create themselves)."""


def pod_security_labels(level: str) -> dict[str, str]:
    """Namespace labels by which the API server enforces Pod Security `level` (and warns and audits at it)."""
    assert level in POD_SECURITY_LEVELS, level
    return {f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "warn", "audit")}


def pod_security_level(node: pytest.Item) -> str:
    """The level a test's namespace enforces: `restricted`, unless its `pod_security(level, reason=...)` marker
    (which must say why) asks for a lower one."""
    marker = node.get_closest_marker("pod_security")
    if marker is None:
        return DEFAULT_POD_SECURITY
    assert marker.kwargs.get("reason"), f"{node.nodeid}: a pod_security marker must give its reason"
    return str(marker.args[0])


def create_namespace(cluster: Cluster, name: str, level: str = DEFAULT_POD_SECURITY) -> None:
    """Create namespace `name` enforcing Pod Security `level` from its first pod on, with its `default`
    ServiceAccount: pods wait for that account, and the controller that makes it would add a moment to every
    test (whichever of the two creates it first, the other finds it there)."""
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    manifest["metadata"]["labels"] = pod_security_labels(level)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": name},
    }
    items = {"apiVersion": "v1", "kind": "List", "items": [manifest, account]}
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(items), check=False)
    if result.returncode != 0 and "AlreadyExists" not in result.stderr:
        raise AssertionError(f"namespace {name} not created: {result.stderr}")


REPO_ROOT = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "phalanx-system"
OPERATOR_VALUES = {
    "reconcileIntervalSeconds": 2,
    "stepReportSeconds": 6,
    "logLevel": "DEBUG",
    "replicaCount": 1,
}
"""The tests' operator: reconciles every 2 s, and a status written for its step alone every 6 s (the chart's 30
would leave the step that tests wait for half a minute behind the workers)."""


@dataclass
class Operator:
    namespace: str
    release: str

    def pods(self, cluster: Cluster) -> list[client.V1Pod]:
        return cluster.core.list_namespaced_pod(
            self.namespace, label_selector="app.kubernetes.io/name=phalanx"
        ).items

    @property
    def lease(self) -> str:
        """The Lease the replicas compete for (the chart's `<fullname>-leader`; the release's name is the
        fullname here)."""
        return f"{self.release}-leader"

    def ready_pods(self, cluster: Cluster) -> list[str]:
        """The names of the operator's pods that run, are Ready and are not being deleted."""
        return sorted(
            pod.metadata.name
            for pod in self.pods(cluster)
            if pod.metadata.deletion_timestamp is None
            and pod.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        )

    def scale(self, cluster: Cluster, replicas: int) -> None:
        """`helm upgrade` the release to `replicas` operator replicas, its other values kept; return once that
        many run and one of them holds the Lease."""
        Helm(cluster.kubeconfig, self.namespace).upgrade(
            REPO_ROOT / "charts" / "phalanx", self.release, {"replicaCount": replicas}, reuse_values=True
        )

        def settled() -> bool:
            pods = [p for p in self.pods(cluster) if p.metadata.deletion_timestamp is None]
            ready = self.ready_pods(cluster)
            return len(ready) == len(pods) == replicas and self.leader(cluster) in ready

        wait_for(settled, 180, message=f"{replicas} operator replicas, one of them holding the Lease")

    def leader(self, cluster: Cluster) -> str | None:
        """The pod holding the operator's Lease (the one acting), None when none does."""
        try:
            lease = client.CoordinationV1Api(cluster.core.api_client).read_namespaced_lease(
                self.lease, self.namespace
            )
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return lease.spec.holder_identity or None


def operator_ready(cluster: Cluster) -> bool:
    pods = cluster.core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=phalanx"
    ).items
    return any(
        pod.status.phase == "Running"
        and pod.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        for pod in pods
    )


@pytest.fixture
def api_clients() -> Iterator[list[client.ApiClient]]:
    """Kubernetes clients a test opens (e.g. with a worker's credentials), closed after it."""
    clients: list[client.ApiClient] = []
    yield clients
    for each in clients:
        each.close()
