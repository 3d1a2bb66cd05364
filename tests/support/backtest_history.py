"""Histories with known burns, for the backtest's tests: what a collector (or a Prometheus)
scraping a pool of vLLM replicas would have stored, with traffic, latency and errors given as
functions of time.

Every scrape a replica reports cumulative counters: ``vllm:request_success_total`` by
``finished_reason`` (stop, error), vLLM's TTFT and e2e histograms (each request observed at a
good or a bad latency: ``GOOD_TTFT_S``/``BAD_TTFT_S`` and ``GOOD_E2E_S``/``BAD_E2E_S``, either
side of the default thresholds 0.8 s and 8 s), ``http_requests_total`` of its API server
(``2xx``/``5xx``: each finished error answered with a 500), and ``up``. Counts per scrape are
whole numbers, so expected ratios can be worked out by hand.

A replica can join late, restart (its counters start again from 0: a reset), be down (``up``
0, no vLLM series) or be unscraped (a gap: no sample at all). ``PromSeries`` come out in the
labels Vigil's collector stores (``pool``, ``kind``, ``instance``), which a Prometheus that
loads them reads through the pool's default series, so one history feeds both sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from collector.store import Store
from support.fleet import LATENCY_LE, TTFT_LE
from support.prometheus import PromSeries
from vigil.model import SeriesKey, labels_of

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GOOD_TTFT_S, BAD_TTFT_S = 0.1, 2.0
GOOD_E2E_S, BAD_E2E_S = 3.0, 20.0

#: An alert table with short windows (TOML), so that hours of history cover them many times
#: over: 1-day SLOs then page at 0.48x and file tickets at 0.8x.
SHORT_ALERT_TABLE = """
[[engine.burn_rate_alerts]]
severity = "page"
budget_share = 0.02
long_window = "1h"
short_window = "5m"

[[engine.burn_rate_alerts]]
severity = "ticket"
budget_share = 0.1
long_window = "3h"
short_window = "30m"
"""

#: A share (0-1) of the requests as a function of Unix seconds.
Share = Callable[[float], float]


def never(_t: float) -> float:
    return 0.0


def between(t0: float, t1: float, share: float, outside: float = 0.0) -> Share:
    """``share`` from ``t0`` (inclusive) to ``t1`` (exclusive), ``outside`` elsewhere."""
    return lambda t: share if t0 <= t < t1 else outside


@dataclass
class Replica:
    """One replica: ``joined`` (first scrape, Unix s), ``restarts`` (Unix s: counters start
    again from 0 there), ``down`` and ``gaps`` (``(t0, t1)`` spans, end exclusive)."""

    instance: str
    joined: float | None = None
    restarts: Sequence[float] = ()
    down: Sequence[tuple[float, float]] = ()
    gaps: Sequence[tuple[float, float]] = ()


@dataclass
class History:
    """A pool ``pool`` of ``replicas`` scraped every ``scrape_s`` from ``start`` to ``end``
    (Unix s, end inclusive), each replica serving ``rate(t)`` requests per second."""

    start: float
    end: float
    replicas: Sequence[Replica]
    scrape_s: float = 60.0
    pool: str = "chat"
    rate: Callable[[float], float] = lambda _t: 2.0
    ttft_bad: Share = never
    e2e_bad: Share = never
    errors: Share = never
    #: Gauges, when given: each replica's KV-cache usage (ratio 0-1) and waiting requests.
    kv_usage: Callable[[float], float] | None = None
    waiting: Callable[[float], float] | None = None
    series: list[PromSeries] = field(default_factory=list)

    def build(self) -> list[PromSeries]:
        self.series = [s for r in self.replicas for s in self._replica(r)]
        return self.series

    def _replica(self, r: Replica) -> list[PromSeries]:
        target = {"instance": r.instance, "pool": self.pool, "kind": "vllm"}
        labels = {**target, "engine": "0", "model_name": MODEL}
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, float]]] = {}

        def put(name: str, extra: dict[str, str], ts: int, value: float) -> None:
            samples.setdefault((name, tuple(sorted(extra.items()))), []).append((ts, value))

        counts: dict[str, float] = {}
        expected: dict[str, float] = {}
        first = self.start if r.joined is None else r.joined
        restarts = sorted(r.restarts)
        n = round((self.end - self.start) / self.scrape_s)
        for k in range(n + 1):
            t = self.start + k * self.scrape_s
            if t < first or any(a <= t < b for a, b in r.gaps):
                continue
            ts = round(t * 1000)
            if any(a <= t < b for a, b in r.down):
                put("up", target, ts, 0.0)
                continue
            put("up", target, ts, 1.0)
            while restarts and restarts[0] <= t:
                restarts.pop(0)
                counts.clear()
            # The requests finished since the previous scrape (none at the first one), whole
            # numbers whose running totals follow the shares exactly (no rounding drift).
            if counts or t > first:
                mid = t - self.scrape_s / 2
                served = self._whole(expected, "served", self.rate(mid) * self.scrape_s)
                errors = self._whole(expected, "errors", served * self.errors(mid))
                ttft_bad = self._whole(expected, "ttft", (served - errors) * self.ttft_bad(mid))
                e2e_bad = self._whole(expected, "e2e", (served - errors) * self.e2e_bad(mid))
            else:
                served = errors = ttft_bad = e2e_bad = 0
            ok = served - errors
            self._add(counts, "stop", ok)
            self._add(counts, "error", errors)
            self._add(counts, "2xx", ok)
            self._add(counts, "5xx", errors)
            for base, bounds, good_s, bad_s, bad in (
                ("vllm:time_to_first_token_seconds", TTFT_LE, GOOD_TTFT_S, BAD_TTFT_S,
                 ttft_bad),
                ("vllm:e2e_request_latency_seconds", LATENCY_LE, GOOD_E2E_S, BAD_E2E_S,
                 e2e_bad),
            ):
                for le in bounds:
                    below = (ok - bad if good_s <= float(le) else 0) + (
                        bad if bad_s <= float(le) else 0)
                    self._add(counts, f"{base}|{le}", below)
                self._add(counts, f"{base}|count", ok)
            for reason in ("stop", "error"):
                put("vllm:request_success_total", {**labels, "finished_reason": reason}, ts,
                    counts[reason])
            for status in ("2xx", "5xx"):
                put("http_requests_total", {**target, "handler": "/v1/chat/completions",
                                            "method": "POST", "status": status}, ts,
                    counts[status])
            for base, bounds in (("vllm:time_to_first_token_seconds", TTFT_LE),
                                 ("vllm:e2e_request_latency_seconds", LATENCY_LE)):
                for le in bounds:
                    put(base + "_bucket", {**labels, "le": le}, ts, counts[f"{base}|{le}"])
                put(base + "_count", labels, ts, counts[f"{base}|count"])
            if self.kv_usage is not None:
                put("vllm:kv_cache_usage_perc", labels, ts, self.kv_usage(t))
            if self.waiting is not None:
                put("vllm:num_requests_waiting", labels, ts, self.waiting(t))
        return [PromSeries(name, dict(extra), pts) for (name, extra), pts in samples.items()]

    @staticmethod
    def _whole(expected: dict[str, float], key: str, amount: float) -> int:
        """The whole part of a running total's growth by ``amount``."""
        before = expected.get(key, 0.0)
        expected[key] = before + amount
        return math.floor(expected[key]) - math.floor(before)

    @staticmethod
    def _add(counts: dict[str, float], key: str, n: float) -> None:
        counts[key] = counts.get(key, 0.0) + n


_GAUGES = frozenset({"up", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"})


def store_rows(series: Iterable[PromSeries]) -> list[tuple[SeriesKey, str, int, float | None]]:
    """The series as ``Store.write`` rows (counters typed as such, ``up`` and vLLM's gauges
    gauges)."""
    rows: list[tuple[SeriesKey, str, int, float | None]] = []
    for s in series:
        family = "gauge" if s.name in _GAUGES else (
            "histogram" if s.name.endswith(("_bucket", "_count")) else "counter")
        key = SeriesKey(s.name, labels_of(dict(s.labels)))
        rows.extend((key, family, ts, None if v is None else float(v)) for ts, v in s.samples)
    return rows


def write_store(store: Store, series: Iterable[PromSeries], chunk: int = 200_000) -> None:
    """Write ``series`` into ``store`` in transactions of ``chunk`` rows."""
    rows = store_rows(series)
    for i in range(0, len(rows), chunk):
        store.write(rows[i:i + chunk])


def nan_free(values: Iterable[float | None]) -> bool:
    """No NaN among ``values`` (``None`` allowed)."""
    return not any(v is not None and math.isnan(v) for v in values)
