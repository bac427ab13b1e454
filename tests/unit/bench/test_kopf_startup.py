from __future__ import annotations

import pytest

from phalanx.bench import kopf_startup
from phalanx.operator import kopftoggles


@pytest.mark.parametrize("kind", [kopftoggles.KOPF_TOGGLE_SET, kopftoggles.LinearToggleSet])
def test_both_sets_release_every_worker_once_the_listing_is_in(kind: type) -> None:
    (seconds,) = kopf_startup.measure(kind, 200, 1)
    assert seconds > 0


def test_the_projection_follows_the_slope_of_the_two_largest_sizes() -> None:
    measured = {500: [0.5, 0.5, 0.5], 1_000: [1.0, 2.0, 2.0], 2_000: [8.0, 8.0, 9.0]}
    seconds, exponent = kopf_startup._projection(measured) or (0.0, 0.0)
    assert exponent == pytest.approx(2.0)
    assert seconds == pytest.approx(8.0 * (kopf_startup.SEED_OBJECTS / 2_000) ** 2)
    assert kopf_startup._projection({500: [1.0]}) is None
