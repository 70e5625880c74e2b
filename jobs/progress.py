"""Progress lines and stage timings for long jobs (stderr, so stdout stays clean)."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.timings: dict[str, float] = {}

    def say(self, msg: str) -> None:
        if self.enabled:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, what: str | None = None):
        self.say(f"{what or name} ...")
        start = time.perf_counter()
        yield
        took = time.perf_counter() - start
        self.timings[name] = self.timings.get(name, 0.0) + took
        self.say(f"{what or name} done in {took:.1f}s")
