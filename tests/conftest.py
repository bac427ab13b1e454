"""Fixtures every test folder shares: the local S3 server, and the one real local cluster (with the operator
installed from its chart) that the end-to-end and chaos suites share in a test session."""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter
from kubernetes import config

from phalanx.devcluster import controlplane

from .e2e.conftest import (
    OPERATOR_NAMESPACE,
    REAL_NODES,
    REPO_ROOT,
    SIMULATED_NODES,
    Cluster,
    Operator,
    operator_ready,
    wait_for,
)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3-compatible server (moto, a registry package) on this machine: the object-store tier's tests
    and the pods of the local cluster reach it at the returned URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("PHALANX_TEST_STATE_DIR")
    state_dir = Path(reuse) if reuse else tmp_path_factory.mktemp("cluster")
    layout = controlplane.up(state_dir, nodes=REAL_NODES, simulated_nodes=SIMULATED_NODES, quiet=True)
    api = config.new_client_from_config(config_file=str(layout.kubeconfig))
    try:
        yield Cluster(state_dir=layout.root, kubeconfig=layout.kubeconfig, api=api)
    finally:
        api.close()
        if not reuse:
            controlplane.down(state_dir, quiet=True)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    version = controlplane.Layout(cluster.state_dir).kubernetes_version
    wait_for(
        lambda: controlplane.service_account_ready(
            cluster.core.read_namespaced_service_account("default", name).secrets, version
        ),
        timeout=60,
        message=f"the default ServiceAccount of namespace {name}",
    )
    request.node.phalanx_namespace = name
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "cluster" not in getattr(item, "fixturenames", ()):
        return
    cluster: Cluster | None = getattr(item, "funcargs", {}).get("cluster")
    if cluster is None:
        return
    for log in sorted(cluster.logs_dir().glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-40:]
        report.sections.append((f"log {log.name} (last 40 lines)", "\n".join(lines)))
    namespace = getattr(item, "phalanx_namespace", None)
    scope = ["-n", namespace] if namespace else ["-A"]
    commands = [["get", "pods", "-o", "wide", *scope], ["get", "events", "--sort-by=.lastTimestamp", *scope]]
    if "operator" in item.fixturenames:
        commands.append(["get", "trainingjobs", "-o", "yaml", *scope])
        commands.append(
            ["logs", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=phalanx", "--tail=150"]
        )
    if namespace:
        # What the pods themselves said is usually the answer; their logs go with their namespace.
        for pod in cluster.core.list_namespaced_pod(namespace).items:
            commands.append(["logs", "-n", namespace, pod.metadata.name, "--tail=60"])
    for what in commands:
        result = cluster.kubectl(*what, check=False, timeout=30)
        report.sections.append((f"kubectl {' '.join(what)}", result.stdout + result.stderr))
    # The dumps above are long and a CI log keeps the tail: say once more, last, what failed.
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        report.sections.append(("the failure (repeated)", f"{crash.path}:{crash.lineno}: {crash.message}"))


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[Operator]:
    """The operator installed from the Helm chart with Helm's SDK; it runs as a pod under the chart's RBAC."""
    import helm_python

    helm = helm_python.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=OPERATOR_NAMESPACE)
    release = "phalanx"
    with contextlib.suppress(helm_python.HelmError):
        helm.uninstall(release, ignore_not_found=True, wait="watcher")
    helm.install(
        str(REPO_ROOT / "charts" / "phalanx"),
        release,
        values={"reconcileIntervalSeconds": 2, "logLevel": "DEBUG"},
        namespace=OPERATOR_NAMESPACE,
        create_namespace=True,
    )
    wait_for(lambda: operator_ready(cluster), 120, message="the operator pod to be Ready")
    try:
        yield Operator(namespace=OPERATOR_NAMESPACE, release=release)
    finally:
        with contextlib.suppress(helm_python.HelmError):
            helm.uninstall(release, ignore_not_found=True, wait="watcher")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Say why a test failed the moment it fails, not only in the summary at the end: a CI run stopped at its
    time limit never prints that summary, and then its log would show only a row of Fs."""
    if not report.failed:
        return
    config = _session_config.get("config")
    terminal = config.pluginmanager.get_plugin("terminalreporter") if config else None
    if not isinstance(terminal, TerminalReporter):
        return
    text = report.longreprtext.splitlines()
    terminal.write_line("")
    terminal.write_sep("-", f"{report.nodeid} failed ({report.when}), {report.duration:.0f} s", red=True)
    terminal.write_line("\n".join(text[-40:]))


_session_config: dict[str, pytest.Config] = {}


def pytest_configure(config: pytest.Config) -> None:
    _session_config["config"] = config
