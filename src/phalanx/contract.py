"""The names that pass between the operator and the worker runtime, defined once.

Both sides import this module and never each other: the operator's image carries no torch, the worker's no
kopf, and either may run a version behind the other during an upgrade. So a name here is a promise to images
already running: add names, never rename or reuse one. docs/ARCHITECTURE.md describes the heartbeat contract
these names spell.
"""

from __future__ import annotations

from typing import Literal

# ----------------------------------------------------------------------------------- the TrainingJob API
GROUP = "phalanx.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"

JobState = Literal[
    "Pending",
    "Scheduling",
    "Unschedulable",
    "Backoff",
    "Running",
    "Finishing",
    "Succeeded",
    "Failed",
    "Suspended",
    "Queued",
    "Invalid",
]
"""`status.state` of a TrainingJob: a closed set (the CRD's enum; the `phalanx_jobs` metric has a series for
each)."""

# -------------------------------------------------------------------------- labels of the job's pods
LABEL_JOB_NAME = "phalanx.dev/job-name"
LABEL_ROLE = "phalanx.dev/role"
LABEL_INDEX = "phalanx.dev/index"
LABEL_COMPONENT = "phalanx.dev/component"
"""Workers and spares share one value (`trainer`), so that one headless Service gives both their DNS names."""

Role = Literal["worker", "spare", "rendezvous"]
ROLE_WORKER: Role = "worker"
ROLE_SPARE: Role = "spare"
ROLE_RENDEZVOUS: Role = "rendezvous"

# ------------------------------------------------------------------------------- heartbeat Leases
LEASE_ANNOTATION_PREFIX = "phalanx.dev/"
"""Every heartbeat field is an annotation of the pod's Lease under this prefix (`phalanx.dev/step`, ...)."""
LEASE_LABELS = {"app.kubernetes.io/managed-by": "phalanx"}
"""Labels of every Lease the operator reads (a pod's heartbeat, a hub's summary, the operator's view canary): its
Lease watch asks the API server for these alone, so the rest of the cluster's Leases (each node's heartbeat, every
10 s a node) never reach it."""
LEASE_SELECTOR = ",".join(f"{key}={value}" for key, value in LEASE_LABELS.items())
"""`LEASE_LABELS` as a label selector."""

Phase = Literal["starting", "rendezvous", "standby", "training", "saving", "restoring", "finished", "exiting"]
PHASE_STARTING: Phase = "starting"
PHASE_RENDEZVOUS: Phase = "rendezvous"
"""Joining a group: torch's rendezvous is forming one with this pod in it."""
PHASE_STANDBY: Phase = "standby"
"""A spare waiting outside every group, ready to join one."""
PHASE_TRAINING: Phase = "training"
PHASE_SAVING: Phase = "saving"
PHASE_RESTORING: Phase = "restoring"
PHASE_FINISHED: Phase = "finished"
PHASE_EXITING: Phase = "exiting"
"""The launcher is ending on its own (its exit code follows in `exit-code`)."""
PHASES: tuple[Phase, ...] = (
    PHASE_STARTING,
    PHASE_RENDEZVOUS,
    PHASE_STANDBY,
    PHASE_TRAINING,
    PHASE_SAVING,
    PHASE_RESTORING,
    PHASE_FINISHED,
    PHASE_EXITING,
)
IN_GROUP_PHASES: tuple[Phase, ...] = (PHASE_TRAINING, PHASE_SAVING, PHASE_RESTORING)
"""Phases of a pod inside a running worker group: they alternate with every step."""
FAULT_STOPPED = "stopped"
"""A launcher's verdict (the Lease's `fault`): one of its training processes is stopped (SIGSTOP, a debugger)."""
FAULT_HUNG = "hung"
"""A launcher's verdict (the Lease's `fault`): one of its ranks waited past its hang threshold for the next step
(`fault-since` is when the wait began, `hang-threshold` the seconds it was judged by)."""
