"""Each checkpoint names its job; a restore passes over another job's unless the job opts in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import advance_to, build_state, expected_fingerprint, fingerprint

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import layout, ownership, skipped


def as_job(
    monkeypatch: pytest.MonkeyPatch, namespace: str, name: str, uid: str, accept: bool = False
) -> None:
    monkeypatch.setenv(ownership.NAMESPACE_ENV, namespace)
    monkeypatch.setenv(ownership.NAME_ENV, name)
    monkeypatch.setenv(ownership.UID_ENV, uid)
    if accept:
        monkeypatch.setenv(ownership.ACCEPT_OTHER_JOBS_ENV, "1")
    else:
        monkeypatch.delenv(ownership.ACCEPT_OTHER_JOBS_ENV, raising=False)


def save_at(directory: Path, step: int) -> None:
    state = build_state()
    ckpt = Checkpointer(state, directory, interval_steps=step)
    advance_to(state, step)
    ckpt.save(step)
    ckpt.wait()
    ckpt.close()
    cleanup_snapshots(directory=directory)  # its pod is gone: the next restore reads the disk


def restore(directory: Path) -> tuple[int, list[tuple[int, str]], dict]:
    """A new pod's restore (nothing in memory): the step, what it passed over and the state."""
    cleanup_snapshots(directory=directory)
    state = build_state()
    ckpt = Checkpointer(state, directory, durable_tier=None)
    step = ckpt.load()
    info = ckpt.last_restore
    ckpt.close()
    assert info is not None
    return step, [(entry.step, entry.reason) for entry in info.skipped], fingerprint(state)


def test_the_manifest_names_the_job_that_wrote_it(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_job(monkeypatch, "team-a", "pretrain", "uid-1")
    save_at(workdir / "ckpt", 3)
    manifest = json.loads((workdir / "ckpt" / "step-3" / layout.MANIFEST_NAME).read_text())
    assert manifest[ownership.MANIFEST_KEY] == {"namespace": "team-a", "name": "pretrain", "uid": "uid-1"}


@pytest.mark.parametrize(("namespace", "name"), [("team-a", "finetune"), ("team-b", "pretrain")])
def test_another_jobs_checkpoint_is_passed_over_and_named(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, namespace: str, name: str
) -> None:
    as_job(monkeypatch, "team-a", "pretrain", "uid-1")
    save_at(workdir / "ckpt", 3)
    as_job(monkeypatch, namespace, name, "uid-2")
    step, passed_over, _ = restore(workdir / "ckpt")
    assert step == 0
    assert passed_over == [(3, skipped.OTHER_JOB)]


def test_the_same_job_created_again_resumes_from_its_own(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_job(monkeypatch, "team-a", "pretrain", "uid-1")
    save_at(workdir / "ckpt", 3)
    as_job(monkeypatch, "team-a", "pretrain", "uid-2")  # deleted and applied again: a new uid
    step, passed_over, state = restore(workdir / "ckpt")
    assert (step, passed_over) == (3, [])
    assert state == expected_fingerprint(3)


def test_a_job_that_opts_in_restores_another_jobs_checkpoint(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_job(monkeypatch, "team-a", "pretrain", "uid-1")
    save_at(workdir / "ckpt", 3)
    as_job(monkeypatch, "team-a", "finetune", "uid-2", accept=True)
    step, passed_over, state = restore(workdir / "ckpt")
    assert (step, passed_over) == (3, [])
    assert state == expected_fingerprint(3)


def test_outside_the_operator_any_checkpoint_is_taken(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_job(monkeypatch, "team-a", "pretrain", "uid-1")
    save_at(workdir / "ckpt", 3)
    for variable in (ownership.NAMESPACE_ENV, ownership.NAME_ENV, ownership.UID_ENV):
        monkeypatch.delenv(variable)
    assert restore(workdir / "ckpt")[:2] == (3, [])
