"""Cross-field rules: each problem names the field to fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phalanx.operator.validation import Admission, check

MakeJob = Callable[..., dict[str, Any]]


def _fields(job: dict[str, Any]) -> dict[str, str]:
    spec, issues = check(job["spec"], job["metadata"]["name"])
    assert (spec is None) == bool(issues)
    return {issue.field: issue.message for issue in issues}


def test_a_good_spec_passes(make_job: MakeJob) -> None:
    spec, issues = check(make_job()["spec"], "demo")
    assert issues == [] and spec is not None and spec.replicas == 2


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas", "greater than maxReplicas"),
        ({"replicas": 5, "maxReplicas": 4}, "spec.replicas", "outside"),
        ({"replicas": 1, "minReplicas": 2, "maxReplicas": 4}, "spec.replicas", "outside"),
        # An object that bypassed the CRD's ranges is refused by the same model, naming the field.
        ({"spares": -1}, "spec.spares", "greater than or equal to 0"),
        ({"replicas": 0, "minReplicas": 1}, "spec.replicas", "greater than or equal to 1"),
        (
            {"checkpoint": {"claimName": "ckpt", "volume": {"emptyDir": {}}}},
            "spec.checkpoint.volume",
            "either",
        ),
        (
            {"heartbeat": {"intervalSeconds": 10, "timeoutSeconds": 5}},
            "spec.heartbeat.timeoutSeconds",
            "greater",
        ),
        ({"gang": {"podGroup": "Kueue"}}, "spec.gang.queueName", "LocalQueue"),
        (
            {"checkpoint": {"path": "/ckpt", "localTier": {"enabled": True, "path": "/ckpt"}}},
            "spec.checkpoint.localTier.path",
            "differ",
        ),
        (
            {"checkpoint": {"objectStore": {"url": "bucket/run"}}},
            "spec.checkpoint.objectStore.url",
            "pattern",
        ),
        (
            {"failurePolicy": {"rules": [{"action": "FailJob"}]}},
            "spec.failurePolicy.rules[0].match",
            "nothing",
        ),
    ],
)
def test_cross_field_problems_name_the_field(
    make_job: MakeJob, overrides: dict, field: str, words: str
) -> None:
    problems = _fields(make_job(**overrides))
    assert field in problems, problems
    assert words in problems[field]


def test_missing_command_names_the_trainer_container(make_job: MakeJob) -> None:
    job = make_job()
    del job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "command" in _fields(job)["spec.template.spec.containers[0].command"]


def test_the_container_named_trainer_is_the_one_checked(make_job: MakeJob) -> None:
    job = make_job()
    containers = job["spec"]["template"]["spec"]["containers"]
    containers.insert(0, {"name": "sidecar", "image": "busybox"})
    assert _fields(job) == {}
    del containers[1]["command"]
    assert "spec.template.spec.containers[1].command" in _fields(job)


def test_a_template_without_the_trainer_container_is_refused_naming_the_field(make_job: MakeJob) -> None:
    job = make_job()
    containers = job["spec"]["template"]["spec"]["containers"]
    containers.insert(0, {"name": "sidecar", "image": "busybox"})
    containers[1]["name"] = "main"
    # No guess: the first container (a sidecar without a command here) would silently run training.
    problems = _fields(job)
    assert list(problems) == ["spec.trainerContainer"]
    assert (
        "'trainer'" in problems["spec.trainerContainer"]
        and "'sidecar', 'main'" in problems["spec.trainerContainer"]
    )


def test_the_trainer_container_can_be_chosen_by_name(make_job: MakeJob) -> None:
    job = make_job(trainerContainer="main")
    containers = job["spec"]["template"]["spec"]["containers"]
    containers[0]["name"] = "main"
    containers.insert(0, {"name": "trainer", "image": "busybox"})  # a sidecar may even be called `trainer`
    assert _fields(job) == {}
    job["spec"]["trainerContainer"] = "trainer"
    assert "spec.template.spec.containers[0].command" in _fields(job)
    job["spec"]["trainerContainer"] = "gone"
    assert "'gone'" in _fields(job)["spec.trainerContainer"]
    job["spec"]["trainerContainer"] = "Not_A_Name"
    assert "spec.trainerContainer" in _fields(job)


def test_no_containers(make_job: MakeJob) -> None:
    job = make_job(template={"spec": {"containers": []}})
    assert "spec.template.spec.containers" in _fields(job)


def test_wrong_types_that_bypassed_the_schema_are_reported_with_their_path(make_job: MakeJob) -> None:
    problems = _fields(make_job(replicas="many", heartbeat={"intervalSeconds": "soon"}))
    assert "spec.replicas" in problems
    assert "spec.heartbeat.intervalSeconds" in problems


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        # Spares alone push the job over the limit: spares is the field to fix, not replicas.
        ({"replicas": 2, "spares": 50000}, "spec.spares", "50002 pods"),
        ({"replicas": 1999, "spares": 2}, "spec.spares", "2001 pods"),
        ({"replicas": 100000, "maxReplicas": 100000}, "spec.replicas", "replicas (100000)"),
        ({"replicas": 100000, "spares": 5}, "spec.replicas", "replicas (100000)"),
        ({"replicas": 2, "spares": 1, "maxReplicas": 2000}, "spec.maxReplicas", "2001 pods"),
    ],
)
def test_each_gang_limit_names_the_field_that_broke_it(
    make_job: MakeJob, spec: dict[str, Any], field: str, words: str
) -> None:
    _, issues = check(make_job(**spec)["spec"], "demo", max_gang_pods=2000)
    assert [issue.field for issue in issues] == [field], issues
    assert words in issues[0].message and "maxGangPods" in issues[0].message and "2000" in issues[0].message


def test_a_gang_at_the_limit_passes(make_job: MakeJob) -> None:
    _, issues = check(make_job(replicas=1999, spares=1, maxReplicas=1999)["spec"], "demo", max_gang_pods=2000)
    assert issues == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"sharedMemory": {"sizeLimit": "lots"}}, "spec.sharedMemory.sizeLimit"),
        ({"sharedMemory": {"sizeLimit": "-1Gi"}}, "spec.sharedMemory.sizeLimit"),
        ({"sharedMemory": {"sizeLimit": "1e1.5"}}, "spec.sharedMemory.sizeLimit"),
        (
            {"checkpoint": {"localTier": {"enabled": True, "sizeLimit": "20 GB"}}},
            "spec.checkpoint.localTier.sizeLimit",
        ),
        (
            {"checkpoint": {"volume": {"emptyDir": {"sizeLimit": "big"}}}},
            "spec.checkpoint.volume.emptyDir.sizeLimit",
        ),
    ],
)
def test_a_quantity_of_the_spec_that_is_not_one_is_refused(
    make_job: MakeJob, overrides: dict[str, Any], field: str
) -> None:
    problems = _fields(make_job(**overrides))
    assert list(problems) == [field], problems
    assert "quantity" in problems[field]


@pytest.mark.parametrize("value", ["8Gi", "512Mi", "1.5G", "500m", "2", 1073741824, "1e9", "+1Ki", ".5Gi"])
def test_quantities_pass_as_strings_or_numbers(make_job: MakeJob, value: Any) -> None:
    spec, issues = check(make_job(sharedMemory={"sizeLimit": value})["spec"], "demo")
    assert issues == [] and spec is not None and spec.shared_memory.size_limit == str(value)


def _with_container(make_job: MakeJob, **container: Any) -> dict[str, Any]:
    job = make_job()
    job["spec"]["template"]["spec"]["containers"][0].update(container)
    return job


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"limits": {"memory": "lots"}}, "limits.memory", "quantity"),
        ({"requests": {"cpu": "two"}}, "requests.cpu", "quantity"),
        ({"requests": {"cpu": "-1"}}, "requests.cpu", "quantity"),
        ({"requests": {"nvidia.com/gpu": "1 "}}, "requests.nvidia.com/gpu", "quantity"),
        ({"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}, "requests.memory", "above the limit"),
    ],
)
def test_resources_of_the_template_are_quantities(
    make_job: MakeJob, resources: dict[str, Any], field: str, words: str
) -> None:
    problems = _fields(_with_container(make_job, resources=resources))
    path = f"spec.template.spec.containers[0].resources.{field}"
    assert list(problems) == [path], problems
    assert words in problems[path]


def test_resources_of_every_container_and_template_emptydirs_are_checked(make_job: MakeJob) -> None:
    job = make_job()
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["initContainers"] = [{"name": "init", "image": "x", "resources": {"limits": {"cpu": "1 core"}}}]
    pod_spec["containers"].append(
        {"name": "sidecar", "image": "x", "resources": {"requests": {"memory": "1GB"}}}
    )
    pod_spec["volumes"] = [{"name": "scratch", "emptyDir": {"sizeLimit": "huge"}}]
    assert set(_fields(job)) == {
        "spec.template.spec.initContainers[0].resources.limits.cpu",
        "spec.template.spec.containers[1].resources.requests.memory",
        "spec.template.spec.volumes[0].emptyDir.sizeLimit",
    }
    pod_spec["initContainers"][0]["resources"] = {"limits": {"cpu": "1"}}
    pod_spec["containers"][1]["resources"] = {"requests": {"memory": "1G"}, "limits": {"memory": 1000000000}}
    pod_spec["volumes"][0]["emptyDir"]["sizeLimit"] = "10Gi"
    assert _fields(job) == {}


@pytest.mark.parametrize(
    ("checkpoint", "field"),
    [
        ({"path": "../../etc"}, "spec.checkpoint.path"),
        ({"path": "checkpoints"}, "spec.checkpoint.path"),
        ({"path": "/data/../etc"}, "spec.checkpoint.path"),
        ({"path": "/data/./ckpt"}, "spec.checkpoint.path"),
        ({"path": "/data//ckpt"}, "spec.checkpoint.path"),
        ({"path": "/data/ckpt/"}, "spec.checkpoint.path"),
        ({"path": "/"}, "spec.checkpoint.path"),
        ({"path": ""}, "spec.checkpoint.path"),
        ({"localTier": {"enabled": True, "path": "local"}}, "spec.checkpoint.localTier.path"),
        ({"localTier": {"enabled": True, "hostPath": "/mnt/../etc"}}, "spec.checkpoint.localTier.hostPath"),
    ],
)
def test_checkpoint_paths_must_be_absolute_and_normalised(
    make_job: MakeJob, checkpoint: dict[str, Any], field: str
) -> None:
    problems = _fields(make_job(checkpoint=checkpoint))
    assert list(problems) == [field], problems
    assert "absolute, normalised path" in problems[field]


@pytest.mark.parametrize("path", ["/checkpoints", "/data/ckpt", "/mnt/.hidden/x", "/a/..b/c.d/...", "/c p"])
def test_normalised_absolute_paths_pass(make_job: MakeJob, path: str) -> None:
    spec, issues = check(make_job(checkpoint={"path": path})["spec"], "demo")
    assert issues == [] and spec is not None and spec.checkpoint.path == path


def test_heartbeat_interval_below_its_minimum_is_refused(make_job: MakeJob) -> None:
    assert "spec.heartbeat.intervalSeconds" in _fields(make_job(heartbeat={"intervalSeconds": 0}))


def test_long_job_names_are_refused_because_pods_use_them_as_hostnames(make_job: MakeJob) -> None:
    _, issues = check(make_job()["spec"], "x" * 60)
    assert [issue.field for issue in issues] == ["metadata.name"]


def test_job_names_its_services_and_hostnames_cannot_carry_are_refused(make_job: MakeJob) -> None:
    for name in ("train.v2", "2nd-run"):
        _, issues = check(make_job()["spec"], name)
        assert [issue.field for issue in issues] == ["metadata.name"], name
        assert "starting with a letter" in issues[0].message
    assert check(make_job()["spec"], "run-2")[1] == []


@pytest.mark.parametrize(
    "options",
    [
        {"key": "AKIA..."},
        {"secret": "..."},
        {"client_kwargs": {"aws_secret_access_key": "..."}},
        {"client_kwargs": {"aws_session_token": "..."}},
        {"config_kwargs": {"password": "..."}},
    ],
)
def test_credentials_in_storage_options_are_refused(make_job: MakeJob, options: dict[str, Any]) -> None:
    store = {"url": "s3://bucket/run", "storageOptions": options}
    fields = _fields(make_job(checkpoint={"path": "/ckpt", "objectStore": store}))
    [(field, message)] = fields.items()
    assert field.startswith("spec.checkpoint.objectStore.storageOptions.") and "credential" in message, fields


def test_storage_options_without_credentials_pass(make_job: MakeJob) -> None:
    options = {"client_kwargs": {"region_name": "eu-west-1"}, "anon": False, "skip_instance_cache": True}
    store = {"url": "s3://bucket/run", "storageOptions": options}
    assert _fields(make_job(checkpoint={"path": "/ckpt", "objectStore": store})) == {}


def _host_path_fields(make_job: MakeJob, host_path: str, prefix: str | None) -> dict[str, str]:
    job = make_job(checkpoint={"path": "/ckpt", "localTier": {"enabled": True, "hostPath": host_path}})
    admission = None if prefix is None else Admission(host_path_prefix=prefix)
    _, issues = check(job["spec"], "demo", admission=admission, namespace="ml")
    return {issue.field: issue.message for issue in issues}


def test_a_host_path_needs_the_operator_s_prefix_and_lies_under_namespace_and_job(make_job: MakeJob) -> None:
    field = "spec.checkpoint.localTier.hostPath"
    assert "allows no host path" in _host_path_fields(make_job, "/var/lib/phalanx", "")[field]
    assert (
        "must lie under /var/lib/phalanx/ml/demo"
        in _host_path_fields(make_job, "/etc", "/var/lib/phalanx")[field]
    )
    outside = _host_path_fields(make_job, "/var/lib/phalanx/ml/demo2", "/var/lib/phalanx/")
    assert "must lie under /var/lib/phalanx/ml/demo " in outside[field]
    assert _host_path_fields(make_job, "/var/lib/phalanx/ml/demo", "/var/lib/phalanx") == {}
    assert _host_path_fields(make_job, "/var/lib/phalanx/ml/demo/tier", "/var/lib/phalanx") == {}
    # Without a local tier, or where host paths are not judged (None), nothing is said.
    assert _host_path_fields(make_job, "/etc", None) == {}


def test_a_template_names_only_an_allowed_service_account_and_never_default(make_job: MakeJob) -> None:
    def fields(account: str, key: str = "serviceAccountName") -> dict[str, str]:
        job = make_job()
        job["spec"]["template"]["spec"][key] = account
        _, issues = check(job["spec"], "demo", admission=Admission(service_accounts=frozenset({"s3-reader"})))
        return {issue.field: issue.message for issue in issues}

    assert "never bound to default" in fields("default")["spec.template.spec.serviceAccountName"]
    assert (
        "never bound to default" in fields("default", "serviceAccount")["spec.template.spec.serviceAccount"]
    )
    assert (
        "not among the operator's workerServiceAccounts"
        in fields("admin")["spec.template.spec.serviceAccountName"]
    )
    assert fields("s3-reader") == {}
    job = make_job()
    job["spec"]["template"]["spec"]["serviceAccountName"] = "admin"
    assert check(job["spec"], "demo")[1] == []  # not judged without the operator's admission


def test_a_heartbeat_faster_than_the_operators_write_budget_allows_is_refused_naming_the_floor(
    make_job: MakeJob,
) -> None:
    admission = Admission(heartbeat_writes_per_second=100)
    # 200 workers and 50 spares at 100 writes per second, each renewing its own Lease: a beat every 2.5 s at most.
    leases = {"intervalSeconds": 1, "timeoutSeconds": 30, "reporting": "leases"}
    job = make_job(replicas=200, spares=50, heartbeat=leases)
    spec, issues = check(job["spec"], "demo", admission=admission)
    assert spec is None
    (issue,) = issues
    assert issue.field == "spec.heartbeat.intervalSeconds"
    assert "at least 2.5 for 250 pods" in issue.message and "heartbeatWritesPerSecond" in issue.message
    job = make_job(replicas=200, spares=50, heartbeat={**leases, "intervalSeconds": 2.5})
    assert check(job["spec"], "demo", admission=admission)[1] == []
    # Scaling up to maxReplicas counts too.
    job = make_job(replicas=2, spares=1, maxReplicas=300, heartbeat=leases)
    assert [issue.field for issue in check(job["spec"], "demo", admission=admission)[1]] == [
        "spec.heartbeat.intervalSeconds"
    ]
    # Through the heartbeat hub (`auto` picks it from 128 pods) the job writes one Lease per interval.
    for reporting in ("auto", "hub"):
        hub = {"intervalSeconds": 1, "timeoutSeconds": 30, "reporting": reporting}
        job = make_job(replicas=12_000, spares=100, heartbeat=hub)
        assert check(job["spec"], "demo", admission=Admission(heartbeat_writes_per_second=100))[1] == []
    job = make_job(replicas=200, spares=50, heartbeat={**hub, "intervalSeconds": 1})
    (issue,) = check(job["spec"], "demo", admission=Admission(heartbeat_writes_per_second=0.5))[1]
    assert "at least 2 for the job's heartbeat hub" in issue.message


def test_a_gang_timeout_or_back_off_under_the_operators_floor_is_refused(make_job: MakeJob) -> None:
    admission = Admission(min_gang_timeout_seconds=10)
    job = make_job(gang={"scheduleTimeoutSeconds": 1, "backoffSeconds": 2})
    spec, issues = check(job["spec"], "demo", admission=admission)
    assert spec is None
    assert {issue.field for issue in issues} == {
        "spec.gang.scheduleTimeoutSeconds",
        "spec.gang.backoffSeconds",
    }
    assert all("minGangTimeoutSeconds" in issue.message for issue in issues)
    job = make_job(gang={"scheduleTimeoutSeconds": 10, "backoffSeconds": 10})
    assert check(job["spec"], "demo", admission=admission)[1] == []
