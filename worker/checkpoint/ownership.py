"""Which job a checkpoint belongs to: every manifest names the job that wrote it, and a restore passes over
another job's checkpoints unless the job opts in.

A job is its namespace and name: a job deleted and created again under the same name (a new uid) resumes
from its own checkpoints, as users expect of `kubectl delete` then `kubectl apply`. The uid is recorded as
well, to tell the two apart when reading a manifest. A manifest that names no job (written outside the
operator, or before manifests named their job) is taken, so that such checkpoints stay restorable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from phalanx.worker.checkpoint import skipped
from phalanx.worker.checkpoint.skipped import Problem

MANIFEST_KEY = "job"
"""In a manifest: the writing job's `namespace`, `name` and `uid`."""
NAMESPACE_ENV = "PHALANX_JOB_NAMESPACE"
NAME_ENV = "PHALANX_JOB_NAME"
UID_ENV = "PHALANX_JOB_UID"
ACCEPT_OTHER_JOBS_ENV = "PHALANX_CHECKPOINT_ACCEPT_OTHER_JOBS"
"""`1`: this job restores checkpoints other jobs wrote at its location (`spec.checkpoint.acceptOtherJobs`)."""


def this_job(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The job this process trains for, from the operator's environment (None: not run by the operator)."""
    env = os.environ if env is None else env
    namespace, name = env.get(NAMESPACE_ENV, ""), env.get(NAME_ENV, "")
    if not namespace or not name:
        return None
    return {"namespace": namespace, "name": name, "uid": env.get(UID_ENV, "")}


def manifest_entry(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a manifest records of the job writing it (nothing outside the operator)."""
    job = this_job(env)
    return {MANIFEST_KEY: job} if job is not None else {}


def other_job_problem(manifest: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Problem | None:
    """Why this job may not restore the checkpoint of `manifest`: it names another job, and this job did not
    opt in to other jobs' checkpoints. None when it may."""
    env = os.environ if env is None else env
    mine = this_job(env)
    writer = manifest.get(MANIFEST_KEY)
    if mine is None or not isinstance(writer, Mapping) or env.get(ACCEPT_OTHER_JOBS_ENV) == "1":
        return None
    theirs = (writer.get("namespace"), writer.get("name"))
    if theirs == (mine["namespace"], mine["name"]):
        return None
    return Problem(
        skipped.OTHER_JOB,
        f"written by job {theirs[0]}/{theirs[1]}, not this one (spec.checkpoint.acceptOtherJobs takes it)",
    )
