"""Fixtures every test folder shares: the local S3 server, and the one real local cluster (with the operator
installed from its chart) that the end-to-end and chaos suites share in a test session."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest import nodes as pytest_nodes
from _pytest.terminal import TerminalReporter
from kubernetes import config

from phalanx import helmsdk
from phalanx.devcluster import controlplane, processes
from phalanx.devcluster.kueue import controller as kueue_controller
from phalanx.helmsdk import Helm

from .e2e.conftest import (
    OPERATOR_NAMESPACE,
    OPERATOR_VALUES,
    REAL_NODES,
    REPO_ROOT,
    SIMULATED_NODES,
    Cluster,
    Operator,
    create_namespace,
    operator_ready,
    pod_security_labels,
    pod_security_level,
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
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if reuse and worker:  # a cluster each
        reuse = f"{reuse}-{worker}"
    state_dir = Path(reuse) if reuse else tmp_path_factory.mktemp("cluster")
    layout = controlplane.up(state_dir, nodes=REAL_NODES, simulated_nodes=SIMULATED_NODES, quiet=True)
    api = config.new_client_from_config(config_file=str(layout.kubeconfig))
    try:
        yield Cluster(state_dir=layout.root, kubeconfig=layout.kubeconfig, api=api)
    finally:
        api.close()
        if not reuse:
            controlplane.down(state_dir, quiet=True)


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Iterator[processes.PidRecord]:
    """Kueue's controller (devcluster/kueue) on the session's cluster, started once by the first test that asks
    for it: ready when its webhooks answer the API server. Stopped with its webhooks removed after the session's
    last test, so that the cluster's other tests never depend on it."""
    layout = controlplane.Layout(cluster.state_dir)
    record = kueue_controller.up(layout)
    try:
        yield record
    finally:
        kueue_controller.down(layout)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    # Enforced from the namespace's first pod: every pod a test makes there meets the level, or is refused.
    create_namespace(cluster, name, pod_security_level(request.node))
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
        # The heartbeat Leases carry each worker's phase and step: where a pod stays Running, whether it
        # trains, saves or waits.
        commands.append(["get", "leases", "-o", "yaml", *scope])
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
    helm_python = helmsdk.sdk()
    helm = Helm(cluster.kubeconfig, OPERATOR_NAMESPACE)
    release = "phalanx"
    with contextlib.suppress(helm_python.HelmError):
        helm.uninstall(release, ignore_not_found=True, wait="watcher")
    # The chart's pod meets `restricted`: its namespace enforces it before the pod exists.
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    labels = [f"{key}={value}" for key, value in pod_security_labels("restricted").items()]
    cluster.kubectl("label", "namespace", OPERATOR_NAMESPACE, "--overwrite", *labels)
    helm.install(
        str(REPO_ROOT / "charts" / "phalanx"),
        release,
        # One replica (leader election still on): the chaos tests freeze, kill and restart the operator's one
        # process; tests/e2e/test_operator_ha.py scales it to the chart's two for the takeover tests.
        values=OPERATOR_VALUES,
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
    time limit never prints that summary, and then its log would show only a row of Fs. With the cluster's
    state (its pods, the node agent's last lines) and the machine's, briefly: enough to tell a test's failure
    from a cluster or a machine that can no longer run pods."""
    if report.when == "call" and "e2e" in report.keywords:
        _note_cluster_outcome(report)
    _timeline.append(
        {
            "test": report.nodeid,
            "phase": report.when,
            "start": round(report.start, 1),
            "seconds": round(report.duration, 2),
            "outcome": report.outcome,
        }
    )
    config = _session_config.get("config")
    terminal = config.pluginmanager.get_plugin("terminalreporter") if config else None
    if not isinstance(terminal, TerminalReporter):
        return
    if report.duration >= SLOW_TEST_SECONDS:
        _say_slow(terminal, report)
    if not report.failed:
        return
    text = report.longreprtext.splitlines()
    terminal.write_line("")
    terminal.write_sep("-", f"{report.nodeid} failed ({report.when}), {report.duration:.0f} s", red=True)
    terminal.write_line("\n".join(text[-30:]))
    for title, content in report.sections:
        if title.startswith(("kubectl get pods", "kubectl get events", "log node-agent")):
            terminal.write_line(f"-- {title}, last 12 lines:")
            terminal.write_line("\n".join(content.splitlines()[-12:]))
    terminal.write_line(f"-- the machine now: {machine_state()}")


SLOW_TEST_SECONDS = 40.0
"""A phase of a test that takes this long is named in the live output with its time and the session's: a CI run
stopped at its time limit never prints the `--durations` table, and then this is where its time went."""
_session_started = time.monotonic()


def _say_slow(terminal: TerminalReporter, report: pytest.TestReport) -> None:
    elapsed = (time.monotonic() - _session_started) / 60
    terminal.write_line("")
    terminal.write_line(
        f"[slow] {report.nodeid} ({report.when}) took {report.duration:.0f} s; the session is at {elapsed:.1f} min"
    )


_session_config: dict[str, pytest.Config] = {}
_sessions: list[pytest.Session] = []
_cluster_failures_in_a_row: list[str] = []
CLUSTER_FAILURES_TO_STOP = 4
"""Tests on the shared local cluster failing one after another: the cluster (or the machine) is broken, and each
further test would only wait out its timeouts. The session stops there, so its summary still gets printed."""


def pytest_configure(config: pytest.Config) -> None:
    _session_config["config"] = config


UNTIMED_LAUNCHER_TESTS = (
    "tests/security/",
    "tests/unit/bench/test_bench_harness.py",
    "tests/unit/worker_runtime/test_ddp_equivalence.py",
    "tests/unit/worker_runtime/test_metrics_endpoint.py",
    "tests/unit/worker_runtime/test_rollback_follower.py",
    "tests/unit/worker_runtime/test_session.py",
    "tests/unit/worker_runtime/test_warmstart.py",
)
"""Launcher tests whose processes only need to finish, judged by no clock."""

TEST_GROUPS = {
    "processes": ("tests/unit/worker_checkpoint/", *UNTIMED_LAUNCHER_TESTS),
    "timed-launchers": ("tests/unit/worker_runtime/",),
}
"""Tests that start training processes on this machine, by group (the first group that names a test wins). With
`-n 2 --dist loadgroup` (`make unit`) a group's tests run one after another on one worker. The timed launchers'
tests judge them by the clock (a spare must stand by while its pair still trains, a hang must be seen within
seconds): two of them side by side on two cores were seen to miss their timing. The other group's processes only
need to finish; its launcher tests are there so that the two groups take about as long (about ten minutes each of
test time), and the rest of the unit tests fill in beside them."""


CLUSTER_SUITES = ("tests/e2e/", "tests/chaos/")
"""The suites on a local cluster. With `-n 2 --dist loadgroup` (`make e2e`) each xdist worker brings up a cluster of
its own (session fixtures are per worker; the two take the host's two routed pod networks), and a test file runs
whole on one worker: its module fixtures are set up once, and its tests run in order."""
SHARED_CLUSTER_GROUPS = {"kueue": ("tests/e2e/test_kueue.py", "tests/e2e/test_kueue_cluster.py")}
"""Files that run on the same worker, so that a fixture of the session (Kueue's controller) starts once."""
LONGEST_FIRST = (
    "tests/e2e/test_image.py",
    "tests/e2e/test_fault_tolerance.py",
    "tests/chaos/test_operator_faults.py",
    "tests/e2e/test_fault_scenarios.py",
    "tests/e2e/test_operator.py",
    "tests/e2e/test_health.py",
    "tests/e2e/test_drills.py",
    "tests/e2e/test_integrations.py",
    "tests/e2e/test_devcluster.py",
    "tests/e2e/test_bad_input.py",
    "tests/e2e/test_preflight.py",
    "tests/e2e/test_kueue.py",
    "tests/e2e/test_kueue_cluster.py",
)
"""Cluster test files that take longest (several minutes each on two cores), in the order the workers take them:
with `--no-loadscope-reorder` (`make e2e`) xdist hands out files in collection order as workers free up (by
default it would hand out those with the most tests first), and a long file taken last would leave the other
worker idle for as long."""


def cluster_test_group(nodeid: str) -> str | None:
    """The xdist group of a cluster test: its file, or a group it shares with other files; None for other tests."""
    if not nodeid.startswith(CLUSTER_SUITES):
        return None
    path = nodeid.split("::", 1)[0]
    return next((group for group, files in SHARED_CLUSTER_GROUPS.items() if path in files), path)


def longest_first(nodeid: str) -> int:
    path = nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((g for g, prefixes in TEST_GROUPS.items() if item.nodeid.startswith(prefixes)), None)
        group = group or cluster_test_group(item.nodeid)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: longest_first(item.nodeid))  # stable: every file keeps its order


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_name_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """What pytest-xdist's `--dist loadgroup` does in each worker, done for pytest 9: xdist (3.8) appends a
    test's group to `item._nodeid`, which pytest 9 no longer reads (a node's id is `item._id`), so the ids the
    worker reports carried no group and every group's tests were spread over both workers."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
        if names and "@" not in item.nodeid:
            item._id = pytest_nodes.coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


def pytest_sessionstart(session: pytest.Session) -> None:
    _sessions.append(session)


_timeline: list[dict[str, object]] = []
"""Every phase of every test, for `timeline.jsonl` in the session's base temporary folder: where a run's time went,
beyond the `--durations` table, kept after the run on the machine that ran it."""


def pytest_sessionfinish(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes it
        return
    with (factory.getbasetemp() / "timeline.jsonl").open("w") as out:
        out.writelines(json.dumps(entry) + "\n" for entry in _timeline)


def _note_cluster_outcome(report: pytest.TestReport) -> None:
    if not report.failed:
        _cluster_failures_in_a_row.clear()
        return
    _cluster_failures_in_a_row.append(report.nodeid)
    if len(_cluster_failures_in_a_row) >= CLUSTER_FAILURES_TO_STOP and _sessions:
        _sessions[-1].shouldstop = (
            f"{len(_cluster_failures_in_a_row)} tests on the local cluster failed in a row "
            f"({', '.join(_cluster_failures_in_a_row)}): the cluster or the machine is broken, see the first failure"
        )


def machine_state() -> str:
    """Free disk, /dev/shm and memory, the load, and what limits this process: what a CI machine may lack."""
    import resource
    import shutil
    import tempfile

    import psutil

    def free(path: str) -> str:
        try:
            return f"{shutil.disk_usage(path).free / 2**30:.1f} GiB"
        except OSError:
            return "absent"

    memory = psutil.virtual_memory()
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    processes = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return (
        f"free: {tempfile.gettempdir()} {free(tempfile.gettempdir())}, repo {free(str(REPO_ROOT))}, "
        f"/dev/shm {free('/dev/shm')}, memory {memory.available / 2**30:.1f} of {memory.total / 2**30:.1f} GiB; "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; open files {files}, processes {processes}"
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The machine as the tests find it. Where `unshare` is refused (some CI sandboxes) the node agent's pods
    share the machine's filesystem (and cluster DNS names do not resolve in them): a failure may be that mode's."""
    from phalanx.devcluster.agent.runtime import probe_namespaces

    setting = os.environ.get(controlplane.POD_NAMESPACES_ENV) or "unset"
    return [
        f"pods' private namespaces: unshare {'works' if probe_namespaces() else 'refused'}; "
        f"{controlplane.POD_NAMESPACES_ENV}={setting}",
        f"machine: {machine_state()}",
    ]
