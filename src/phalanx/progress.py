"""Progress of long steps (builds of many minutes): whoever watches always sees them move."""

from __future__ import annotations

import threading
import time

SILENCE_SECONDS = 25.0
"""The longest a step runs without a line printed about it (`SilenceReporter`)."""


class SilenceReporter:
    """Prints what it is given, and on its own a `still ...` line whenever `interval` seconds passed without
    one: someone watching a build of many minutes always sees it move (a line at least every half minute)."""

    def __init__(self, what: str, interval: float = SILENCE_SECONDS) -> None:
        self.what = what
        self.interval = interval
        self.started = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="go-progress")

    def __enter__(self) -> SilenceReporter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def say(self, line: str) -> None:
        with self._lock:
            self._last = time.monotonic()
            print(line, flush=True)

    def _watch(self) -> None:
        while not self._done.wait(min(1.0, self.interval / 4)):
            now = time.monotonic()
            if now - self._last >= self.interval:
                elapsed = int(now - self.started)
                self.say(f"{self.what}: still running, {elapsed // 60} min {elapsed % 60:02d} s")
