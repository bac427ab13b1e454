"""Tenants: a namespace's editors run TrainingJobs and its viewers read them, through the chart's ClusterRoles
that Kubernetes' own `edit` and `view` roles take in (aggregation), with no cluster-wide grant of their own."""

from __future__ import annotations

import pytest
import yaml

from .conftest import Cluster, Operator, wait_for
from .test_operator import get_job, job_pods, trainingjob

pytestmark = pytest.mark.e2e

EDITOR, VIEWER = "alice", "bob"


def as_user(cluster: Cluster, user: str, *args: str, input: str | None = None) -> tuple[int, str]:
    """`kubectl` as `user` (impersonated by the cluster's admin): its exit code and what it printed."""
    result = cluster.kubectl(*args, f"--as={user}", input=input, check=False)
    return result.returncode, result.stdout + result.stderr


def allowed(
    cluster: Cluster, user: str, verb: str, resource: str, namespace: str, subresource: str = ""
) -> bool:
    extra = [f"--subresource={subresource}"] if subresource else []
    code, _ = as_user(cluster, user, "auth", "can-i", verb, resource, *extra, "-n", namespace)
    return code == 0


def test_a_namespace_editor_runs_trainingjobs_and_a_viewer_only_reads(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    cluster.kubectl(
        "create", "rolebinding", "editors", "--clusterrole=edit", f"--user={EDITOR}", "-n", namespace
    )
    cluster.kubectl(
        "create", "rolebinding", "viewers", "--clusterrole=view", f"--user={VIEWER}", "-n", namespace
    )
    # The controller-manager folds the chart's roles into `edit` and `view` a moment after they exist.
    wait_for(
        lambda: (
            allowed(cluster, EDITOR, "create", "trainingjobs.phalanx.dev", namespace)
            and allowed(cluster, VIEWER, "list", "trainingjobs.phalanx.dev", namespace)
        ),
        60,
        message="the aggregated roles to reach edit and view",
    )

    # Suspended: the editor's rights are the point here, not training.
    job = trainingjob("tenant", replicas=1, minReplicas=1, maxReplicas=2, suspend=True)
    code, said = as_user(cluster, EDITOR, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))
    assert code == 0, said
    code, said = as_user(cluster, EDITOR, "scale", "trainingjob/tenant", "--replicas=2", "-n", namespace)
    assert code == 0, said
    assert get_job(cluster, namespace, "tenant")["spec"]["replicas"] == 2

    code, said = as_user(cluster, VIEWER, "get", "trainingjobs", "-n", namespace)
    assert code == 0 and "tenant" in said, said
    code, said = as_user(
        cluster, VIEWER, "get", "trainingjob/tenant", "-n", namespace, "-o", "jsonpath={.status}"
    )
    assert code == 0, said
    for verb in (
        ("scale", "trainingjob/tenant", "--replicas=1"),
        ("delete", "trainingjob/tenant"),
        ("patch", "trainingjob/tenant", "--type=merge", "-p", '{"spec":{"suspend":false}}'),
    ):
        code, said = as_user(cluster, VIEWER, *verb, "-n", namespace)
        assert code != 0 and "forbidden" in said.lower(), (verb, said)
    # Neither may write the status the operator owns.
    assert not allowed(cluster, EDITOR, "update", "trainingjobs.phalanx.dev", namespace, "status")
    assert not allowed(cluster, VIEWER, "update", "trainingjobs.phalanx.dev", namespace, "status")
    assert allowed(cluster, VIEWER, "get", "trainingjobs.phalanx.dev", namespace, "status")

    code, said = as_user(cluster, EDITOR, "delete", "trainingjob/tenant", "-n", namespace, "--wait=true")
    assert code == 0, said
    assert cluster.kubectl("get", "trainingjob/tenant", "-n", namespace, check=False).returncode != 0
    assert job_pods(cluster, namespace, "tenant") == []
