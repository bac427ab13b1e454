"""Pod Security `restricted` against the real API server: the test namespaces enforce it (tests/conftest.py),
the operator's pods meet it unless the template asks otherwise, the chart's pod meets it, and a template that
breaks it is refused by the API server and told as a `FailedCreate` Warning with the server's answer."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from .conftest import OPERATOR_NAMESPACE, Cluster, Operator, operator_ready, pod_security_labels, wait_for
from .test_operator import events_for, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

RESTRICTED = pod_security_labels("restricted")


def _labels(cluster: Cluster, name: str) -> dict[str, str]:
    return cluster.core.read_namespace(name).metadata.labels or {}


def test_a_restricted_namespace_admits_the_jobs_pods_and_refuses_a_privileged_template(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    assert RESTRICTED.items() <= _labels(cluster, namespace).items()
    # The chart's pod was created in a namespace that enforced `restricted` already, and runs.
    assert RESTRICTED.items() <= _labels(cluster, OPERATOR_NAMESPACE).items()
    assert operator_ready(cluster)

    # The enforcement is real: a plain pod, with none of restricted's settings, is refused.
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "main", "image": "pause", "command": ["sleep", "60"]}]},
    }
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod(namespace, bare)
    assert refused.value.status == 403
    assert 'violates PodSecurity \\"restricted:latest\\"' in refused.value.body, refused.value.body

    # The job's template says nothing about security: the operator's defaults make its pods restricted ones.
    cluster.apply(trainingjob("secure", replicas=2, spares=1, steps=20), namespace)
    wait_succeeded(cluster, namespace, "secure", timeout=300)
    created = [
        event for event in events_for(cluster, namespace, "secure") if event["reason"] == "CreatedPods"
    ]
    assert created and not [
        event for event in events_for(cluster, namespace, "secure") if event["reason"] == "FailedCreate"
    ]

    # A template that asks for a privileged trainer keeps it, and the API server refuses those pods: the job
    # says so in a Warning with the server's answer, and no trainer pod exists.
    privileged = trainingjob("privileged", replicas=2, steps=20)
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    cluster.apply(privileged, namespace)
    failed = wait_for(
        lambda: [
            event
            for event in events_for(cluster, namespace, "privileged")
            if event["reason"] == "FailedCreate"
        ],
        120,
        message="a FailedCreate Event for the privileged job",
    )[0]
    assert failed["type"] == "Warning"
    message = failed["message"]
    assert message.startswith("pod privileged-worker-") and "refused: 403 Forbidden" in message, message
    assert 'violates PodSecurity "restricted:latest"' in message and "privileged" in message, message
    assert not job_pods(cluster, namespace, "privileged", "phalanx.dev/component=trainer")
