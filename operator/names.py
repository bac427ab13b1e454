"""Names and labels of everything the operator creates for a TrainingJob (deterministic, so restarts never
duplicate anything)."""

from __future__ import annotations

from typing import Any

from phalanx import contract
from phalanx.operator import api

LABEL_JOB_NAME = contract.LABEL_JOB_NAME
LABEL_ROLE = contract.LABEL_ROLE
LABEL_INDEX = contract.LABEL_INDEX
LABEL_COMPONENT = contract.LABEL_COMPONENT
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "phalanx-operator"

Role = contract.Role
ROLE_WORKER = contract.ROLE_WORKER
ROLE_SPARE = contract.ROLE_SPARE
ROLE_RENDEZVOUS = contract.ROLE_RENDEZVOUS
COMPONENT_TRAINER = "trainer"
COMPONENT_RENDEZVOUS = "rendezvous"

TRAINER_CONTAINER = api.DEFAULT_TRAINER_CONTAINER
RENDEZVOUS_CONTAINER = "rendezvous"
HEARTBEAT_HUB_CONTAINER = "heartbeat-hub"
"""The rendezvous pod's container that summarises the workers' heartbeats (`heartbeat.reporting: hub`)."""
CHECKPOINT_VOLUME = "phalanx-checkpoint"
LOCAL_CHECKPOINT_VOLUME = "phalanx-local-checkpoint"
SHARED_MEMORY_VOLUME = "phalanx-shm"
OBJECT_STORE_CREDENTIALS_VOLUME = "phalanx-object-store-credentials"
OBJECT_STORE_CREDENTIALS_PATH = "/var/run/secrets/phalanx/object-store"
"""Where the trainer finds the object store's credentials (`checkpoint.objectStore.secretName`), as files."""
STORE_SECRET_VOLUME = "phalanx-store-secret"
STORE_SECRET_KEY = "secret"
STORE_SECRET_DIR = "/var/run/secrets/phalanx/store"
STORE_SECRET_FILE = f"{STORE_SECRET_DIR}/{STORE_SECRET_KEY}"
"""Where the job's rendezvous store and its launchers find the store's secret (worker/storegate.py)."""

# Pod hostnames are DNS labels: the job name plus "-worker-NNNN" must fit in 63 characters.
MAX_HOSTNAME = 63
WORKER_SUFFIX_ROOM = len("-worker-") + 4


def worker_pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def rendezvous_name(job_name: str) -> str:
    """Name of the rendezvous pod and of its headless Service."""
    return f"{job_name}-rdzv"


def store_secret_name(job_name: str) -> str:
    """The Secret whose value the job's rendezvous store requires of every client (worker/storegate.py)."""
    return f"{job_name}-store"


def network_policy_name(job_name: str) -> str:
    """The job's NetworkPolicy: only its own pods reach its pods."""
    return f"{job_name}-pods"


def workers_service_name(job_name: str) -> str:
    """Headless Service giving each worker pod the DNS name `<pod>.<job>-workers`."""
    return f"{job_name}-workers"


def worker_account_name(job_name: str) -> str:
    """ServiceAccount, Role and RoleBinding that let the job's pods write their heartbeat Leases."""
    return f"{job_name}-worker"


def worker_leases_binding_name(job_name: str) -> str:
    """RoleBinding of the job's workers to the chart's worker ClusterRole (their heartbeat Leases)."""
    return f"{job_name}-worker-leases"


def pod_group_name(job_name: str) -> str:
    return job_name


def rendezvous_endpoint(job_name: str, namespace: str, port: int) -> str:
    return f"{rendezvous_name(job_name)}.{namespace}.svc:{port}"


def job_labels(job_name: str) -> dict[str, str]:
    return {LABEL_JOB_NAME: job_name, LABEL_MANAGED_BY: MANAGED_BY}


def trainer_selector(job_name: str) -> dict[str, str]:
    """Selects the job's worker and spare pods."""
    return {LABEL_JOB_NAME: job_name, LABEL_COMPONENT: COMPONENT_TRAINER}


def active_worker_selector(job_name: str) -> str:
    """Label selector string of the active workers, published in status for the scale subresource."""
    return f"{LABEL_JOB_NAME}={job_name},{LABEL_ROLE}={ROLE_WORKER}"


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """Makes a child collected with the job (and lets kubectl show its owner)."""
    meta = job["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
