"""The launcher follows its TrainingJob with a watch, under the worker's own RBAC, on the real API server.

No operator runs here: the tests create the TrainingJob and the worker's ServiceAccount, Role and
RoleBinding (built by the operator's own `build_worker_rbac`) directly, and write `status` as the operator
would. Launchers run as local processes (tests/unit/worker_runtime/localjob.py) with a kubeconfig for
the worker ServiceAccount.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from phalanx.operator import api, builders, names
from phalanx.worker.heartbeat import micro_time
from phalanx.worker.jobwatch import ApiStatusError, JobFeed, JobView
from phalanx.worker.lease import (
    TRAININGJOB_GROUP,
    TRAININGJOB_PLURAL,
    TRAININGJOB_VERSION,
    TrainingJobApi,
    desired_replicas_of,
)
from phalanx.worker.regroup import regroup_of

from .conftest import OPERATOR_NAMESPACE, REPO_ROOT, Cluster, operator_ready, wait_for

sys.path.insert(0, str(REPO_ROOT / "tests" / "unit" / "worker_runtime"))

from localjob import LocalJob

pytestmark = pytest.mark.e2e


def trainingjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "phalanx:test",
                            "command": ["python", "-m", "phalanx.worker.examples.tinygpt"],
                        }
                    ]
                }
            },
        },
    }


@pytest.fixture
def crd(cluster: Cluster, no_operator: None) -> None:
    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "trainingjobs.phalanx.dev.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainingjobs.phalanx.dev", "--timeout=60s")


@pytest.fixture(scope="module")
def no_operator(cluster: Cluster) -> Iterator[None]:
    """These tests write the jobs' status as the operator would: an operator an earlier module installed
    (the session's) would overwrite it, so it is scaled to zero here and back afterwards."""
    found = cluster.kubectl(
        "get",
        "deployments",
        "-n",
        OPERATOR_NAMESPACE,
        "-o",
        "jsonpath={.items[*].metadata.name}",
        check=False,
    )
    deployments = found.stdout.split() if found.returncode == 0 else []
    for name in deployments:
        cluster.kubectl("scale", "deployment", name, "-n", OPERATOR_NAMESPACE, "--replicas=0")
    wait_for(
        lambda: not cluster.core.list_namespaced_pod(OPERATOR_NAMESPACE).items,
        120,
        message="the operator's pods to go",
    )
    try:
        yield
    finally:
        for name in deployments:
            cluster.kubectl("scale", "deployment", name, "-n", OPERATOR_NAMESPACE, "--replicas=1")
        if deployments:
            wait_for(lambda: operator_ready(cluster), 120, message="the operator pod to be Ready again")


def create_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    cluster.apply(trainingjob(name), namespace)
    return cluster.get_json("trainingjob", name, "-n", namespace)


def write_status(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    cluster.custom.patch_namespaced_custom_object_status(
        TRAININGJOB_GROUP, TRAININGJOB_VERSION, namespace, TRAININGJOB_PLURAL, name, {"status": status}
    )


def regroup(epoch: int) -> dict[str, Any]:
    return {"before": micro_time(datetime.now(UTC)), "epoch": epoch, "reason": f"test request {epoch}"}


def account_kubeconfig(
    cluster: Cluster, namespace: str, account: str, path: Path, bound_pod: client.V1Pod | None = None
) -> Path:
    """A kubeconfig that authenticates as `account` with a token from the TokenRequest API: 1.20 has it too,
    and releases after 1.23 make no token Secret for an account. `bound_pod`: a token bound to that pod, as
    the kubelet mounts one (the API server then names the pod in the user's extra)."""
    bound = (
        None
        if bound_pod is None
        else client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=bound_pod.metadata.name, uid=bound_pod.metadata.uid
        )
    )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600, bound_object_ref=bound)
    )
    issued = wait_for(
        lambda: cluster.core.create_namespaced_service_account_token(account, namespace, request),
        timeout=60,
        message=f"a token for {account}",
    )
    token = issued.status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = dict(admin["clusters"][0]["cluster"])
    if "certificate-authority" in server:
        server["certificate-authority"] = str(
            (cluster.kubeconfig.parent / server["certificate-authority"]).resolve()
        )
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": server}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "worker", "context": {"cluster": "local", "user": account}}],
                "current-context": "worker",
            }
        )
    )
    return path


def worker_kubeconfig(cluster: Cluster, namespace: str, job: dict[str, Any], path: Path) -> Path:
    """The worker ServiceAccount with the operator's Role for it, and a kubeconfig using it."""
    objects = builders.build_worker_rbac(job, api.TrainingJobSpec.model_validate(job["spec"]))
    cluster.apply(objects, namespace)
    account = next(item for item in objects if item["kind"] == "ServiceAccount")["metadata"]["name"]
    return account_kubeconfig(cluster, namespace, account, path)


def feed_for(path: Path, namespace: str, name: str, clients: list[client.ApiClient], poll: float) -> JobFeed:
    api_client = config.new_client_from_config(config_file=str(path))
    clients.append(api_client)
    return JobFeed(TrainingJobApi(name, namespace, api_client), JobView(), poll_interval=poll)


def epoch_seen(feed: JobFeed) -> int:
    request = regroup_of(feed.view.current())
    return request.epoch if request else 0


def test_the_worker_role_lets_the_launcher_watch_its_own_job_only(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, api_clients: list[client.ApiClient]
) -> None:
    job = create_job(cluster, namespace, "watched")
    create_job(cluster, namespace, "other")
    kubeconfig = worker_kubeconfig(cluster, namespace, job, tmp_path / "worker.kubeconfig")
    # An hour between reads: whatever arrives sooner came through the watch.
    feed = feed_for(kubeconfig, namespace, "watched", api_clients, poll=3600).start()
    try:
        wait_for(lambda: feed.view.current() is not None, 30, message="the first list of the job")
        write_status(cluster, namespace, "watched", {"replicas": {"desired": 3}, "regroup": regroup(1)})
        wait_for(lambda: epoch_seen(feed) == 1, 30, message="the status change to arrive")
        assert desired_replicas_of(feed.view.current() or {}) == 3
        write_status(cluster, namespace, "watched", {"regroup": regroup(2)})
        wait_for(lambda: epoch_seen(feed) == 2, 30, message="the second status change to arrive")
        assert not feed.polling, "the API server refused the watch"
    finally:
        feed.stop()
    with pytest.raises(ApiStatusError) as refused:
        feed_for(kubeconfig, namespace, "other", api_clients, poll=1).api.get()
    assert refused.value.status == 403


def test_without_list_and_watch_the_launcher_reads_the_job_instead(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, api_clients: list[client.ApiClient]
) -> None:
    job = create_job(cluster, namespace, "polled")
    objects = builders.build_worker_rbac(job, api.TrainingJobSpec.model_validate(job["spec"]))
    for item in objects:
        if item["kind"] == "Role":
            for rule in item["rules"]:
                if rule.get("resources") == [TRAININGJOB_PLURAL]:
                    rule["verbs"] = ["get"]  # the Role before watching was asked for
    cluster.apply(objects, namespace)
    account = next(item for item in objects if item["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = account_kubeconfig(cluster, namespace, account, tmp_path / "worker.kubeconfig")
    feed = feed_for(kubeconfig, namespace, "polled", api_clients, poll=0.5).start()
    try:
        wait_for(lambda: feed.view.current() is not None, 30, message="the first read of the job")
        assert feed.polling
        write_status(cluster, namespace, "polled", {"regroup": regroup(1)})
        wait_for(lambda: epoch_seen(feed) == 1, 30, message="the status change to be read")
    finally:
        feed.stop()


def restarts(output: str) -> list[str]:
    return re.findall(r"restarting the worker group: (.*)", output)


def test_launchers_regroup_when_the_trainingjob_status_asks(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    job = create_job(cluster, namespace, "regrouped")
    kubeconfig = worker_kubeconfig(cluster, namespace, job, tmp_path / "worker.kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "PHALANX_JOB_NAME": "regrouped", "POD_NAMESPACE": namespace}
    example = ["--steps", "50", "--step-delay", "0.1", "--global-batch", "16"]
    # Named as the job's pods are: the chart's lease policy lets the job's account write only their Leases.
    pods = [names.worker_pod_name("regrouped", index) for index in range(2)]
    local = LocalJob(tmp_path / "local", run_id=f"regrouped-{namespace}")
    local.root.mkdir()
    local.start_store()
    try:
        for name in pods:
            local.start_node(name, example, launcher_args=["--heartbeat-interval", "1"], env=env)
        wait_for(lambda: local.last_step() >= 5, 120, message="the group to train")
        write_status(cluster, namespace, "regrouped", {"regroup": regroup(1)})
        wait_for(
            lambda: all(restarts(local.node_output(name)) for name in pods),
            60,
            message="both launchers to restart their group",
        )
        for name in pods:
            assert local.wait_node(name, 120) == 0, local.node_output(name)
        outputs = {name: local.node_output(name) for name in pods}
    finally:
        local.close()

    assert "cannot watch the TrainingJob" not in "".join(outputs.values())
    claimers = [
        name for name, text in outputs.items() if re.search(r"regroup 1 \(.*\): .* restarting it", text)
    ]
    assert len(claimers) == 1, outputs
    assert [restarts(text) for text in outputs.values()] == [["restart-epoch 0->1"]] * 2
    for name in pods:
        annotations = cluster.get_json("lease", name, "-n", namespace)["metadata"]["annotations"]
        assert annotations["phalanx.dev/phase"] == "finished"
        assert annotations["phalanx.dev/group-restarts"] == "1"
        assert annotations["phalanx.dev/group-started"] == ""
        assert annotations["phalanx.dev/restore-source"] in ("memory", "peer")
        assert int(annotations["phalanx.dev/restored-step"]) >= 5
        for key in ("phase-since", "resumed-at"):
            assert datetime.fromisoformat(annotations["phalanx.dev/" + key]).tzinfo is not None
        assert float(annotations["phalanx.dev/compute-seconds"]) >= 0
