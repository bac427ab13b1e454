"""The automatic checkpoint interval end to end: `intervalSteps: auto` on real training in the local cluster.

The operator starts from the bootstrap interval, chooses one once the workers report what a durable save
costs, shows it with its inputs in `status.checkpoint`, and the workers' heartbeats say they save at it. Two
workers killed one after the other raise the failure rate: the MTBF input falls and so does the interval, with
an Event. The prior is small (600 s with a quarter of a failure's weight), so two failures cut the MTBF several
times over: more than the measured save cost's noise on a busy machine (it can double) can make up for. A state
that grows mid-run makes every save copy more: the measured save cost rises and so does the interval. Failures
of another job on the cluster lower a new job's MTBF from its start. The tests check directions, never values.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .conftest import Cluster, Operator, wait_for
from .test_fault_tolerance import HEARTBEAT
from .test_operator import events_for, get_job, job_pods, trainingjob, wait_succeeded

pytestmark = pytest.mark.e2e

NAME = "autockpt"
STEPS = 320
AUTO = {
    "volume": {"emptyDir": {}},
    "path": "/checkpoints",
    "intervalSteps": "auto",
    # The job's own failures alone: other tests' jobs on the cluster would add theirs (clusterHistory).
    "autoInterval": {
        "priorMtbfSeconds": 600,
        "priorFailures": 0.25,
        "minIntervalSeconds": 0,
        "clusterHistory": False,
    },
}


def checkpoint_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return get_job(cluster, namespace, NAME).get("status", {}).get("checkpoint") or {}


def restarts(cluster: Cluster, namespace: str) -> int:
    return get_job(cluster, namespace, NAME).get("status", {}).get("restarts", {}).get("total", 0)


def training_intervals(cluster: Cluster, namespace: str, name: str = NAME) -> set[str]:
    """The interval in force each training worker's heartbeat reports."""
    found = set()
    for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
        annotations = cluster.get_json("lease", pod.metadata.name, "-n", namespace)["metadata"]["annotations"]
        if annotations.get("phalanx.dev/phase") == "training":
            found.add(annotations.get("phalanx.dev/checkpoint-interval", ""))
    return found


def training_victim(cluster: Cluster, namespace: str, spared: list[str], name: str = NAME) -> str | None:
    """A worker that trains now, once the job recovered from the failures before (none being recovered)."""
    job = get_job(cluster, namespace, name)
    recovering = [c for c in job["status"].get("conditions", []) if c["type"] == "Recovering"]
    if recovering and recovering[0]["status"] == "True":
        return None
    for pod in job_pods(cluster, namespace, name, "phalanx.dev/role=worker"):
        if pod.metadata.name in spared or pod.metadata.deletion_timestamp is not None:
            continue
        lease = cluster.get_json("lease", pod.metadata.name, "-n", namespace)
        if lease["metadata"].get("annotations", {}).get("phalanx.dev/phase") == "training":
            return str(pod.metadata.name)
    return None


def test_bad_intervals_are_refused_at_apply_time(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    for value in ("fast", 0):
        job = trainingjob("badinterval", checkpoint={"intervalSteps": value})
        result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(job), check=False)
        assert result.returncode != 0 and "intervalSteps" in result.stderr, result.stderr


def _yaml(body: dict[str, Any]) -> str:
    return yaml.safe_dump(body)


def test_auto_interval_is_chosen_followed_and_falls_with_failures(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    job = trainingjob(NAME, replicas=2, spares=1, steps=STEPS, step_delay=0.15, checkpoint=AUTO)
    job["spec"]["heartbeat"] = HEARTBEAT
    cluster.apply(job, namespace)

    # Bootstrap, then the first choice once a durable save was measured.
    first = wait_for(
        lambda: (status := checkpoint_status(cluster, namespace)).get("saveSeconds") is not None and status,
        240,
        message="an interval chosen from a measured save cost",
    )
    print(f"first choice: {first}")
    assert first["mode"] == "auto" and first["intervalSteps"] >= 1
    assert first["saveSeconds"] >= 0 and first["stepSeconds"] > 0 and first["failuresSeen"] == 0
    assert first["mtbfSeconds"] >= 600 and "Young/Daly" in first["reason"]
    # The workers took it at their next durable save.
    wait_for(
        lambda: (
            training_intervals(cluster, namespace)
            == {str(checkpoint_status(cluster, namespace)["intervalSteps"])}
        ),
        60,
        message="the training workers' heartbeats to report the chosen interval",
    )

    # Two failures, one after the other: the failure rate goes up.
    before = checkpoint_status(cluster, namespace)
    victims: list[str] = []
    for count in (1, 2):
        victim = wait_for(
            lambda: training_victim(cluster, namespace, victims), 120, message="a training worker"
        )
        victims.append(victim)
        cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
        wait_for(lambda n=count: restarts(cluster, namespace) >= n, 60, message=f"failure {count} handled")
    after = wait_for(
        # Chosen again at the first failure or the second, whichever moved it by more than the change threshold
        # (a small save cost can leave the second one's change below it).
        lambda: (status := checkpoint_status(cluster, namespace)).get("failuresSeen", 0) >= 1 and status,
        60,
        message="the interval chosen again after the failures",
    )
    print(f"before the failures: {before}; after: {after}")
    assert after["mtbfSeconds"] < before["mtbfSeconds"]
    assert after["intervalSteps"] < before["intervalSteps"]
    changes = [
        e["message"] for e in events_for(cluster, namespace, NAME) if e["reason"] == "CheckpointInterval"
    ]
    assert any(
        f"-> {after['intervalSteps']} steps" in message and "failures" in message for message in changes
    ), changes
    wait_for(
        lambda: (
            training_intervals(cluster, namespace)
            == {str(checkpoint_status(cluster, namespace)["intervalSteps"])}
        ),
        90,
        message="the training workers' heartbeats to report the new interval",
    )

    # (Training on to the end under a chosen interval is the next test's and every fault test's: not waited for.)
    # The second failure left no spare: the job is Pending below its replicas until the new pod has started,
    # which a busy machine takes a while to do.
    current = wait_for(
        lambda: (
            (status := get_job(cluster, namespace, NAME)["status"])["state"]
            in ("Running", "Finishing", "Succeeded")
            and status
        ),
        120,
        message=lambda: f"the job running again ({get_job(cluster, namespace, NAME)['status'].get('state')})",
    )
    assert current["checkpoint"]["mode"] == "auto", current


@pytest.mark.long
def test_auto_interval_grows_when_saves_get_costlier(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # A prior of a million failures pins the MTBF at 600 s whatever the running time: only the save cost moves.
    # From step `grow_at` the checkpointed state carries 768 MB more, so every save has that much more to copy:
    # tens of milliseconds more than the small model's save (a few ms, up to 30 on a busy machine). The step
    # is mostly a fixed delay so that the persisting of the bigger state, which slows the steps on a machine
    # of two cores, cannot hide the growth: the status follows only a change of more than a fifth.
    name, grow_at, steps = "autocost", 60, 200
    checkpoint = {
        **AUTO,
        "autoInterval": {"priorMtbfSeconds": 600, "priorFailures": 1e6, "minIntervalSeconds": 0},
    }
    job = trainingjob(name, replicas=2, spares=0, steps=steps, step_delay=0.4, checkpoint=checkpoint)
    job["spec"]["heartbeat"] = HEARTBEAT
    job["spec"]["template"]["spec"]["containers"][0]["args"] += [
        "--grow-state-at-step", str(grow_at), "--grow-state-mb", "768",
    ]  # fmt: skip
    cluster.apply(job, namespace)

    def status() -> dict[str, Any]:
        found = get_job(cluster, namespace, name).get("status", {})
        return {**(found.get("checkpoint") or {}), "step": found.get("step") or 0}

    cheap = wait_for(
        lambda: (s := status()).get("saveSeconds") is not None and s["step"] < grow_at and s,
        240,
        message="an interval chosen from cheap saves, before the state grows",
    )
    costly = wait_for(
        lambda: (
            (s := status())["step"] > grow_at
            and s.get("saveSeconds", 0) > 1.5 * cheap["saveSeconds"]
            and s["intervalSteps"] != cheap["intervalSteps"]
            and s
        ),
        240,
        message=lambda: (
            f"the interval chosen again from the costlier saves (cheap: {cheap}, now: {status()})"
        ),
    )
    print(f"cheap saves: {cheap}; costly saves: {costly}")
    incidents = get_job(cluster, namespace, name)["status"].get("incidents")
    assert costly["failuresSeen"] == cheap["failuresSeen"] == 0, incidents
    assert abs(costly["mtbfSeconds"] - cheap["mtbfSeconds"]) < 0.01 * cheap["mtbfSeconds"]

    # Young/Daly: the interval in seconds grows with the square root of the save cost. In steps it is that over
    # the step time, which the bigger state's persisting (and a busy machine) lengthens too: seen from 28 steps to
    # 21 while the seconds grew.
    def interval_seconds(found: dict[str, Any]) -> float:
        return float(found["intervalSteps"]) * float(found["stepSeconds"])

    assert interval_seconds(costly) > interval_seconds(cheap), (cheap, costly)
    changes = [
        e["message"] for e in events_for(cluster, namespace, name) if e["reason"] == "CheckpointInterval"
    ]
    assert any(f"-> {costly['intervalSteps']} steps" in m and "save " in m for m in changes), changes
    wait_for(
        lambda: training_intervals(cluster, namespace, name) == {str(status()["intervalSteps"])},
        90,
        message="the training workers' heartbeats to report the new interval",
    )


@pytest.mark.long
def test_another_jobs_failures_lower_a_new_jobs_mtbf(
    cluster: Cluster, operator: Operator, namespace: str
) -> None:
    # A job on this cluster loses two workers to deletions (infrastructure failures, not its user's).
    flaky = trainingjob("flaky", replicas=2, spares=0, steps=2000, step_delay=0.1)
    cluster.apply(flaky, namespace)
    victims: list[str] = []
    for count in (1, 2):
        victim = wait_for(
            lambda: training_victim(cluster, namespace, victims, "flaky"), 120, message="a training worker"
        )
        victims.append(victim)
        cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
        wait_for(
            lambda n=count: get_job(cluster, namespace, "flaky")["status"]["restarts"]["total"] >= n,
            60,
            message=f"failure {count} of the flaky job handled",
        )
    # A new job with a day's prior: alone it would save rarely; the cluster's history says otherwise.
    checkpoint = {
        **AUTO,
        "autoInterval": {"priorMtbfSeconds": 86400, "priorFailures": 1, "minIntervalSeconds": 0},
    }
    cluster.apply(
        trainingjob("newcomer", replicas=2, steps=60, step_delay=0.1, checkpoint=checkpoint), namespace
    )
    chosen = wait_for(
        lambda: (
            (status := get_job(cluster, namespace, "newcomer").get("status", {}).get("checkpoint") or {}).get(
                "saveSeconds"
            )
            is not None
            and status
        ),
        240,
        message="the newcomer's interval chosen from a measured save cost",
    )
    print(f"newcomer: {chosen}")
    assert chosen["failuresSeen"] == 0 and chosen["clusterFailuresSeen"] >= 2, chosen
    assert chosen["clusterWorkerHours"] > 0
    # Two failures in minutes of the other job's worker time outweigh the day of prior several times over.
    assert chosen["mtbfSeconds"] < 86400 / 2, chosen
    assert "other jobs'" in chosen["reason"]
    wait_succeeded(cluster, namespace, "newcomer", timeout=300)
