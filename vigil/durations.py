"""Prometheus-style durations ("15s", "1m30s", "48h", "35d") to seconds."""

from __future__ import annotations

import math
import re

__all__ = ["SECONDS_PER_HOUR", "format_duration", "parse_duration", "prom_duration"]

#: What a GPU-hour price is per second of replica time divided by (and every other hour).
SECONDS_PER_HOUR = 3600.0

_UNITS = {
    "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(value: str | int | float) -> float:
    """Seconds from a Prometheus duration string, or a plain number of seconds.

    Raises ``ValueError`` with the offending text when the string is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '15s' or '5m', got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a duration must be a finite number of seconds >= 0: {value!r}")
        return float(value)
    text = value.strip()
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"expected a duration such as '15s', '5m', '48h' or '35d', got {value!r}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration string for whole seconds (``3600`` -> ``"1h"``)."""
    s = round(seconds)
    if s == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out.append(f"{s // size}{unit}")
            s %= size
    return "".join(out)


def prom_duration(seconds: float) -> str:
    """A Prometheus duration for ``seconds``: ``"5m"``, ``"1d"``, ``"1h30m"``; milliseconds
    (``"1500ms"``) when it is not a whole number of seconds."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds!r}")
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    return format_duration(ms // 1000)
