"""`phalanx.worker.session` in one process: resume, heartbeats, durable saves, the loss guard; and the
framework callbacks stay out of `import phalanx.worker`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.worker import session
from phalanx.worker.guards import NonFiniteLossError
from phalanx.worker.training_session import Run


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator's and the launcher's environment for one pod, in a temporary folder."""
    monkeypatch.setenv("PHALANX_SNAPSHOT_DIR", str(tmp_path / "shm"))
    monkeypatch.setenv("PHALANX_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("PHALANX_CHECKPOINT_INTERVAL", "4")
    monkeypatch.setenv("PHALANX_CHECKPOINT_KEEP", "2")
    monkeypatch.setenv("PHALANX_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.setenv("PHALANX_JOB_UID", tmp_path.name)
    (tmp_path / "status").mkdir()
    return tmp_path


def train(steps: int, model: nn.Module, optimizer: torch.optim.Optimizer, run: Run) -> None:
    for step in range(run.start_step + 1, steps + 1):
        inputs = torch.full((4, 3), float(step))
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.step(loss)


def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)


def test_a_run_resumes_where_it_stopped_and_matches_an_undisturbed_one(env: Path) -> None:
    model, optimizer = fresh()
    with session(model, optimizer, checkpoint_dir=env / "first") as run:
        assert run.start_step == 0
        train(6, model, optimizer, run)
    record = json.loads((env / "status" / "rank-0.json").read_text())
    assert record["step"] == 6 and record["phase"] == "finished" and record["loss"] is not None
    # A new process (fresh objects) resumes from the snapshot this pod holds in memory.
    model, optimizer = fresh()
    with session(model, optimizer, checkpoint_dir=env / "first") as run:
        assert run.start_step == 6 and run.checkpointer.last_restore.source == "memory"
        train(10, model, optimizer, run)
    resumed = model.weight.detach().clone()
    # Durable saves on the operator's interval (4) and at the end; the newest `keep` (2) are kept.
    assert sorted(path.name for path in (env / "first").glob("step-*")) == ["step-10", "step-8"]

    model, optimizer = fresh()
    with session(model, optimizer, checkpoint_dir=env / "second") as run:
        train(10, model, optimizer, run)
    assert torch.equal(model.weight.detach(), resumed)


def test_the_last_steps_save_is_published_as_a_save(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last step's durable save may wait for the save in flight (a copy to object storage, say): the
    launcher's hang watch counts only time in `training`, so the run says `saving` first."""
    model, optimizer = fresh()
    phases: list[str] = []
    with session(model, optimizer, checkpoint_dir=env / "ckpt") as run:
        train(6, model, optimizer, run)  # durable saves every 4 steps: step 6 is saved at the end
        save = run.checkpointer.save

        def watched_save(step: int, **options: object) -> object:
            phases.append(json.loads((env / "status" / "rank-0.json").read_text())["phase"])
            return save(step, **options)  # type: ignore[arg-type]

        monkeypatch.setattr(run.checkpointer, "save", watched_save)
    assert phases == ["saving"]
    assert json.loads((env / "status" / "rank-0.json").read_text())["phase"] == "finished"


def test_the_last_steps_save_is_decided_alike_on_every_rank(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final save is a collective: every rank must decide alike whether it is needed. A run that ended on
    a durable step has started that save on every rank, and none saves again; only the writing rank learns
    when a save is written, so that cannot be what decides (the other ranks would save alone and wait)."""
    model, optimizer = fresh()
    saves: list[int] = []
    with session(model, optimizer, checkpoint_dir=env / "ckpt") as run:
        train(8, model, optimizer, run)  # durable saves every 4 steps: step 8's is started, maybe not written
        run.checkpointer.stats["last_durable_step"] = -1  # what a rank that does not write knows
        save = run.checkpointer.save

        def counted_save(step: int, **options: object) -> object:
            saves.append(step)
            return save(step, **options)  # type: ignore[arg-type]

        monkeypatch.setattr(run.checkpointer, "save", counted_save)
    assert saves == []
    assert sorted(path.name for path in (env / "ckpt").glob("step-*")) == ["step-4", "step-8"]


def test_a_run_publishes_the_checkpoints_its_restore_passed_over(env: Path) -> None:
    model, optimizer = fresh()
    with session(model, optimizer, checkpoint_dir=env / "ckpt") as run:
        train(4, model, optimizer, run)
    # A save cut short after its folder got its final name (no manifest), newer than step 4; no snapshot left.
    (env / "ckpt" / "step-8").mkdir()
    for folder in (env / "shm").iterdir():
        shutil.rmtree(folder)
    model, optimizer = fresh()
    with session(model, optimizer, checkpoint_dir=env / "ckpt") as run:
        assert run.start_step == 4 and run.checkpointer.last_restore.source == "disk"
        record = json.loads((env / "status" / "rank-0.json").read_text())
        assert json.loads(record["checkpoint_skipped"]) == [
            {"step": 8, "tier": "durable", "reason": "Torn", "message": "no manifest (incomplete)"}
        ]


def test_a_ddp_wrapped_model_saves_the_module_underneath(env: Path) -> None:
    model, optimizer = fresh()
    run = Run(nn.parallel.DataParallel(model), optimizer)
    assert run.state.model is model
    run.close()


def test_a_non_finite_loss_rolls_back_then_gives_up(env: Path) -> None:
    model, optimizer = fresh()
    with session(model, optimizer, max_rollbacks=1) as run:
        train(3, model, optimizer, run)
        before = model.weight.detach().clone()
        with torch.no_grad():
            model.weight.fill_(float("nan"))  # what an optimizer step on a NaN gradient leaves
        assert run.step(torch.tensor(float("nan"))) == 3
        assert torch.equal(model.weight.detach(), before)
        with pytest.raises(NonFiniteLossError):
            run.step(float("inf"))


def test_importing_phalanx_worker_imports_no_framework() -> None:
    code = (
        "import sys, phalanx.worker, phalanx.worker.integrations, phalanx.worker.training_session; "
        "assert callable(phalanx.worker.session); "
        "print(sorted(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_sigterm_saves_the_last_step_durably_and_exits_143(env: Path) -> None:
    log = env / "log.jsonl"
    command = [sys.executable, "-m", "phalanx.worker.examples.session_loop", "--steps", "100000"]
    process = subprocess.Popen([*command, "--step-delay", "0.02", "--log-file", str(log)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not log.exists() or log.read_text().count('"step"') < 5):
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143
    finally:
        process.kill()
    last = max(json.loads(line)["step"] for line in log.read_text().splitlines() if '"step"' in line)
    saved = sorted(int(path.name.removeprefix("step-")) for path in (env / "checkpoints").glob("step-*"))
    assert saved and saved[-1] >= last - 1 >= 4, (saved, last)
