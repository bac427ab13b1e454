"""The failure policy: the user's rules, first match wins, then the defaults (pure functions).

Defaults, in order, after the user's rules:
- `default-permanent`: launcher exit codes 2 (bad configuration), 5 (loss diverged) and 6 (preflight
  failed): restarting cannot help, so the job fails at once without spending restarts.
- `default-oom`: a trainer killed for memory is the user's to fix: replaced, counted.
- `default-infrastructure`: lost nodes, heartbeat silence, no progress, stragglers, deletions, evictions,
  disruptions and processes killed from outside (exit 137/143, and 3: rendezvous unreachable): replaced,
  never charged to the user's `maxRestarts`.
- `default`: anything else (a user's non-zero exit code, a container restart): replaced and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from phalanx.operator import api, detection
from phalanx.operator.timeutil import format_time, parse_time

PERMANENT_EXIT_CODES = [2, 5, 6]
INFRASTRUCTURE_EXIT_CODES = [3, *detection.KILL_EXIT_CODES]

DEFAULT_RULES: tuple[api.FailureRule, ...] = (
    api.FailureRule(
        name="default-permanent",
        match=api.FailureMatch(exit_codes=PERMANENT_EXIT_CODES),
        action="FailJob",
    ),
    api.FailureRule(
        name="default-oom",
        match=api.FailureMatch(pod_conditions=[detection.OOM_REASON]),
        action="ReplaceWorker",
        counts_toward_max_restarts=True,
    ),
    api.FailureRule(
        name="default-infrastructure",
        match=api.FailureMatch(
            exit_codes=INFRASTRUCTURE_EXIT_CODES,
            pod_conditions=[detection.POD_DELETED, detection.EVICTED, detection.DISRUPTION_TARGET],
            node_conditions=[
                detection.NODE_NOT_READY,
                detection.NODE_UNREACHABLE,
                detection.NODE_DELETED,
                detection.NODE_NO_EXECUTE,
            ],
            heartbeat_timeout=True,
            no_progress=True,
            trainer_stopped=True,
            straggler=True,
        ),
        action="ReplaceWorker",
        counts_toward_max_restarts=False,
    ),
)
FALLBACK_RULE = api.FailureRule(name="default", action="ReplaceWorker")

# Causes that are never the user's code's fault (used when a rule leaves `countsTowardMaxRestarts` unset).
INFRASTRUCTURE_CAUSES = frozenset(
    {
        detection.KILLED,
        detection.POD_DELETED,
        detection.EVICTED,
        detection.DISRUPTION_TARGET,
        detection.NODE_LOST,
        detection.HEARTBEAT_TIMEOUT,
        detection.NO_PROGRESS,
        detection.TRAINER_STOPPED,
        detection.STRAGGLER,
    }
)


@dataclass(frozen=True)
class Decision:
    """What to do about one failure, and which rule said so."""

    action: api.FailureAction
    rule: str
    """The rule's name (`rule-N` for the N-th unnamed user rule, `default-...` for the defaults)."""
    counts: bool
    """Whether the restart spends the job-wide `maxRestarts`."""
    max_restarts: int | None
    """The rule's own restart budget, if any."""


def matches(match: api.FailureMatch, failure: detection.Failure) -> bool:
    """A failure matches when any criterion the rule lists matches it."""
    return bool(
        (match.exit_codes and failure.exit_code is not None and failure.exit_code in match.exit_codes)
        or (match.pod_conditions and failure.pod_conditions & set(match.pod_conditions))
        or (match.node_conditions and failure.node_conditions & set(match.node_conditions))
        or (match.heartbeat_timeout and failure.cause == detection.HEARTBEAT_TIMEOUT)
        or (match.no_progress and failure.cause == detection.NO_PROGRESS)
        or (match.trainer_stopped and failure.cause == detection.TRAINER_STOPPED)
        or (match.straggler and failure.cause == detection.STRAGGLER)
    )


def rules_in_order(policy: api.FailurePolicySpec) -> list[tuple[str, api.FailureRule]]:
    """(name, rule) of the user's rules, then the defaults."""
    named = [(rule.name or f"rule-{number}", rule) for number, rule in enumerate(policy.rules, start=1)]
    return [*named, *((rule.name or "", rule) for rule in DEFAULT_RULES)]


def decide(failure: detection.Failure, policy: api.FailurePolicySpec) -> Decision:
    """The action for `failure`: the first matching rule's, else the fallback (replace, counted for user
    failures)."""
    name, rule = next(
        ((name, rule) for name, rule in rules_in_order(policy) if matches(rule.match, failure)),
        (FALLBACK_RULE.name or "default", FALLBACK_RULE),
    )
    counts = rule.counts_toward_max_restarts
    if counts is None:
        counts = failure.cause not in INFRASTRUCTURE_CAUSES
    return Decision(action=rule.action, rule=name, counts=counts, max_restarts=rule.max_restarts)


@dataclass(frozen=True)
class Budget:
    """Whether a restart is allowed, and the counts after it."""

    allowed: bool
    restarts: api.RestartCounts
    message: str = ""


def spend(restarts: api.RestartCounts, decision: Decision, cause: str, max_restarts: int) -> Budget:
    """Count one restart by cause and rule; refused past `maxRestarts` (counted ones) or the rule's budget.

    Counts are job-wide and never reset, so a re-rendezvous never hides earlier failures.
    """
    after = restarts.model_copy(deep=True)
    after.total += 1
    after.by_cause[cause] = after.by_cause.get(cause, 0) + 1
    after.by_rule[decision.rule] = after.by_rule.get(decision.rule, 0) + 1
    if decision.counts:
        after.counted += 1
    if decision.counts and after.counted > max_restarts:
        return Budget(False, after, f"restart budget ({max_restarts}) spent")
    if decision.max_restarts is not None and after.by_rule[decision.rule] > decision.max_restarts:
        return Budget(False, after, f"rule {decision.rule}'s restart budget ({decision.max_restarts}) spent")
    return Budget(True, after)


REPLACEMENT_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class ReplacementPacing:
    """How fast pods replace failures that do not spend `maxRestarts` (the chart's values).

    Those failures (exits 3, 137 and 143, lost nodes, evictions) are the infrastructure's, so they never end a
    job; but a job whose code exits 143 in a loop would otherwise delete and create a pod every few seconds
    forever. The first `free_per_hour` in an hour are replaced at once (a rack that fails costs seconds);
    each further one waits twice as long as the one before, from `backoff_seconds` up to `max_backoff_seconds`;
    past `cap_per_hour` no pod replaces one until the oldest of the hour is an hour old.
    """

    free_per_hour: int = 10
    backoff_seconds: float = 10.0
    max_backoff_seconds: float = 600.0
    cap_per_hour: int = 100


def record_uncounted(times: list[str] | None, now: datetime, pacing: ReplacementPacing) -> list[str]:
    """`times` (of uncounted replacements, oldest first) with `now` added: those of the last hour only, and no
    more than the cap needs (`next_replacement_at` reads the newest `cap_per_hour + 1`), so the list in the
    status stays small however many pods fail."""
    recent = [*recent_times(times, now), now]
    return [format_time(moment) for moment in recent[-(pacing.cap_per_hour + 1) :]]


def next_replacement_at(times: list[str] | None, now: datetime, pacing: ReplacementPacing) -> datetime | None:
    """When pods may next be created for the uncounted replacements `times` (the newest last) asked for; None:
    now. The n-th of the hour past `free_per_hour` waits `backoff_seconds * 2**(n - free - 1)` (at most
    `max_backoff_seconds`) after the one before it; past `cap_per_hour`, until enough of them are an hour old."""
    recent = recent_times(times, now)
    count = len(recent)
    if count <= pacing.free_per_hour:
        return None
    over = count - pacing.free_per_hour - 1
    wait = min(pacing.backoff_seconds * 2 ** min(over, 32), pacing.max_backoff_seconds)
    due = recent[-2] + timedelta(seconds=wait)
    if count > pacing.cap_per_hour:
        due = max(due, recent[count - pacing.cap_per_hour - 1] + REPLACEMENT_WINDOW)
    return due if due > now else None


def recent_times(times: list[str] | None, now: datetime) -> list[datetime]:
    """Those of the stamps `times` that lie in the last hour, oldest first."""
    parsed = sorted(moment for text in times or () if (moment := parse_time(text)) is not None)
    return [moment for moment in parsed if now - moment < REPLACEMENT_WINDOW]
