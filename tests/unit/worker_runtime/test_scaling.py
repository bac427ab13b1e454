"""The number of active nodes follows the desired count while the job runs (worker/scaling.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from localjob import LocalJob, wait_for

from phalanx.worker import rendezvous
from phalanx.worker.env import MAX_NODES_KEY
from phalanx.worker.lease import desired_replicas_of
from phalanx.worker.scaling import (
    FileDesiredNodes,
    LiveRendezvousSettings,
    MaxNodesChange,
    MaxNodesFollower,
    StoreMaxNodes,
    plan_max_nodes_change,
)


@pytest.mark.parametrize(
    ("desired", "in_force", "min_nodes", "expected"),
    [
        (None, 2, 1, None),
        (2, 2, 1, None),
        (3, 2, 1, MaxNodesChange(value=3, restart=False)),
        (2, 3, 1, MaxNodesChange(value=2, restart=True)),
        (1, 3, 2, None),
        (2, 3, 2, MaxNodesChange(value=2, restart=True)),
    ],
)
def test_plan_publishes_growth_without_restart_and_restarts_on_shrink(
    desired: int | None, in_force: int, min_nodes: int, expected: MaxNodesChange | None
) -> None:
    assert plan_max_nodes_change(desired, in_force, min_nodes) == expected


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"spec": {"replicas": 2}, "status": {"replicas": {"desired": 3}}}, 3),
        ({"spec": {"replicas": 5}, "status": {"replicas": {"desired": 3}}}, 3),
        ({"spec": {"replicas": 2}, "status": {"replicas": {"desired": 0}}}, 2),
        ({"spec": {"replicas": 2}}, 2),
        ({"spec": {}, "status": None}, None),
    ],
)
def test_desired_replicas_prefers_the_operators_accepted_value(job: dict[str, Any], expected: int) -> None:
    assert desired_replicas_of(job) == expected


@pytest.fixture
def store() -> Iterator[dist.Store]:
    server = rendezvous.serve("127.0.0.1", 0)
    yield rendezvous.connect("127.0.0.1", server.port, timeout=5)
    del server


def test_first_reader_seeds_the_key_and_later_readers_keep_it(store: dist.Store) -> None:
    first = StoreMaxNodes(lambda: store, initial=2)
    late = StoreMaxNodes(lambda: store, initial=3)  # a pod created after a scale, env says 3
    assert first.refresh() == 2
    assert late.refresh() == 2
    assert store.get(MAX_NODES_KEY) == b"2"


def test_one_of_many_followers_publishes_a_growth_and_nobody_restarts(store: dist.Store) -> None:
    desired = {"value": 2}
    followers = [
        MaxNodesFollower(
            lambda: desired["value"], StoreMaxNodes(lambda: store, 2), 1, writer=f"w{i}", interval=1
        )
        for i in range(4)
    ]
    assert [follower.tick() for follower in followers] == [None] * 4
    desired["value"] = 3
    changes = [follower.tick() for follower in followers]
    assert changes == [MaxNodesChange(3, restart=False), None, None, None]
    assert all(follower.in_force.current() == 3 for follower in followers)
    assert rendezvous.read_restart_epoch(store) == 0


def test_a_shrink_restarts_the_group_once(store: dist.Store) -> None:
    views = [StoreMaxNodes(lambda: store, 3) for _ in range(3)]
    desired = {"value": 2}
    followers = [
        MaxNodesFollower(lambda: desired["value"], view, 1, f"w{i}", 1) for i, view in enumerate(views)
    ]
    assert sum(follower.tick() is not None for follower in followers) == 1
    assert rendezvous.read_restart_epoch(store) == 1
    assert [view.current() for view in views] == [2, 2, 2]


def test_a_desired_count_below_the_minimum_is_ignored(store: dist.Store) -> None:
    follower = MaxNodesFollower(lambda: 1, StoreMaxNodes(lambda: store, 3), 2, "w", 1)
    assert follower.tick() is None
    assert rendezvous.parse_max_nodes(store.get(MAX_NODES_KEY).decode()) == 3


def test_rendezvous_settings_read_max_nodes_live() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousSettings, RendezvousTimeout

    base = RendezvousSettings("run", 1, 2, RendezvousTimeout(), timedelta(seconds=1), 3)
    value = {"max": 2}
    live = LiveRendezvousSettings(base, lambda: value["max"])
    value["max"] = 3
    assert (live.max_nodes, live.min_nodes, live.run_id, live.keep_alive_max_attempt) == (3, 1, "run", 3)


def test_file_source_reads_one_integer(tmp_path: Path) -> None:
    source = FileDesiredNodes(str(tmp_path / "desired"))
    assert source() is None
    (tmp_path / "desired").write_text("3\n")
    assert source() == 3
    (tmp_path / "desired").write_text("three")
    assert source() is None


def _world_sizes_after(job: LocalJob, step: int) -> set[int]:
    return {record["world_size"] for record in job.steps() if record["step"] > step}


def _restarts(output: str) -> list[str]:
    return re.findall(r"restarting the worker group: (.*)", output)


@pytest.mark.parametrize("job", ["c10d", "rounds"], indirect=True)
def test_group_grows_to_three_when_the_desired_count_changes(job: LocalJob, tmp_path: Path) -> None:
    desired = tmp_path / "desired-nodes"
    desired.write_text("2")
    steps = 120
    example = ["--steps", str(steps), "--step-delay", "0.1", "--global-batch", "24"]
    follow = ["--max-nodes-file", str(desired), "--heartbeat-interval", "0.5"]
    job.start_node("a", example, nnodes="1:2", launcher_args=follow)
    job.start_node("b", example, nnodes="1:2", launcher_args=follow)
    # On a busy machine node b may join after node a started alone (last call is 1 s): that restarts the
    # group once before the scale ("waiting to join"), which is not what is tested here.
    wait_for(lambda: 2 in _world_sizes_after(job, 0), 90, "the group to train at world size 2")
    job.start_node("c", example, nnodes="1:2", launcher_args=follow)
    wait_for(lambda: "-> standby" in job.node_output("c"), 60, "the third launcher to stand by")
    grown_from = job.last_step()
    assert grown_from < steps - 30, "training ran too far before the scale"
    assert 3 not in _world_sizes_after(job, 0), "the standby joined before the desired count grew"

    restarts_before_the_scale = len(_restarts(job.node_output("a")))
    desired.write_text("3")
    wait_for(lambda: 3 in _world_sizes_after(job, grown_from), 90, "training at world size 3")

    for name in ("a", "b", "c"):
        assert job.wait_node(name, 120) == 0, job.node_output(name)
    outputs = {name: job.node_output(name) for name in ("a", "b", "c")}
    publishers = [name for name, text in outputs.items() if "active nodes 2 -> 3" in text]
    assert len(publishers) == 1, publishers
    restarts = _restarts(outputs["a"])[restarts_before_the_scale:]
    assert len(restarts) == 1, restarts
    summary = job.any_summary()
    assert (summary["final_step"], summary["world_size"]) == (steps, 3)
    client = rendezvous.connect("127.0.0.1", job.port, timeout=5)
    assert rendezvous.parse_max_nodes(client.get(MAX_NODES_KEY).decode()) == 3
