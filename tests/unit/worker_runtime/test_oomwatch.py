"""The OOM-kill count of the container's memory cgroup, in both cgroup versions."""

from __future__ import annotations

from pathlib import Path

from phalanx.worker import oomwatch


def v1(root: Path, kills: int, limit: str) -> Path:
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.oom_control").write_text(
        f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
    )
    (root / "memory" / "memory.limit_in_bytes").write_text(limit)
    return root


def v2(root: Path, kills: int, limit: str) -> Path:
    root.mkdir(parents=True)
    (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
    (root / "memory.max").write_text(limit)
    return root


def test_a_kill_after_the_group_started_is_seen_in_either_version(tmp_path: Path) -> None:
    for make, name in ((v1, "v1"), (v2, "v2")):
        root = make(tmp_path / name, 2, str(512 * 2**20))
        cgroup = oomwatch.MemoryCgroup.find(root)
        assert cgroup is not None and cgroup.limit_bytes() == 512 * 2**20
        watch = oomwatch.OomWatch(cgroup)
        watch.group_started()
        assert not watch.killed_since_start()  # kills before this group are not its own
        cgroup.counter.write_text(cgroup.counter.read_text().replace("oom_kill 2", "oom_kill 3"))
        assert watch.killed_since_start()
        assert "memory limit of 512 MiB" in watch.describe() and "resources.limits.memory" in watch.describe()


def test_no_limit_and_no_cgroup_say_nothing_false(tmp_path: Path) -> None:
    unlimited = oomwatch.MemoryCgroup.find(v2(tmp_path / "v2", 0, "max\n"))
    assert unlimited is not None and unlimited.limit_bytes() is None
    assert oomwatch.MemoryCgroup.find(v1(tmp_path / "v1", 0, "9223372036854771712")).limit_bytes() is None  # type: ignore[union-attr]
    nothing = oomwatch.OomWatch(oomwatch.MemoryCgroup.find(tmp_path / "empty"))
    nothing.group_started()
    assert not nothing.killed_since_start() and "the memory available" in nothing.describe()
