"""All-or-nothing decisions and the gang-scheduler integrations."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from phalanx.operator import api, gang

MakePod = Callable[..., dict[str, Any]]
GANG = api.GangSpec(schedule_timeout_seconds=60, backoff_seconds=10, max_backoff_seconds=25)


def test_all_scheduled(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod(f"demo-worker-{i}") for i in range(3)]
    assert gang.decide(pods, 3, GANG, 0, now).action == "Scheduled"


def test_missing_pods_are_not_a_full_gang(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod(f"demo-worker-{i}", created="2026-01-01T11:59:50Z") for i in range(2)]
    decision = gang.decide(pods, 3, GANG, 0, now)
    assert decision.action == "Wait" and "2 of 3" in decision.message


def test_pending_within_the_timeout_waits(make_pod: MakePod, now: datetime) -> None:
    pods = [make_pod("demo-worker-0", created="2026-01-01T11:59:30Z"), make_pod("demo-worker-1", node=None)]
    pods[1]["metadata"]["creationTimestamp"] = "2026-01-01T11:59:30Z"
    decision = gang.decide(pods, 2, GANG, 0, now)
    assert decision.action == "Wait" and decision.reason == "Scheduling"


def test_timeout_deletes_all_with_the_schedulers_reason(make_pod: MakePod, now: datetime) -> None:
    pending = make_pod("demo-worker-1", node=None, phase="Pending", created="2026-01-01T11:58:00Z")
    pending["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available",
        }
    ]
    pods = [make_pod("demo-worker-0", created="2026-01-01T11:58:00Z"), pending]
    decision = gang.decide(pods, 2, GANG, 0, now)
    assert decision.action == "DeleteAll" and decision.reason == "ScheduleTimeout"
    assert "1 of 2" in decision.message and "0/2 nodes are available" in decision.message
    assert decision.retry_after == now + timedelta(seconds=10)


def test_backoff_doubles_and_is_capped() -> None:
    assert [gang.backoff_seconds(attempt, GANG) for attempt in (1, 2, 3, 4)] == [10, 20, 25, 25]


def test_coscheduling_labels_and_pod_group(make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job(gang={"podGroup": "Coscheduling", "scheduleTimeoutSeconds": 90})
    spec = api.TrainingJobSpec.model_validate(job["spec"])
    labels, annotations = gang.pod_group_metadata("demo", spec)
    assert labels == {"scheduling.x-k8s.io/pod-group": "demo"} and annotations == {}
    group = gang.build_pod_group(job, spec)
    assert group is not None and group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 90}


def test_volcano_annotation_scheduler_and_queue(make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job(gang={"podGroup": "Volcano", "queueName": "research"})
    spec = api.TrainingJobSpec.model_validate(job["spec"])
    assert gang.pod_group_metadata("demo", spec) == ({}, {"scheduling.k8s.io/group-name": "demo"})
    assert gang.scheduler_name(spec) == "volcano"
    group = gang.build_pod_group(job, spec)
    assert group is not None and group["spec"] == {"minMember": 3, "queue": "research"}


def test_kueue_labels_without_a_pod_group_object(make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job(gang={"podGroup": "Kueue", "queueName": "team-a"})
    spec = api.TrainingJobSpec.model_validate(job["spec"])
    labels, annotations = gang.pod_group_metadata("demo", spec)
    assert labels == {"kueue.x-k8s.io/pod-group-name": "demo", "kueue.x-k8s.io/queue-name": "team-a"}
    assert annotations == {"kueue.x-k8s.io/pod-group-total-count": "3"}
    assert gang.build_pod_group(job, spec) is None
