"""What a pool costs over a window, and per 1000 requests and per million output tokens.

GPU time is what is paid for, busy or idle: an up replica costs its GPUs' hourly price whether
it serves requests or not. A replica is billed for the time it ran: each ``up == 1`` sample of a
vLLM target stands for one scrape interval of that target (the time since its previous scrape,
when scraped on schedule). A replica that appeared 30 minutes ago has 30 minutes of samples and
costs 30 minutes; a scrape gap (no samples) and a down replica (``up == 0``) cost nothing. So,
over the window ``w`` (``[engine] cost_window``, 1 h), per target::

    up_seconds = min(count of up == 1 samples in w × interval, w)
    gpu_hours  = sum(up_seconds) / 3600 × gpus_per_replica
    cost_usd   = gpu_hours × prices[pool.gpu]
    requests   = sum(increase(vllm:request_success_total{pool, kind="vllm"}[w]))   (see below)
    output_tokens = sum(increase(vllm:generation_tokens_total{pool, kind="vllm"}[w]))
    per_1000_requests         = cost_usd / requests × 1000
    per_million_output_tokens = cost_usd / output_tokens × 1e6
    idle_share = share of the pool's vllm:num_requests_running samples in w that are 0
    idle_cost_usd = cost_usd × idle_share

In a Prometheus that scrapes the replicas itself (a pool with a ``selector``), a replica is
told apart by the pool's ``replica_label`` (``pod``, say) and a pod scraped by two jobs has two
``up`` series: each replica is billed once, for the most of its series'
``up_seconds`` (``max by (<replica label>) (...)``), never their sum.

``interval`` is the target's configured scrape interval (``[[targets]] scrape_interval``, else
``[collector] scrape_interval``), the series' ``instance`` being the target's name. A replica no
``[[targets]]`` entry lists (chosen by a selector in a team's Prometheus, or found by
``[[discovery]]``) takes ``Config.unlisted_scrape_interval``: the pool's ``scrape_interval``,
else the discovery entries' interval, else, for a selector pool, ``[collector]
scrape_interval`` — the interval the generated rule bills with, so the engine reading that
Prometheus and the rule agree. Only when none is known (a pool without a selector whose series
a Prometheus discovered on its own) does a series take the median spacing of its samples in the
window (with at least ``MIN_SAMPLES_FOR_SPACING`` samples; else ``[collector]
scrape_interval``). Never more than ``[engine] lookback``: no sample counts for longer than
PromQL would see it. The ``min(…, w)`` keeps a window's edge sample from billing more than the
window. In PromQL, per target: ``clamp_max(sum_over_time(up[w]) * interval, w)``
(``alerts.rules.promql.gpu_cost_expr``; equal to this whenever the interval is known).

History the store has downsampled (``slo.sources.protocol.Downsampled``: older than ``[store]
raw_retention``, one sample per ``[store] resolution`` bucket) bills each kept sample for
``max(interval, resolution)``, the bucket it stands for.

With ``[[pools]] bill_down_time = true`` every sample counts, ``up == 0`` too
(``count_over_time(up[w])``): for fleets whose crashed pods keep their GPUs.

Anything without data is ``None``, never 0 (e.g. ``per_1000_requests`` with no requests).

**What "requests" means in every per-1000 figure, pool and tier: the requests a replica
finished**, what vLLM counts in ``vllm:request_success_total``: completed (``finished_reason``
``stop``, ``length``, ``repetition``) or failed in the engine (``error``). The pool reads that
counter; a tier counts its gateway records that a replica answered with a 2xx or a 5xx (vLLM
answers an engine failure with a 500). Not counted:

* requests aborted before the end: the client went away (``error_class`` ``client_cancel``,
  status 499) or the gateway gave up on a silent replica (``timeout``, 504: it closes the
  connection, so vLLM aborts the request as for a client). vLLM counts no aborted request:
  ``OutputProcessor.abort_requests`` bypasses its statistics (vllm-project/vllm#31503), so it
  is in no ``finished_reason`` (not even ``abort``) and not in
  ``vllm:e2e_request_latency_seconds``, while its tokens are in
  ``vllm:generation_tokens_total``. The GPU time they took stays in ``cost_usd`` (and in their
  tier's share of it), spread over the finished requests; per tier they are reported as
  ``cancelled`` and ``timed_out``.
* refusals, by the gateway before a replica (``ERROR_REFUSED_CLASSES``) or by the replica's
  API server before its engine (``upstream_4xx``): no GPU time, left out of ``by_tier``.
* semantic-cache hits: the gateway answered them, no replica worked; reported per tier as
  ``cache_hits``, what they saved as ``saved_usd`` and ``cache_savings_usd``.

A replica that died mid-request (connection reset, a 502 from the gateway) is counted by its
tier although vLLM's counter never saw it: the gateway cannot tell it from an engine failure.

With the gateway's request log (``slo.sources.protocol.RequestLog``) two more figures exist:

* ``by_tier``: the pool's ``cost_usd`` split over the tiers (premium / standard / batch) in
  proportion to the GPU time the gateway attributed to each tier's requests (``cost_usd`` of
  each record: the replica's price per second × the request's latency ÷ the requests sharing
  the replica meanwhile; cancelled and timed-out requests included, they used the GPU), so the
  tiers add up to the pool's cost, idle time included; falling back to output tokens when no
  record carries a cost. Per tier: ``requests`` (finished by a replica, as above),
  ``cancelled``, ``timed_out``, ``cache_hits``, output tokens, cost, cost per 1000 requests.
* ``cache_savings_usd``: what the semantic cache's hits would have cost on the GPUs (the
  ``saved_usd`` of each hit: the cost of the request that filled the entry).

Units: USD, GPU-hours, seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from slo.objectives.quantiles import finite_or_none
from slo.objectives.sli import replica_label, replica_of, vllm_matchers, vllm_up_matchers
from slo.promql.aggregate import sum_by
from slo.sources.protocol import Downsampled, OwnSamples, RequestLog, Source, is_external
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ERROR_CLIENT_CANCEL,
    ERROR_REFUSED_CLASSES,
    ERROR_TIMEOUT,
    ERROR_UPSTREAM_4XX,
    LABEL_INSTANCE,
    LABEL_MODEL_NAME,
    SERIES_UP,
    VLLM_GENERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
)
from vigil.durations import SECONDS_PER_HOUR, format_duration
from vigil.model import Labels, Point, RequestRecord

__all__ = [
    "MIN_SAMPLES_FOR_SPACING",
    "READ_CHUNK_S",
    "billed_intervals",
    "coverage_interval",
    "gpu_hours",
    "gpu_hours_of",
    "idle_share",
    "pool_cost",
    "reached_engine",
    "samples_between",
    "tier_costs",
    "up_seconds",
]

#: Fewest samples whose median spacing stands for an unknown scrape interval: with fewer, one
#: gap (a restart, a missed scrape) could be the median.
MIN_SAMPLES_FOR_SPACING = 4
#: Records no replica worked on: refused by the gateway, or by the replica's API server before
#: its engine (an upstream 4xx: vLLM validates a request before the engine sees it).
_REFUSED_CLASSES = (*ERROR_REFUSED_CLASSES, ERROR_UPSTREAM_4XX)


def reached_engine(record: RequestRecord) -> bool:
    """Whether a request took GPU time: it reached a replica's engine (not refused by the
    gateway or by the replica's API server, not answered from the semantic cache)."""
    return record.error_class not in _REFUSED_CLASSES and not record.cache_hit


def coverage_interval(
    configured_s: float | None, ts_ms: Sequence[int] | npt.NDArray[np.int64], default_s: float,
    lookback_s: float,
) -> float:
    """Seconds one sample of a target stands for: ``configured_s`` (its scrape interval) when
    known; else the median spacing of its samples ``ts_ms`` (Unix ms, in order) when there are
    at least ``MIN_SAMPLES_FOR_SPACING``, else ``default_s``; at most ``lookback_s``."""
    if configured_s is not None:
        return min(configured_s, lookback_s)
    if len(ts_ms) >= MIN_SAMPLES_FOR_SPACING:
        # The middle spacing, or the mean of the two middle ones: statistics.median's value
        # (exact in float64 for millisecond gaps), over arrays of a month of samples.
        spacing = float(np.median(np.diff(np.asarray(ts_ms, dtype=np.int64)))) / 1000.0
        if spacing > 0:
            return min(spacing, lookback_s)
    return min(default_s, lookback_s)


def _scrape_intervals(source: Source, config: Config, pool: PoolConfig
                      ) -> tuple[dict[str, float], float | None]:
    """The pool's configured scrape intervals (seconds) by target name, and the interval of
    its replicas no ``[[targets]]`` entry lists (None: unknown, measured from the samples)."""
    configured = {t.name: config.scrape_interval(t) for t in config.targets
                  if t.pool == pool.name}
    # Replicas no [[targets]] entry lists: a known interval bills them exactly as the
    # generated rule does (PromQL cannot measure spacing); a selector's series never match a
    # target name, and the engine reading a team's Prometheus must equal the rules.
    if is_external(source) and pool.has_selector:
        configured = {}
    return configured, config.unlisted_scrape_interval(pool)


def up_seconds(
    source: Source, config: Config, pool: PoolConfig, at_s: float, window_s: float
) -> dict[Labels, float]:
    """Per vLLM target of the pool (keyed by its ``up`` series' labels): the seconds it is
    billed for in the window, ``min(samples × interval, window)`` (see the module docstring;
    ``up == 1`` samples only unless ``pool.bill_down_time``). Targets without a sample in the
    window are absent; a target down all window is 0.

    Read from a Prometheus (``source.external``), the key is the replica instead,
    ``((<replica label>, value),)``, billed for the most of its series (a pod scraped by two
    jobs is one replica); a series without that label stays on its own."""
    configured, unlisted = _scrape_intervals(source, config, pool)
    thinned = source.downsampled() if isinstance(source, Downsampled) else None
    out: dict[Labels, float] = {}
    series = _sample_arrays(source, SERIES_UP, vllm_up_matchers(pool, source), at_s, window_s,
                            chunked=False)
    for labels, (ts, values) in series.items():
        billed = ts if pool.bill_down_time else ts[values == 1.0]
        interval = coverage_interval(
            configured.get(dict(labels).get(LABEL_INSTANCE, ""), unlisted),
            ts, config.collector.scrape_interval, config.engine.lookback,
        )
        before_ms, resolution_s = thinned if thinned is not None else (None, 0.0)
        old = 0 if before_ms is None else int(np.count_nonzero(billed < before_ms))
        if old:
            # Downsampled history: each kept sample is the last of its bucket.
            seconds = (len(billed) - old) * interval + old * max(interval, resolution_s)
        else:
            # The same IEEE operations as clamp_max(sum_over_time(up[w]) * interval, w).
            seconds = float(len(billed)) * interval
        out[labels] = min(seconds, window_s)
    if not is_external(source):
        return out
    label = replica_label(pool, source)
    per_replica: dict[Labels, float] = {}
    for labels, seconds in out.items():
        replica = dict(labels).get(label)
        # A series without the label is its own replica: merging all such would under-bill.
        key = labels if replica is None else ((label, replica),)
        per_replica[key] = max(per_replica.get(key, seconds), seconds)
    return per_replica


#: The longest span one read of raw samples asks for (seconds): a month of 15 s scrapes of a
#: fleet in one answer would be hundreds of megabytes of JSON from a Prometheus.
READ_CHUNK_S = 86400.0


def samples_between(source: Source, metric: str, matchers: Any, lo_s: float, hi_s: float
                    ) -> dict[Labels, list[Point]]:
    """The raw samples of ``metric{matchers}`` in ``(lo_s, hi_s]`` (Unix seconds), read a day
    at a time, per series in time order."""
    out: dict[Labels, list[Point]] = {}
    t = hi_s
    while t > lo_s:
        span = min(READ_CHUNK_S, t - lo_s)
        for labels, points in source.samples(metric, matchers, t, span).items():
            out.setdefault(labels, []).extend(points)
        t -= span
    for points in out.values():
        points.sort()
    return out


def billed_intervals(
    source: Source, config: Config, pool: PoolConfig, lo_s: float, hi_s: float
) -> dict[str, list[tuple[float, float]]]:
    """Per replica, the union of the intervals ``(ts − cover, ts]`` its billed ``up`` samples
    after ``lo_s`` stand for (``cover`` as in ``up_seconds``: the target's scrape interval, or the
    bucket of a downsampled sample), not yet merged or clipped. Every second of them is
    paid for (``slo.cost.attribution``)."""
    configured, unlisted = _scrape_intervals(source, config, pool)
    thinned = source.downsampled() if isinstance(source, Downsampled) else None
    before_ms, resolution_s = thinned if thinned is not None else (None, 0.0)
    out: dict[str, list[tuple[float, float]]] = {}
    # A sample shortly after the window stands for seconds inside it: read one lookback on
    # (the caller clips the intervals to the window).
    hi = hi_s + config.engine.lookback
    up = _sample_arrays(source, SERIES_UP, vllm_up_matchers(pool, source), hi, hi - lo_s,
                        chunked=True)
    for labels, (all_ts, values) in up.items():
        interval = coverage_interval(
            configured.get(dict(labels).get(LABEL_INSTANCE, ""), unlisted),
            all_ts, config.collector.scrape_interval, config.engine.lookback)
        ts = all_ts if pool.bill_down_time else all_ts[values == 1.0]
        if not len(ts):
            continue
        cover = np.full(len(ts), interval)
        if before_ms is not None:
            cover[ts < before_ms] = max(interval, resolution_s)
        end = ts / 1000.0
        out.setdefault(replica_of(labels, replica_label(pool, source)), []).extend(
            _union(end - cover, end))
    return out


def _sample_arrays(source: Source, metric: str, matchers: Any, at_s: float, range_s: float,
                   *, chunked: bool
                   ) -> dict[Labels, tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """The samples per series that ``samples(metric, at_s, range_s)`` gives, as arrays:
    times (Unix ms) and values, staleness markers and NaN left out.

    Vigil's store hands them over as arrays in one read (``OwnSamples.window_arrays``): a
    month of a fleet's scrapes is millions of samples, and as ``Point`` objects most of a
    month's chargeback, and of a chart of cost, went to making them. Any other source
    answers ``samples``, a day at a time (``samples_between``) when ``chunked``."""
    arrays = (source.window_arrays(metric, matchers, at_s, range_s)
              if isinstance(source, OwnSamples) else None)
    if arrays is not None:
        out = {}
        for labels, (ts, vals) in arrays.items():
            keep = ~np.isnan(vals)
            if keep.any():
                out[labels] = (ts[keep], vals[keep])
        return out
    read = (samples_between(source, metric, matchers, at_s - range_s, at_s) if chunked
            else source.samples(metric, matchers, at_s, range_s))
    return {labels: (np.array([p.ts_ms for p in pts], dtype=np.int64),
                     np.array([p.value for p in pts], dtype=np.float64))
            for labels, points in read.items()
            if (pts := [p for p in points if p.value is not None and not math.isnan(p.value)])}


def _union(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64]
           ) -> list[tuple[float, float]]:
    """The union of the intervals ``[starts[i], ends[i]]`` (``ends`` ascending), as few
    intervals as it takes: a replica scraped on schedule is one interval a stretch."""
    order = np.argsort(starts, kind="stable")
    a, b = starts[order], ends[order]
    reach = np.maximum.accumulate(b)
    # A new interval begins where a start lies past every end before it.
    new = np.concatenate([[True], a[1:] > reach[:-1]])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:] - 1, [len(a) - 1]])
    return list(zip(a[first].tolist(), reach[last].tolist(), strict=True))


def gpu_hours_of(replica_seconds: float, gpus_per_replica: int) -> float:
    """GPU-hours of ``replica_seconds`` seconds of replica time (``/ 3600 × GPUs``, the
    generated rule's order of operations)."""
    return replica_seconds / SECONDS_PER_HOUR * gpus_per_replica


def gpu_hours(
    source: Source, config: Config, pool: PoolConfig, at_s: float, window_s: float
) -> float | None:
    """GPU-hours the pool's vLLM targets ran in the window (idle time included; down time
    only with ``bill_down_time``); ``None`` when no target of the pool was scraped in it."""
    per_target = up_seconds(source, config, pool, at_s, window_s)
    if not per_target:
        return None
    return gpu_hours_of(sum_by(per_target, (), source.semantics)[()], pool.gpus_per_replica)


def idle_share(source: Source, pool: PoolConfig, at_s: float, window_s: float) -> float | None:
    """Share (0-1) of the pool's ``vllm:num_requests_running`` samples in the window that are 0;
    ``None`` without samples. Counted over samples, so every scrape of every engine weighs
    the same."""
    series = _sample_arrays(source, VLLM_REQUESTS_RUNNING, vllm_matchers(pool, source), at_s,
                            window_s, chunked=False)
    count = sum(len(values) for _, values in series.values())
    if not count:
        return None
    return sum(int(np.count_nonzero(values == 0)) for _, values in series.values()) / count


def tier_costs(
    records: Sequence[RequestRecord], cost_usd: float | None
) -> tuple[dict[str, dict[str, float | None]] | None, float | None]:
    """``(by_tier, cache_savings_usd)`` of one pool's records over the cost window (see the
    module docstring); ``(None, None)`` without records.

    Per tier: ``requests`` (finished by a replica: the ``per_1000_requests`` denominator, the
    requests vLLM's ``request_success_total`` counts), ``cancelled``, ``timed_out`` and
    ``cache_hits`` (counts), ``output_tokens``, ``saved_usd``, ``cost_share`` (0-1),
    ``cost_usd`` and ``per_1000_requests`` (USD)."""
    # Refused ones cost nothing: by the gateway, or by the replica's API before its engine.
    records = [r for r in records if r.error_class not in _REFUSED_CLASSES]
    if not records:
        return None, None
    tiers: dict[str, dict[str, float]] = {}
    for r in records:
        t = tiers.setdefault(r.tier or "unknown",
                             {"requests": 0.0, "cancelled": 0.0, "timed_out": 0.0,
                              "output_tokens": 0.0, "weight": 0.0, "cache_hits": 0.0,
                              "saved_usd": 0.0})
        t["output_tokens"] += r.generated_tokens
        if r.cache_hit:
            t["cache_hits"] += 1
            if r.saved_usd is not None and math.isfinite(r.saved_usd):
                t["saved_usd"] += r.saved_usd
            continue
        # The GPU time of every request that reached a replica weighs, finished or not; only
        # the finished ones are counted, as vLLM's own counter (and so the pool) counts them.
        if r.cost_usd is not None and math.isfinite(r.cost_usd):
            t["weight"] += r.cost_usd
        if r.error_class == ERROR_CLIENT_CANCEL:
            t["cancelled"] += 1
        elif r.error_class == ERROR_TIMEOUT:
            t["timed_out"] += 1
        else:
            t["requests"] += 1
    by_weight = math.fsum(t["weight"] for t in tiers.values())
    key = "weight" if by_weight > 0 else "output_tokens"
    total = by_weight if by_weight > 0 else math.fsum(t["output_tokens"] for t in tiers.values())
    out: dict[str, dict[str, float | None]] = {}
    for name, t in sorted(tiers.items()):
        share = t[key] / total if total > 0 else None
        cost = None if share is None or cost_usd is None else cost_usd * share
        out[name] = {
            "requests": t["requests"],
            "cancelled": t["cancelled"],
            "timed_out": t["timed_out"],
            "output_tokens": t["output_tokens"],
            "cache_hits": t["cache_hits"],
            "saved_usd": t["saved_usd"],
            "cost_share": share,
            "cost_usd": cost,
            "per_1000_requests": _per(cost, t["requests"], 1000.0),
        }
    saved = [r.saved_usd for r in records
             if r.cache_hit and r.saved_usd is not None and math.isfinite(r.saved_usd)]
    return out, (math.fsum(saved) if any(r.cache_hit for r in records) else None)


def _per(cost: float | None, amount: float | None, unit: float) -> float | None:
    """``cost / amount × unit``, ``None`` when either is unknown or nothing was served."""
    if cost is None or amount is None or amount <= 0:
        return None
    return finite_or_none(cost / amount * unit)


def pool_cost(
    source: Source,
    config: Config,
    pool: PoolConfig,
    at_s: float,
    window_s: float | None = None,
    *,
    request_log: RequestLog | None = None,
) -> dict[str, Any]:
    """The ``"cost"`` block of one pool in the status JSON, over ``window_s`` (default
    ``[engine] cost_window``). USD, GPU-hours, requests, tokens; ``None`` = no data.
    ``request_log``: the gateway's, for ``by_tier`` and ``cache_savings_usd``."""
    w = config.engine.cost_window if window_s is None else window_s
    price = config.prices[pool.gpu]  # parse_config guarantees a price for every pool's GPU
    hours = gpu_hours(source, config, pool, at_s, w)
    cost = None if hours is None else hours * price
    m = vllm_matchers(pool, source)
    requests = source.increase(VLLM_REQUEST_SUCCESS, m, at_s, w).get(())
    tokens = source.increase(VLLM_GENERATION_TOKENS, m, at_s, w).get(())
    idle = idle_share(source, pool, at_s, w)
    by = (LABEL_MODEL_NAME,)
    models: dict[str, dict[str, float | None]] = {}
    for name, key in ((VLLM_REQUEST_SUCCESS, "requests"), (VLLM_GENERATION_TOKENS,
                                                         "output_tokens")):
        for labels, value in source.increase(name, m, at_s, w, by).items():
            model = dict(labels).get(LABEL_MODEL_NAME)
            if model:
                models.setdefault(model, {"requests": None, "output_tokens": None})[key] = value
    by_tier, savings = (None, None)
    if request_log is not None:
        by_tier, savings = tier_costs(list(request_log.records(pool.name, at_s, w)), cost)
    return {
        "window": format_duration(w),
        "model": pool.model,
        "gpu": pool.gpu,
        "usd_per_gpu_hour": price,
        "gpu_hours": hours,
        "cost_usd": cost,
        "requests": requests,
        "output_tokens": tokens,
        "per_1000_requests": _per(cost, requests, 1000.0),
        "per_million_output_tokens": _per(cost, tokens, 1_000_000.0),
        "idle_share": idle,
        "idle_cost_usd": None if cost is None or idle is None else cost * idle,
        "models": dict(sorted(models.items())),
        # From the gateway's request log: GPU cost split by priority tier and what
        # semantic-cache hits saved (null without gateway records).
        "by_tier": by_tier,
        "cache_savings_usd": savings,
    }
