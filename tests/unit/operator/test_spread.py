from __future__ import annotations

from phalanx.operator import spread


def test_a_keys_period_is_its_own_the_same_every_time_and_within_the_share() -> None:
    periods = [spread.period_of(60.0, f"ml/job-{index}") for index in range(200)]
    assert all(60.0 <= period < 60.0 * (1 + spread.SHARE) for period in periods)
    assert periods == [spread.period_of(60.0, f"ml/job-{index}") for index in range(200)]
    # Spread over the whole range, not bunched: a tenth of the keys or fewer in each tenth of it.
    tenths = [int((period / 60.0 - 1) / spread.SHARE * 10) for period in periods]
    assert max(tenths.count(tenth) for tenth in range(10)) <= 40
    assert spread.period_of(0.0, "ml/job") == 0.0
