"""The data model shared by every layer: labels, series, points, target health, requests.

Parsed expositions use prometheus_client's own ``Metric`` and ``Sample`` types (the library's
model); once a sample belongs to a target and a time it becomes a ``Point`` of a ``SeriesKey``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

__all__ = [
    "STALE",
    "Labels",
    "Point",
    "RequestRecord",
    "SeriesKey",
    "TargetHealth",
    "labels_of",
]

#: Sorted ``(name, value)`` pairs: hashable, comparable, and the canonical order for storage.
Labels = tuple[tuple[str, str], ...]

#: The value of a staleness marker (Prometheus writes a special NaN; we store SQL NULL).
STALE = None


def labels_of(mapping: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Canonical ``Labels`` from a dict or pairs: sorted by name, empty values dropped.

    Prometheus treats a label with an empty value as absent, so we do too.
    """
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted((k, v) for k, v in items if v != ""))


class SeriesKey(NamedTuple):
    """One time series: metric name plus its full label set (target labels included)."""

    name: str
    labels: Labels

    def label(self, name: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == name:
                return v
        return default

    def as_dict(self) -> dict[str, str]:
        return dict(self.labels)


class Point(NamedTuple):
    """A sample in time: ``ts_ms`` Unix milliseconds; ``value`` a float, or ``None`` (stale)."""

    ts_ms: int
    value: float | None


class TargetHealth(NamedTuple):
    """The latest scrape of one target, as Prometheus's targets page shows it.

    ``last_scrape`` is Unix seconds (0 = never), ``duration`` seconds, ``samples`` the number of
    samples the target exposed, ``error`` the failure reason when down; when up, the scrape's
    warnings, one per line ("" when none), such as a vLLM family Vigil reads that the
    exposition lacks (``collector.vllm_families``).
    """

    target: str
    pool: str
    kind: str
    url: str
    up: bool
    last_scrape: float
    duration: float
    samples: int
    error: str

    @property
    def never_scraped(self) -> bool:
        return self.last_scrape == 0


class RequestRecord(NamedTuple):
    """One finished request as the engine reads it from the gateway's request log (the seam
    for per-endpoint SLIs, per-request anomalies, cost by tier and e2e per 512 tokens).

    ``ts_s``: when it finished, Unix seconds; ``ttft_s``/``e2e_s``: seconds, ``None`` when
    unknown (e.g. no first token); ``error``: a server-side failure (5xx, timeout, OOM) — a
    client cancellation is not an error.
    """

    id: str
    ts_s: float
    pool: str
    model: str
    endpoint: str
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: bool = False
    #: Who sent it (gateway only): tenant, tier ("premium" | "standard" | "batch").
    tenant: str = ""
    tier: str = ""
    #: Error class: "" (none), "timeout", "upstream_5xx", "oom", "client_cancel", "rejected",
    #: "over_cap", "bad_request", "upstream_4xx".
    error_class: str = ""
    #: "l1" (exact) or "l2" (semantic) when answered from the cache, else "".
    cache_hit: str = ""
    #: GPU cost attributed to the request (USD); a cache hit costs 0 and saves ``saved_usd``.
    cost_usd: float | None = None
    saved_usd: float | None = None
    #: Where the token counts come from: "usage" (the server's own count), "chunks" (streamed
    #: content chunks counted, a lower bound), "unknown"; "" when the log does not say.
    tokens_source: str = ""
    #: The HTTP status the client got (0 when the log does not say); a stream that failed
    #: after its 200 keeps 200 and has ``error`` set.
    status: int = 0
    #: Prompt tokens served from the engine's prefix cache (None: the source does not say).
    cached_tokens: int | None = None
    #: The replica (target name) that served it ("" when none or unknown), and the seconds it
    #: waited at the gateway's admission before going there (part of ``e2e_s``).
    replica: str = ""
    queue_s: float = 0.0


def finite(value: float) -> bool:
    """True when ``value`` is a real number (not NaN, not ±Inf)."""
    return not (math.isnan(value) or math.isinf(value))
