"""The worker's side of `phalanx drill --hang-worker`: freeze this pod's training processes on request.

The launcher keeps renewing its heartbeat Lease while the training processes make no step. The drill cannot
freeze them through the Kubernetes API alone, so it asks: it writes `phalanx.dev/drill-hang: <pod name>/<pod
uid>` on the TrainingJob, and the launcher of that pod (which follows its TrainingJob anyway,
worker/jobwatch.py) stops its training processes and their children with SIGSTOP. Nothing else changes:
the launcher's watch over its training processes (worker/trainerwatch.py) sees them stopped, as it would a
stop from anywhere else, and the operator replaces the pod (`TrainerStopped`). The UID keeps a later pod of
the same name from freezing too; the request is honoured once per launcher.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable

import psutil

from phalanx.worker import jobwatch

logger = logging.getLogger("phalanx.launch")

DRILL_HANG_ANNOTATION = "phalanx.dev/drill-hang"
"""On a TrainingJob, `<pod name>/<pod uid>`: that pod's launcher freezes its training processes (a drill)."""


def hang_target(pod_name: str, pod_uid: str) -> str:
    """The annotation's value that names one pod."""
    return f"{pod_name}/{pod_uid}"


def is_hang_requested(job: jobwatch.JobObject | None, pod_name: str, pod_uid: str) -> bool:
    """Whether `job` asks the pod `pod_name` (of UID `pod_uid`) to hang: only a job that allows drills
    (`spec.drills.allowed`) can, whoever annotated it."""
    if job is None or not pod_name:
        return False
    if not ((job.get("spec") or {}).get("drills") or {}).get("allowed"):
        return False
    wanted = ((job.get("metadata") or {}).get("annotations") or {}).get(DRILL_HANG_ANNOTATION)
    return bool(wanted) and wanted == hang_target(pod_name, pod_uid)


def with_descendants(pids: Iterable[int]) -> list[int]:
    """The processes and all their descendants (a trainer's data loader workers hang with it)."""
    found: list[int] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            found.append(pid)
            found.extend(child.pid for child in process.children(recursive=True))
    return list(dict.fromkeys(found))


class HangDrill(jobwatch.Ticker):
    """Freezes the training processes once the TrainingJob names this pod in `DRILL_HANG_ANNOTATION`."""

    thread_name = "phalanx-drill-hang"
    failure = "hang drill failed"

    def __init__(
        self,
        current_job: Callable[[], jobwatch.JobObject | None],
        training_pids: Callable[[], Iterable[int]],
        pod_name: str,
        pod_uid: str,
        interval: float,
    ) -> None:
        super().__init__(interval)
        self.current_job = current_job
        self.training_pids = training_pids
        self.pod_name = pod_name
        self.pod_uid = pod_uid
        self.frozen: list[int] = []

    def tick(self) -> list[int]:
        if self.frozen or not is_hang_requested(self.current_job(), self.pod_name, self.pod_uid):
            return self.frozen
        pids = with_descendants(self.training_pids())
        if not pids:
            return self.frozen  # no group runs yet: the next look freezes the one that starts
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        self.frozen = pids
        logger.warning(
            "drill: training processes %s stopped on request (%s); the launcher keeps renewing its Lease",
            " ".join(map(str, pids)),
            DRILL_HANG_ANNOTATION,
        )
        return self.frozen
