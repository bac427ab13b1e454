"""Prometheus text format: samples, and counter deltas between two scrapes (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY", "CREATE", "UPDATE"})
"""`verb` values of `apiserver_request_total` that change something."""
REQUESTS = ("apiserver_request_total",)
"""The family `request_deltas` needs (pass as `only` to `parse`)."""


def parse(text: str, only: tuple[str, ...] = ()) -> dict[Key, float]:
    """Every sample of a scrape (only the metric families named in `only`, when given: an apiserver scrape
    is megabytes), keyed by sample name and sorted labels."""
    if only:
        text = "\n".join(line for line in text.splitlines() if _family_line(line, only)) + "\n"
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return samples


def _family_line(line: str, names: tuple[str, ...]) -> bool:
    if line.startswith("#"):
        parts = line.split()
        return len(parts) > 2 and parts[2] in names
    return line.split("{", 1)[0].split(" ", 1)[0] in names


def select(samples: Mapping[Key, float], name: str, **labels: str) -> dict[Labels, float]:
    """Samples of `name` whose labels include `labels`."""
    return {
        key_labels: value
        for (sample_name, key_labels), value in samples.items()
        if sample_name == name and all(dict(key_labels).get(k) == v for k, v in labels.items())
    }


def total(samples: Mapping[Key, float], name: str, **labels: str) -> float:
    return sum(select(samples, name, **labels).values())


def delta(before: Mapping[Key, float], after: Mapping[Key, float], name: str) -> dict[Labels, float]:
    """Per-label-set increase of counter `name` between two scrapes (a counter that restarted counts from 0)."""
    changes: dict[Labels, float] = {}
    for labels, value in select(after, name).items():
        previous = before.get((name, labels), 0.0)
        increase = value - previous if value >= previous else value
        if increase:
            changes[labels] = increase
    return changes


@dataclass(frozen=True)
class RequestCount:
    """Requests the apiserver served between two scrapes, for one verb/resource/code."""

    verb: str
    resource: str
    subresource: str
    code: str
    count: float


def request_deltas(before: Mapping[Key, float], after: Mapping[Key, float]) -> list[RequestCount]:
    """`apiserver_request_total` increases, one row per verb, resource, subresource and code."""
    rows: dict[tuple[str, str, str, str], float] = {}
    for labels, increase in delta(before, after, "apiserver_request_total").items():
        values = dict(labels)
        key = (
            values.get("verb", ""),
            values.get("resource", ""),
            values.get("subresource", ""),
            values.get("code", ""),
        )
        rows[key] = rows.get(key, 0.0) + increase
    return [RequestCount(*key, count) for key, count in sorted(rows.items())]


def writes(rows: Iterable[RequestCount], keep: Callable[[RequestCount], bool] = lambda _: True) -> float:
    """Write requests among `rows` that `keep` accepts."""
    return sum(row.count for row in rows if row.verb.upper() in WRITE_VERBS and keep(row))


def errors(rows: Iterable[RequestCount]) -> dict[str, float]:
    """Requests answered 429 (throttled) or 5xx, by code."""
    found: dict[str, float] = {}
    for row in rows:
        if row.code == "429" or row.code.startswith("5"):
            found[row.code] = found.get(row.code, 0.0) + row.count
    return found


def by_resource(rows: Iterable[RequestCount], keep: Callable[[RequestCount], bool]) -> dict[str, float]:
    """Counts of the rows `keep` accepts, keyed `VERB resource[/subresource]`."""
    found: dict[str, float] = {}
    for row in rows:
        if keep(row):
            key = f"{row.verb} {row.resource}" + (f"/{row.subresource}" if row.subresource else "")
            found[key] = found.get(key, 0.0) + row.count
    return found
