"""Series over time for the charts: one engine evaluation per chart point, nothing more.

The SLO engine (``slo/``) answers at one instant; a chart needs a value every ``step``. Each
``*_point`` function below evaluates ONE instant with the engine's own functions — the
``Source`` queries, ``histogram_quantile``, ``error_ratio``, ``burn_rate``, ``pool_cost``,
``kv_usage_at``, ``queue_length_at`` — and returns a small JSON-ready dict, so that
``dashboard.data`` can cache every point on its own (a live chart then computes only its newest
point). Nothing here re-derives a formula: where a value also appears in the status JSON
(``slo.status.evaluate``) at the same instant and window, it is the same number (the tests
check it).

``chart_step`` bounds the work: at most ``MAX_POINTS`` points per chart, on a step that is a
round duration and never finer than the scrape interval; consecutive round steps differ by at
most 2×, so a range of ``MIN_POINTS`` scrape intervals or more gets at least ``MIN_POINTS``.
A point's window is at least its step (like Grafana's ``$__rate_interval``), so consecutive
points cover the range without gaps. ``first_sample`` tells how young the store is, for the
controls to fit the default range to its data.

A ``pool`` is its ``PoolConfig`` (the pages pass it), whose series are chosen as the engine
chooses them (``slo.objectives.sli.pool_series``: the pool's ``selector`` / ``dcgm_selector`` in a
Prometheus, Vigil's ``pool``/``kind`` labels in the store), or its name (Vigil's labels).

Units: times Unix seconds, windows seconds, latencies seconds, ratios 0-1, costs USD.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from slo.cost.pool import pool_cost
from slo.objectives.burn_rate import burn_rate
from slo.objectives.quantiles import QUANTILES, finite_or_none, quantile_key
from slo.objectives.sli import error_ratio, pool_series, vllm_matchers
from slo.objectives.spec import SloSpec
from slo.promql.quantile import Bucket, histogram_quantile
from slo.scaling.signals import kv_usage_at, kv_usage_by_pool_replica, queue_length_at
from slo.sources.embedded import EmbeddedSource
from slo.sources.protocol import RequestLog, Source
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    DCGM_GPU_UTIL,
    DCGM_SM_ACTIVE,
    KIND_DCGM,
    LABEL_FINISHED_REASON,
    LABEL_GPU,
    LABEL_INSTANCE,
    LABEL_MODEL_NAME,
    SERIES_UP,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_ITERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
)
from vigil.model import Labels

#: A pool as the point functions take it: its configuration, or its name (Vigil's labels).
Pool: TypeAlias = PoolConfig | str

__all__ = [
    "MAX_POINTS",
    "MIN_POINTS",
    "STEPS",
    "burn_point",
    "chart_step",
    "chart_times",
    "cost_point",
    "counter_rate_point",
    "counter_ratio_point",
    "finished_point",
    "first_sample",
    "histogram_distribution",
    "kv_point",
    "mean_point",
    "quantile_point",
    "queue_point",
    "sm_point",
]

#: The most points one chart line evaluates (each is one or a few engine queries).
MAX_POINTS = 120
#: The fewest points a full-size chart gets when the range holds that many scrape intervals.
MIN_POINTS = 60
#: Round steps (seconds) a chart may use, finest first; each at most twice the one before,
#: so that the finest step within ``MAX_POINTS`` still gives ``MAX_POINTS / 2`` points.
STEPS = (15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
         10800.0, 21600.0, 43200.0, 86400.0)


def chart_step(range_s: float, *, min_step_s: float = 15.0, max_points: int = MAX_POINTS
               ) -> float:
    """The step (seconds) of a chart over ``range_s``: the finest round step (``STEPS``) not
    finer than ``min_step_s`` (the scrape interval: finer points would repeat samples) that
    keeps at most ``max_points`` points; a range too long for the coarsest is divided evenly."""
    if not (math.isfinite(range_s) and range_s > 0):
        raise ValueError(f"the chart range must be a positive number of seconds, not {range_s!r}")
    if max_points < 2:
        raise ValueError(f"a chart needs at least 2 points, not {max_points!r}")
    for step in STEPS:
        if step >= min_step_s and range_s / step <= max_points - 1:
            return step
    return max(min_step_s, range_s / (max_points - 1))


def chart_times(end_s: float, range_s: float, step_s: float) -> list[float]:
    """Evaluation times of a chart ending at ``end_s``, oldest first: the multiples of
    ``step_s`` inside ``[end_s - range_s, end_s)`` — the same instants on every refresh, so
    their cached points are reused — and ``end_s`` itself, so that the last point is the
    value the status shows now."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"the step must be a positive number of seconds, not {step_s!r}")
    start = end_s - range_s
    first = math.ceil(start / step_s - 1e-9) * step_s
    times = []
    t = first
    while t < end_s - 1e-6:
        times.append(t)
        t = round(t + step_s, 6)
    return [*times, end_s]


def first_sample(source: Source, end_s: float, range_s: float) -> float | None:
    """The time (Unix seconds) of the fleet's first sample when the store is younger than
    ``range_s`` at ``end_s``: the oldest ``up`` sample (every scrape writes one) in
    ``(end_s - range_s, end_s]``. ``None`` when data reaches further back, or there is none.

    Two cheap reads: is there a sample before the range (embedded store: the latest ``up``
    at or before its start, one index seek per target, however old; Prometheus: within the
    lookback), and only if not, the range's ``up`` samples, which a young store has few of."""
    start = end_s - range_s
    if isinstance(source, EmbeddedSource):
        if source.store.last_points(SERIES_UP, None, math.floor(start * 1000)):
            return None
    elif source.instant(SERIES_UP, {}, start):
        return None
    firsts = [pts[0].ts_ms for pts in source.samples(SERIES_UP, {}, end_s, range_s).values()
              if pts]
    return min(firsts) / 1000.0 if firsts else None


# --- quality: latency quantiles, tokens, finished requests, burn rates -------------------------
def _by_model(groups: Mapping[Labels, Any]) -> dict[str, Any]:
    return {dict(k).get(LABEL_MODEL_NAME, ""): v for k, v in groups.items()
            if dict(k).get(LABEL_MODEL_NAME)}


def quantile_point(source: Source, pool: Pool, at_s: float, window_s: float, metric: str,
                   qs: Sequence[float] = QUANTILES) -> dict[str, dict[str, float | None]]:
    """Per model: ``{"p50": s, "p95": s, "p99": s}`` of histogram ``metric`` over the window,
    ``histogram_quantile(q, sum by (model_name, le) (rate(metric_bucket{pool}[w])))`` — the
    query and function ``slo.objectives.quantiles.model_quantiles`` uses, for one histogram only (a
    chart of TTFT does not need the other nine queries)."""
    groups = source.bucket_increase(metric, vllm_matchers(pool, source), at_s, window_s,
                                    (LABEL_MODEL_NAME,))
    out: dict[str, dict[str, float | None]] = {}
    for model, buckets in sorted(_by_model(groups).items()):
        out[model] = {quantile_key(q): finite_or_none(histogram_quantile(q, buckets,
                                                                          source.semantics))
                      for q in qs}
    return out


def mean_point(source: Source, pool: Pool, at_s: float, window_s: float, metric: str
               ) -> dict[str, float | None]:
    """Per model: ``increase(metric_sum[w]) / increase(metric_count[w])`` (e.g. generated
    tokens per request), as ``model_quantiles`` computes ``tokens_per_request.*.mean``."""
    m = vllm_matchers(pool, source)
    by = (LABEL_MODEL_NAME,)
    sums = _by_model(source.increase(metric + SUFFIX_SUM, m, at_s, window_s, by))
    counts = _by_model(source.increase(metric + SUFFIX_COUNT, m, at_s, window_s, by))
    return {model: (None if not counts.get(model) else finite_or_none(total / counts[model]))
            for model, total in sorted(sums.items())}


def finished_point(source: Source, pool: Pool, at_s: float, window_s: float,
                   model: str | None = None) -> dict[str, float]:
    """Finished requests by ``finished_reason`` over the window (``stop``, ``length``,
    ``abort``, ``error``, ``repetition``): ``sum by (finished_reason)
    (increase(vllm:request_success_total{pool[, model]}[w]))``. The ``error`` share of their
    sum is the error-rate SLI of ``slo.objectives.sli.error_ratio``."""
    groups = source.increase(VLLM_REQUEST_SUCCESS, vllm_matchers(pool, source, model=model),
                             at_s, window_s,
                             (LABEL_FINISHED_REASON,))
    return {dict(k).get(LABEL_FINISHED_REASON, ""): v for k, v in sorted(groups.items())}


def burn_point(spec: SloSpec, source: Source, at_s: float, window_s: float,
               request_log: RequestLog | None = None) -> dict[str, float | None]:
    """``{"error_ratio", "burn_rate"}`` of one SLO over one window at ``at_s``:
    ``slo.objectives.sli.error_ratio`` and ``slo.objectives.burn_rate.burn_rate``, exactly as the
    status JSON's ``slos[].windows.<w>`` (``None`` without data)."""
    r = error_ratio(spec, source, at_s, window_s, request_log=request_log).error_ratio
    return {"error_ratio": r, "burn_rate": burn_rate(r, spec.objective)}


# --- server: KV cache, queue, GPU, counters ------------------------------------------------------
def kv_point(source: Source, pool: PoolConfig, at_s: float) -> dict[str, Any]:
    """KV-cache usage (ratio 0-1) at ``at_s``: the pool's ``mean`` and ``max`` over replicas
    (``slo.scaling.signals.kv_usage_at``, what scaling reads) and ``replicas``: each replica's value
    (``alerts.conditions.kv_usage_by_replica``, what KvCacheUsageHigh reads)."""
    pooled = kv_usage_at(source, pool, at_s)
    per = kv_usage_by_pool_replica(source, pool, at_s)
    return {
        "mean": None if pooled is None else pooled[0],
        "max": None if pooled is None else pooled[1],
        "replicas": {instance: v for (_, instance), v in sorted(per.items())},
    }


def queue_point(source: Source, pool: PoolConfig, at_s: float) -> float | None:
    """Requests waiting in the pool at ``at_s`` (sum over replicas; ``queue_length_at``)."""
    return queue_length_at(source, pool, at_s)


def sm_point(source: Source, pool: Pool, at_s: float) -> dict[str, float]:
    """GPU SM utilisation (ratio 0-1) per ``"<dcgm target> gpu <n>"`` from the pool's DCGM
    targets: ``DCGM_FI_PROF_SM_ACTIVE`` where the exporter collects it (it is commented out of
    dcgm-exporter's default CSV), else ``DCGM_FI_DEV_GPU_UTIL`` / 100 (the share of time any
    kernel ran: coarser, but always there). The DCGM series are the pool's
    ``pool_series(pool, source, "dcgm")`` (its ``dcgm_selector`` in a Prometheus)."""
    m = pool_series(pool, source, KIND_DCGM)
    out: dict[str, float] = {}
    for metric, scale in ((DCGM_SM_ACTIVE, 1.0), (DCGM_GPU_UTIL, 0.01)):
        for labels, value in source.instant(metric, m, at_s).items():
            d = dict(labels)
            key = f"{d.get(LABEL_INSTANCE, '')} gpu {d.get(LABEL_GPU, '?')}"
            if key not in out and math.isfinite(value):
                out[key] = value * scale
    return dict(sorted(out.items()))


def counter_ratio_point(source: Source, pool: Pool, at_s: float, window_s: float,
                        numerator: str, denominator: str) -> float | None:
    """``sum(increase(numerator[w])) / sum(increase(denominator[w]))`` over the pool's vLLM
    series (prefix-cache hit rate, speculative-decoding acceptance rate); ``None`` when the
    denominator is absent or did not grow."""
    m = vllm_matchers(pool, source)
    den = source.increase(denominator, m, at_s, window_s).get(())
    if den is None or not den > 0:
        return None
    num = source.increase(numerator, m, at_s, window_s).get((), 0.0)
    return finite_or_none(num / den)


def counter_rate_point(source: Source, pool: Pool, at_s: float, window_s: float, metric: str
                       ) -> float | None:
    """``sum(rate(metric[w]))`` per second over the pool's vLLM series; ``None`` without it."""
    total = source.increase(metric, vllm_matchers(pool, source), at_s, window_s).get(())
    return None if total is None else total / window_s


def histogram_distribution(source: Source, pool: Pool, at_s: float, window_s: float,
                           metric: str = VLLM_ITERATION_TOKENS) -> list[dict[str, Any]]:
    """The observations of histogram ``metric`` over the window, bucket by bucket (``sum by
    (le) (increase(metric_bucket[w]))`` made non-cumulative): ``[{"lower", "upper", "count",
    "share"}]`` in bound order, ``upper`` ``inf`` for the last. For ``vllm:iteration_tokens_total``
    this is the distribution of tokens per engine step, vLLM's batch-size proxy."""
    groups = source.bucket_increase(metric, vllm_matchers(pool, source), at_s, window_s)
    return _non_cumulative(groups.get(()) or [])


def _non_cumulative(buckets: Iterable[Bucket]) -> list[dict[str, Any]]:
    merged: dict[float, float] = {}
    for le, c in buckets:
        merged[le] = merged.get(le, 0.0) + c
    rows: list[dict[str, Any]] = []
    lower, below = 0.0, 0.0
    total = merged.get(math.inf)
    for le in sorted(merged):
        n = max(0.0, merged[le] - below)
        rows.append({"lower": lower, "upper": le, "count": n})
        lower, below = le, max(below, merged[le])
    for row in rows:
        row["share"] = row["count"] / total if total else None
    return rows


# --- business: cost ------------------------------------------------------------------------------
def cost_point(source: Source, config: Config, pool: PoolConfig, at_s: float, window_s: float,
               request_log: RequestLog | None = None) -> dict[str, Any]:
    """``slo.cost.pool.pool_cost`` over ``window_s`` at ``at_s``: the status JSON's ``cost`` block
    (USD, GPU-hours, requests, tokens, and with the gateway's records ``by_tier`` and
    ``cache_savings_usd``; ``None`` = no data)."""
    return pool_cost(source, config, pool, at_s, window_s, request_log=request_log)
