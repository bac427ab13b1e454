"""A pod watch in a background thread that records when each change reached the benchmark.

The times are this process's monotonic clock when the watch event arrived, so latencies measured from
two events of the same stream share one clock and one delivery path (apiserver -> watch -> here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes import client, watch

T = TypeVar("T")


@dataclass(frozen=True)
class PodEvent:
    """One pod change as seen by the watch."""

    t: float
    """time.monotonic() when the event arrived."""
    type: str
    """ADDED, MODIFIED or DELETED."""
    name: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)
    node: str | None = None
    phase: str | None = None
    deleting: bool = False
    gated: bool = False
    """Some scheduling gate holds it (the operator lifts the gang's once the whole gang exists)."""


def pod_event(kind: str, raw: dict[str, Any], moment: float) -> PodEvent:
    meta = raw.get("metadata") or {}
    return PodEvent(
        t=moment,
        type=kind,
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        node=(raw.get("spec") or {}).get("nodeName"),
        phase=(raw.get("status") or {}).get("phase"),
        deleting=bool(meta.get("deletionTimestamp")),
        gated=bool((raw.get("spec") or {}).get("schedulingGates")),
    )


class Watch(Generic[T]):
    """Records every event of a list call's watch (converted by `convert`) until stopped.

    `list_call(api)` returns the list function (e.g. `CoreV1Api(api).list_namespaced_pod`), called with
    `args`; after an expired version or a dropped connection it lists again and watches on from there.
    """

    def __init__(
        self,
        new_api: Callable[[], client.ApiClient],
        list_call: Callable[[client.ApiClient], Callable[..., Any]],
        args: tuple[Any, ...],
        convert: Callable[[str, dict[str, Any], float], T],
        label_selector: str | None = None,
    ) -> None:
        self._api = new_api()
        self._list_fn = list_call(self._api)
        self._args = args
        self._convert = convert
        self._kwargs = {"label_selector": label_selector} if label_selector else {}
        self._events: list[T] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{args}", daemon=True)
        self._ready = threading.Event()
        self.error: Exception | None = None

    def __enter__(self) -> Watch[T]:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the watch of {self._args} did not start")

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=15)
        self._api.close()

    def events(self) -> list[T]:
        with self._lock:
            return list(self._events)

    def _list(self) -> str:
        listed = self._list_fn(*self._args, **self._kwargs)
        if not isinstance(listed, dict):
            listed = self._api.sanitize_for_serialization(listed)
        now = time.monotonic()
        with self._lock:
            for item in listed.get("items") or []:
                self._events.append(self._convert("LISTED", item, now))
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        try:
            version = self._list()
        except Exception as error:
            self.error = error
            self._ready.set()
            return
        self._ready.set()
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                for event in self._watch.stream(
                    self._list_fn,
                    *self._args,
                    resource_version=version,
                    timeout_seconds=10,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                    **self._kwargs,
                ):
                    raw = event.get("raw_object") or event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise client.ApiException(status=raw.get("code"), reason=raw.get("message"))
                    version = (raw.get("metadata") or {}).get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        converted = self._convert(event["type"], raw, time.monotonic())
                        with self._lock:
                            self._events.append(converted)
                    if self._stop.is_set():
                        break
            except Exception as error:
                # Expired version (410) or a dropped connection: list again, then watch from there.
                self.error = error
                if self._stop.is_set():
                    break
                time.sleep(0.2)
                try:
                    version = self._list()
                except Exception as list_error:
                    self.error = list_error
                    time.sleep(1)


def pod_watch(
    new_api: Callable[[], client.ApiClient], namespace: str, label_selector: str | None = None
) -> Watch[PodEvent]:
    """Every pod event of `namespace` (optionally only pods matching `label_selector`)."""
    return Watch(
        new_api,
        lambda api: client.CoreV1Api(api).list_namespaced_pod,
        (namespace,),
        pod_event,
        label_selector,
    )


@dataclass(frozen=True)
class ObjectEvent:
    """One change of a custom object (a TrainingJob) as seen by the watch."""

    t: float
    type: str
    name: str
    status: dict[str, Any]
    annotations: dict[str, str]


def object_event(kind: str, raw: dict[str, Any], moment: float) -> ObjectEvent:
    meta = raw.get("metadata") or {}
    return ObjectEvent(
        moment, kind, meta.get("name", ""), dict(raw.get("status") or {}), dict(meta.get("annotations") or {})
    )


def custom_watch(
    new_api: Callable[[], client.ApiClient], group: str, version: str, namespace: str, plural: str
) -> Watch[ObjectEvent]:
    """Every change of the custom objects `plural` in `namespace`."""
    return Watch(
        new_api,
        lambda api: client.CustomObjectsApi(api).list_namespaced_custom_object,
        (group, version, namespace, plural),
        object_event,
    )


# ------------------------------------------------------------------------------ analysis (pure)


def changed_fields(before: ObjectEvent, after: ObjectEvent) -> list[str]:
    """Status fields and annotations that differ between two versions of one object."""
    fields = [
        f"status.{key}"
        for key in sorted(set(before.status) | set(after.status))
        if before.status.get(key) != after.status.get(key)
    ]
    fields += [
        f"annotation {key}"
        for key in sorted(set(before.annotations) | set(after.annotations))
        if before.annotations.get(key) != after.annotations.get(key)
    ]
    return fields


def churn(events: Iterable[ObjectEvent], start: float, end: float) -> tuple[int, dict[str, int]]:
    """Updates of the objects between `start` and `end`, and how often each field changed in them."""
    latest: dict[str, ObjectEvent] = {}
    updates = 0
    counts: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e.t):
        previous = latest.get(event.name)
        latest[event.name] = event
        if event.type != "MODIFIED" or previous is None or not start <= event.t <= end:
            continue
        updates += 1
        for name in changed_fields(previous, event) or ["(nothing: metadata only)"]:
            counts[name] = counts.get(name, 0) + 1
    return updates, counts


def first_times(events: Iterable[PodEvent], when: Callable[[PodEvent], bool]) -> dict[str, float]:
    """For each pod uid, the time of its first event matching `when`."""
    found: dict[str, float] = {}
    for event in events:
        if event.uid not in found and when(event):
            found[event.uid] = event.t
    return found


def created(event: PodEvent) -> bool:
    return event.type == "ADDED"


def ungated(event: PodEvent) -> bool:
    return event.type != "DELETED" and not event.gated


def bound(event: PodEvent) -> bool:
    return event.type != "DELETED" and bool(event.node)


def running(event: PodEvent) -> bool:
    return event.type != "DELETED" and event.phase == "Running" and not event.deleting


def cumulative(times: Iterable[float], origin: float) -> tuple[list[float], list[float]]:
    """A step curve: x = seconds since `origin`, y = how many times have passed."""
    ordered = sorted(time_ - origin for time_ in times)
    return ordered, [float(index + 1) for index in range(len(ordered))]


def thin(x: list[float], y: list[float], points: int = 200) -> tuple[list[float], list[float]]:
    """At most `points` evenly spaced points of a curve, the last one kept (plots and JSON stay small)."""
    if len(x) <= points:
        return x, y
    step = len(x) / points
    picks = sorted({int(index * step) for index in range(points)} | {len(x) - 1})
    return [x[i] for i in picks], [y[i] for i in picks]


def per_second(times: Iterable[float]) -> list[float]:
    """Counts in consecutive one-second windows from the first to the last time (the rate curve)."""
    ordered = sorted(times)
    if not ordered:
        return []
    start = ordered[0]
    windows = [0.0] * (int(ordered[-1] - start) + 1)
    for moment in ordered:
        windows[int(moment - start)] += 1
    return windows


def rate(times: Iterable[float], origin: float | None = None) -> float | None:
    """Events per second: N events over the time from `origin` to the last one, or, without an origin,
    the N - 1 intervals between the first and the last."""
    ordered = sorted(times)
    if not ordered:
        return None
    if origin is None:
        span, count = ordered[-1] - ordered[0], len(ordered) - 1
    else:
        span, count = ordered[-1] - origin, len(ordered)
    return count / span if span > 0 and count > 0 else None
