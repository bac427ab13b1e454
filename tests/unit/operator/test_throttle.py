"""A job's pod creations pause after the API server refuses some, doubling up to a ceiling."""

from __future__ import annotations

from phalanx.operator.throttle import CreationThrottle, is_refusal, pause_seconds, retry_after_seconds


def test_refusals_are_throttling_and_server_errors_only() -> None:
    assert is_refusal(429) and is_refusal(500) and is_refusal(503)
    assert not is_refusal(409) and not is_refusal(422) and not is_refusal(403) and not is_refusal(None)


def test_pauses_double_up_to_the_ceiling_and_follow_retry_after() -> None:
    assert [pause_seconds(n, 1.0, 10.0) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert pause_seconds(1, 1.0, 10.0, retry_after=7.0) == 7.0
    assert pause_seconds(1, 1.0, 10.0, retry_after=600.0) == 10.0
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_seconds(None) is None


def test_a_job_pauses_alone_and_starts_over_after_a_clean_batch() -> None:
    moment = [100.0]
    throttle = CreationThrottle(first=1.0, longest=8.0, clock=lambda: moment[0])
    job, other = ("ml", "big"), ("ml", "small")
    assert throttle.refused(job) == 1.0
    # Requests already in flight that are refused too do not lengthen the pause.
    assert throttle.refused(job) == 1.0
    assert throttle.paused_for(job) == 1.0 and throttle.paused_for(other) == 0.0
    moment[0] += 1.0
    assert throttle.paused_for(job) == 0.0
    assert throttle.refused(job) == 2.0  # the second refusal in a row
    moment[0] += 2.0
    throttle.succeeded(job)
    assert throttle.refused(job) == 1.0
