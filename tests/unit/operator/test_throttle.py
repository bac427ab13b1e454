"""A job's pod creations pause after the API server refuses some, doubling up to a ceiling; a pod the server
rejects is described by its answer, and a new spec may try at once."""

from __future__ import annotations

import json

from phalanx.operator.throttle import (
    ANSWER_LIMIT,
    CreationThrottle,
    Rejection,
    describe_answer,
    is_refusal,
    is_rejection,
    pause_seconds,
    rejection_message,
    retry_after_seconds,
)


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


def test_rejections_are_the_4xx_answers_that_would_repeat() -> None:
    assert is_rejection(400) and is_rejection(403) and is_rejection(404) and is_rejection(422)
    assert not is_rejection(409) and not is_rejection(429) and not is_rejection(500)
    assert not is_rejection(None) and not is_rejection(200)


def test_the_answer_names_the_servers_reason_and_message_cut_to_a_sane_length() -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "status": "Failure",
            "reason": "Invalid",
            "code": 422,
            "message": 'Pod "demo-worker-0" is invalid: spec.affinity...matchFields[0].values:\n Required value',
        }
    )
    assert describe_answer(422, "Unprocessable Entity", body) == (
        '422 Invalid: Pod "demo-worker-0" is invalid: spec.affinity...matchFields[0].values: Required value'
    )
    long = describe_answer(400, "Bad Request", json.dumps({"message": "x" * 5000}))
    assert long.startswith("400 Bad Request: xxx") and long.endswith("...")
    assert len(long) == len("400 Bad Request: ") + ANSWER_LIMIT
    assert describe_answer(403, "Forbidden", "not json") == "403 Forbidden: not json"
    assert describe_answer(404, "Not Found", None) == "404 Not Found"


def test_one_message_per_round_names_the_first_pod_the_others_and_the_next_attempt() -> None:
    first = Rejection("demo-worker-0", "422 Invalid: no", 4.0)
    assert rejection_message([first]) == "pod demo-worker-0 refused: 422 Invalid: no; next attempt in 4s"
    other = Rejection("demo-worker-1", "422 Invalid: no", 4.0)
    assert rejection_message([first, other]) == (
        "pod demo-worker-0 refused: 422 Invalid: no (1 more pods refused); next attempt in 4s"
    )


def test_a_rejection_pause_doubles_and_ends_when_the_spec_changes() -> None:
    moment = [0.0]
    throttle = CreationThrottle(first=1.0, longest=4.0, clock=lambda: moment[0])
    job = ("ml", "bad")
    assert throttle.refused(job, generation=1) == 1.0
    assert throttle.paused_for(job, 1) == 1.0
    moment[0] = 1.0
    assert throttle.refused(job, generation=1) == 2.0
    moment[0] = 3.0
    assert [throttle.refused(job, generation=1) for _ in range(2)] == [4.0, 4.0]  # capped; in flight: same
    moment[0] = 7.0
    assert throttle.refused(job, generation=1) == 4.0
    assert throttle.paused_for(job, 1) == 4.0
    assert throttle.paused_for(job) == 4.0  # without a generation: no judgement on the spec
    # A new spec may build pods the server takes: the pause ends and the count starts over.
    assert throttle.paused_for(job, 2) == 0.0
    assert throttle.refused(job, generation=2) == 1.0
    # A "not now" pause does not end with the spec.
    other = ("ml", "busy")
    throttle.refused(other)
    assert throttle.paused_for(other, 5) == 1.0


def test_the_latest_rejection_is_remembered_until_a_batch_goes_through() -> None:
    throttle = CreationThrottle()
    key = ("ml", "demo")
    assert throttle.rejection(key) is None
    throttle.rejected(key, Rejection("demo-rdzv", "403 Forbidden: exceeded quota: pods", 1.0))
    throttle.rejected(("ml", "other"), Rejection("other-worker-0", "422 Invalid", 1.0))
    assert throttle.rejection(key) == "pod demo-rdzv refused: 403 Forbidden: exceeded quota: pods"
    throttle.succeeded(key)
    assert throttle.rejection(key) is None
    assert throttle.rejection(("ml", "other")) == "pod other-worker-0 refused: 422 Invalid"
    throttle.forget(("ml", "other"))
    assert throttle.rejection(("ml", "other")) is None
