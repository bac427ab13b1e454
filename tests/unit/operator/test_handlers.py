"""The handler layer carries a plan out in order: children, pods, one status write, then Events."""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import sys
import threading
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException

from phalanx import beatsummary
from phalanx.operator import api, builders, gang, handlers, ownwrites, quiettick, spread, stepreport
from phalanx.operator.kube import ForeignObject, Kube
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.reconcile import Event, Plan
from phalanx.operator.settings import settings_from
from phalanx.operator.status import summarize_pod
from phalanx.operator.timeutil import format_time


class FakeKube:
    """Records calls; `status_errors` are raised by the next status writes, in order."""

    def __init__(self, job: dict[str, Any], status_errors: list[int] | None = None) -> None:
        self.job = job
        self.calls: list[tuple[str, str]] = []
        self.status_errors = list(status_errors or [])
        self.listed: list[dict[str, Any]] | None = None
        """The job's pods as the API server lists them (None: a test that expects no listing)."""

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get", name))
        return self.job

    def ensure(self, obj: dict[str, Any]) -> None:
        self.calls.append(("ensure", obj["kind"]))

    def create(self, obj: dict[str, Any]) -> bool:
        self.calls.append(("create", obj["metadata"]["name"]))
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self.calls.append(("delete" if grace_seconds is None else f"delete-grace-{grace_seconds}", name))

    def ungate_pod(self, namespace: str, name: str, gate: str) -> None:
        self.calls.append(("ungate", name))

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.calls.append(("label", f"{name}={labels['phalanx.dev/role']}"))

    def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        if self.status_errors:
            code = self.status_errors.pop(0)
            self.calls.append(("status-failed", str(code)))
            raise ApiException(status=code, reason="Conflict")
        self.calls.append(("status", status["state"]))
        self.written_status = status

    def post_event(self, job: dict[str, Any], event: Event) -> None:
        self.calls.append(("event", event.reason))

    def forget(self, namespace: str, name: str, keep: Collection[str] = ()) -> None:
        self.calls.append(("forget", name))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get-pod", name))
        return None

    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        self.calls.append(("list-pods", job_name))
        assert self.listed is not None, "the job's pods were listed, which this test did not expect"
        return copy.deepcopy(self.listed)


def _run(
    job: dict[str, Any],
    kube: FakeKube,
    pods: list[dict[str, Any]] | None = None,
    leases: dict[Any, list[dict[str, Any]]] | None = None,
    nodes: dict[Any, list[dict[str, Any]]] | None = None,
    metrics: OperatorMetrics | None = None,
) -> None:
    reconciler = handlers.JobReconciler(kube, metrics or OperatorMetrics())  # type: ignore[arg-type]
    index = {("ml", "demo"): pods or []}
    kube.listed = pods or []  # the API server agrees with the index
    logger = kopf.LocalObjectLogger(body=job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", index, leases or {}, nodes or {}, logger)


def test_lost_node_pods_go_with_grace_zero_and_promoted_spares_are_relabelled(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    healthy = {"labels": {}, "ready": "True", "noExecute": []}
    pods = [
        make_pod("demo-worker-0", node="node-gone"),
        make_pod("demo-worker-1"),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    leases = {("ml", "demo-worker-2"): [{"phase": "training", "step": "3"}]}
    metrics = OperatorMetrics()
    kube = FakeKube(make_job())
    _run(kube.job, kube, pods, leases, {"node-a": [healthy]}, metrics)
    assert ("delete-grace-0", "demo-worker-0") in kube.calls
    assert ("label", "demo-worker-2=worker") in kube.calls
    kinds = [call[0] for call in kube.calls]
    assert kinds.index("status") > kinds.index("delete-grace-0") and kinds.index("event") > kinds.index(
        "status"
    )
    assert metrics.registry.get_sample_value("phalanx_failures_total", {"cause": "NodeLost"}) == 1
    assert metrics.registry.get_sample_value("phalanx_spare_swaps_total") == 1


def test_a_forming_gang_waits_at_its_scheduling_gate_until_every_pod_exists(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    kube = FakeKube(make_job())
    _run(kube.job, kube)
    created = [call[1] for call in kube.calls if call[0] == "create"]
    assert sorted(created) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert not [call for call in kube.calls if call[0] == "ungate"]

    def waiting(name: str, role: str = "worker") -> dict[str, Any]:
        # Created just now: the reconcile runs on the clock, and the gang's timeout is far away.
        just_now = format_time(datetime.now(UTC))
        # As the pod index keeps it: the summary must carry the gate.
        return summarize_pod(
            gang.gated(make_pod(name, role=role, node=None, phase="Pending", created=just_now))
        )

    pods = [waiting("demo-worker-0"), waiting("demo-worker-1"), waiting("demo-rdzv", "rendezvous")]
    # One pod of the gang is missing (its creation was refused, or the operator stopped): no gate opens.
    partial = FakeKube(make_job())
    _run(partial.job, partial, pods)
    assert [call[1] for call in partial.calls if call[0] == "create"] == ["demo-worker-2"]
    assert not [call for call in partial.calls if call[0] == "ungate"]
    # Every trainer but no rendezvous (its creation refused): still held, and the condition says so.
    trainers = [waiting("demo-worker-0"), waiting("demo-worker-1"), waiting("demo-worker-2")]
    no_store = FakeKube(make_job())
    _run(no_store.job, no_store, trainers)
    assert [call[1] for call in no_store.calls if call[0] == "create"] == ["demo-rdzv"]
    assert not [call for call in no_store.calls if call[0] == "ungate"]
    (gang_condition,) = [c for c in no_store.written_status["conditions"] if c["type"] == "GangScheduled"]
    assert "3 of its 4 pods (the rendezvous included) exist" in gang_condition["message"], gang_condition
    assert "held at the scheduling gate" in gang_condition["message"]
    whole = FakeKube(make_job())
    _run(whole.job, whole, [*pods, waiting("demo-worker-2")])
    opened = [call[1] for call in whole.calls if call[0] == "ungate"]
    assert sorted(opened) == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"]
    assert not [call for call in whole.calls if call[0] == "create"]


def test_a_gang_s_gates_are_lifted_once_while_the_index_still_shows_them(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """Lifting a big gang's gates takes a while; the reconciles its pods' events bring meanwhile read an index
    that still shows the gates, and must not PATCH every pod again."""
    just_now = format_time(datetime.now(UTC))
    names_and_roles = [(f"demo-worker-{i}", "worker") for i in range(3)] + [("demo-rdzv", "rendezvous")]
    pods = [
        summarize_pod(gang.gated(make_pod(name, role=role, node=None, phase="Pending", created=just_now)))
        for name, role in names_and_roles
    ]
    kube = FakeKube(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    for _ in range(3):
        reconciler.reconcile("ml", "demo", {("ml", "demo"): copy.deepcopy(pods)}, {}, {}, logger)
    opened = [call[1] for call in kube.calls if call[0] == "ungate"]
    assert sorted(opened) == sorted(name for name, _ in names_and_roles)
    # Once the index shows them open, nothing is remembered; a pod of the same name made anew is judged afresh.
    shown = [gang.ungated(pod) for pod in pods]
    reconciler.reconcile("ml", "demo", {("ml", "demo"): shown}, {}, {}, logger)
    assert len(reconciler.own_writes) == 0
    remade = [*shown[:2], {**pods[2], "metadata": {**pods[2]["metadata"], "uid": "another"}}, shown[3]]
    reconciler.reconcile("ml", "demo", {("ml", "demo"): remade}, {}, {}, logger)
    assert [call[1] for call in kube.calls if call[0] == "ungate"][len(opened) :] == ["demo-worker-2"]


def test_pods_counted_as_created_before_the_index_shows_them_are_never_taken_for_deleted_ones(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """Between its creations and their watch events the operator counts the pods as existing (without a uid); the
    pods the index then shows are the same ones, not replacements of pods someone deleted."""

    class StoringKube(FakeKube):
        def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
            super().replace_status(job, status)
            self.job = {**self.job, "status": status}

    kube = StoringKube(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    for _ in range(2):
        reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)
    created = sorted(name for kind, name in kube.calls if kind == "create")
    assert len(created) == 4
    just_now = format_time(datetime.now(UTC))
    roles = {"demo-rdzv": "rendezvous"}
    shown = [
        summarize_pod(
            gang.gated(
                make_pod(name, role=roles.get(name, "worker"), node=None, phase="Pending", created=just_now)
            )
        )
        for name in created
    ]
    kube.calls.clear()
    reconciler.reconcile("ml", "demo", {("ml", "demo"): shown}, {}, {}, logger)
    reconciler.reconcile("ml", "demo", {("ml", "demo"): shown}, {}, {}, logger)
    assert not [call for call in kube.calls if call[0].startswith(("delete", "create"))], kube.calls
    assert "PodDeleted" not in str(kube.job["status"]), kube.job["status"].get("incidents")
    assert ("event", "PodDeleted") not in kube.calls


def test_a_gang_made_whole_by_a_pod_the_index_does_not_show_yet_lifts_each_gate_once(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """The last pod's creation makes the gang whole before its watch event comes; that event comes with the gate
    still on. Its gate is lifted once the index shows it, and no gate twice."""
    just_now = format_time(datetime.now(UTC))

    def waiting(name: str, role: str = "worker") -> dict[str, Any]:
        return summarize_pod(
            gang.gated(make_pod(name, role=role, node=None, phase="Pending", created=just_now))
        )

    indexed = [waiting("demo-worker-0"), waiting("demo-worker-1"), waiting("demo-rdzv", "rendezvous")]
    kube = FakeKube(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def reconcile(pods: list[dict[str, Any]]) -> None:
        reconciler.reconcile("ml", "demo", {("ml", "demo"): copy.deepcopy(pods)}, {}, {}, logger)

    reconcile(indexed)
    assert [name for kind, name in kube.calls if kind == "create"] == ["demo-worker-2"]
    reconcile(indexed)  # whole, counting the pod just created: the indexed pods' gates are lifted
    reconcile(
        [*indexed, waiting("demo-worker-2")]
    )  # its ADDED event, gate on; the others' lifts not shown yet
    reconcile([*indexed, waiting("demo-worker-2")])
    opened = sorted(name for kind, name in kube.calls if kind == "ungate")
    assert opened == ["demo-rdzv", "demo-worker-0", "demo-worker-1", "demo-worker-2"], opened


def test_a_job_another_controller_manages_is_left_alone(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    kube = FakeKube(make_job(managedBy="kueue.x-k8s.io/multikueue"))
    _run(kube.job, kube, [make_pod("demo-worker-0")])
    assert kube.calls == [("get", "demo")]
    assert handlers.waiting_gang(kube.job) is None


def test_recovery_metrics_and_goodput() -> None:
    from phalanx.operator import api

    metrics = OperatorMetrics()
    recovered = api.Incident(cause="Killed", seconds_to_recover=3.0, steps_lost=1)
    metrics.record_recovery([recovered], [recovered], 0)
    assert metrics.registry.get_sample_value("phalanx_recovery_duration_seconds_count") == 1
    assert metrics.registry.get_sample_value("phalanx_lost_steps_total") == 1
    metrics.record_job("ml", "demo", {"goodput": 0.97})
    labels = {"namespace": "ml", "trainingjob": "demo"}
    assert metrics.registry.get_sample_value("phalanx_job_goodput_ratio", labels) == 0.97
    metrics.record_job("ml", "demo", {})
    assert metrics.registry.get_sample_value("phalanx_job_goodput_ratio", labels) is None


def test_status_is_written_once_after_the_pods_and_before_the_events(make_job: Callable[..., Any]) -> None:
    kube = FakeKube(make_job())
    _run(kube.job, kube)
    kinds = [call[0] for call in kube.calls]
    assert kinds.count("status") == 1
    last_create = max(i for i, kind in enumerate(kinds) if kind == "create")
    assert kinds.index("status") > last_create
    assert kinds.index("event") > kinds.index("status")
    assert ("create", "demo-worker-0") in kube.calls and ("create", "demo-rdzv") in kube.calls


def test_conflicts_on_an_unchanged_status_are_retried(make_job: Callable[..., Any]) -> None:
    # A Pause sets spec.suspend and kopf answers that update with an annotation of its own: two new versions
    # of the job, neither touching the status this reconcile planned from.
    kube = FakeKube(make_job(), status_errors=[409, 409])
    _run(kube.job, kube)
    assert [c for c in kube.calls if c[0].startswith("status")] == [
        ("status-failed", "409"),
        ("status-failed", "409"),
        ("status", "Scheduling"),
    ]
    assert ("event", "CreatedPods") in kube.calls


def test_no_events_when_the_status_cannot_be_written(make_job: Callable[..., Any]) -> None:
    kube = FakeKube(make_job(), status_errors=[409] * handlers.STATUS_WRITE_ATTEMPTS)
    _run(kube.job, kube)
    assert len([c for c in kube.calls if c[0] == "status-failed"]) == handlers.STATUS_WRITE_ATTEMPTS
    assert not any(call[0] in ("event", "status") for call in kube.calls)


def test_a_status_written_meanwhile_is_not_overwritten(make_job: Callable[..., Any]) -> None:
    kube = FakeKube(make_job(), status_errors=[409])
    original_get = kube.get_job
    reads = iter([kube.job, {**kube.job, "status": {"state": "Running"}}])
    kube.get_job = lambda namespace, name: original_get(namespace, name) and next(reads)  # type: ignore[method-assign]
    _run(kube.job, kube)
    assert [c for c in kube.calls if c[0].startswith("status")] == [("status-failed", "409")]
    assert not any(call[0] == "event" for call in kube.calls)


def test_an_unchanged_status_is_not_written_again(make_job: Callable[..., Any]) -> None:
    from phalanx.operator.reconcile import Observed, plan
    from phalanx.operator.timeutil import now

    stored = plan(make_job(), Observed(pods=[], now=now())).status
    kube = FakeKube({**make_job(), "status": stored})
    _run(kube.job, kube)
    assert not any(call[0].startswith("status") for call in kube.calls)


def test_all_handlers_register_with_ids_matching_their_kwargs() -> None:
    registry = kopf.OperatorRegistry()
    kube = FakeKube({})
    handlers.register(registry, settings_from({}), handlers.JobReconciler(kube, OperatorMetrics()))  # type: ignore[arg-type]
    index_ids = {handler.id for handler in registry._indexing.get_all_handlers()}
    assert index_ids == {
        "phalanx_pods",
        "phalanx_pod_jobs",
        "phalanx_leases",
        "phalanx_job_histories",
        "phalanx_waiting_gangs",
        "phalanx_priorities",
        "phalanx_hubs",
    }
    resource_ids = {handler.id for handler in registry._changing.get_all_handlers()}
    assert {"created", "updated", "resumed", "deleted"} <= resource_ids
    assert {handler.id for handler in registry._spawning.get_all_handlers()} == {"tick"}


@pytest.mark.parametrize(
    "body", [{"metadata": {"name": "w-0", "labels": {"a": "b"}, "annotations": {"x": "y"}}}]
)
def test_pod_summaries_keep_only_what_decisions_need(body: dict[str, Any]) -> None:
    from phalanx.operator.status import summarize_pod

    summary = summarize_pod(
        {
            **body,
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "image": "x"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": "trainer", "ready": True, "state": {"running": {}}}],
            },
        }
    )
    assert "annotations" not in summary["metadata"] and "containers" not in summary["spec"]
    assert summary["spec"] == {"nodeName": "n1"}
    assert summary["status"]["containerStatuses"] == [{"name": "trainer", "ready": True}]


def test_pod_summaries_keep_a_bounded_termination_message() -> None:
    from phalanx.operator.status import TERMINATION_MESSAGE_CHARS, summarize_pod

    terminated = {"exitCode": 2, "reason": "Error", "message": "x" * 5000}
    summary = summarize_pod(
        {
            "metadata": {"name": "w-0"},
            "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
        }
    )
    kept = summary["status"]["containerStatuses"][0]["terminated"]
    assert kept["message"] == "x" * TERMINATION_MESSAGE_CHARS and kept["exitCode"] == 2


def test_pod_summaries_keep_the_nodes_a_pod_was_kept_off() -> None:
    from phalanx.operator.status import summarize_pod
    from phalanx.operator.topology import avoid_nodes

    spec = avoid_nodes({"containers": [{"name": "trainer", "image": "x"}]}, frozenset({"n2", "n1"}))
    summary = summarize_pod({"metadata": {"name": "w-3"}, "spec": spec, "status": {"phase": "Pending"}})
    assert summary["spec"] == {"avoidNodes": ["n1", "n2"]}


def test_pod_summaries_keep_the_scheduling_gates_a_forming_gang_opens() -> None:
    from phalanx.operator import gang
    from phalanx.operator.status import summarize_pod

    def summary(name: str) -> dict[str, Any]:
        pod = gang.gated({"metadata": {"name": name}, "spec": {"containers": [{"name": "main"}]}})
        return summarize_pod({**pod, "status": {"phase": "Pending"}})

    worker, rendezvous = summary("w-0"), summary("rdzv")
    assert gang.is_gated(worker)
    assert gang.to_ungate([worker], 1, [rendezvous]) == ["rdzv", "w-0"]


def test_a_pod_event_reconciles_the_job_named_by_its_label(make_job: Callable[..., Any]) -> None:
    registry = kopf.OperatorRegistry()
    kube = FakeKube(make_job())
    queue = handlers.register(registry, settings_from({}), handlers.JobReconciler(kube, OperatorMetrics()))  # type: ignore[arg-type]
    (handler,) = [h for h in registry._watching.get_all_handlers() if h.id == "pod_changed"]
    handled = handler.fn(
        name="demo-worker-0",
        namespace="ml",
        labels={"phalanx.dev/job-name": "demo"},
        type="MODIFIED",
        logger=kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings()),
        phalanx_pods={},
        phalanx_leases={},
        phalanx_job_histories={},
        phalanx_waiting_gangs={},
        phalanx_priorities={},
        phalanx_hubs={},
    )
    asyncio.run(handled)
    assert queue.join(30)
    assert ("get", "demo") in kube.calls and any(call[0] == "status" for call in kube.calls)


def _handler_event(handler_id: str) -> dict[str, Any]:
    """What kopf passes handler `handler_id` for an event that asks for job `demo`'s reconcile."""
    lease = _lease_body("demo-worker-0", "2026-01-01T12:00:00.1Z", phase="training", rank="0", step="1")
    owner = {"kind": api.KIND, "apiVersion": api.API_VERSION, "controller": True, "name": "demo"}
    workload = {"metadata": {"name": "demo-workload", "ownerReferences": [owner]}}
    return {
        "pod_changed": {
            "name": "demo-worker-0",
            "labels": {"phalanx.dev/job-name": "demo"},
            "type": "MODIFIED",
        },
        "lease_changed": {"name": "demo-worker-0", "body": lease, "type": "MODIFIED"},
        "created": {"name": "demo"},
        "workload_changed": {"name": "demo-workload", "body": workload, "type": "MODIFIED"},
    }[handler_id]


@pytest.mark.parametrize("handler_id", ["pod_changed", "lease_changed", "created", "workload_changed"])
def test_a_handler_returns_before_the_reconcile_it_asked_for_runs(
    make_job: Callable[..., Any], handler_id: str
) -> None:
    """kopf takes one object's events one at a time, index first: a pod or Lease handler that waited for its
    job's reconcile held that object's index entry back for as long as the reconcile queued. With 1,000 jobs
    started at once that was minutes, and running gangs were deleted as unplaced, live workers as silent. The
    job's own create/update/resume handler (the job indexes: failure history, waiting gangs) and its Kueue
    Workload's queue theirs too."""
    released = threading.Event()

    class HeldKube(FakeKube):
        def get_job(self, namespace: str, name: str) -> dict[str, Any]:
            assert released.wait(30)
            return super().get_job(namespace, name)

    registry = kopf.OperatorRegistry()
    kube = HeldKube(make_job())
    queue = handlers.register(registry, settings_from({}), handlers.JobReconciler(kube, OperatorMetrics()))  # type: ignore[arg-type]
    every = [*registry._changing.get_all_handlers(), *registry._watching.get_all_handlers()]
    (handler,) = [h for h in every if h.id == handler_id]
    release_later = threading.Timer(5.0, released.set)
    release_later.start()
    try:
        handled = handler.fn(
            **_handler_event(handler_id),
            namespace="ml",
            logger=kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings()),
            phalanx_pods={},
            phalanx_pod_jobs={("ml", "demo-worker-0"): ["demo"]},
            phalanx_leases={},
            phalanx_job_histories={},
            phalanx_waiting_gangs={},
            phalanx_priorities={},
            phalanx_hubs={},
        )
        if asyncio.iscoroutine(handled):
            asyncio.run(handled)
        # Returned while the reconcile it queued still waits for the job.
        assert not released.is_set()
        assert not any(call[0] in ("status", "create") for call in kube.calls)
    finally:
        released.set()
        release_later.cancel()
    assert queue.join(30)
    assert any(call[0] == "status" for call in kube.calls)


def test_the_job_is_read_under_its_lock(make_job: Callable[..., Any]) -> None:
    """A reconcile queued behind another must plan from the status that one stored: reading the job before
    taking the lock once let a reconcile take the operator's own deletions for someone else's."""
    reconciler: handlers.JobReconciler | None = None

    class LockCheckingKube(FakeKube):
        def get_job(self, namespace: str, name: str) -> dict[str, Any]:
            assert reconciler is not None
            self.calls.append(("get-locked", str(reconciler._lock(namespace, name).locked())))
            return self.job

    kube = LockCheckingKube(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    assert ("get-locked", "True") in kube.calls and ("get-locked", "False") not in kube.calls


def _lease_body(name: str, renewed: str, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "annotations": {f"phalanx.dev/{key}": value for key, value in annotations.items()},
        },
        "spec": {"renewTime": renewed},
    }


def lease_events(
    make_job: Callable[..., Any], handler_id: str, pod: str
) -> Callable[[str | None, dict[str, Any]], int]:
    """Runs the Lease handler `handler_id` on an event of `pod`'s Lease (the job's `demo`); each call returns the
    reconciles of the job that the event caused."""
    registry = kopf.OperatorRegistry()
    kube = FakeKube(make_job())
    queue = handlers.register(registry, settings_from({}), handlers.JobReconciler(kube, OperatorMetrics()))  # type: ignore[arg-type]
    (handler,) = [h for h in registry._watching.get_all_handlers() if h.id == handler_id]

    def event(kind: str | None, body: dict[str, Any]) -> int:
        before = kube.calls.count(("get", "demo"))
        handled = handler.fn(
            namespace="ml",
            name=body["metadata"]["name"],
            body=body,
            type=kind,
            logger=kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings()),
            phalanx_pods={},
            phalanx_pod_jobs={("ml", pod): ["demo"]},
            phalanx_leases={},
            phalanx_job_histories={},
            phalanx_waiting_gangs={},
            phalanx_priorities={},
            phalanx_hubs={},
        )
        # On kopf's event loop (the handler is async, so renewals never hop to a thread).
        assert inspect.iscoroutine(handled)
        asyncio.run(handled)
        assert queue.join(30)
        return kube.calls.count(("get", "demo")) - before

    return event


def test_a_heartbeat_wakes_its_job_only_when_what_matters_changed(make_job: Callable[..., Any]) -> None:
    event = lease_events(make_job, "lease_changed", "demo-worker-0")

    training = {"phase": "training", "step": "10", "rank": "0", "group-started": "2026-01-01T11:00:00Z"}
    # The operator's start-up listing: remembered, left to the resume handlers.
    assert event(None, _lease_body("demo-worker-0", "2026-01-01T12:00:00.1Z", **training)) == 0
    # Renewals with a new step and timings: nothing to act on at once.
    for second in range(1, 4):
        renewal = {**training, "step": str(10 + second), "step-seconds": "0.5"}
        assert (
            event("MODIFIED", _lease_body("demo-worker-0", f"2026-01-01T12:00:0{second}.1Z", **renewal)) == 0
        )
    # A new group resumed: the job is reconciled now (its incident can close).
    resumed = {**training, "group-started": "2026-01-01T12:00:05Z", "resumed-at": "2026-01-01T12:00:06Z"}
    assert event("MODIFIED", _lease_body("demo-worker-0", "2026-01-01T12:00:06.1Z", **resumed)) == 1
    assert event("MODIFIED", _lease_body("demo-worker-0", "2026-01-01T12:00:07.1Z", **resumed)) == 0
    # A Lease of a pod the operator does not know wakes nothing; a deleted one is forgotten.
    assert event("MODIFIED", _lease_body("other-0", "2026-01-01T12:00:07.1Z", **resumed)) == 0
    assert event("DELETED", _lease_body("demo-worker-0", "2026-01-01T12:00:07.1Z", **resumed)) == 0
    assert event("ADDED", _lease_body("demo-worker-0", "2026-01-01T12:00:08.1Z", **resumed)) == 1


def hub_lease(
    beats: dict[int, dict[str, str]], at: datetime, settled: datetime | None = None
) -> dict[str, Any]:
    """The job `demo`'s hub summary Lease of `beats`, each renewed at `at`, made at `at` (saying the hang verdict
    `settled`, as the hub does once every live peer renewed after it)."""
    stamped = {index: {**beat, "renewTime": beatsummary.micro_time(at)} for index, beat in beats.items()}
    summary = beatsummary.summarise("demo-worker-", stamped, at, 1.5, settled=settled)
    return {
        "metadata": {
            "name": "demo-rdzv",
            "ownerReferences": [{"kind": "Pod", "name": "demo-rdzv", "uid": "uid-rdzv"}],
            "annotations": {beatsummary.SUMMARY_ANNOTATION: beatsummary.encode(summary)},
        },
        "spec": {"renewTime": beatsummary.micro_time(at)},
    }


def test_a_hub_summary_wakes_its_job_only_when_some_worker_s_signal_changed(
    make_job: Callable[..., Any],
) -> None:
    event = lease_events(make_job, "hub_changed", "demo-rdzv")

    def summary_event(kind: str | None, second: int, beats: dict[int, dict[str, str]]) -> int:
        """Reconciles of the job caused by the hub's summary of `beats` made at 12:00:`second`."""
        return event(kind, hub_lease(beats, datetime(2026, 1, 1, 12, 0, second, tzinfo=UTC)))

    training = {"phase": "training", "group-started": "2026-01-01T11:00:00Z"}
    gang = {index: {**training, "step": "10", "rank": str(index)} for index in range(3)}
    gang[3] = {"phase": "standby"}
    assert summary_event(None, 1, gang) == 0  # the start-up listing: remembered only
    # Steps move, and with them which member a class's figures (rank included) come from: nothing to act on.
    for second in range(2, 5):
        moved = {
            **gang,
            **{index: {**gang[index], "step": str(10 + second + (index + second) % 3)} for index in range(3)},
        }
        assert summary_event("MODIFIED", second, moved) == 0
    # The spare joins the group: the job is reconciled now.
    promoted = {**gang, 3: {**training, "step": "14", "rank": "1"}}
    assert summary_event("MODIFIED", 5, promoted) == 1
    assert summary_event("MODIFIED", 6, promoted) == 0


def test_the_hub_summary_in_which_every_peer_renewed_after_a_hang_verdict_wakes_its_job_once(
    make_job: Callable[..., Any],
) -> None:
    # The operator holds a hang verdict until every peer renewed after it; no signal changes when they do, so
    # the summary that first shows it is what wakes the job (the hub publishes it at once: worker/beathub.py).
    event = lease_events(make_job, "hub_changed", "demo-rdzv")
    training = {"phase": "training", "group-started": "2026-01-01T11:00:00Z", "step": "10"}
    hung = {
        **training,
        "rank": "0",
        "fault": "hung",
        "fault-since": "2026-01-01T12:00:00Z",
        "hang-threshold": "2.5",
    }

    def summary_event(second: int) -> int:
        beats = {0: hung, **{i: {**training, "rank": str(i)} for i in (1, 2)}}
        at = datetime(2026, 1, 1, 12, 0, second, tzinfo=UTC)
        stamped = [{**beat, "renewTime": beatsummary.micro_time(at)} for beat in beats.values()]
        verdict = beatsummary.earliest_verdict(stamped)
        settled = verdict if beatsummary.awaited_verdict(stamped) is None else None
        return event("MODIFIED", hub_lease(beats, at, settled))

    assert summary_event(1) == 1  # the verdict itself is news (its peers renewed before it: it waits)
    assert summary_event(2) == 0  # the peers' renewals still precede the verdict (12:00:02.5)
    assert summary_event(3) == 1  # every peer renewed after it: act now
    assert summary_event(4) == 0  # once per verdict


def test_heartbeat_signal_ignores_renewals_steps_and_timings() -> None:
    from phalanx.operator.status import heartbeat_signal

    base = {"phase": "training", "rank": "1", "step": "5", "renewTime": "t1", "step-seconds": "0.4"}
    moved = {**base, "step": "6", "renewTime": "t2", "step-seconds": "0.5", "compute-seconds": "0.3"}
    assert heartbeat_signal(base) == heartbeat_signal(moved)
    # Inside a group, training, saving and restoring alternate with every step: one state here.
    assert heartbeat_signal({**base, "phase": "saving"}) == heartbeat_signal(base)
    assert heartbeat_signal({**base, "phase": "restoring"}) == heartbeat_signal(base)
    # Empty annotations mean unknown, like absent ones.
    assert heartbeat_signal({**base, "resumed-at": ""}) == heartbeat_signal(base)
    for key, value in [
        ("phase", "standby"),
        ("phase", "finished"),
        ("rank", "0"),
        ("group-started", "x"),
        ("resumed-at", "y"),
        ("restored-step", "3"),
        ("restore-source", "peer"),
        ("group-restarts", "2"),
        ("fault", "stopped"),
        ("fault", "hung"),
    ]:
        assert heartbeat_signal({**base, key: value}) != heartbeat_signal(base), key


def test_summaries_keep_when_things_ended() -> None:
    from phalanx.operator.status import summarize_node, summarize_pod

    pod = summarize_pod(
        {
            "metadata": {"name": "w-0"},
            "status": {
                "phase": "Failed",
                "conditions": [{"type": "DisruptionTarget", "status": "True", "lastTransitionTime": "t0"}],
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "restartCount": 1,
                        "lastState": {"terminated": {"exitCode": 1, "finishedAt": "t1"}},
                        "state": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": "t2"}},
                    }
                ],
            },
        }
    )
    (container,) = pod["status"]["containerStatuses"]
    assert container["terminated"] == {"exitCode": 137, "reason": "Error", "finishedAt": "t2"}
    assert container["lastFinishedAt"] == "t1" and container["lastExitCode"] == 1
    assert pod["status"]["conditions"][0]["lastTransitionTime"] == "t0"
    node = summarize_node(
        {
            "metadata": {"name": "n", "labels": {"zone": "z"}},
            "spec": {
                "taints": [
                    {"key": "a", "effect": "NoExecute", "timeAdded": "t5"},
                    {"key": "b", "effect": "NoExecute", "timeAdded": "t4"},
                    {"key": "c", "effect": "NoSchedule", "timeAdded": "t1"},
                ]
            },
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "Unknown",
                        "lastHeartbeatTime": "t3",
                        "lastTransitionTime": "t6",
                    }
                ]
            },
        }
    )
    assert node == {
        "labels": {"zone": "z"},
        "ready": "Unknown",
        "readyHeartbeat": "t3",
        "readySince": "t6",
        "noExecute": ["a", "b"],
        "noExecuteSince": "t4",
        "drillCrash": None,
        "allocatable": {},
        "unschedulable": False,
        "taints": [
            {"key": "a", "value": None, "effect": "NoExecute"},
            {"key": "b", "value": None, "effect": "NoExecute"},
            {"key": "c", "value": None, "effect": "NoSchedule"},
        ],
    }


class BarrierKube(FakeKube):
    """Creations wait for each other at a barrier: only requests sent at the same time get through."""

    def __init__(self, job: dict[str, Any], parties: int) -> None:
        super().__init__(job)
        self.barrier = threading.Barrier(parties, timeout=10)

    def create(self, obj: dict[str, Any]) -> bool:
        self.barrier.wait()  # BrokenBarrierError (test failure) if the creations came one by one
        return super().create(obj)


def test_a_gang_is_created_by_parallel_requests_before_the_status_write(
    make_job: Callable[..., Any],
) -> None:
    kube = BarrierKube(make_job(replicas=6, spares=1), parties=4)
    reconciler = handlers.JobReconciler(kube, OperatorMetrics(), api_concurrency=4)  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)
    created = [name for kind, name in kube.calls if kind == "create"]
    assert len(created) == len(set(created)) == 8  # the rendezvous, 6 workers and a spare, each once
    kinds = [kind for kind, _ in kube.calls]
    assert kinds.index("status") > max(i for i, kind in enumerate(kinds) if kind == "create")


def test_triggers_arriving_while_a_reconcile_waits_for_the_job_are_covered_by_it(
    make_job: Callable[..., Any],
) -> None:
    kube = FakeKube(make_job())
    metrics = OperatorMetrics()
    reconciler = handlers.JobReconciler(kube, metrics)  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def trigger() -> None:
        reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)

    running = reconciler._lock("ml", "demo")
    running.acquire()  # a reconcile of the job is in progress
    waiting = threading.Thread(target=trigger)
    waiting.start()
    while ("ml", "demo") not in reconciler._queued:
        threading.Event().wait(0.01)
    for _ in range(5):
        trigger()  # returns at once: the waiting reconcile will see these changes
    running.release()
    waiting.join(timeout=10)
    assert [call for call in kube.calls if call[0] == "get"] == [("get", "demo")]
    assert metrics.registry.get_sample_value("phalanx_reconciles_coalesced_total") == 5
    trigger()  # nothing waits any more: a new trigger runs
    assert len([call for call in kube.calls if call[0] == "get"]) == 2


class ThrottlingKube(FakeKube):
    """The API server throttles: the `refuse_from`-th creation and the next `refusals` answer 429."""

    def __init__(self, job: dict[str, Any], refuse_from: int, refusals: int) -> None:
        super().__init__(job)
        self.sent = 0
        self.refuse = range(refuse_from, refuse_from + refusals)

    def create(self, obj: dict[str, Any]) -> bool:
        self.sent += 1
        if self.sent in self.refuse:
            self.calls.append(("refused", obj["metadata"]["name"]))
            raise ApiException(status=429, reason="Too Many Requests")
        return super().create(obj)


def test_throttled_creations_pause_the_job_and_resume_after_the_backoff(make_job: Callable[..., Any]) -> None:
    from phalanx.operator.throttle import CreationThrottle

    moment = [0.0]
    kube = ThrottlingKube(make_job(replicas=6, spares=0), refuse_from=3, refusals=1)
    metrics = OperatorMetrics()
    creations = CreationThrottle(first=2.0, longest=30.0, clock=lambda: moment[0])
    reconciler = handlers.JobReconciler(kube, metrics, creations=creations)  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def reconcile() -> Any:
        return reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)

    plan = reconcile()
    # Two creations went through, the third was refused, and the other four were never sent.
    assert [kind for kind, _ in kube.calls if kind in ("create", "refused")] == [
        "create",
        "create",
        "refused",
    ]
    assert plan.wake_after == 2.0  # woken when the pause ends, not at the next periodic reconcile
    assert ("event", "FailedCreate") not in kube.calls  # "not now" is no fault of the job's
    assert metrics.registry.get_sample_value("phalanx_api_errors_total", {"operation": "create"}) == 1
    first = {name for kind, name in kube.calls if kind == "create"}
    kube.calls.clear()
    moment[0] = 1.0
    reconcile()
    assert not [call for call in kube.calls if call[0] in ("create", "refused")]
    moment[0] = 2.5
    reconcile()
    # The two created before the pause are not sent again though the (empty) index does not show them yet.
    created = [name for kind, name in kube.calls if kind == "create"]
    assert len(created) == 5 and not first & set(created)
    assert creations.paused_for(("ml", "demo")) == 0.0


def test_the_cluster_view_counts_other_jobs_live_pods_and_is_taken_only_before_a_gang_is_placed(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    own = make_pod("demo-worker-0", node="node-a")
    other = {
        **make_pod("demo-worker-0", node="node-a"),
        "spec": {"nodeName": "node-a", "requests": {"cpu": "2"}},
    }
    finished = make_pod("demo-worker-1", node="node-b", phase="Succeeded")
    unbound = make_pod("demo-worker-2", node=None)
    pods = {("ml", "demo"): [own], ("ml", "other"): [other, finished, unbound]}
    nodes = {"node-a": [{"ready": "True"}], "node-b": [{"ready": "True"}]}
    view = handlers.cluster_view(("ml", "demo"), pods, nodes)
    assert set(view.nodes) == {"node-a", "node-b"}
    assert view.bound == {"node-a": [{"pods": "1", "cpu": "2"}]}
    job = make_job()
    assert handlers._gang_unplaced(job, [])
    assert not handlers._gang_unplaced(job, [own])  # an attempt is under way
    assert not handlers._gang_unplaced({**job, "status": {"gang": {"scheduledTime": "t"}}}, [])
    assert not handlers._gang_unplaced(make_job(suspend=True), [])


def test_a_reconcile_after_the_operator_was_paused_replaces_no_worker(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """The index still shows the Leases of before a 60 s pause: with the view clock's gap left out, no
    heartbeat is late; judged by the wall clock alone, every worker would be replaced."""
    from datetime import timedelta

    from phalanx.operator import viewclock
    from phalanx.operator.timeutil import format_micro_time, now

    paused_at = now() - timedelta(seconds=60)
    pods = [make_pod("demo-worker-0"), make_pod("demo-worker-1"), make_pod("demo-rdzv", role="rendezvous")]
    stale = {"phase": "training", "step": "50", "renewTime": format_micro_time(paused_at)}
    leases = {("ml", "demo-worker-0"): [stale], ("ml", "demo-worker-1"): [stale]}
    healthy = {"node-a": [{"labels": {}, "ready": "True", "noExecute": []}]}

    def deletions(view: viewclock.OperatorView | None) -> list[tuple[str, str]]:
        kube = FakeKube(make_job(spares=0))
        reconciler = handlers.JobReconciler(kube, OperatorMetrics(), view=view)  # type: ignore[arg-type]
        logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
        reconciler.reconcile("ml", "demo", {("ml", "demo"): pods}, leases, healthy, logger)
        return [call for call in kube.calls if call[0].startswith("delete")]

    assert len(deletions(None)) == 2
    view = viewclock.OperatorView(["phalanx-system"], clusterwide=True)
    view.saw("phalanx-system", paused_at)
    assert deletions(view) == []


def test_the_gangs_ranked_before_a_job_are_those_waiting_without_pods(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    def job(name: str, created: str, **template_spec: Any) -> dict[str, Any]:
        body = make_job()
        body["metadata"].update(name=name, uid=f"uid-{name}", creationTimestamp=created)
        body["spec"]["template"]["spec"].update(template_spec)
        return body

    older = job("older", "2026-01-01T10:00:00Z")
    started = job("started", "2026-01-01T10:30:00Z")
    urgent = job("urgent", "2026-01-01T12:00:00Z", priorityClassName="urgent")
    newer = job("newer", "2026-01-01T11:00:00Z")
    waiting = [
        w for body in (older, started, urgent, newer) if (w := handlers.waiting_gang(body)) is not None
    ]
    placed = {**job("placed", "2026-01-01T09:00:00Z"), "status": {"gang": {"scheduledTime": "x"}}}
    assert handlers.waiting_gang(placed) is None
    pods = {("ml", "started"): [make_pod("started-worker-0", owner="uid-started")]}
    priorities = {"urgent": [1000]}
    gangs = handlers.earlier_gangs(newer, waiting, pods, priorities)
    assert [gang.name for gang in gangs] == ["ml/urgent", "ml/older"]
    assert gangs[0].count == 3  # two workers and a spare
    assert handlers.earlier_gangs(urgent, waiting, pods, priorities) == []
    assert handlers.job_priority(newer, {handlers.GLOBAL_DEFAULT_PRIORITY: [7]}) == 7


def test_gangs_whose_pods_the_index_shows_in_part_keep_room_for_the_rest(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """Three two-pod gangs of 5 CPUs and four 8-CPU nodes: while the index shows one pod of each of the first
    two gangs (their second creations not seen yet), the third still does not fit."""
    from phalanx.operator import capacity

    def job(name: str) -> dict[str, Any]:
        body = make_job(replicas=2, spares=0)
        body["metadata"].update(name=name, uid=f"uid-{name}", creationTimestamp="2026-01-01T10:00:00Z")
        body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "5"}}
        return body

    a, b, c = job("a"), job("b"), job("c")
    waiting = [w for body in (a, b, c) if (w := handlers.waiting_gang(body)) is not None]
    pods = {
        ("ml", name): [
            {
                **make_pod(f"{name}-worker-0", node=None, owner=f"uid-{name}"),
                "spec": {"requests": {"cpu": "5"}},
            }
        ]
        for name in ("a", "b")
    }
    nodes = {f"node-{i}": [{"ready": "True", "allocatable": {"cpu": "8", "pods": "110"}}] for i in range(4)}
    pod_spec = builders.build_worker_pod(c, api.TrainingJobSpec.model_validate(c["spec"]), 0, "worker")[
        "spec"
    ]

    unseen = handlers.unseen_gang_pods(c, waiting, pods)
    assert unseen == [{"cpu": "5"}, {"cpu": "5"}]
    assert handlers.earlier_gangs(c, waiting, pods, {}) == []  # started: counted through their pods
    view = handlers.cluster_view(("ml", "c"), pods, nodes, (), unseen)
    assert not capacity.gang_fit(view, pod_spec, 2).fits
    # Judged by the pods the index shows alone, the third gang would be let in.
    assert capacity.gang_fit(handlers.cluster_view(("ml", "c"), pods, nodes), pod_spec, 2).fits
    # A gang the index shows whole misses nothing.
    whole = {**pods, ("ml", "a"): [*pods[("ml", "a")], make_pod("a-worker-1", node=None, owner="uid-a")]}
    assert handlers.unseen_gang_pods(c, waiting, whole) == [{"cpu": "5"}]


INVALID = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "reason": "Invalid",
        "code": 422,
        "message": 'Pod "demo-worker-0" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "nowhere"',
    }
)


class RejectingKube(FakeKube):
    """The API server refuses the pods named in `rejected` (with `status`), says `exists` ones exist already
    (409), and creates the rest; the Events' texts are kept."""

    def __init__(
        self,
        job: dict[str, Any],
        rejected: set[str],
        status: int = 422,
        exists: frozenset[str] = frozenset(),
        body: str = INVALID,
    ) -> None:
        super().__init__(job)
        self.rejected = rejected
        self.status = status
        self.body = body
        self.exists = exists
        self.events: list[Event] = []

    def create(self, obj: dict[str, Any]) -> bool:
        name = obj["metadata"]["name"]
        if name in self.rejected:
            self.calls.append(("refused", name))
            raise ApiException(status=self.status, reason="Refused", body=self.body)
        if name in self.exists:
            self.calls.append(("exists", name))
            return False
        return super().create(obj)

    def post_event(self, job: dict[str, Any], event: Event) -> None:
        super().post_event(job, event)
        self.events.append(event)


def _reconciler(kube: FakeKube, moment: list[float]) -> Callable[[], Any]:
    from phalanx.operator.throttle import CreationThrottle

    creations = CreationThrottle(first=1.0, longest=4.0, clock=lambda: moment[0])
    reconciler = handlers.JobReconciler(kube, OperatorMetrics(), creations=creations)  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    return lambda: reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)


def test_a_refused_pod_is_a_failed_create_warning_never_a_created_pods_and_its_job_backs_off(
    make_job: Callable[..., Any],
) -> None:
    moment = [0.0]
    kube = RejectingKube(make_job(), rejected={"demo-worker-0", "demo-worker-1", "demo-worker-2"})
    reconcile = _reconciler(kube, moment)
    plan = reconcile()
    # The rendezvous pod went through; the first trainer was refused and the others were not sent.
    assert [call for call in kube.calls if call[0] in ("create", "refused")] == [
        ("create", "demo-rdzv"),
        ("refused", "demo-worker-0"),
    ]
    assert "CreatedPods" in [event.reason for event in plan.events]  # planned, but nothing it names exists
    (failed,) = [event for event in kube.events if event.reason == "FailedCreate"]
    assert failed.type == "Warning"
    assert failed.message == (
        'pod demo-worker-0 refused: 422 Invalid: Pod "demo-worker-0" is invalid: '
        'spec.containers[0].volumeMounts[0].name: Not found: "nowhere"; next attempt in 1s'
    )
    assert not [event for event in kube.events if event.reason == "CreatedPods"]
    assert plan.wake_after == 1.0

    # Reconciles during the pause send nothing and say nothing more.
    kube.calls.clear()
    moment[0] = 0.5
    reconcile()
    assert not [call for call in kube.calls if call[0] in ("create", "refused")]
    # Each later attempt is refused again: one Warning per step, the steps doubling up to the ceiling.
    pauses = []
    for _ in range(4):
        moment[0] += 10.0
        pauses.append(reconcile().wake_after)
    assert pauses == [2.0, 4.0, 4.0, 4.0]
    failures = [event for event in kube.events if event.reason == "FailedCreate"]
    assert len(failures) == 5 and failures[-1].message.endswith("next attempt in 4s")
    assert not [event for event in kube.events if event.reason == "CreatedPods"]


def test_a_new_spec_tries_at_once_and_created_pods_names_what_was_created(
    make_job: Callable[..., Any],
) -> None:
    moment = [0.0]
    kube = RejectingKube(make_job(), rejected={"demo-worker-0"})
    reconcile = _reconciler(kube, moment)
    reconcile()
    assert reconcile().wake_after == 1.0  # paused at the same spec
    # The user fixes the template: a new generation, sent at once, though the pause has not run out.
    kube.job["metadata"]["generation"] = 2
    kube.rejected = set()
    kube.calls.clear()
    plan = reconcile()
    # The rendezvous pod, created before, is remembered until the (here empty) pod index shows it.
    assert [name for kind, name in kube.calls if kind == "create"] == [
        "demo-worker-0",
        "demo-worker-1",
        "demo-worker-2",
    ]
    assert plan.wake_after != 1.0
    created = [event for event in kube.events if event.reason == "CreatedPods"]
    assert [event.message for event in created] == ["created demo-worker-0, demo-worker-1, demo-worker-2"]


def test_created_pods_leaves_out_pods_refused_or_already_there(make_job: Callable[..., Any]) -> None:
    # A quota that holds one more pod: the third trainer is refused (403), the second existed already.
    quota = 'pods "demo-worker-2" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2'
    kube = RejectingKube(
        make_job(spares=2),
        rejected={"demo-worker-2"},
        status=403,
        exists=frozenset({"demo-worker-1"}),
        body=json.dumps({"kind": "Status", "reason": "Forbidden", "code": 403, "message": quota}),
    )
    _reconciler(kube, [0.0])()
    assert [call for call in kube.calls if call[0] in ("create", "exists", "refused")] == [
        ("create", "demo-rdzv"),
        ("create", "demo-worker-0"),
        ("exists", "demo-worker-1"),
        ("refused", "demo-worker-2"),
    ]
    assert [(event.reason, event.message) for event in kube.events if event.reason != "FailedCreate"][-1] == (
        "CreatedPods",
        "created demo-worker-0",
    )
    (failed,) = [event for event in kube.events if event.reason == "FailedCreate"]
    assert failed.message == f"pod demo-worker-2 refused: 403 Forbidden: {quota}; next attempt in 1s"
    # The Warning follows the status write, after every planned Event.
    kinds = [kind for kind, _ in kube.calls]
    assert kinds.index("status") < len(kinds) - 1 and kube.calls[-1] == ("event", "FailedCreate")


def test_a_refusal_is_told_even_when_the_status_is_not_written(make_job: Callable[..., Any]) -> None:
    kube = RejectingKube(make_job(), rejected={"demo-worker-0"})
    kube.status_errors = [500]
    _reconciler(kube, [0.0])()
    assert [event.reason for event in kube.events] == ["FailedCreate"]


def test_an_invalid_waiting_job_holds_no_room_and_breaks_no_other_reconcile(
    make_job: Callable[..., Any],
) -> None:
    mine = make_job()
    mine["metadata"].update(creationTimestamp="2026-01-01T12:00:00Z")
    broken = make_job()
    broken["metadata"].update(name="broken", uid="uid-broken", creationTimestamp="2026-01-01T10:00:00Z")
    broken["spec"]["template"]["spec"]["containers"][0]["name"] = "main"  # no `trainer` container
    huge = make_job(spares=50000)
    huge["metadata"].update(name="huge", uid="uid-huge", creationTimestamp="2026-01-01T10:00:00Z")
    waiting = [handlers.waiting_gang(body) for body in (broken, huge)]
    assert handlers.earlier_gangs(mine, [w for w in waiting if w], {}, {}, max_gang_pods=2000) == []


def test_a_promotion_is_relabelled_and_announced_once_while_the_index_lags(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """The role label the operator wrote reaches its pod index a moment later: a reconcile in between must
    not relabel the pod and announce the promotion again."""
    healthy = {"labels": {}, "ready": "True", "noExecute": []}
    pods = [
        make_pod("demo-worker-0", node="node-gone"),
        make_pod("demo-worker-1"),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    leases = {("ml", "demo-worker-2"): [{"phase": "training", "step": "3", "rank": "0"}]}
    job = make_job()
    job["status"] = {"gang": {"scheduledTime": "2026-01-01T11:59:30Z"}, "startTime": "2026-01-01T11:59:30Z"}

    class StoringKube(FakeKube):
        def replace_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
            super().replace_status(job, status)
            self.job = {**self.job, "status": status}

    kube = StoringKube(job)
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    nodes = {"node-a": [healthy]}
    # Each reconcile reads pod summaries the index made from the pods' events: still labelled `spare`.
    reconciler.reconcile("ml", "demo", {("ml", "demo"): copy.deepcopy(pods)}, leases, nodes, logger)
    assert kube.calls.count(("label", "demo-worker-2=worker")) == 1
    announced = kube.calls.count(("event", "SparePromoted"))
    assert announced == 1
    reconciler.reconcile("ml", "demo", {("ml", "demo"): copy.deepcopy(pods)}, leases, nodes, logger)
    assert kube.calls.count(("label", "demo-worker-2=worker")) == 1
    assert kube.calls.count(("event", "SparePromoted")) == announced
    # Once the index shows the label, the memory of it goes; a new pod of that name is judged afresh.
    caught_up = [*pods[:2], make_pod("demo-worker-2", role="worker"), pods[3]]
    reconciler.reconcile("ml", "demo", {("ml", "demo"): caught_up}, leases, nodes, logger)
    remembered = reconciler.own_writes.pending("ml", "demo")
    assert not [change for _, change in remembered if isinstance(change, ownwrites.RoleLabel)], remembered


class ExistingPodsKube(RejectingKube):
    """Every creation answers AlreadyExists; `get_pod` returns a pod owned by `owner_uid`."""

    def __init__(self, job: dict[str, Any], owner_uid: str) -> None:
        super().__init__(job, rejected=set())
        self.owner_uid = owner_uid

    def create(self, obj: dict[str, Any]) -> bool:
        self.calls.append(("exists", obj["metadata"]["name"]))
        return False

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        owner = {"kind": "TrainingJob", "uid": self.owner_uid, "controller": True}
        return {"metadata": {"name": name, "ownerReferences": [owner]}}


@pytest.mark.parametrize(("owner", "stalled"), [("uid-123", True), ("someone-else", False)])
def test_the_job_s_own_pods_existing_but_never_indexed_mean_the_pod_watch_stopped(
    make_job: Callable[..., Any], owner: str, stalled: bool
) -> None:
    from phalanx.operator import watchguard

    moment = [0.0]
    kube = ExistingPodsKube(make_job(), owner_uid=owner)
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    reconciler.unseen_pods = watchguard.UnseenPods(limit_seconds=60, clock=lambda: moment[0])
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def reconcile() -> None:
        reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)

    reconcile()
    assert not reconciler.watch_stalled.is_set()
    moment[0] = 30.0
    reconcile()  # still within the limit: an index a moment behind is no evidence
    assert not reconciler.watch_stalled.is_set()
    moment[0] = 61.0
    reconcile()
    # The job's own pods, existing and unseen for a minute: the watch stopped. Someone else's say nothing.
    assert reconciler.watch_stalled.is_set() is stalled


def test_pods_it_created_and_never_indexed_are_not_sent_again_and_mean_the_pod_watch_stopped(
    make_job: Callable[..., Any],
) -> None:
    from phalanx.operator import watchguard

    moment = [0.0]

    class CreatingKube(ExistingPodsKube):
        def create(self, obj: dict[str, Any]) -> bool:
            self.calls.append(("create", obj["metadata"]["name"]))
            return True

    kube = CreatingKube(make_job(), owner_uid="uid-123")
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    reconciler.unseen_pods = watchguard.UnseenPods(limit_seconds=60, clock=lambda: moment[0])
    reconciler.own_writes = ownwrites.OwnWrites(limit_seconds=60, clock=lambda: moment[0])
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def reconcile() -> None:
        reconciler.reconcile("ml", "demo", {("ml", "demo"): []}, {}, {}, logger)

    reconcile()
    created = [name for kind, name in kube.calls if kind == "create"]
    assert len(created) == 4
    moment[0] = 30.0
    reconcile()  # the index a moment behind: the pods are taken as existing, not created again
    assert [name for kind, name in kube.calls if kind == "create"] == created
    assert not reconciler.watch_stalled.is_set()
    moment[0] = 61.0
    reconcile()
    assert reconciler.watch_stalled.is_set()


@pytest.mark.parametrize("owner", [None, "uid-of-someone-else"])
def test_a_pod_labelled_as_the_jobs_but_not_owned_by_it_is_never_the_jobs(
    make_job: Callable[..., Any], make_pod: Callable[..., Any], owner: str | None
) -> None:
    # The job label is anyone's to set: a pod of someone else's that exits 2 (a permanent failure of a worker)
    # neither fails the job nor gets deleted, and takes no place in the gang.
    gang = [
        make_pod("demo-worker-0"),
        make_pod("demo-worker-1"),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    impostor = make_pod("demo-worker-3", phase="Failed", exit_code=2, owner=owner)
    healthy = {"labels": {}, "ready": "True", "noExecute": []}
    kube = FakeKube(make_job())
    _run(kube.job, kube, [*gang, impostor], nodes={"node-a": [healthy]})
    deleted = [call for call in kube.calls if call[0].startswith("delete")]
    assert not deleted, deleted
    assert kube.written_status["state"] not in ("Failed", "Invalid"), kube.written_status
    assert "demo-worker-3" not in str(kube.written_status.get("workers")), kube.written_status


class StoredObjects(Kube):
    """The real `Kube.ensure` over objects kept in a dict instead of an API server."""

    def __init__(self, existing: dict[str, dict[str, Any]]) -> None:
        super().__init__(client=None)  # type: ignore[arg-type]
        self.objects = existing

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        if method == "GET":
            if path not in self.objects:
                raise ApiException(status=404, reason="Not Found")
            return self.objects[path]
        name = body["metadata"]["name"]
        self.objects[f"{path}/{name}"] = body
        return body


@pytest.mark.parametrize(
    "owners",
    [
        [],
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "squatter",
                "uid": "u-9",
                "controller": True,
            }
        ],
    ],
)
def test_an_existing_object_of_someone_elses_is_refused_never_adopted(
    make_job: Callable[..., Any], owners: list[dict[str, Any]]
) -> None:
    job = make_job()
    (service,) = [child for child in builders.build_fixed_children(job, api.TrainingJobSpec.model_validate(job["spec"]), None) if child["kind"] == "Service" and child["metadata"]["name"] == "demo-rdzv"]  # fmt: skip
    path = "/api/v1/namespaces/ml/services/demo-rdzv"
    squatted = {"kind": "Service", "metadata": {"name": "demo-rdzv", "ownerReferences": owners}}
    kube = StoredObjects({path: squatted})
    with pytest.raises(ForeignObject, match=r"Service demo-rdzv exists and is not this job's"):
        kube.ensure(service)
    assert kube.objects[path] is squatted
    # Ours: accepted as it is; missing: created.
    kube.objects[path] = service
    kube.ensure(service)
    del kube.objects[path]
    kube._verified.clear()
    kube.ensure(service)
    assert kube.objects[path]["metadata"]["ownerReferences"][0]["uid"] == "uid-123"


class CountedReads(StoredObjects):
    def __init__(self) -> None:
        super().__init__({})
        self.reads = 0

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        self.reads += method == "GET"
        return super().request(method, path, body, content_type)


def test_a_child_is_read_again_only_once_deleted_after_pods_were_made_or_after_its_period(
    make_job: Callable[..., Any],
) -> None:
    job = make_job()
    children = builders.build_fixed_children(job, api.TrainingJobSpec.model_validate(job["spec"]), None)
    (service,) = [child for child in children if child["metadata"]["name"] == "demo-rdzv"]
    kube = CountedReads()
    for child in children:
        kube.ensure(child)
    assert kube.reads == len(children)
    for child in children:
        kube.ensure(child)
    assert kube.reads == len(children), "a child found a moment ago is not read again"
    # Its watch saw it deleted: read (and made) again, and only it.
    assert kube.unverify("Service", "ml", "demo-rdzv", "demo")
    del kube.objects["/api/v1/namespaces/ml/services/demo-rdzv"]
    for child in children:
        kube.ensure(child)
    assert kube.reads == len(children) + 1
    assert "/api/v1/namespaces/ml/services/demo-rdzv" in kube.objects
    # The job created pods: the children no watch covers (here the store Secret) are read again.
    kube.forget("ml", "demo", keep=handlers.WATCHED_CHILDREN.keys())
    for child in children:
        kube.ensure(child)
    assert kube.reads == len(children) + 2
    # Forgotten whole (the job deleted, the operator restarted): all are read again.
    kube.forget("ml", "demo")
    for child in children:
        kube.ensure(child)
    assert kube.reads == 2 * len(children) + 2
    # A deletion after the job was forgotten (the cascade of its own deletion) is no news.
    kube.forget("ml", "demo")
    assert not kube.unverify("Service", "ml", "demo-rdzv", "demo")
    # Past its period a child is read again whatever the watch said.
    kube.ensure(service)
    kube.recheck_seconds = 0.0
    kube.ensure(service)
    assert kube.reads == 2 * len(children) + 4


def test_children_no_watch_covers_are_checked_again_after_pods_are_made_never_before(
    make_job: Callable[..., Any],
) -> None:
    kube = FakeKube(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    creations = [index for index, call in enumerate(kube.calls) if call[0] == "create"]
    forgets = [index for index, call in enumerate(kube.calls) if call[0] == "forget"]
    assert creations and forgets and min(forgets) > max(creations), kube.calls


class DeletedWhileRead(CountedReads):
    """The Service is deleted (and its watch event handled) while its GET is answered."""

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        answer = super().request(method, path, body, content_type)
        if method == "GET" and path.endswith("/services/demo-rdzv"):
            del self.objects[path]
            self.unverify("Service", "ml", "demo-rdzv", "demo")
        return answer


def test_a_child_deleted_while_it_is_checked_is_checked_again(make_job: Callable[..., Any]) -> None:
    job = make_job()
    children = builders.build_fixed_children(job, api.TrainingJobSpec.model_validate(job["spec"]), None)
    (service,) = [child for child in children if child["metadata"]["name"] == "demo-rdzv"]
    kube = DeletedWhileRead()
    kube.objects["/api/v1/namespaces/ml/services/demo-rdzv"] = service
    kube.ensure(service)
    kube.__class__ = CountedReads
    kube.ensure(service)  # not taken as verified: read again, found missing, made
    assert kube.reads == 2
    assert "/api/v1/namespaces/ml/services/demo-rdzv" in kube.objects


class SquattedService(FakeKube):
    def ensure(self, obj: dict[str, Any]) -> None:
        super().ensure(obj)
        if obj["kind"] == "Service" and obj["metadata"]["name"] == "demo-rdzv":
            raise ForeignObject("Service", "demo-rdzv", "it has no controller")


def test_a_job_whose_service_is_someone_elses_creates_no_pod_and_says_why(
    make_job: Callable[..., Any],
) -> None:
    kube = SquattedService(make_job())
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    for _ in range(2):
        reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    assert not [call for call in kube.calls if call[0] == "create"], kube.calls
    assert [call for call in kube.calls if call == ("event", "ForeignObject")] == [("event", "ForeignObject")]
    owned = next(c for c in kube.written_status["conditions"] if c["type"] == "ChildrenOwned")
    assert (owned["status"], owned["reason"]) == ("False", "ForeignObject"), owned
    assert "Service demo-rdzv exists and is not this job's" in owned["message"]
    # Once the Service is gone (and so the job's own is made), the pods come and the condition clears.
    kube.__class__ = FakeKube
    for _ in range(2):
        kube.job = {**kube.job, "status": kube.written_status}
        reconciler.reconcile("ml", "demo", {}, {}, {}, logger)
    assert [call for call in kube.calls if call[0] == "create"], kube.calls
    owned = next(c for c in kube.written_status["conditions"] if c["type"] == "ChildrenOwned")
    assert (owned["status"], owned["reason"]) == ("True", "AllOwned"), owned


def test_every_handler_of_the_workers_renewals_runs_on_the_event_loop() -> None:
    # One event per worker per heartbeat interval: a sync handler would cost each a hop to a thread and back.
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings_from({}), handlers.JobReconciler(None, OperatorMetrics()))  # type: ignore[arg-type]
    every = [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]
    on_heartbeats = [h for h in every if handlers.HEARTBEAT_PHASE_ANNOTATION in (h.annotations or {})]
    assert {h.id for h in on_heartbeats} == {"phalanx_leases", "lease_changed"}
    assert all(inspect.iscoroutinefunction(h.fn) for h in on_heartbeats)


def test_a_status_that_moved_only_its_step_waits_for_the_step_report(make_job: Callable[..., Any]) -> None:
    """Heartbeats move `status.step` between any two reconciles: written whenever it moved, every training job's
    status would be written at every periodic reconcile. A step alone waits `step_report_seconds` after the
    last write; anything else (a state, an Event) is written at once, the step with it."""
    clock = [100.0]
    kube = FakeKube({**make_job(), "status": {"state": "Running", "step": 10}})
    metrics = OperatorMetrics()
    reconciler = handlers.JobReconciler(kube, metrics)  # type: ignore[arg-type]
    reconciler.step_reports = stepreport.StepReports(30.0, clock=lambda: clock[0])
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def written(status: dict[str, Any], *events: Event) -> bool:
        kube.calls.clear()
        reconciler._apply(kube.job, Plan(status=status, events=list(events)), logger)
        if ("status", status["state"]) in kube.calls:
            kube.job = {**kube.job, "status": status}
            return True
        return False

    def step_metric() -> float | None:
        return metrics.registry.get_sample_value(
            "phalanx_job_step", {"namespace": "ml", "trainingjob": "demo"}
        )

    assert written({"state": "Running", "step": 11})  # this process never wrote it: at once
    clock[0] += 5
    assert not written({"state": "Running", "step": 12})
    assert kube.job["status"]["step"] == 11 and step_metric() == 12
    assert written({"state": "Degraded", "step": 13})  # another change: at once, with the step
    interval = reconciler.step_reports.interval_of(("ml", "demo"))
    assert 30.0 <= interval <= 45.0
    clock[0] += interval - 1
    assert not written({"state": "Degraded", "step": 14})
    assert written(
        {"state": "Degraded", "step": 15}, Event("Normal", "Something", "an Event goes with its status")
    )
    clock[0] += interval
    assert written({"state": "Degraded", "step": 16})
    assert not written({"state": "Degraded", "step": 17})
    reconciler.forget("ml", "demo", "uid")
    assert written({"state": "Degraded", "step": 18})  # forgotten: as never written


def test_jobs_started_together_write_their_steps_apart() -> None:
    """A hundred jobs applied together would write their steps in one burst every interval: each job's own
    interval lies between 1 and 1.5 times the setting, the same at every reconcile."""
    reports = stepreport.StepReports(30.0)
    intervals = [reports.interval_of(("ml", f"job-{number}")) for number in range(100)]
    assert all(30.0 <= interval < 45.0 for interval in intervals)
    assert max(intervals) - min(intervals) > 10.0
    assert reports.interval_of(("ml", "job-7")) == intervals[7]


def test_the_periodic_reconcile_runs_on_threads_of_its_own_and_the_indexes_on_the_loop(
    make_job: Callable[..., Any],
) -> None:
    """A hundred jobs' ticks come due every few seconds: on kopf's handler threads they queue ahead of the
    reconciles events call for, and a sync index would wait behind them for each event of its object."""
    registry = kopf.OperatorRegistry()
    threads: list[str] = []

    class ThreadNamingKube(FakeKube):
        def get_job(self, namespace: str, name: str) -> dict[str, Any]:
            threads.append(threading.current_thread().name)
            return super().get_job(namespace, name)

    kube = ThreadNamingKube(make_job())
    handlers.register(registry, settings_from({}), handlers.JobReconciler(kube, OperatorMetrics()))  # type: ignore[arg-type]
    indexes = registry._indexing.get_all_handlers()
    assert indexes and all(inspect.iscoroutinefunction(index.fn) for index in indexes)
    (tick,) = [h for h in registry._spawning.get_all_handlers() if h.id == "tick"]
    asyncio.run(
        tick.fn(
            name="demo",
            namespace="ml",
            logger=kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings()),
            body=kube.job,
            **{index.id: {} for index in indexes},
        )
    )
    assert threads and threads[0].startswith("phalanx-periodic")


def test_a_periodic_reconcile_that_finds_nothing_to_do_reads_nothing(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """Most ticks find nothing to do, and their read of the job is most of what they cost the API server: a
    tick plans from kopf's copy of the job and reads the job only when that plan would do something (a plan
    that acts is always made again from the stored job), and at least every `fresh_read_seconds` anyway."""
    clock = [100.0]
    pods = [
        make_pod("demo-worker-0"),
        make_pod("demo-worker-1"),
        make_pod("demo-worker-2", role="spare"),
        make_pod("demo-rdzv", role="rendezvous"),
    ]
    nodes = {"node-a": [{"labels": {}, "ready": "True", "noExecute": []}]}
    kube = FakeKube(make_job())
    metrics = OperatorMetrics()
    reconciler = handlers.JobReconciler(kube, metrics)  # type: ignore[arg-type]
    reconciler.fresh_reads = quiettick.FreshReads(30.0, clock=lambda: clock[0])
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())

    def tick(watched: dict[str, Any]) -> list[tuple[str, str]]:
        kube.calls.clear()
        reconciler.reconcile("ml", "demo", {("ml", "demo"): pods}, {}, nodes, logger, watched=watched)
        if hasattr(kube, "written_status"):
            kube.job = {**kube.job, "status": kube.written_status}
        return [call for call in kube.calls if call[0] != "ensure"]

    first = tick(kube.job)
    assert first[0] == ("get", "demo") and ("status", "Running") in first, first  # never read: read it
    # kopf's copy still lacks the status just written: the plan from it acts, so the job is read again.
    stale = {key: value for key, value in kube.job.items() if key != "status"}
    clock[0] += 5
    assert tick(stale)[0] == ("get", "demo")
    # Nothing changed since (the pods' creations are remembered): nothing read, nothing done.
    clock[0] += 5
    assert tick(copy.deepcopy(kube.job)) == []
    assert metrics.registry.get_sample_value("phalanx_quiet_ticks_total") == 1
    # Read anyway once the last read (the stale tick's) is the job's own period old: 30 to 45 s, by job.
    last_read, period = clock[0] - 5, spread.period_of(30.0, "ml/demo")
    clock[0] = last_read + period - 0.1
    assert tick(copy.deepcopy(kube.job)) == []
    clock[0] = last_read + period
    assert tick(copy.deepcopy(kube.job)) == [("get", "demo")]
    # A job being deleted is never planned from a copy.
    clock[0] += 1
    going = copy.deepcopy(kube.job)
    going["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    assert tick(going)[0] == ("get", "demo")


def test_a_plan_is_quiet_only_when_carrying_it_out_changes_nothing() -> None:
    stored = {"state": "Running", "step": 10}
    assert quiettick.quiet(Plan(status=dict(stored)), stored, lambda: False)
    assert quiettick.quiet(Plan(status={"state": "Running", "step": 11}), stored, lambda: True)
    assert not quiettick.quiet(Plan(status={"state": "Running", "step": 11}), stored, lambda: False)
    assert not quiettick.quiet(Plan(status={"state": "Degraded", "step": 10}), stored, lambda: True)
    for acting in (
        Plan(status=dict(stored), delete_pods=["w-0"]),
        Plan(status=dict(stored), create_pods=[{"metadata": {"name": "w-1"}}]),
        Plan(status=dict(stored), events=[Event("Normal", "Something", "said")]),
        Plan(status=dict(stored), relabel_pods={"w-2": "worker"}),
        Plan(status=dict(stored), delete_job=True),
        Plan(status=dict(stored), suspend=True),
    ):
        assert not quiettick.quiet(acting, stored, lambda: True), acting


def test_a_reconcile_thread_reads_the_indexes_while_kopf_changes_them() -> None:
    """kopf changes its indexes on its event loop while reconciles read them on their threads: a loop over a
    live index raised `dictionary changed size during iteration` once a pod came or went under it, the
    reconcile failed, and kopf retried its handler only a minute later (a small job's replacement waited out
    30 s beside a big gang). Here another thread churns a real kopf index with the interpreter switching
    threads as often as it can."""
    from kopf._core.engines.indexing import Index

    index: Index[tuple[str, str], dict[str, Any]] = Index()
    pod = {"metadata": {}, "spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}}
    for number in range(200):
        index._replace(("pod", str(number)), {("ml", f"job-{number}"): pod})
    stop = threading.Event()

    def churn() -> None:
        number = 0
        while not stop.is_set():
            number = (number + 1) % 200
            index._discard(("pod", str(number)))
            index._replace(("pod", str(number)), {("ml", f"job-{number}"): pod})

    churning = threading.Thread(target=churn)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    churning.start()
    try:
        for _ in range(300):
            copied = handlers.index_copy(index)
            view = handlers.cluster_view(("ml", "mine"), copied, {})
            # A pod or two away at any moment: missing from the keys taken, or gone by the time its store is read.
            assert len(copied) >= 190 and sum(len(pods) for pods in view.bound.values()) >= 190
            assert handlers._first(index.get(("ml", "job-7"))) in (pod, None)
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        churning.join()


def test_a_gang_is_deleted_for_its_schedule_timeout_only_when_the_api_server_agrees(
    make_job: Callable[..., Any], make_pod: Callable[..., Any]
) -> None:
    """The index lags (with 1,000 jobs started at once it did): a gang it still shows unbound past its timeout
    may be bound and running. The pods are listed before the gang is deleted."""
    long_ago = "2026-01-01T00:00:00Z"  # far past any schedule timeout
    roles = [("demo-worker-0", "worker"), ("demo-worker-1", "worker"), ("demo-worker-2", "worker")]
    roles.append(("demo-rdzv", "rendezvous"))
    unbound = [
        make_pod(name, role=role, node=None, phase="Pending", created=long_ago) for name, role in roles
    ]
    stale = [summarize_pod(pod) for pod in unbound]
    running = [make_pod(name, role=role, created=long_ago) for name, role in roles]
    index = {("ml", "demo"): stale}
    nodes = {"node-a": [{"labels": {}, "ready": "True", "noExecute": []}]}

    kube = FakeKube(make_job())
    kube.listed = running
    reconciler = handlers.JobReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    logger = kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings())
    plan = reconciler.reconcile("ml", "demo", index, {}, nodes, logger)
    assert ("list-pods", "demo") in kube.calls
    assert not [call for call in kube.calls if call[0].startswith("delete")], kube.calls
    assert plan is not None and not [event for event in plan.events if event.reason == "ScheduleTimeout"]

    # The API server lists them unscheduled too: the gang goes, as its timeout says.
    late = FakeKube(make_job())
    late.listed = unbound
    reconciler = handlers.JobReconciler(late, OperatorMetrics())  # type: ignore[arg-type]
    reconciler.reconcile("ml", "demo", index, {}, nodes, logger)
    deleted = sorted(call[1] for call in late.calls if call[0].startswith("delete"))
    assert deleted, late.calls
    assert ("event", "ScheduleTimeout") in late.calls


def test_a_node_s_health_change_reconciles_the_jobs_bound_to_it_now(make_job: Callable[..., Any]) -> None:
    """A node turning NotReady (or deleted) is acted on at once, not at its jobs' next periodic reconcile."""
    from phalanx.operator import nodeview

    reconciled: list[tuple[str, str]] = []

    class RecordingReconciler(handlers.JobReconciler):
        def reconcile(self, namespace: str, name: str, *args: Any, **kwargs: Any) -> Plan | None:
            reconciled.append((namespace, name))
            return None

    kube = FakeKube(make_job())
    reconciler = RecordingReconciler(kube, OperatorMetrics())  # type: ignore[arg-type]
    view = nodeview.NodeView(lambda token: {}, lambda version: iter(()))
    reconciler.nodes = view
    registry = kopf.OperatorRegistry()
    queue = handlers.register(registry, settings_from({}), reconciler)
    assert view.on_change is not None
    view.on_change("node-a")  # before any reconcile: the start-up reconciles cover every job
    assert queue.join(10) and reconciled == []

    def bound(name: str, node: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": {"phase": "Running"}}

    pods = {("ml", "demo"): [bound("demo-worker-0", "node-a")], ("ml", "other"): [bound("other-0", "node-b")]}
    indexes = registry._indexing.get_all_handlers()
    (tick,) = [h for h in registry._spawning.get_all_handlers() if h.id == "tick"]
    for job in ("demo", "other"):
        asyncio.run(
            tick.fn(
                name=job,
                namespace="ml",
                logger=kopf.LocalObjectLogger(body=kube.job, settings=kopf.OperatorSettings()),
                body=kube.job,
                **{index.id: pods if index.id == "phalanx_pods" else {} for index in indexes},
            )
        )
    reconciled.clear()
    view.on_change("node-a")
    assert queue.join(10) and reconciled == [("ml", "demo")]
    view.on_change("node-c")
    assert queue.join(10) and reconciled == [("ml", "demo")]
