"""RFC 3339 timestamps as the Kubernetes API writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

# A stamp written to the second stands for any moment of that second.
WHOLE_SECOND = timedelta(microseconds=999_999)


def now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """`2024-01-02T03:04:05Z` (seconds precision, as metav1.Time)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """`2024-01-02T03:04:05.123456Z` (microseconds, as metav1.MicroTime)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    if not text or not isinstance(text, str):
        return None
    return _parse(text)


@lru_cache(maxsize=1 << 16)
def _parse(text: str) -> datetime | None:
    """One stamp parsed (kept: a 12,500-pod job's reconcile reads each pod's and Lease's stamps many times)."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_time_end(text: str | None) -> datetime | None:
    """The latest moment a stamp can mean: one written to the second (a container's `finishedAt`, a node
    condition's times) stands for the whole of that second, so the end of it is returned."""
    parsed = parse_time(text)
    if parsed is None or text is None:
        return None
    has_fraction = "." in text.split("T", 1)[-1]
    return parsed if has_fraction else parsed + WHOLE_SECOND
