"""Kubeflow Trainer and JobSet beside Phalanx: their manifests, the step log read as a recovery, the metrics."""

from __future__ import annotations

from phalanx.bench import faults, peer_jobset, peer_kubeflow, peer_operators, peers, registry
from phalanx.bench.core import BenchResult, Metric
from phalanx.bench.faults import RestoreLine, StepLine, StepLog
from phalanx.bench.peer_operators import PodsSeen, Trial

NOW = "2026-01-01T10:00:00+00:00"


def test_both_peers_are_registered_after_phalanx_recovery() -> None:
    names = registry.names()
    assert names.index("recovery") < names.index("peer-kubeflow") < names.index("peer-jobset")
    assert registry.select(["peer-kubeflow"])[0].load() is peer_kubeflow
    assert registry.select(["peer-jobset"])[0].load() is peer_jobset


def test_the_trainjob_is_the_torch_runtime_running_the_tiny_gpt_under_torchrun() -> None:
    job = peer_operators.trainjob_manifest("t")
    spec = job["spec"]
    assert job["kind"] == "TrainJob" and spec["runtimeRef"] == {"name": "torch-distributed"}
    command = spec["trainer"]["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"]  # torchrun's own entry point
    assert command[3:5] == ["-m", faults.TRAINER_MODULE]
    assert "--checkpoint-dir" in command and "--log-file" in command
    assert spec["trainer"]["numNodes"] == 2 and spec["trainer"]["numProcPerNode"] == 1
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]
    pod_spec = pod["spec"]["template"]["spec"]
    assert pod_spec["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}}
    ]
    assert pod_spec["containers"][0]["name"] == "node"  # the runtime's trainer container


def test_the_jobset_restarts_on_any_failure_and_sets_what_kubeflow_sets() -> None:
    job = peer_operators.jobset_manifest("js")
    spec = job["spec"]
    assert spec["failurePolicy"]["maxRestarts"] > 0 and "rules" not in spec["failurePolicy"]
    job_spec = spec["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["backoffLimit"] == 0 and job_spec["completionMode"] == "Indexed"
    assert job_spec["parallelism"] == job_spec["completions"] == 2
    container = job_spec["template"]["spec"]["containers"][0]
    assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
    env = {item["name"]: item for item in container["env"]}
    assert set(env) == {
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    }
    assert env["PET_MASTER_ADDR"]["value"] == "js-node-0-0.js"  # the JobSet's pod DNS name of rank 0
    assert container["command"] == peer_operators.trainjob_manifest("t")["spec"]["trainer"]["command"]


LOG = StepLog(
    steps=[StepLine(step, 100.0 + step, 1.0, 2) for step in range(1, 31)]
    + [StepLine(21, 150.0, 1.0, 2), StepLine(22, 150.5, 1.0, 2)],
    restores=[
        RestoreLine(0, 0, "none", 0.0, 100.0, "start"),
        RestoreLine(1, 0, "none", 0.0, 100.0, "start"),
        RestoreLine(1, 20, "disk", 0.1, 149.0, "start"),
        RestoreLine(0, 20, "disk", 0.1, 149.2, "start"),
    ],
)


def test_the_resume_is_the_first_step_after_a_restore_that_followed_the_kill() -> None:
    kill = 128.5  # step 28 was the last before it
    resumed = peer_operators.resumed_after(LOG, kill)
    assert resumed == peer_operators.Resumed(first_step_time=150.0, restored_step=20)
    assert peer_operators.steps_lost(LOG, kill, 20) == 8
    assert peer_operators.resumed_after(LOG, 149.5) is None  # no restore after it yet


def test_pods_recreated_and_restarted() -> None:
    before = PodsSeen({"a": ("p0", 0), "b": ("p1", 2)})
    in_place = PodsSeen({"a": ("p0", 1), "b": ("p1", 3)})
    assert in_place.recreated_since(before) == 0 and in_place.restarts_since(before) == 2
    new = PodsSeen({"c": ("p0", 0), "d": ("p1", 0)})
    assert new.recreated_since(before) == 2 and new.restarts_since(before) == 0


def test_what_shows_a_frozen_worker_was_noticed() -> None:
    before = PodsSeen({"a": ("p0", 0), "b": ("p1", 0)})
    assert peer_operators.noticed(before, before, 0, 0, False) == ""
    assert peer_operators.noticed(before, before, 0, 0, True) == "the job failed"
    assert peer_operators.noticed(before, before, 0, 1, False) == "the JobSet restarted"
    assert peer_operators.noticed(before, PodsSeen({"a": ("p0", 0)}), 0, 0, False) == "pods recreated"
    assert peer_operators.noticed(before, PodsSeen({"a": ("p0", 1), "b": ("p1", 0)}), 0, 0, False) == (
        "a container restarted"
    )


def test_peer_metrics_are_set_beside_the_hot_spare_and_the_new_pod() -> None:
    kills = [Trial("kill", 1, "p0", 1.0, seconds=9.0, steps_lost=7, pods_recreated=2, container_restarts=0)]
    kills.append(Trial("kill", 2, "p1", 2.0, error="job failed"))
    freezes = [Trial("freeze", 3, "p0", 3.0)]
    found = peer_operators.metrics_for(peer_operators.JOBSET, kills, freezes)
    by_name = {metric.name: metric for metric in found}
    assert by_name["jobset: kill -> first step"].samples == [9.0]  # the failed trial is in the notes only
    assert by_name["jobset: frozen worker -> noticed"].samples == []
    recovery = BenchResult(
        name="recovery",
        title="",
        started_at=NOW,
        metrics=[
            Metric(name="hot-spare: kill -> first step", unit="s", samples=[1.5]),
            Metric(name="hot-spare: steps lost", unit="count", samples=[0.0]),
        ],
    )
    never = peer_operators.never_texts(peer_operators.JOBSET, freezes, 90)
    assert never == {"jobset: frozen worker -> noticed": "never within 90 s (1 of 1 trials)"}
    peer = BenchResult(name="peer-jobset", title="", started_at=NOW, metrics=found, details={"never": never})
    rows = {row.metric: row for row in peers.comparison_rows([recovery, peer], NOW)}
    assert rows["jobset: kill -> first step"].ratio == "6x"
    assert rows["jobset: kill -> first step (vs new pod)"].ratio == (
        "recovery did not measure 'new-pod: kill -> first step' in this invocation"
    )
    assert rows["jobset: steps lost"].ratio == "Phalanx 0, peer 7"
    assert rows["jobset: frozen worker -> noticed"].ratio == "never within 90 s (1 of 1 trials)"
    assert "jobset: pods recreated per kill" not in rows  # no Phalanx figure to set it beside
