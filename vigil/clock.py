"""Injected time. Everything that reads the time takes a ``Clock`` so tests can move it."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "ManualClock", "system_clock"]

#: A clock returns the current Unix time in seconds (float).
Clock = Callable[[], float]


def system_clock() -> float:
    """Wall-clock Unix time in seconds."""
    return time.time()


class ManualClock:
    """A clock for tests: starts at ``start`` seconds and moves only when told."""

    def __init__(self, start: float = 1_795_000_000.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time."""
        self.now += seconds
        return self.now
