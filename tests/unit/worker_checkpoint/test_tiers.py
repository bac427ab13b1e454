"""Tiered checkpoints: a fast tier every interval, a durable tier (a directory or S3 through fsspec) less
often, and a restore that takes the newest complete copy on any tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import advance_to, build_state, expected_fingerprint, fingerprint, run_ranks

from phalanx.worker import Checkpointer, cleanup_snapshots
from phalanx.worker.checkpoint import durable, layout, skipped, tiers

BUCKET = "phalanx-checkpoints"


def s3_tier(endpoint: str, prefix: str, every: int = 2, keep: int = 2) -> tiers.DurableTier:
    options = {"endpoint_url": endpoint, "key": "phalanx", "secret": "phalanx-secret"}
    tier = tiers.DurableTier(f"s3://{BUCKET}/{prefix}", every=every, keep=keep, options=options)
    fs, _ = tier.filesystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return tier


def train_and_save(fast: Path, tier: tiers.DurableTier, steps: int, interval: int = 2) -> dict[str, float]:
    """Steps 1..`steps` with a fast-tier commit every `interval` steps, each waited for so the copies
    land on a known schedule; returns the checkpointer's counters."""
    state = build_state()
    ckpt = Checkpointer(state, fast, interval_steps=interval, keep=3, durable_tier=tier, node_local=True)
    for step in range(1, steps + 1):
        advance_to(state, step)
        ckpt.save(step)
        ckpt.wait()
    ckpt.close()
    cleanup_snapshots(directory=fast)
    return dict(ckpt.stats)


def restore(fast: Path, tier: tiers.DurableTier | None) -> tuple[int, str, dict[str, Any]]:
    state = build_state()
    ckpt = Checkpointer(state, fast, interval_steps=2, keep=3, durable_tier=tier, node_local=True)
    step = ckpt.load()
    assert ckpt.last_restore is not None
    source = ckpt.last_restore.source
    ckpt.close()
    cleanup_snapshots(directory=fast)
    return step, source, fingerprint(state)


def durable_steps(tier: tiers.DurableTier) -> list[int]:
    if tier.is_directory:
        return durable.complete_steps(tier.directory)
    fs, root = tier.filesystem()
    return [step for step in tiers._url_steps(fs, root) if fs.exists(f"{root}/step-{step}/manifest.json")]


def directory_tier(workdir: Path) -> tiers.DurableTier:
    return tiers.DurableTier(str(workdir / "durable"), every=2, keep=2)


@pytest.fixture(params=["directory", "s3"])
def tier(request: pytest.FixtureRequest, workdir: Path) -> tiers.DurableTier:
    if request.param == "directory":
        return directory_tier(workdir)
    return s3_tier(request.getfixturevalue("s3_endpoint"), workdir.name)


def test_every_other_commit_is_copied_and_the_durable_tier_keeps_its_own_count(
    workdir: Path, tier: tiers.DurableTier
) -> None:
    stats = train_and_save(workdir / "fast", tier, steps=12)
    # Commits at 2, 4, ..., 12; copies of every second one: 4, 8, 12; the durable tier keeps 2.
    assert durable.complete_steps(workdir / "fast") == [12, 10, 8]
    assert durable_steps(tier) == [12, 8]
    assert stats["durable_copies_total"] == 3 and stats["last_durable_copy_step"] == 12
    assert stats["durable_copy_failures_total"] == 0


def test_restore_prefers_the_fast_tier_when_it_is_newer(workdir: Path, tier: tiers.DurableTier) -> None:
    train_and_save(workdir / "fast", tier, steps=10)
    assert durable.complete_steps(workdir / "fast")[0] == 10 and durable_steps(tier)[0] == 8
    step, source, state = restore(workdir / "fast", tier)
    assert (step, source) == (10, "disk")
    assert state == expected_fingerprint(10)


def test_a_lost_fast_tier_restores_from_the_durable_tier(workdir: Path, tier: tiers.DurableTier) -> None:
    train_and_save(workdir / "fast", tier, steps=10)
    # The pod comes back on another node: its node-local tier is empty.
    step, source, state = restore(workdir / "new-node", tier)
    assert (step, source) == (8, "disk")
    assert state == expected_fingerprint(8)
    # Fetched into the new fast tier, verified and committed there.
    assert durable.complete_steps(workdir / "new-node") == [8]


def test_a_corrupt_durable_copy_falls_back_to_the_previous_one(
    workdir: Path, tier: tiers.DurableTier
) -> None:
    train_and_save(workdir / "fast", tier, steps=8)
    assert durable_steps(tier) == [8, 4]
    corrupt = bytes(4096)
    if tier.is_directory:
        path = tier.directory / "step-8" / layout.STATE_FILE
        data = bytearray(path.read_bytes())
        data[: len(corrupt)] = corrupt
        path.write_bytes(bytes(data))
    else:
        fs, root = tier.filesystem()
        data = bytearray(fs.cat_file(f"{root}/step-8/{layout.STATE_FILE}"))
        data[: len(corrupt)] = corrupt
        fs.pipe_file(f"{root}/step-8/{layout.STATE_FILE}", bytes(data))
    step, source, state = restore(workdir / "new-node", tier)
    # Step 8's copy fails its sha256 check and never reaches the fast tier; the fast tier then has
    # nothing newer than the durable step 4, which is fetched instead.
    assert (step, source) == (4, "disk"), step
    assert state == expected_fingerprint(4)
    assert durable.complete_steps(workdir / "new-node") == [4]


def test_a_copy_without_its_manifest_is_never_loaded_and_is_purged(workdir: Path, s3_endpoint: str) -> None:
    tier = s3_tier(s3_endpoint, workdir.name, every=1, keep=2)
    train_and_save(workdir / "fast", tier, steps=4)
    fs, root = tier.filesystem()
    # A saver killed mid-copy: step 5's data file is up, its manifest is not.
    fs.pipe_file(f"{root}/step-5/{layout.STATE_FILE}", b"half a checkpoint")
    copy = tiers.newest(tier)
    assert copy is not None and copy.step == 4
    step, _, state = restore(workdir / "new-node", tier)
    assert step == 4 and state == expected_fingerprint(4)
    # Once a newer copy completes, the cut-short one is older than the newest: the purge removes it.
    train_and_save(workdir / "fast2", tier, steps=8)
    assert tiers._url_steps(fs, root) == [8, 6]


def test_an_unreachable_durable_tier_leaves_the_fast_tier_working(workdir: Path) -> None:
    tier = tiers.DurableTier(
        "s3://nowhere/run",
        every=1,
        keep=2,
        options={
            "endpoint_url": "http://127.0.0.1:9",
            "key": "phalanx",
            "secret": "phalanx-secret",
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
        },
    )
    state = build_state()
    ckpt = Checkpointer(state, workdir / "fast", interval_steps=2, keep=3, durable_tier=tier, node_local=True)
    for step in (1, 2, 3, 4):
        advance_to(state, step)
        ckpt.save(step)
        ckpt.wait()
    ckpt.close()
    cleanup_snapshots(directory=workdir / "fast")
    assert durable.complete_steps(workdir / "fast") == [4, 2]
    assert ckpt.stats["durable_copy_failures_total"] == 2
    step, source, restored = restore(workdir / "fast", tier)
    assert (step, source) == (4, "disk") and restored == expected_fingerprint(4)


def test_tier_from_env() -> None:
    env = {
        tiers.URL_ENV: "s3://bucket/run-1",
        tiers.EVERY_ENV: "5",
        tiers.KEEP_ENV: "4",
        tiers.OPTIONS_ENV: json.dumps({"endpoint_url": "http://minio:9000"}),
    }
    tier = tiers.DurableTier.from_env(env)
    assert tier == tiers.DurableTier("s3://bucket/run-1", 5, 4, {"endpoint_url": "http://minio:9000"})
    assert tiers.DurableTier.from_job(tier.as_job()) == tier
    assert not tier.is_directory and tiers.DurableTier("/mnt/ckpt").is_directory
    assert tiers.DurableTier.from_env({}) is None
    with pytest.raises(ValueError, match="JSON object"):
        tiers.DurableTier.from_env({tiers.URL_ENV: "/x", tiers.OPTIONS_ENV: "[1]"})


def test_sharded_checkpoints_refuse_a_node_local_tier(workdir: Path) -> None:
    with pytest.raises(ValueError, match="every pod shares"):
        Checkpointer(build_state(), workdir / "fast", sharded=True, node_local=True, durable_tier=None)


def test_set_aside_hides_durable_copies_from_restores(workdir: Path, tier: tiers.DurableTier) -> None:
    train_and_save(workdir / "fast", tier, steps=8)
    assert durable_steps(tier) == [8, 4]
    moved = tiers.set_aside(tier, lambda step, _manifest: step > 4, "epoch-1")
    assert moved == [8]
    assert durable_steps(tier) == [4]
    copy = tiers.newest(tier)
    assert copy is not None and copy.step == 4
    step, _, state = restore(workdir / "new-node", tier)
    assert step == 4 and state == expected_fingerprint(4)


def test_the_rank_on_the_node_that_kept_the_newest_checkpoint_sends_it_to_the_others(workdir: Path) -> None:
    save = {"phase": "save", "steps": 10, "interval": 2, "every": 3, "fast": ["node-a", "node-b", "node-c"]}
    env = [{"PHALANX_SNAPSHOT_DIR": str(workdir / f"memory-{rank}"), "LOCAL_RANK": "0"} for rank in range(3)]
    run_ranks("tiered", 3, workdir, env, extra=save)
    # Rank 0 wrote on node A: steps 10 and 8 there (keep 2); every third commit (step 6) on the durable tier.
    assert durable.complete_steps(workdir / "node-a") == [10, 8]
    assert durable.complete_steps(workdir / "durable") == [6]
    # Every pod comes back with no memory, and the one on node A is now rank 2.
    fresh = [{**entry, "PHALANX_SNAPSHOT_DIR": entry["PHALANX_SNAPSHOT_DIR"] + "-new"} for entry in env]
    load = {**save, "phase": "load", "fast": ["node-b", "node-c", "node-a"]}
    results = run_ranks("tiered", 3, workdir, fresh, extra=load)
    assert [(result["step"], result["source"]) for result in results] == [(10, "disk")] * 3
    for result in results:
        assert result["state"] == expected_fingerprint(10)


def test_a_restore_names_the_durable_copies_and_local_checkpoints_it_passed_over(
    workdir: Path, tier: tiers.DurableTier
) -> None:
    train_and_save(workdir / "fast", tier, steps=8)
    assert durable_steps(tier) == [8, 4]
    # On the durable tier: a copy cut short (data, no manifest) at step 12, a corrupt copy of step 8.
    if tier.is_directory:
        (tier.directory / "step-12").mkdir()
        (tier.directory / "step-12" / layout.STATE_FILE).write_bytes(b"half a copy")
        path = tier.directory / "step-8" / layout.STATE_FILE
        path.write_bytes(bytes(path.stat().st_size))
    else:
        fs, root = tier.filesystem()
        fs.pipe_file(f"{root}/step-12/{layout.STATE_FILE}", b"half a copy")
        size = len(fs.cat_file(f"{root}/step-8/{layout.STATE_FILE}"))
        fs.pipe_file(f"{root}/step-8/{layout.STATE_FILE}", bytes(size))
    # On the new node's own tier: a folder its writer never finished.
    (workdir / "new-node" / "step-10").mkdir(parents=True)
    state = build_state()
    ckpt = Checkpointer(
        state, workdir / "new-node", interval_steps=2, keep=3, durable_tier=tier, node_local=True
    )
    assert ckpt.load() == 4
    info = ckpt.last_restore
    ckpt.close()
    cleanup_snapshots(directory=workdir / "new-node")
    assert info is not None and fingerprint(state) == expected_fingerprint(4)
    assert [(entry.step, entry.tier, entry.reason) for entry in info.skipped] == [
        (12, skipped.TIER_DURABLE, skipped.TORN),
        (10, skipped.TIER_LOCAL, skipped.TORN),
        (8, skipped.TIER_DURABLE, skipped.CORRUPT),
    ]
    assert "do not match the manifest" in info.skipped[-1].message


def test_the_stores_credentials_come_from_files_as_storage_options(tmp_path: Path) -> None:
    # A Secret mounted as a volume: one file per key, plus the volume's own bookkeeping.
    folder = tmp_path / "credentials"
    (folder / "..2026_11_27").mkdir(parents=True)
    (folder / "AWS_ACCESS_KEY_ID").write_text("AKIDEXAMPLE\n")
    (folder / "AWS_SECRET_ACCESS_KEY").write_text("s3cr3t")
    (folder / "account_key").write_text("azure")
    (folder / "AWS_DEFAULT_REGION").write_text("eu-west-1")
    env = {
        tiers.URL_ENV: "s3://bucket/run",
        tiers.OPTIONS_ENV: json.dumps({"endpoint_url": "http://minio:9000"}),
        tiers.CREDENTIALS_ENV: str(folder),
    }
    tier = tiers.DurableTier.from_env(env)
    assert tier is not None
    assert dict(tier.options) == {
        "endpoint_url": "http://minio:9000",
        "key": "AKIDEXAMPLE",
        "secret": "s3cr3t",
        "account_key": "azure",
    }
    # What the saver process is handed carries them (over its pipe, not its environment).
    assert tier.as_job()["options"]["secret"] == "s3cr3t"
