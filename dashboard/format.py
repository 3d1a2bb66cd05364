"""How the dashboard writes numbers: one place, so every page spells a ratio or a price alike.

Every function takes ``None`` (the engine's "no data") and returns ``NULL`` for it, never "0".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from slo.objectives.quantiles import SOURCE_GATEWAY, quantile_range, seconds_bucket_text
from vigil.durations import format_duration

__all__ = [
    "NULL",
    "count",
    "duration",
    "percent",
    "quantile",
    "quantile_origin",
    "ratio",
    "seconds",
    "seconds_range",
    "span",
    "timestamp",
    "tokens",
    "tokens_range",
    "usd",
]

#: What a missing value looks like (the same dash as `vigil slo status`).
NULL = "–"


def _finite(value: float | None) -> float | None:
    """``value`` when it is a real number, else ``None`` (NaN and ±Inf are "no data" too)."""
    return value if value is not None and math.isfinite(value) else None


def percent(value: float | None, digits: int = 1) -> str:
    """A ratio 0-1 as a percentage: ``0.995`` -> ``"99.5%"``."""
    v = _finite(value)
    return NULL if v is None else f"{v * 100:.{digits}f}%"


def ratio(value: float | None, digits: int = 2) -> str:
    """A burn rate or another multiple: ``2.4`` -> ``"2.40x"``."""
    v = _finite(value)
    return NULL if v is None else f"{v:.{digits}f}x"


def seconds(value: float | None) -> str:
    """A latency in seconds: milliseconds below 1 s (``0.64`` -> ``"640 ms"``)."""
    v = _finite(value)
    if v is None:
        return NULL
    return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"


def usd(value: float | None) -> str:
    """Dollars: cents above $100, three decimals above a cent, two significant digits below
    (``0.0031`` -> ``"$0.0031"``), so small per-request prices stay readable."""
    v = _finite(value)
    if v is None:
        return NULL
    if abs(v) >= 100:
        return f"${v:,.2f}"
    if abs(v) >= 0.01 or v == 0:
        return f"${v:.3f}"
    return f"${v:.2g}"


def count(value: float | None) -> str:
    """A count: whole numbers without decimals, thousands separated; one decimal for a small
    fractional count (an extrapolated ``increase``)."""
    v = _finite(value)
    if v is None:
        return NULL
    return f"{v:,.0f}" if abs(v - round(v)) < 1e-9 or abs(v) >= 100 else f"{v:,.1f}"


def tokens(value: float | None) -> str:
    """A token count (``187.4`` -> ``"187"``)."""
    v = _finite(value)
    return NULL if v is None else f"{v:,.0f}"


def duration(value: float | None) -> str:
    """Seconds as a Prometheus duration (``170`` -> ``"2m50s"``)."""
    v = _finite(value)
    return NULL if v is None else format_duration(max(0.0, v))


def span(value: float | None) -> str:
    """A stretch of time in words, to the minute: ``360`` -> ``"6 min"``, ``4500`` ->
    ``"1 h 15 min"``, ``90000`` -> ``"1 d 1 h"`` (under a minute: ``"40 s"``)."""
    v = _finite(value)
    if v is None:
        return NULL
    v = max(0.0, v)
    if v < 60:
        return f"{v:.0f} s"
    minutes = round(v / 60)
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {mins} min" if mins else f"{hours} h"
    return f"{mins} min"


def timestamp(value: float | None) -> str:
    """Unix seconds as ``2026-11-30 10:00:00Z`` (UTC, as every Vigil command prints time)."""
    v = _finite(value)
    return NULL if v is None else datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def seconds_range(lo: float, hi: float) -> str:
    """A histogram bucket of seconds: ``(0, 0.3]`` -> ``"≤ 300 ms"``, ``(0.1, 0.25]`` ->
    ``"100–250 ms"``, ``(1, 2.5]`` -> ``"1–2.5 s"``
    (``slo.objectives.quantiles.seconds_bucket_text``, which ``vigil slo status`` prints too)."""
    return seconds_bucket_text(lo, hi)


def tokens_range(lo: float, hi: float) -> str:
    """A histogram bucket of tokens: ``"≤ 100 tokens"``, ``"100–200 tokens"``,
    ``"> 2,000 tokens"``."""
    if math.isinf(hi):
        return f"> {lo:,.0f} tokens"
    if lo <= 0:
        return f"≤ {hi:,.0f} tokens"
    return f"{lo:,.0f}–{hi:,.0f} tokens"


def quantile(block: Mapping[str, Any] | None, key: str, unit: str = "seconds") -> str:
    """One figure of an engine quantile block (``quantiles.ttft_seconds``, ``"p95"``; ``unit``
    ``"seconds"`` or ``"tokens"``): the number, or the histogram bucket that holds it when the
    bucket is wider than a third of the number (``slo.objectives.quantiles.quantile_range``), since
    the number is then an interpolation, not a measurement."""
    found = quantile_range(block, key)
    if found is not None:
        return seconds_range(*found) if unit == "seconds" else tokens_range(*found)
    value = (block or {}).get(key)
    return seconds(value) if unit == "seconds" else tokens(value)


def quantile_origin(blocks: list[Mapping[str, Any] | None]) -> str:
    """Where a row of figures comes from, in words: the gateway's records (exact), vLLM's
    histogram buckets, or both."""
    sources = {b.get("source") for b in blocks if b} - {None}
    if not sources:
        return NULL
    if sources == {SOURCE_GATEWAY}:
        return "exact, from the gateway's records"
    if SOURCE_GATEWAY in sources:
        return "the gateway's records and vLLM's histogram buckets"
    return "vLLM's histogram buckets"
