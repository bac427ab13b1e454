"""A job's rendezvous store answers only the job's pods: a client without the job's secret (here, this test on
the pod network) gets nothing from it, while the job trains through the gate, and the same client with the
job's secret reaches the same store."""

from __future__ import annotations

import base64
import re
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from phalanx.worker import rendezvous
from phalanx.worker.env import MAX_NODES_KEY, RESTART_EPOCH_KEY

from .conftest import Cluster, Operator, wait_for
from .test_operator import get_job, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e


def test_the_rendezvous_store_refuses_a_client_without_the_job_s_secret(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("gated", steps=200, step_delay=0.1), namespace)
    wait_for(lambda: (get_job(cluster, namespace, "gated").get("status") or {}).get("step", 0) >= 3, 240)
    job_uid = get_job(cluster, namespace, "gated")["metadata"]["uid"]
    address = cluster.core.read_namespaced_pod("gated-rdzv", namespace).status.pod_ip
    port = 29400

    with pytest.raises((RuntimeError, dist.DistError)):
        stranger = dist.TCPStore(
            address, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3)
        )
        stranger.add(RESTART_EPOCH_KEY, 1)

    secret: dict[str, Any] = cluster.get_json("secret", "gated-store", "-n", namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job_uid
    value = base64.b64decode(secret["data"]["secret"])
    member = rendezvous.connect(address, port, 10, value)
    assert rendezvous.parse_max_nodes(member.get(MAX_NODES_KEY).decode()) == 2  # the job's own store
    assert rendezvous.read_restart_epoch(member) == 0  # the stranger's restart never got in
    logs = cluster.kubectl("logs", "gated-rdzv", "-n", namespace).stdout
    assert f"phalanx-rendezvous ready host={address} port={port} gated" in logs, logs

    # The training processes' own store (their env:// rendezvous) is hosted by a launcher behind the gate too.
    workers = cluster.core.list_namespaced_pod(namespace, label_selector="phalanx.dev/job-name=gated").items
    hosts = [
        found
        for pod in workers
        if (
            found := re.search(
                r"store: behind the gate at (\S+):(\d+) \(hosted here\)",
                cluster.kubectl("logs", pod.metadata.name, "-n", namespace).stdout,
            )
        )
    ]
    assert len(hosts) == 1, [pod.metadata.name for pod in workers]
    attempt_host, attempt_port = hosts[0][1], int(hosts[0][2])
    with pytest.raises((RuntimeError, dist.DistError)):
        stranger = dist.TCPStore(
            attempt_host, attempt_port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3)
        )
        stranger.set("phalanx-stranger", b"1")
    rendezvous.connect(attempt_host, attempt_port, 10, value).set("phalanx-member", b"1")  # the job's own

    final = wait_succeeded(cluster, namespace, "gated", timeout=300)
    assert final["status"]["restarts"]["total"] == 0, final["status"]["restarts"]
