"""A real Kueue (devcluster/kueue) on the local cluster: it queues batch Jobs and admits them within a quota."""

from __future__ import annotations

import copy
import http.server
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from phalanx.devcluster import processes

from .conftest import RESTRICTED_CONTAINER, Cluster, wait_for

pytestmark = pytest.mark.e2e

API = "kueue.x-k8s.io/v1beta2"
"""The version Kueue stores its objects at (the CRDs' storage version)."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class Gate:
    """An HTTP endpoint on this host that answers 200 once opened: a pod that polls it runs until the test says."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if gate.opened.is_set() else 503)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gate() -> Iterator[Gate]:
    opened = Gate()
    yield opened
    opened.close()


def job(name: str, queue: str, cpu: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "command": ["python", "-c", script],
                            "resources": {"requests": {"cpu": cpu}},
                            "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
                        }
                    ],
                }
            },
        },
    }


def create(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Creates an object; returns it as stored, after the admission webhooks changed it."""
    return json.loads(
        cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(manifest)).stdout
    )


def workload_of(cluster: Cluster, namespace: str, job_name: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a Job (it owns none other)."""
    workloads = cluster.custom.list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
    )
    for workload in workloads["items"]:
        owners = workload["metadata"].get("ownerReferences", [])
        if any(owner["kind"] == "Job" and owner["name"] == job_name for owner in owners):
            return workload
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = (obj or {}).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


def job_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("job", name, "-n", namespace)


def job_finished(cluster: Cluster, namespace: str, name: str) -> bool:
    conditions = job_status(cluster, namespace, name).get("status", {}).get("conditions", [])
    failed = [c for c in conditions if c["type"] == "Failed" and c["status"] == "True"]
    assert not failed, f"job {name} failed: {failed}"
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def pods_of(cluster: Cluster, namespace: str, job_name: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}"
    ).items


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_kueue_admits_queued_jobs_within_the_cluster_queues_quota(
    cluster: Cluster, kueue: processes.PidRecord, namespace: str, gate: Gate
) -> None:
    # ClusterQueues and ResourceFlavors are cluster-wide: named after the test's namespace.
    flavor, cluster_queue = f"{namespace}-flavor", f"{namespace}-cq"
    try:
        cluster.apply([
            {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
            {
                "apiVersion": API,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1"}]}],
                        }
                    ],
                },
            },
            {
                "apiVersion": API,
                "kind": "LocalQueue",
                "metadata": {"name": "queue", "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ])  # fmt: skip
        wait_for(
            lambda: (
                condition(cluster.get_json("clusterqueue", cluster_queue), "Active").get("status") == "True"
            ),
            60,
            message=f"ClusterQueue {cluster_queue} to be Active",
        )

        # The first Job holds 600m of the 1-CPU quota until the gate opens.
        waits = (
            "import time, urllib.request\n"
            "while True:\n"
            "    try:\n"
            f"        urllib.request.urlopen({gate.url!r}, timeout=5); break\n"
            "    except Exception:\n"
            "        time.sleep(0.5)\n"
            "print('first done')\n"
        )
        # Kueue's webhook suspends it at creation; it runs once its Workload is admitted.
        assert create(cluster, namespace, job("first", "queue", "600m", waits))["spec"]["suspend"] is True
        wait_for(
            lambda: condition(workload_of(cluster, namespace, "first"), "Admitted").get("status") == "True",
            120,
            message="the first Job's Workload to be admitted",
        )
        first = workload_of(cluster, namespace, "first")
        assert first is not None
        assert first["status"]["admission"]["clusterQueue"] == cluster_queue
        wait_for(
            lambda: [pod.status.phase for pod in pods_of(cluster, namespace, "first")] == ["Running"],
            180,
            message="the first Job's pod to run on a node of the agent",
        )
        assert job_status(cluster, namespace, "first")["spec"]["suspend"] is False

        # The second does not fit beside it: it stays suspended, its Workload pending and saying why.
        assert create(cluster, namespace, job("second", "queue", "600m", "print('second done')"))["spec"][
            "suspend"
        ]

        def pending_for_quota() -> dict[str, Any] | None:
            reserved = condition(workload_of(cluster, namespace, "second"), "QuotaReserved")
            return (
                reserved
                if reserved.get("status") == "False" and "insufficient" in reserved["message"]
                else None
            )

        reserved = wait_for(pending_for_quota, 60, message="the second Job's Workload to wait for quota")
        assert f"insufficient unused quota for cpu in flavor {flavor}" in reserved["message"], reserved
        assert job_status(cluster, namespace, "second")["spec"]["suspend"] is True
        assert not job_finished(cluster, namespace, "first")
        assert pods_of(cluster, namespace, "second") == []

        gate.opened.set()
        wait_for(lambda: job_finished(cluster, namespace, "first"), 180, message="the first Job to complete")
        wait_for(
            lambda: job_finished(cluster, namespace, "second"), 240, message="the second Job to complete"
        )
        first_done = parse_time(job_status(cluster, namespace, "first")["status"]["completionTime"])
        admitted = condition(workload_of(cluster, namespace, "second"), "Admitted")
        assert admitted["status"] == "True"
        assert parse_time(admitted["lastTransitionTime"]) >= first_done.replace(microsecond=0)
        assert workload_of(cluster, namespace, "second")["status"]["admission"]["podSetAssignments"][0][
            "flavors"
        ] == {"cpu": flavor}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", check=False, timeout=180)
        for kind, name in (("clusterqueue", cluster_queue), ("resourceflavor", flavor)):
            cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)


def test_kueue_leaves_jobs_without_a_queue_alone(
    cluster: Cluster, kueue: processes.PidRecord, namespace: str
) -> None:
    """`manageJobsWithoutQueueName: false`: a Job with no queue label runs as if Kueue were not there."""
    plain = job("plain", "unused", "10m", "print('plain')")
    del plain["metadata"]["labels"]
    assert create(cluster, namespace, plain)["spec"]["suspend"] is False
    wait_for(
        lambda: job_finished(cluster, namespace, "plain"), 180, message="the Job without a queue to complete"
    )
    assert workload_of(cluster, namespace, "plain") is None
