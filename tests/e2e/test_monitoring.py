"""Debian's real Prometheus scrapes the local cluster the way the chart's ServiceMonitor and PodMonitor say:
the operator's per-job series and the trainers' own exist, and the chart's stuck-job alert fires on a job
whose training stops while its heartbeats go on (its progress timeout set long, so the operator waits).

There is no Prometheus Operator here: its monitors are turned into the scrape configuration it would write
(pods kept by the monitors' selectors and port names, then their relabelings), and the PrometheusRule's groups
are the rules file as they are (the stuck-job alert pending 4 s instead of a minute). Debian's Prometheus is built without Kubernetes discovery, so the test lists the
pods itself every 2 s into a file Prometheus watches, with the labels Kubernetes discovery gives each pod's
port. Timeouts: scrape and rule evaluation every 2 s, `stuckFor` 20 s.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from phalanx.devcluster import controlplane, monitoring

from .conftest import OPERATOR_NAMESPACE, REPO_ROOT, Cluster, Operator, wait_for
from .test_operator import get_job, trainingjob

pytestmark = pytest.mark.e2e

STUCK_FOR = "20s"
CHART_VALUES = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "stuckFor": STUCK_FOR, "stuckPendingFor": "4s"},
    }
}


def rendered(release: str) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(REPO_ROOT / "charts" / "phalanx")
    files = chart.render(CHART_VALUES, name=release, namespace=OPERATOR_NAMESPACE, is_install=True)
    return [
        doc
        for path, text in files.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def _label_source(key: str) -> str:
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in key)


def scrape_config(
    name: str,
    discovered: Path,
    pods: dict[str, str],
    endpoint: dict[str, Any],
    port: str,
    namespaces: list[str] | None,
) -> dict[str, Any]:
    """What the Prometheus Operator makes of a monitor's endpoint: the pods discovered (in `discovered`) kept by
    the selector's labels and the port's name, labelled with their namespace, then the endpoint's
    relabelings."""
    keep = [
        {"source_labels": [_label_source(key)], "regex": value, "action": "keep"}
        for key, value in pods.items()
    ]
    if namespaces:
        keep.append(
            {
                "source_labels": ["__meta_kubernetes_namespace"],
                "regex": "|".join(namespaces),
                "action": "keep",
            }
        )
    keep.append(
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port, "action": "keep"}
    )
    keep += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        *(
            {"source_labels": relabel["sourceLabels"], "target_label": relabel["targetLabel"]}
            for relabel in endpoint.get("relabelings") or []
        ),
    ]
    return {
        "job_name": name,
        "honor_labels": bool(endpoint.get("honorLabels")),
        "file_sd_configs": [{"files": [str(discovered)]}],
        "relabel_configs": keep,
    }


def pod_targets(cluster: Cluster) -> list[dict[str, Any]]:
    """Every port of every running pod, labelled as Prometheus' Kubernetes pod discovery labels it."""
    groups = []
    for pod in cluster.core.list_pod_for_all_namespaces().items:
        if not pod.status.pod_ip or pod.status.phase != "Running":
            continue
        meta = {
            "__meta_kubernetes_namespace": pod.metadata.namespace,
            "__meta_kubernetes_pod_name": pod.metadata.name,
            **{_label_source(key): value for key, value in (pod.metadata.labels or {}).items()},
        }
        for container in pod.spec.containers:
            for port in container.ports or []:
                groups.append(
                    {
                        "targets": [f"{pod.status.pod_ip}:{port.container_port}"],
                        "labels": {**meta, "__meta_kubernetes_pod_container_port_name": port.name or ""},
                    }
                )
    return groups


class Discovery(threading.Thread):
    """Writes the cluster's pod targets to `path` every `interval` seconds until stopped."""

    def __init__(self, cluster: Cluster, path: Path, interval: float = 2.0) -> None:
        super().__init__(name="pod-discovery", daemon=True)
        self.cluster, self.path, self.interval = cluster, path, interval
        self.stopped = threading.Event()
        self.refresh()

    def refresh(self) -> None:
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps(pod_targets(self.cluster)))
        staging.rename(self.path)  # Prometheus reads a whole file or the previous one

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            with contextlib.suppress(Exception):  # the next round tries again
                self.refresh()


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str) -> list[dict[str, Any]]:
        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(address, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets_up(self, job: str) -> list[dict[str, Any]]:
        return self.query(f'up{{job="{job}"}} == 1')


@pytest.fixture
def prometheus(cluster: Cluster, operator: Operator, tmp_path: Path) -> Iterator[Prometheus]:
    binaries = monitoring.install()
    objects = rendered(operator.release)
    (service,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]
    (service_monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (pod_monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    (endpoint,) = service_monitor["spec"]["endpoints"]
    (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    discovered = tmp_path / "pods.json"
    discovery = Discovery(cluster, discovered)
    discovery.start()
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            # The ServiceMonitor's Service sends to the pods its selector picks, on the port it names.
            scrape_config(
                "phalanx-operator",
                discovered,
                service["spec"]["selector"],
                endpoint,
                service_port["targetPort"],
                service_monitor["spec"]["namespaceSelector"]["matchNames"],
            ),
            scrape_config(
                "phalanx-trainers",
                discovered,
                pod_monitor["spec"]["selector"]["matchLabels"],
                pod_endpoint,
                pod_endpoint["port"],
                None,
            ),
        ],
    }
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    port = controlplane.free_port(set())
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            str(binaries.prometheus),
            f"--config.file={tmp_path / 'prometheus.yaml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: server.query("vector(1)"), 60, message="Prometheus to answer")
        yield server
    finally:
        discovery.stopped.set()
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        print((tmp_path / "prometheus.log").read_text()[-3000:])


def test_prometheus_scrapes_the_jobs_series_and_the_stuck_job_alert_fires(
    cluster: Cluster, operator: Operator, namespace: str, prometheus: Prometheus
) -> None:
    job = trainingjob("stuck", replicas=1, steps=1000, metricsPort=9400)
    # Five steps, then the sixth takes ten minutes: the heartbeats go on, the step stands still.
    (container,) = job["spec"]["template"]["spec"]["containers"]
    container["args"] += ["--slow-pod", "stuck-worker-0", "--slow-seconds", "600", "--slow-from-step", "6"]
    # Long enough that the operator leaves it be: the alert is what tells.
    job["spec"]["heartbeat"] = {
        "intervalSeconds": 1,
        "timeoutSeconds": 10,
        "progressTimeoutSeconds": 3600,
        "hangFactor": 0,
    }
    cluster.apply(job, namespace)
    selector = f'namespace="{namespace}",trainingjob="stuck"'

    wait_for(lambda: prometheus.targets_up("phalanx-operator"), 120, message="the operator scraped")
    wait_for(
        lambda: prometheus.query(f"phalanx_job_step{{{selector}}} == 5"),
        240,
        message="the job's step 5 scraped",
    )
    for series in (
        f'phalanx_job_state{{{selector},state="Running"}} == 1',
        f"phalanx_job_recovery_seconds{{{selector}}} == 0",
        'phalanx_jobs{state="Running"} >= 1',
    ):
        assert prometheus.query(series), series
    # The trainer's own series, through the PodMonitor's port and relabelings.
    wait_for(
        lambda: prometheus.query(f'phalanx_worker_step{{{selector},pod="stuck-worker-0"}} == 5'),
        60,
        message="the trainer's metrics scraped",
    )

    def firing() -> list[dict[str, Any]]:
        return prometheus.query(
            f'ALERTS{{alertname="PhalanxTrainingJobStuck",alertstate="firing",{selector}}}'
        )

    (alert,) = wait_for(firing, 180, message="the stuck-job alert to fire")
    assert alert["metric"]["severity"] == "critical"
    # The operator let it be all along: still Running, no incident.
    status = get_job(cluster, namespace, "stuck")["status"]
    assert status["state"] == "Running" and not status.get("incidents"), status
