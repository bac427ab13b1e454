"""The pure parts of the cluster benchmarks: room planning, watch timelines, latencies, churn, parsing."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from phalanx.bench import gang_creation, operator_scale, rerendezvous
from phalanx.bench.heartbeats import lease_body
from phalanx.bench.watch import (
    ObjectEvent,
    PodEvent,
    bound,
    churn,
    created,
    cumulative,
    first_times,
    per_second,
    rate,
    running,
)

MI = 2**20


# ------------------------------------------------------------------------------ gang room planning


def test_blockers_leave_room_for_exactly_the_pods_wanted() -> None:
    rooms = [
        gang_creation.NodeRoom("sim-0", cpu_milli=8000, memory=16384 * MI, pods=250),
        gang_creation.NodeRoom("sim-1", cpu_milli=7990, memory=16384 * MI, pods=240),
    ]
    blockers = gang_creation.plan_blockers(rooms, want=300, pod_memory=8 * MI, keep_cpu_milli=50)
    assert [b.node for b in blockers] == ["sim-0", "sim-1"]
    assert [b.leaves for b in blockers] == [249, 51]
    for blocker, room in zip(blockers, rooms, strict=True):
        left_memory = room.memory - blocker.memory
        assert left_memory // (8 * MI) == blocker.leaves  # exactly `leaves` gang pods fit by memory
        assert room.cpu_milli - blocker.cpu_milli == 49  # a 50m rendezvous pod would not fit
    assert sum(b.leaves for b in blockers) == 300


def test_blockers_use_the_fewest_nodes_and_refuse_what_cannot_fit() -> None:
    rooms = [gang_creation.NodeRoom(f"sim-{i}", 8000, 16384 * MI, 250) for i in range(3)]
    assert len(gang_creation.plan_blockers(rooms, 51, 8 * MI, 50)) == 1
    with pytest.raises(ValueError, match="hold only 747 of 800"):
        gang_creation.plan_blockers(rooms, 800, 8 * MI, 50)


def test_node_room_subtracts_the_requests_of_bound_pods() -> None:
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="sim-0"),
        status=client.V1NodeStatus(allocatable={"cpu": "8", "memory": "16Gi", "pods": "250"}),
    )

    def pod(cpu: str | None, memory: str) -> client.V1Pod:
        requests = {"memory": memory, **({"cpu": cpu} if cpu else {})}
        container = client.V1Container(name="c", resources=client.V1ResourceRequirements(requests=requests))
        return client.V1Pod(spec=client.V1PodSpec(containers=[container]))

    room = gang_creation.node_room(node, [pod("250m", "1Gi"), pod(None, "8Mi")])
    assert room == gang_creation.NodeRoom("sim-0", 7750, 16 * 2**30 - 2**30 - 8 * MI, 248)


def test_gang_job_tolerates_simulated_nodes_without_a_selector_the_rendezvous_would_copy() -> None:
    job = gang_creation.gang_job("gang", gang_creation.QUICK, 10, nodes=["sim-2"])
    spec = job["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec
    assert spec["tolerations"][0]["key"] == "phalanx.dev/simulated"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["sim-2"]} in terms[0][
        "matchExpressions"
    ]
    assert "cpu" not in spec["containers"][0]["resources"]["requests"]
    assert job["spec"]["replicas"] + job["spec"]["spares"] == gang_creation.QUICK.gang


# ------------------------------------------------------------------------------ watch timelines


def event(
    t: float, kind: str, uid: str, node: str | None = None, phase: str | None = None, **labels: str
) -> PodEvent:
    return PodEvent(t=t, type=kind, name=uid, uid=uid, labels=labels, node=node, phase=phase)


def test_first_times_of_creation_binding_and_running() -> None:
    events = [
        event(1.0, "ADDED", "a"),
        event(1.5, "MODIFIED", "a", node="sim-0", phase="Pending"),
        event(2.0, "MODIFIED", "a", node="sim-0", phase="Running"),
        event(1.2, "ADDED", "b"),
        event(3.0, "MODIFIED", "b", node="sim-1", phase="Running"),
        event(4.0, "DELETED", "b", node="sim-1", phase="Running"),
    ]
    assert first_times(events, created) == {"a": 1.0, "b": 1.2}
    assert first_times(events, bound) == {"a": 1.5, "b": 3.0}
    assert first_times(events, running) == {"a": 2.0, "b": 3.0}
    assert gang_creation.max_concurrently_bound(events) == 2


def test_rate_curves() -> None:
    assert cumulative([3.0, 1.0, 2.0], origin=1.0) == ([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert per_second([10.0, 10.2, 10.9, 11.1, 12.5]) == [3.0, 1.0, 1.0]
    assert rate([0.0, 1.0, 2.0]) == 1.0  # two intervals in two seconds
    assert rate([1.0, 2.0], origin=0.0) == 1.0  # two events two seconds after the origin
    assert rate([]) is None and rate([5.0]) is None


def test_churn_counts_the_fields_each_update_changed() -> None:
    def job(t: float, kind: str, step: int, state: str = "Running", **annotations: str) -> ObjectEvent:
        return ObjectEvent(t, kind, "job-0", {"step": step, "state": state}, dict(annotations))

    events = [
        job(0.0, "LISTED", 10),
        job(5.0, "MODIFIED", 20),
        job(10.0, "MODIFIED", 30, **{"kopf": "x"}),
        job(15.0, "MODIFIED", 30, **{"kopf": "x"}),
        job(99.0, "MODIFIED", 40),
    ]
    updates, fields = churn(events, start=1.0, end=20.0)
    assert updates == 3
    assert fields == {"status.step": 2, "annotation kopf": 1, "(nothing: metadata only)": 1}


# ------------------------------------------------------------------------------ operator at scale


def test_replacement_latency_from_the_deleted_event_to_a_new_pod_of_the_job() -> None:
    events = [
        event(0.0, "LISTED", "w0", **{"phalanx.dev/job-name": "job-1"}),
        event(0.0, "LISTED", "x0", **{"phalanx.dev/job-name": "job-2"}),
        event(10.2, "DELETED", "w0", **{"phalanx.dev/job-name": "job-1"}),
        event(10.3, "ADDED", "x1", **{"phalanx.dev/job-name": "job-2"}),
        event(10.45, "ADDED", "w1", **{"phalanx.dev/job-name": "job-1"}),
    ]
    latency = operator_scale.replacement_latency(events, "job-1", "w0", since=10.0)
    assert latency == pytest.approx(0.25)
    assert operator_scale.replacement_latency(events[:3], "job-1", "w0", since=10.0) is None


def test_absurd_jobs_ask_for_a_typo_and_one_pod_over_the_simulated_nodes() -> None:
    typo, oversized = operator_scale.absurd_manifests(1250)
    assert typo["spec"]["replicas"] == typo["spec"]["maxReplicas"] == 100_000
    assert oversized["spec"]["replicas"] == 1251
    assert oversized["spec"]["template"]["spec"]["nodeSelector"] == {"phalanx.dev/simulated": "true"}
    refused = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec"}]}}
    held = {
        "status": {
            "conditions": [{"type": "GangScheduled", "status": "False", "reason": "InsufficientCapacity"}]
        }
    }
    scheduling = {
        "status": {"conditions": [{"type": "GangScheduled", "status": "False", "reason": "Scheduling"}]}
    }
    assert operator_scale.stopped_without_pods(refused) and operator_scale.stopped_without_pods(held)
    assert not operator_scale.stopped_without_pods(scheduling) and not operator_scale.stopped_without_pods({})
    events = [
        event(1.0, "ADDED", "a", **{"phalanx.dev/job-name": "absurd-typo"}),
        event(1.1, "MODIFIED", "a", **{"phalanx.dev/job-name": "absurd-typo"}),
        event(1.2, "ADDED", "b", **{"phalanx.dev/job-name": "job-000"}),
    ]
    assert operator_scale.pods_of(events, ["absurd-typo", "absurd-oversized"]) == 1
    note = operator_scale.absurd_note(
        [0.1, 0.2],
        [0.3, 0.4],
        (0, 0),
        {
            "jobs": {"absurd-typo": 100_000},
            "seconds_to_refused_or_held": 1.5,
            "pods": 0,
            "conditions": {"absurd-typo": ["Failed=True InvalidSpec: spec.replicas: over maxGangPods"]},
        },
    )
    assert "p50 300 ms, p99 400 ms against p50 100 ms, p99 200 ms" in note
    assert "had 0 pods" in note and "maxGangPods" in note


def test_histogram_quantile_interpolates_inside_buckets() -> None:
    buckets = {0.01: 50.0, 0.1: 90.0, 1.0: 100.0, float("inf"): 100.0}
    assert operator_scale.histogram_quantile(buckets, 0.5) == pytest.approx(0.01)
    assert operator_scale.histogram_quantile(buckets, 0.7) == pytest.approx(0.01 + 0.09 * 0.5)
    assert operator_scale.histogram_quantile(buckets, 0.95) == pytest.approx(0.1 + 0.9 * 0.5)
    assert operator_scale.histogram_quantile({float("inf"): 0.0}, 0.5) is None


def test_operator_writes_leave_heartbeats_nodes_and_events_out() -> None:
    from phalanx.bench.prom import RequestCount

    rows = [
        RequestCount("PUT", "trainingjobs", "status", "200", 10),
        RequestCount("POST", "pods", "", "201", 4),
        RequestCount("PATCH", "leases", "", "200", 100),
        RequestCount("PATCH", "nodes", "status", "200", 5),
        RequestCount("PATCH", "events", "", "200", 7),
        RequestCount("GET", "trainingjobs", "", "200", 50),
    ]
    assert operator_scale.operator_writes(rows) == 14
    assert operator_scale.status_writes(rows) == 10
    # Reads: the operator's GETs of its jobs and their children; not LIST/WATCH, not pods (the node agent reads
    # them too), not leases.
    rows += [
        RequestCount("GET", "services", "", "200", 3),
        RequestCount("GET", "secrets", "", "404", 1),
        RequestCount("LIST", "trainingjobs", "", "200", 9),
        RequestCount("WATCH", "services", "", "200", 2),
        RequestCount("GET", "pods", "", "200", 8),
        RequestCount("GET", "leases", "", "200", 6),
    ]
    assert operator_scale.operator_reads(rows) == 54


def test_simulated_heartbeat_follows_the_lease_contract() -> None:
    from datetime import UTC, datetime

    body = lease_body("job-worker-3", "uid-3", "ns", 120, 1, 2, 30, datetime(2026, 1, 1, tzinfo=UTC))
    meta = body["metadata"]
    assert meta["name"] == "job-worker-3" and meta["ownerReferences"][0]["uid"] == "uid-3"
    assert meta["annotations"]["phalanx.dev/phase"] == "training"
    assert meta["annotations"]["phalanx.dev/step"] == "120"
    assert meta["annotations"]["phalanx.dev/world-size"] == "2"
    assert body["spec"] == {
        "holderIdentity": "job-worker-3",
        "leaseDurationSeconds": 30,
        "renewTime": "2026-01-01T00:00:00.000000Z",
    }


# ------------------------------------------------------------------------------ re-rendezvous


WORKER_METRICS = """# HELP phalanx_worker_step Last training step completed by this pod.
# TYPE phalanx_worker_step gauge
phalanx_worker_step 412.0
# HELP phalanx_worker_world_size Training processes in the current group.
# TYPE phalanx_worker_world_size gauge
phalanx_worker_world_size 3.0
# HELP phalanx_worker_rendezvous_seconds Duration of the last rendezvous of this launcher.
# TYPE phalanx_worker_rendezvous_seconds gauge
phalanx_worker_rendezvous_seconds 1.75
# HELP phalanx_worker_phase 1 for the pod's current phase.
# TYPE phalanx_worker_phase gauge
phalanx_worker_phase{phase="rendezvous"} 0.0
phalanx_worker_phase{phase="training"} 1.0
# HELP phalanx_worker_group_restarts_total Worker-group restarts by this launcher, by cause.
# TYPE phalanx_worker_group_restarts_total counter
phalanx_worker_group_restarts_total{cause="membership"} 2.0
phalanx_worker_group_restarts_total{cause="epoch"} 1.0
"""


def test_worker_view_and_training_at_a_size() -> None:
    view = rerendezvous.worker_view("w0", WORKER_METRICS)
    assert view == rerendezvous.WorkerView("w0", 412, 3, "training", 1.75, 3)
    assert rerendezvous.training_at({"w0": view}, 3, past_step=400) is False  # one worker of three
    three = {name: rerendezvous.WorkerView(name, 500, 3, "training", 1.0, 1) for name in ("a", "b", "c")}
    assert rerendezvous.training_at(three, 3, past_step=400)
    assert not rerendezvous.training_at(three, 3, past_step=500)


def test_rerendezvous_is_the_longest_among_workers_that_reformed() -> None:
    before = {
        "a": rerendezvous.WorkerView("a", 100, 2, "training", 0.5, 1),
        "b": rerendezvous.WorkerView("b", 100, 2, "training", 0.5, 1),
    }
    after = {
        "a": rerendezvous.WorkerView("a", 120, 3, "training", 1.2, 2),
        "b": rerendezvous.WorkerView("b", 120, 3, "training", 2.4, 2),
        "c": rerendezvous.WorkerView("c", 120, 3, "training", 9.0, 0),  # the newcomer waited for the others
    }
    assert rerendezvous.rerendezvous_seconds(before, after) == 2.4
    assert rerendezvous.rerendezvous_seconds(before, before) is None


def test_thin_keeps_at_most_the_points_asked_and_the_last() -> None:
    from phalanx.bench.watch import thin

    x = [float(i) for i in range(1000)]
    short_x, short_y = thin(x, x, points=100)
    assert len(short_x) <= 101 and short_x[0] == 0.0 and short_x[-1] == 999.0 and short_x == short_y
    assert thin([1.0], [2.0]) == ([1.0], [2.0])


def test_one_short_timeout_leaves_the_scheduler_time_to_place_what_fits() -> None:
    sizes = gang_creation.FULL
    assert gang_creation.short_timeout(sizes, None) == sizes.short_timeout
    assert gang_creation.short_timeout(sizes, 2.0) == sizes.short_timeout  # a fast machine: the floor
    assert gang_creation.short_timeout(sizes, 76.0) == 129  # 1.5 x 76 s + 15 s


def test_events_posted_between_two_looks_by_reason() -> None:
    before = {(True, "CreatedPods"): 3.0, (False, "FailedToUpdateEndpoint"): 10.0}
    after = {
        (True, "CreatedPods"): 5.0,
        (True, "HeartbeatTimeout"): 1.0,
        (False, "FailedToUpdateEndpoint"): 14.0,
    }
    assert operator_scale.reasons_posted(before, after, mine=True) == {
        "CreatedPods": 2.0,
        "HeartbeatTimeout": 1.0,
    }
    assert operator_scale.reasons_posted(before, after, mine=False) == {"FailedToUpdateEndpoint": 4.0}


def test_heartbeat_timeouts_with_leases_renewed_in_time_are_called_false_alarms() -> None:
    assert operator_scale.heartbeat_false_alarms({"HeartbeatTimeout": 4}, max_gap=9.0)[0].startswith(
        "False alarms: the operator posted 4 HeartbeatTimeout"
    )
    assert operator_scale.heartbeat_false_alarms({"HeartbeatTimeout": 4}, max_gap=45.0) == []
    assert operator_scale.heartbeat_false_alarms({"CreatedPods": 2}, max_gap=5.0) == []


def test_operator_log_problems_are_told_by_their_level() -> None:
    from phalanx.bench.cluster import problem_lines, warning_summary

    lines = [
        "2026-01-01 10:00:00,001 WARNING phalanx.operator.handlers: create failed: 403 Forbidden",
        "2026-01-01 10:00:00,002 WARNING phalanx.operator.handlers: create failed: 403 Forbidden",
        "2026-01-01 10:00:00,003 INFO kopf.objects: body mentions ERROR and 429 but is fine",
        "2026-01-01 10:00:00,004 ERROR kopf.objects: handler failed",
        "a line without a timestamp WARNING",
    ]
    assert len(problem_lines(lines)) == 3
    assert warning_summary(lines) == [
        "2 x WARNING phalanx.operator.handlers: create failed: 403 Forbidden",
        "1 x ERROR kopf.objects: handler failed",
    ]


def test_jobs_not_running_are_named_with_the_reason_they_give() -> None:
    def job(name: str, state: str, *conditions: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": name}, "status": {"state": state, "conditions": list(conditions)}}

    running = {"type": "Running", "status": "True", "reason": "Training", "message": "2 workers running"}
    waiting = {"type": "Running", "status": "False", "reason": "BelowMinReplicas", "message": "0 of 2"}
    jobs = [job("a", "Running", running), job("b", "Pending", waiting), job("c", "Pending")]
    assert operator_scale.not_running(jobs) == {
        "b": "Pending (BelowMinReplicas: 0 of 2)",
        "c": "Pending (no Running condition)",
    }


def test_the_heartbeat_emulator_s_longest_gap_counts_a_lease_s_wait_for_its_first_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod whose first renewals fail went unrenewed from its first listing: that wait is a gap like any other
    (left out, a pod silent past the timeout before its first beat read as the operator's false alarm)."""
    from phalanx.bench import heartbeats

    refusals = [True, True, False, False]

    def write(api: object, namespace: str, name: str, body: object, known: bool) -> None:
        if refusals.pop(0):
            raise RuntimeError("503")

    monkeypatch.setattr(heartbeats, "write_lease", write)
    emulator = heartbeats.HeartbeatSimulator(lambda: None, "ns", 0.1, 30, 1, threads=1)
    pod = {"metadata": {"uid": "u1", "name": "job-worker-0", "labels": {}}}
    monkeypatch.setattr(emulator, "_workers", lambda: [pod])
    for _ in range(3):
        emulator._round()
        time.sleep(0.2)
    assert emulator.failures == 2 and emulator.writes == 1
    assert emulator.max_gap >= 0.4
    emulator._round()
    assert emulator.writes == 2 and emulator.max_gap < 1.0
