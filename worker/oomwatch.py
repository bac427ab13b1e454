"""Whether the kernel killed a training process for memory: the container's memory cgroup counts OOM kills.

Inside a container the launcher is PID 1 and the OOM killer picks the largest process, a training process,
so the container itself would go on: the launcher would restart the group in the pod, meet the same limit
again, and the kubelet would never report `OOMKilled`. Instead, a training process killed while the cgroup's
OOM-kill count rose ends the pod, so that the container ends `OOMKilled` and the operator's failure policy
(`default-oom`, or the user's rule) decides. Both cgroup versions: v2 `memory.events`, v1
`memory.oom_control` (the container's own hierarchy is mounted at /sys/fs/cgroup).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60
"""Limits at or above this are "no limit" (v1 writes 9223372036854771712)."""


@dataclass(frozen=True)
class MemoryCgroup:
    """The files of this process's memory cgroup that say how often it ran out and what its limit is."""

    counter: Path
    limit: Path

    @classmethod
    def find(cls, root: Path = CGROUP_ROOT) -> MemoryCgroup | None:
        if (root / "memory.events").is_file():
            return cls(root / "memory.events", root / "memory.max")
        v1 = root / "memory"
        if (v1 / "memory.oom_control").is_file():
            return cls(v1 / "memory.oom_control", v1 / "memory.limit_in_bytes")
        return None

    def oom_kills(self) -> int | None:
        """Processes the OOM killer took in this cgroup so far (None: the kernel does not say)."""
        with contextlib.suppress(OSError, ValueError):
            return parse_oom_kills(self.counter.read_text())
        return None

    def limit_bytes(self) -> int | None:
        """The memory limit (None: none, or unreadable)."""
        with contextlib.suppress(OSError, ValueError):
            text = self.limit.read_text().strip()
            if text != "max" and int(text) < UNLIMITED:
                return int(text)
        return None


def parse_oom_kills(text: str) -> int | None:
    """The `oom_kill` line of memory.events (v2) or memory.oom_control (v1)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


class OomWatch:
    """Counts OOM kills from the start of a worker group: `killed_since_start()` after a failure."""

    def __init__(self, cgroup: MemoryCgroup | None = None) -> None:
        self.cgroup = cgroup if cgroup is not None else MemoryCgroup.find()
        self._at_start: int | None = None

    def group_started(self) -> None:
        self._at_start = self.cgroup.oom_kills() if self.cgroup is not None else None

    def killed_since_start(self) -> bool:
        if self.cgroup is None or self._at_start is None:
            return False
        now = self.cgroup.oom_kills()
        return now is not None and now > self._at_start

    def describe(self) -> str:
        limit = self.cgroup.limit_bytes() if self.cgroup is not None else None
        where = (
            f"the container's memory limit of {limit / 2**20:.0f} MiB" if limit else "the memory available"
        )
        return (
            f"a training process was killed for memory (OOM): it needed more than {where}. Raise the "
            "trainer's resources.limits.memory or use less memory per process"
        )
