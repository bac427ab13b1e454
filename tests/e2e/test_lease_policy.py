"""The chart's ValidatingAdmissionPolicy on the real API server: a job's worker ServiceAccount writes only its own
job's heartbeat Leases, and a pod's own token only that pod's Lease; the operator and the jobs train as before.

The per-job Role alone lets a job's pods write every Lease of the namespace: each refusal below succeeds without
the policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from .conftest import Cluster, Operator, wait_for
from .test_operator import trainingjob
from .test_worker_watch import account_kubeconfig

pytestmark = pytest.mark.e2e

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def lease_step(cluster: Cluster, namespace: str, lease: str) -> int:
    found = cluster.get_json("lease", lease, "-n", namespace)
    return int(found["metadata"].get("annotations", {}).get("phalanx.dev/step", "0"))


def wait_beating(cluster: Cluster, namespace: str, lease: str, after: int, timeout: float = 120) -> None:
    """Until the heartbeat Lease `lease` carries a step beyond `after`: its worker trains and renews it."""
    wait_for(
        lambda: lease_step(cluster, namespace, lease) > after,
        timeout,
        message=f"{lease}'s heartbeat Lease to carry a step beyond {after}",
    )


def lease_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 10},
    }


def refusal(call: Any) -> str:
    """The API server's message for a write the test expects refused (403, the policy's `reason`)."""
    with pytest.raises(client.ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    message: str = json.loads(refused.value.body)["message"]
    return message


def leases_as(kubeconfig: Path, clients: list[client.ApiClient]) -> client.CoordinationV1Api:
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    clients.append(api_client)
    return client.CoordinationV1Api(api_client)


def test_a_jobs_workers_write_only_their_own_jobs_heartbeat_leases(
    cluster: Cluster,
    operator: Operator,
    namespace: str,
    tmp_path: Path,
    api_clients: list[client.ApiClient],
) -> None:
    policy = "phalanx-worker-leases"
    assert cluster.get_json("validatingadmissionpolicy", policy)["spec"]["failurePolicy"] == "Fail"
    binding = cluster.get_json("validatingadmissionpolicybinding", policy)
    assert binding["spec"]["policyName"] == policy
    # Long enough to outlast the test: job beta's Lease must still be there to be tampered with.
    for name in ("alpha", "beta"):
        cluster.apply(trainingjob(name, replicas=1, steps=100000, step_delay=0.05), namespace)
    # The workers' own writes, with the tokens their pods mount, pass the policy: both train and beat.
    for lease in ("alpha-worker-0", "beta-worker-0"):
        wait_beating(cluster, namespace, lease, after=0, timeout=300)

    # Job alpha's account, with a token bound to no pod: the name decides.
    as_alpha = leases_as(
        account_kubeconfig(cluster, namespace, "alpha-worker", tmp_path / "alpha.kubeconfig"), api_clients
    )
    renewed = {"spec": {"holderIdentity": "alpha-worker-0"}}
    message = refusal(lambda: as_alpha.patch_namespaced_lease("beta-worker-0", namespace, renewed))
    assert f"phalanx: UPDATE of Lease {namespace}/beta-worker-0 refused" in message, message
    assert "service account alpha-worker may write only the heartbeat Leases of its own" in message, message
    message = refusal(lambda: as_alpha.create_namespaced_lease(namespace, lease_body("beta-worker-1")))
    assert f"phalanx: CREATE of Lease {namespace}/beta-worker-1 refused" in message, message
    # A Lease that only looks like alpha's (another job's pods, `alpha-worker-1-worker-<n>`) is not alpha's.
    message = refusal(
        lambda: as_alpha.create_namespaced_lease(namespace, lease_body("alpha-worker-1-worker-0"))
    )
    assert "refused" in message, message
    assert (
        cluster.get_json("lease", "beta-worker-0", "-n", namespace)["spec"]["holderIdentity"]
        == "beta-worker-0"
    )
    missing = cluster.kubectl("get", "lease", "beta-worker-1", "-n", namespace, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr, missing.stdout + missing.stderr
    # Nor another job's heartbeat hub summary (beta's rendezvous pod's Lease), nor one named like alpha's.
    message = refusal(lambda: as_alpha.create_namespaced_lease(namespace, lease_body("beta-rdzv")))
    assert f"phalanx: CREATE of Lease {namespace}/beta-rdzv refused" in message, message
    refusal(lambda: as_alpha.create_namespaced_lease(namespace, lease_body("alpha-rdzv-0")))
    # Its own job's Leases it still writes, its hub's summary too.
    as_alpha.create_namespaced_lease(namespace, lease_body("alpha-rdzv"))
    cluster.kubectl("delete", "lease", "alpha-rdzv", "-n", namespace)
    mark = {"metadata": {"labels": {"test.phalanx.dev/written-by": "alpha"}}}
    as_alpha.patch_namespaced_lease("alpha-worker-0", namespace, mark)
    as_alpha.create_namespaced_lease(namespace, lease_body("alpha-worker-1"))
    cluster.kubectl("delete", "lease", "alpha-worker-1", "-n", namespace)

    # A token bound to alpha's pod, as the kubelet mounts: the API server names the pod, and that pod's token
    # writes that pod's Lease only, not even another of its own job's.
    pod = cluster.core.read_namespaced_pod("alpha-worker-0", namespace)
    pod_kubeconfig = account_kubeconfig(
        cluster, namespace, "alpha-worker", tmp_path / "alpha-pod.kubeconfig", bound_pod=pod
    )
    pod_client = config.new_client_from_config(config_file=str(pod_kubeconfig))
    api_clients.append(pod_client)
    review = client.AuthenticationV1Api(pod_client).create_self_subject_review(
        client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    )
    user = review.status.user_info if review.status else None
    assert user is not None and (user.extra or {}).get(POD_NAME_EXTRA) == ["alpha-worker-0"]
    as_pod = client.CoordinationV1Api(pod_client)
    message = refusal(lambda: as_pod.create_namespaced_lease(namespace, lease_body("alpha-worker-1")))
    assert f"phalanx: CREATE of Lease {namespace}/alpha-worker-1 refused" in message, message
    assert "the token of pod alpha-worker-0 may write only that pod's own heartbeat Lease" in message, message
    refusal(lambda: as_pod.patch_namespaced_lease("beta-worker-0", namespace, renewed))
    # A worker pod cannot speak for its job's hub: only the rendezvous pod's token writes that summary.
    message = refusal(lambda: as_pod.create_namespaced_lease(namespace, lease_body("alpha-rdzv")))
    assert "the token of pod alpha-worker-0 may write only that pod's own heartbeat Lease" in message, message
    as_pod.patch_namespaced_lease("alpha-worker-0", namespace, mark)

    # Neither the operator nor the jobs are held back: alpha keeps training and beating, under the policy.
    wait_beating(cluster, namespace, "alpha-worker-0", after=lease_step(cluster, namespace, "alpha-worker-0"))
    job = cluster.get_json("trainingjob", "alpha", "-n", namespace)
    conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
    assert conditions.get("Failed") != "True", job.get("status")
