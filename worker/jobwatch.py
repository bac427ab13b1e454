"""Following the pod's own TrainingJob: a Kubernetes watch (or a file), feeding the launcher's followers.

The launcher reacts to two things the operator writes into its TrainingJob: the desired number of active
workers (`status.replicas.desired`, worker/scaling.py) and regroup requests (`status.regroup`,
worker/regroup.py). Both must reach every launcher within a fraction of a second, so the launcher watches
the one object instead of reading it every heartbeat interval:

- `JobFeed` lists the job (`fieldSelector metadata.name=<job>`), then watches from the list's
  resourceVersion, carrying the resourceVersion of every event (and bookmark) into the next watch. An
  expired resourceVersion (410 Gone) means a fresh list; any other error a reconnect after a short,
  growing pause. When the API server refuses the list or watch (403: a Role with `get` only), it falls
  back to reading the job every `poll_interval` seconds.
- `FileJobFeed` reads the job from a JSON file whenever the file changes (no Kubernetes: local runs, tests).

Both put the newest object into a `JobView`, which wakes its subscribers (`Ticker`s): each follower
re-reads the view on a wake-up and also every interval, so a step that failed (the store briefly gone) is
retried without a new event. The Kubernetes calls themselves live in worker/lease.py (`TrainingJobApi`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger("phalanx.launch")

JobObject = dict[str, Any]
"""A TrainingJob as the API server returns it (plain JSON)."""


class JobView:
    """The newest TrainingJob seen, shared by the feed (writer) and the followers (readers)."""

    def __init__(self) -> None:
        self._job: JobObject | None = None
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[], None]] = []

    def subscribe(self, wake: Callable[[], None]) -> None:
        self._subscribers.append(wake)

    def update(self, job: JobObject) -> None:
        with self._lock:
            self._job = job
        for wake in self._subscribers:
            wake()

    def current(self) -> JobObject | None:
        with self._lock:
            return self._job


class ApiStatusError(Exception):
    """The API server answered a request with an error status (403, 410, ...)."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(f"{status} {message}".strip())
        self.status = status


class JobApi(Protocol):
    """The three reads of one TrainingJob a feed needs (worker/lease.py implements them)."""

    def get(self) -> JobObject: ...

    def list(self) -> tuple[JobObject | None, str]:
        """The job (None if absent) and the list's resourceVersion."""
        ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (`{"type": ..., "object": ...}`) from `resource_version` on."""
        ...


class JobFeed:
    """List, then watch the job, keeping resourceVersion continuity; polling when a watch is refused."""

    def __init__(
        self,
        api: JobApi,
        view: JobView,
        poll_interval: float,
        watch_timeout: int = 60,
        backoff: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        self.api = api
        self.view = view
        self.poll_interval = poll_interval
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self.polling = False
        """True once the API server refused the list or watch: the feed reads the job every interval."""
        self._stop = threading.Event()
        self._pause = backoff[0]
        self._last_problem = ""
        self._thread = threading.Thread(target=self.run, name="phalanx-job-feed", daemon=True)

    def start(self) -> JobFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if self.polling:
                    self._poll_once()
                    continue
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch(resource_version)
            except ApiStatusError as error:
                if error.status == 410:
                    resource_version = None
                elif error.status in (401, 403, 405):
                    self.polling = True
                    logger.warning(
                        "cannot watch the TrainingJob (%s): reading it every %gs instead",
                        error,
                        self.poll_interval,
                    )
                else:
                    self._trouble(error)
            except Exception as error:
                self._trouble(error)

    def _list(self) -> str:
        job, resource_version = self.api.list()
        if job is not None:
            self.view.update(job)
        self._recovered()
        return resource_version

    def _watch(self, resource_version: str) -> str | None:
        """One watch call; returns the resourceVersion to go on from (None: list again)."""
        events = 0
        for event in self.api.watch(resource_version, self.watch_timeout):
            events += 1
            if self._stop.is_set():
                break
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    return None  # our resourceVersion is too old: list again
                raise ApiStatusError(code, str(obj.get("message", "")))
            resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
            if kind in ("ADDED", "MODIFIED"):
                self.view.update(obj)
            self._recovered()
        if not events:
            # A watch the server closed without a word (its timeout, or trouble): no busy loop of those.
            self._stop.wait(self.backoff[0])
        return resource_version

    def _poll_once(self) -> None:
        try:
            self.view.update(self.api.get())
            self._recovered()
        except Exception as error:
            self._report(f"cannot read the TrainingJob: {error}")
        self._stop.wait(self.poll_interval)

    def _trouble(self, error: BaseException) -> None:
        self._report(f"TrainingJob watch interrupted ({error}); reconnecting")
        self._stop.wait(self._pause)
        self._pause = min(self._pause * 2, self.backoff[1])

    def _recovered(self) -> None:
        self._pause = self.backoff[0]
        if self._last_problem:
            logger.info("following the TrainingJob again")
            self._last_problem = ""

    def _report(self, problem: str) -> None:
        if problem != self._last_problem:
            logger.warning("%s", problem)
            self._last_problem = problem


class FileJobFeed:
    """The job from a JSON file, read whenever its content changes (checked every `interval` seconds)."""

    def __init__(self, path: str, view: JobView, interval: float = 0.1) -> None:
        self.path = Path(path)
        self.view = view
        self.interval = interval
        self._text = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phalanx-job-file", daemon=True)

    def read_once(self) -> bool:
        """Publish the file's job if it changed and parses; True when it did."""
        try:
            text = self.path.read_text()
        except OSError:
            return False
        if text == self._text:
            return False
        try:
            job = json.loads(text)
        except ValueError:
            return False  # half written: the next look sees the whole file
        if not isinstance(job, Mapping):
            return False
        self._text = text
        self.view.update(dict(job))
        return True

    def start(self) -> FileJobFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval)


class Ticker:
    """A background step run when woken (a new job object) and every `interval` seconds otherwise.

    Subclasses implement `tick()`; a failing tick is logged once per distinct problem and retried at the
    next wake-up or interval.
    """

    thread_name = "phalanx-ticker"
    failure = "background step failed"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_problem = ""
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)

    def tick(self) -> object:
        raise NotImplementedError

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception as error:
                self._report(f"{self.failure}: {error}")

    def _report(self, problem: str) -> None:
        # Once per distinct problem: a retry every interval would flood the log otherwise.
        if problem != self._last_problem:
            logger.warning("%s", problem)
            self._last_problem = problem

    def _clear_problem(self) -> None:
        self._last_problem = ""
