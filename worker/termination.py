"""The launcher's last words: the container's termination message.

Kubernetes reads the file at the container's `terminationMessagePath` (default /dev/termination-log) when the
container ends and keeps it in the pod's status (`state.terminated.message`), where `kubectl describe pod`
shows it and the operator reads why a worker stopped. The node agent's containers have no such file; the
agent names one in `PHALANX_TERMINATION_LOG` instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

TERMINATION_LOG_ENV = "PHALANX_TERMINATION_LOG"
DEFAULT_PATH = Path("/dev/termination-log")
MAX_BYTES = 4096
"""What the kubelet keeps of a termination message."""


def path_from(env: Mapping[str, str]) -> Path | None:
    """Where this container's termination message goes; None outside a container that has one."""
    configured = env.get(TERMINATION_LOG_ENV)
    if configured:
        return Path(configured)
    return DEFAULT_PATH if DEFAULT_PATH.is_file() else None


def write(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Writes `message` (cut to what the kubelet keeps); False when there is nowhere to write it."""
    path = path_from(os.environ if env is None else env)
    if path is None:
        return False
    data = message.encode()[:MAX_BYTES]
    with contextlib.suppress(OSError):
        path.write_bytes(data)
        return True
    return False
