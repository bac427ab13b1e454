"""The automatic checkpoint interval on the launcher's side: from the TrainingJob's status to the trainers' file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.worker import autointerval
from phalanx.worker.autointerval import IntervalFollower, interval_from_job, parse_interval


def job(checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "tj"}, "status": {"checkpoint": checkpoint} if checkpoint else {}}


def test_the_environment_carries_a_number_or_auto() -> None:
    assert parse_interval("auto") == "auto"
    assert parse_interval(" 25 ") == 25
    assert parse_interval(0) == 0
    assert parse_interval(50) == 50
    for bad in ("fast", "-3", "2.5", "", True, -1):
        with pytest.raises(ValueError):
            parse_interval(bad)


def test_only_an_auto_interval_of_the_status_is_passed_on() -> None:
    assert interval_from_job(job({"mode": "auto", "intervalSteps": 40})) == 40
    assert interval_from_job(job({"mode": "fixed", "intervalSteps": 40})) is None
    assert interval_from_job(job({"mode": "auto", "intervalSteps": 0})) is None
    assert interval_from_job(job({"mode": "auto"})) is None
    assert interval_from_job(job(None)) is None
    assert interval_from_job(None) is None


def test_the_file_is_replaced_whole_and_read_back(tmp_path: Path) -> None:
    path = autointerval.interval_file(tmp_path)
    assert autointerval.read_interval(path) is None
    autointerval.write_interval(path, 12)
    assert autointerval.read_interval(path) == 12
    assert [p.name for p in tmp_path.iterdir()] == [autointerval.INTERVAL_FILE_NAME]
    path.write_text("garbage")
    assert autointerval.read_interval(path) is None
    source = autointerval.file_source({autointerval.INTERVAL_FILE_ENV: str(path)})
    autointerval.write_interval(path, 7)
    assert source() == 7
    assert autointerval.file_source({})() is None


def test_the_follower_writes_each_new_interval_once(tmp_path: Path) -> None:
    current: dict[str, Any] = {"job": job(None)}
    path = autointerval.interval_file(tmp_path)
    follower = IntervalFollower(lambda: current["job"], path, interval=1.0)
    assert follower.tick() is None and not path.exists()
    current["job"] = job({"mode": "auto", "intervalSteps": 30})
    assert follower.tick() == 30 and autointerval.read_interval(path) == 30
    modified = path.stat().st_mtime_ns
    assert follower.tick() == 30 and path.stat().st_mtime_ns == modified
    current["job"] = job({"mode": "auto", "intervalSteps": 18})
    assert follower.tick() == 18 and autointerval.read_interval(path) == 18
    # A job switched to a fixed interval leaves the last file alone: the trainers' fixed interval ignores it.
    current["job"] = job({"mode": "fixed", "intervalSteps": 100})
    assert follower.tick() == 18 and autointerval.read_interval(path) == 18
