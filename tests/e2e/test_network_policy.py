"""Each job gets a NetworkPolicy letting only its own pods reach its pods (the chart's default).

The local cluster's nodes enforce no NetworkPolicy (no CNI that does): this proves the object the operator makes,
that it is the job's, and that the job trains with it; enforcement is the CNI's (docs/SECURITY.md)."""

from __future__ import annotations

import pytest

from .conftest import Cluster, Operator, wait_for
from .test_operator import trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e


def test_a_job_gets_a_network_policy_of_its_own_and_trains_with_it(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.apply(trainingjob("fenced", replicas=2, steps=20, metricsPort=9400), namespace)
    policy = wait_for(
        lambda: next(
            iter(
                cluster.get_json(
                    "networkpolicies", "-n", namespace, "--field-selector=metadata.name=fenced-pods"
                )["items"]
            ),
            None,
        ),
        60,
        message="the job's NetworkPolicy",
    )
    own = {"matchLabels": {"phalanx.dev/job-name": "fenced"}}
    assert policy["spec"]["podSelector"] == own and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": own}]}], policy["spec"]
    job = wait_succeeded(cluster, namespace, "fenced", timeout=300)
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["kind"] == "TrainingJob" and owner["uid"] == job["metadata"]["uid"] and owner["controller"]
