"""The launcher's faster polling of torch's rendezvous state: the interval it picks, that only torch's
one-second state poll changes, and that this torch still has that call (an upgrade that drops it fails
here instead of silently making every regroup slower)."""

from __future__ import annotations

import inspect

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from phalanx.worker import rendezvous


def test_the_poll_interval_scales_with_the_group_within_bounds() -> None:
    assert rendezvous.sync_poll_interval(2) == 0.05
    assert rendezvous.sync_poll_interval(50) == 0.05
    assert rendezvous.sync_poll_interval(200) == pytest.approx(0.2)
    assert rendezvous.sync_poll_interval(1000) == 1.0
    assert rendezvous.sync_poll_interval(5000) == 1.0  # never slower than torch's own second
    assert rendezvous.sync_poll_interval(0) == 0.05


def test_torch_still_polls_its_state_through_a_one_second_module_delay() -> None:
    executor = inspect.getsource(dynamic_rendezvous._DistributedRendezvousOpExecutor.run)
    assert "_delay(seconds=1)" in executor


def test_only_the_state_poll_is_shortened(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[object] = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", asked.append)
    assert rendezvous.install_sync_poll(0.05)
    dynamic_rendezvous._delay(seconds=1)
    dynamic_rendezvous._delay(seconds=(0, 0.3))
    assert asked == [0.05, (0, 0.3)]
    # Installing again (a second client in one process) wraps torch's call, not our own wrapper.
    assert rendezvous.install_sync_poll(0.2)
    dynamic_rendezvous._delay(seconds=1)
    assert asked[-1] == 0.2
