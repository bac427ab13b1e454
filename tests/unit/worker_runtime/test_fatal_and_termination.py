"""A training process's last words for the launcher, and the launcher's for Kubernetes."""

from __future__ import annotations

from pathlib import Path

from phalanx.worker import fatal, heartbeat, termination


def test_reasons_are_left_per_rank_read_in_order_and_cleared(tmp_path: Path) -> None:
    for rank, message in ((1, "rank one's reason"), (0, "rank zero's reason")):
        fatal.record(message, {heartbeat.STATUS_DIR_ENV: str(tmp_path), "LOCAL_RANK": str(rank)})
    assert fatal.read(tmp_path) == ["rank zero's reason", "rank one's reason"]
    fatal.clear(tmp_path)
    assert fatal.read(tmp_path) == []


def test_outside_a_launcher_a_reason_goes_nowhere(tmp_path: Path) -> None:
    fatal.record("nobody reads this", {})
    assert not any(tmp_path.iterdir())


def test_the_termination_message_is_cut_to_what_the_kubelet_keeps(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert termination.write("é" * 5000, {termination.TERMINATION_LOG_ENV: str(path)})
    assert len(path.read_bytes()) == termination.MAX_BYTES


def test_without_a_termination_log_nothing_is_written(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "termination-log"
    assert not termination.write("why", {termination.TERMINATION_LOG_ENV: str(missing)})
