"""The scaling signals of one pool, read through a ``Source``, and the recommendation for it.

Aggregation over a pool's replicas (matchers ``{pool="<name>", kind="vllm"}``; the collector
labels every series with ``instance``/``pool``/``kind``; in a Prometheus that scrapes the
replicas itself, the pool's ``selector``, with its ``replica_label`` telling replicas apart
where ``instance`` does below — ``slo.objectives.sli.pool_series``):

* **KV-cache usage** (ratio 0-1) is the MEAN over the pool's replicas of each replica's latest
  ``vllm:kv_cache_usage_perc`` (instant lookup, 5-minute lookback); a replica exposing several
  series (one per data-parallel engine) counts once, with the mean of its engines. In PromQL:
  ``avg(avg by (instance) (vllm:kv_cache_usage_perc{pool="p",kind="vllm"}))``. The mean, not
  the max, because the router spreads requests over the replicas: one replica with a full cache
  next to idle ones is a routing problem that another replica would not fix. The MAX is
  computed too, for display (``kv_cache_usage_max``).
* **Queue length** (requests) is the SUM of ``vllm:num_requests_waiting`` over the replicas —
  ``sum(vllm:num_requests_waiting{pool="p",kind="vllm"})`` — because waiting requests are work
  the pool as a whole has not started, whichever replica holds them.
* **TTFT p95** (seconds) is ``histogram_quantile(0.95, sum by (le)
  (rate(vllm:time_to_first_token_seconds_bucket{pool="p",kind="vllm"}[5m])))``, the quantile
  being ``[scaling] scale_out_ttft_quantile`` (0.95 by default) and the window ``[engine]
  window``. We ask the source for the bucket *increase*; the quantile is the
  same because ``rate`` divides every bucket by the same window length and
  ``histogram_quantile`` only uses ratios of bucket counts.
* **Request rate** (requests/s), sampled only to size by a capacity profile, is
  ``sum(rate(vllm:request_success_total{pool="p",kind="vllm"}[1m]))``: every finished request
  whatever its ``finished_reason``. The window is ``rate_window_for(step_s)``, at least four
  samples, and short, so that the trend fitted through it follows a ramp closely.

Each signal is sampled at a fixed step (default 15 s, the default scrape interval) ending at
``at_s``: KV-cache usage and queue length over ``max(scale_in_hold, fit window)`` (10 min by
default: 41 instant queries each), TTFT over the fit window only (5 min: 21 bucket-increase
queries), since TTFT takes no part in scale-in. The cost per pool and evaluation is therefore
about ``2 × 41 + 21 = 103`` queries, each touching every replica's series (``steps ×
replicas`` series reads; the TTFT queries read each replica's ~20 bucket series over the
5-minute window). A larger ``step_s`` makes it cheaper and blinder to short spikes. With a
capacity profile, the request rate adds 21 ``increase`` queries over the fit window.

The replica count and the cooldown come from ``up`` (the collector's scrape health series), so
that the cooldown follows real scale-outs without Vigil keeping any state: a scale-out is a
moment at which the number of the pool's vLLM targets with ``up == 1`` increased.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from slo.objectives.sli import pool_series, replica_label, replica_of, vllm_up_matchers
from slo.promql.lookup import LOOKBACK_DELTA_S, Semantics, duration_ms, eval_time_ms, semantics_of
from slo.promql.quantile import histogram_quantile
from slo.scaling.policy import (
    CapacitySizing,
    Recommendation,
    Timeline,
    decide,
    fit_window_for,
    latest,
)
from slo.sources.protocol import Matchers, Source
from vigil.config import Config, PoolConfig, ScalingConfig
from vigil.conventions import (
    SERIES_UP,
    VLLM_KV_CACHE_USAGE,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
)
from vigil.model import Labels

__all__ = [
    "DEFAULT_STEP_S",
    "KV_METRIC",
    "QUEUE_METRIC",
    "REQUEST_METRIC",
    "TTFT_METRIC",
    "PoolSignals",
    "ReplicaChange",
    "current_replicas",
    "kv_usage_at",
    "kv_usage_by_pool_replica",
    "kv_usage_by_replica",
    "kv_usage_of_fleet",
    "last_scale_in_at",
    "last_scale_out_at",
    "pool_matchers",
    "pool_mean_max",
    "pool_signals",
    "queue_length_at",
    "rate_window_for",
    "recommend_for_pool",
    "replica_changes",
    "replica_mean",
    "request_rate_at",
    "sample_times",
    "ttft_quantile_at",
    "ttft_threshold_for",
]

KV_METRIC = VLLM_KV_CACHE_USAGE
QUEUE_METRIC = VLLM_REQUESTS_WAITING
#: The histogram's base name; the source adds ``_bucket``.
TTFT_METRIC = VLLM_TTFT
#: The counter of finished requests the request rate is the rate of.
REQUEST_METRIC = VLLM_REQUEST_SUCCESS
#: Seconds between samples of a signal timeline: the default scrape interval.
DEFAULT_STEP_S = 15.0
#: Seconds after a pool's first sample during which targets coming up are the collector
#: discovering them, not a scale-out (several scrape intervals: every target's first scrape).
DISCOVERY_S = 60.0


def pool_matchers(pool: PoolConfig, source: Source | None = None) -> Matchers:
    """The label matchers of the pool's vLLM series in ``source``: ``{pool="<name>",
    kind="vllm"}``, or the pool's ``selector`` in a Prometheus
    (``slo.objectives.sli.pool_series``)."""
    return pool_series(pool, source)


def sample_times(at_s: float, span_s: float, step_s: float) -> list[float]:
    """Evaluation times ``at_s - k × step_s`` covering ``span_s`` seconds, oldest first.

    The newest is exactly ``at_s``; the oldest is ``at_s - span_s`` when ``span_s`` is a
    multiple of ``step_s`` (so a 10-minute hold is covered end to end).
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be > 0 seconds, not {step_s!r}")
    if not (math.isfinite(span_s) and span_s >= 0):
        raise ValueError(f"span_s must be >= 0 seconds, not {span_s!r}")
    # The epsilon keeps 600 / 15 at 40 steps despite float rounding.
    n = math.floor(span_s / step_s + 1e-9)
    return [at_s - k * step_s for k in range(n, -1, -1)]


def rate_window_for(step_s: float) -> float:
    """The request-rate window (seconds): 1 minute, or 4 samples when they are further
    apart (a rate over fewer samples jumps with every scrape's jitter)."""
    return max(60.0, 4.0 * float(step_s))


def request_rate_at(source: Source, pool: PoolConfig, at_s: float, window_s: float = 60.0
                    ) -> float | None:
    """The pool's rate of finished requests (requests/s) over the ``window_s`` seconds
    before ``at_s``: ``sum(rate(vllm:request_success_total{pool}[window]))``. None when no
    replica has two samples in the window (PromQL's empty result)."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be > 0 seconds, not {window_s!r}")
    value = source.increase(REQUEST_METRIC, pool_matchers(pool, source), at_s, window_s,
                            by=()).get(())
    if value is None or not math.isfinite(value):
        return None
    return value / window_s


def replica_mean(values: Iterable[float]) -> float | None:
    """One replica's value from its series' (one per data-parallel engine): the mean of the
    finite ones, ``math.fsum / n`` (correctly rounded, so the series' order does not matter);
    None without one. The arithmetic of every per-replica figure: the status, the scaling
    signals, the KvCacheUsageHigh alert of `vigil serve` and of the dashboard, the backtest."""
    finite = [v for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else None


def pool_mean_max(per_replica: Mapping[str, float]) -> tuple[float, float] | None:
    """``(mean, max)`` over replicas of their values (``math.fsum / n``); None without one."""
    if not per_replica:
        return None
    values = list(per_replica.values())
    return math.fsum(values) / len(values), max(values)


def kv_usage_by_replica(source: Source, pool: PoolConfig, at_s: float) -> dict[str, float]:
    """``{replica: KV-cache usage}`` (ratio 0-1) at ``at_s``: each replica (told apart by
    ``slo.objectives.sli.replica_label``) the ``replica_mean`` of its series; a replica with
    no finite value is absent."""
    label = replica_label(pool, source)
    per_replica: dict[str, list[float]] = defaultdict(list)
    for labels, value in source.instant(KV_METRIC, pool_matchers(pool, source), at_s).items():
        per_replica[replica_of(labels, label)].append(value)
    return {r: m for r, vs in sorted(per_replica.items())
            if (m := replica_mean(vs)) is not None}


def kv_usage_at(source: Source, pool: PoolConfig, at_s: float) -> tuple[float, float] | None:
    """``(mean, max)`` over the pool's replicas of KV-cache usage (ratio 0-1) at ``at_s``
    (``kv_usage_by_replica``); None when no replica reports a finite value within the
    lookback."""
    return pool_mean_max(kv_usage_by_replica(source, pool, at_s))


def kv_usage_by_pool_replica(source: Source, pool: PoolConfig, at_s: float
                             ) -> dict[tuple[str, str], float]:
    """``{(pool name, replica): usage}``: ``kv_usage_by_replica`` keyed as the KvCacheUsageHigh
    condition reads it (``alerts.conditions.evaluate_conditions``' ``kv_usage``). Series in a
    Prometheus carry no ``pool`` label, so the pool is the one whose series were read."""
    return {(pool.name, r): v for r, v in kv_usage_by_replica(source, pool, at_s).items()}


def kv_usage_of_fleet(config: Config, source: Source, at_s: float
                      ) -> dict[tuple[str, str], float]:
    """Every pool's ``kv_usage_by_pool_replica``: what the KvCacheUsageHigh condition reads,
    in `vigil serve` and on the dashboard alike."""
    out: dict[tuple[str, str], float] = {}
    for pool in config.pools:
        out.update(kv_usage_by_pool_replica(source, pool, at_s))
    return out


def queue_length_at(source: Source, pool: PoolConfig, at_s: float) -> float | None:
    """The sum over the pool's replicas of waiting requests at ``at_s``; None with no data."""
    values = [v for v in source.instant(QUEUE_METRIC, pool_matchers(pool, source), at_s).values()
              if math.isfinite(v)]
    return math.fsum(values) if values else None


def ttft_quantile_at(
    source: Source, pool: PoolConfig, at_s: float, window_s: float = 300.0,
    quantile: float | None = None,
) -> float | None:
    """The pool's TTFT ``quantile`` (seconds; default ``[scaling] scale_out_ttft_quantile``'s
    default, the p95) over the ``window_s`` before ``at_s``; None when there is no histogram
    or no request in the window (PromQL's NaN)."""
    q = ScalingConfig().scale_out_ttft_quantile if quantile is None else quantile
    groups = source.bucket_increase(TTFT_METRIC, pool_matchers(pool, source), at_s, window_s,
                                    by=())
    buckets = groups.get(())
    if not buckets:
        return None
    value = histogram_quantile(q, buckets, source.semantics)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class PoolSignals:
    """The sampled timelines of one pool (``(Unix seconds, value)``, oldest first).

    ``kv_mean`` and ``kv_max`` are KV-cache usage (ratio 0-1, mean and max over replicas),
    ``queue`` waiting requests (sum over replicas), ``ttft_p95`` the TTFT at ``[scaling]
    scale_out_ttft_quantile`` (seconds), ``request_rate`` finished requests per second (empty
    unless asked for). A time with no data is left out of a timeline.
    """

    kv_mean: Timeline
    kv_max: Timeline
    queue: Timeline
    ttft_p95: Timeline
    request_rate: Timeline = field(default_factory=list)


def pool_signals(
    source: Source,
    pool: PoolConfig,
    at_s: float,
    *,
    scaling: ScalingConfig,
    step_s: float = DEFAULT_STEP_S,
    ttft_window_s: float = 300.0,
    fit_window_s: float | None = None,
    request_rate: bool = False,
) -> PoolSignals:
    """Sample the pool's signals every ``step_s`` seconds up to ``at_s`` (see module docs).

    KV-cache usage and queue length span ``max(scaling.scale_in_hold, fit window)``; the TTFT
    quantile (``scaling.scale_out_ttft_quantile``) spans the fit window (default
    ``fit_window_for(scaling)``), each computed over the ``ttft_window_s`` before its sample
    time. ``request_rate``: also sample the request rate (requests/s, over
    ``rate_window_for(step_s)``) across the fit window.
    """
    fit = fit_window_for(scaling) if fit_window_s is None else float(fit_window_s)
    kv_mean: Timeline = []
    kv_max: Timeline = []
    queue: Timeline = []
    for t in sample_times(at_s, max(float(scaling.scale_in_hold), fit), step_s):
        kv = kv_usage_at(source, pool, t)
        if kv is not None:
            kv_mean.append((t, kv[0]))
            kv_max.append((t, kv[1]))
        q = queue_length_at(source, pool, t)
        if q is not None:
            queue.append((t, q))
    ttft: Timeline = []
    for t in sample_times(at_s, fit, step_s):
        value = ttft_quantile_at(source, pool, t, ttft_window_s,
                                 float(scaling.scale_out_ttft_quantile))
        if value is not None:
            ttft.append((t, value))
    rate: Timeline = []
    if request_rate:
        rate_window = rate_window_for(step_s)
        for t in sample_times(at_s, fit, step_s):
            r = request_rate_at(source, pool, t, rate_window)
            if r is not None:
                rate.append((t, r))
    return PoolSignals(kv_mean, kv_max, queue, ttft, rate)


def ttft_threshold_for(config: Config, pool: PoolConfig) -> float:
    """The TTFT threshold (seconds) scaling compares with: the strictest of the pool's TTFT
    SLOs (an SLO without a threshold uses ``[slo_defaults]``), else the default.

    The strictest, because the pool-wide p95 mixes every endpoint's requests and the scale-out
    must protect the most demanding SLO.
    """
    default = config.slo_defaults.ttft_threshold_seconds
    thresholds = [
        slo.threshold_seconds if slo.threshold_seconds is not None else default
        for slo in config.slos
        if slo.pool == pool.name and slo.indicator == "ttft"
    ]
    return min(thresholds) if thresholds else default


def current_replicas(source: Source, pool: PoolConfig, at_s: float) -> int:
    """How many of the pool's vLLM replicas are up (``up == 1``) at ``at_s``: distinct values
    of the replica label (``slo.objectives.sli.replica_label``) among the up series, so that a pod
    scraped by two jobs counts once."""
    label = replica_label(pool, source)
    return len({replica_of(labels, label)
                for labels, v in source.instant(SERIES_UP, vllm_up_matchers(pool, source),
                                                at_s).items()
                if v == 1.0})


class ReplicaChange(NamedTuple):
    """The number of up vLLM targets of a pool changed from ``before`` to ``after`` at
    ``at_s`` (Unix seconds)."""

    at_s: float
    before: int
    after: int


def replica_changes(
    source: Source,
    pool: PoolConfig,
    at_s: float,
    horizon_s: float,
    *,
    lookback_s: float = LOOKBACK_DELTA_S,
    discovery_s: float = DISCOVERY_S,
) -> list[ReplicaChange]:
    """Every change, within ``(at_s - horizon_s, at_s]``, of the count of up vLLM targets.

    The count at time t is ``count(count by (<replica label>) (up{pool, kind="vllm"} == 1))``
    evaluated at t: a replica counts while the newest ``up`` sample of one of its series is 1
    and within ``lookback_s``. It is swept exactly
    over the raw samples (one ``Source.samples`` call over ``horizon_s + lookback_s``, so that
    the count at the start of the horizon is known): it changes only at a sample or when a
    sample ages out of the lookback. Oldest first.

    A pool Vigil has just started watching is not a scale-out: when the pool has no sample
    at all in the read range before its first one (and that range starts more than a
    lookback earlier), the targets that come up within ``discovery_s`` of that first sample
    are the collector finding them, and those increases are not reported (a fresh collector
    would otherwise hold every pool in its scale-out cooldown for its first minutes).

    Caveat (errs on the side of waiting longer): ``samples`` drops staleness markers, so a
    target that vanishes without a failed scrape (``up == 0``) leaves the count only when its
    last sample ages out.
    """
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be > 0 seconds, not {horizon_s!r}")
    sem = semantics_of(source.semantics)
    at_ms = eval_time_ms(at_s)
    # v3 sees a sample while ts > t - lookback, so it is gone at exactly ts + lookback; v2
    # (ts >= t - lookback) keeps it one millisecond longer.
    life_ms = duration_ms(lookback_s) + (1 if sem is Semantics.V2 else 0)
    horizon_start_ms = at_ms - duration_ms(horizon_s)

    # time (ms) -> [(series, value or None for "ages out")]
    events: dict[int, list[tuple[Labels, float | None]]] = defaultdict(list)
    series = source.samples(SERIES_UP, vllm_up_matchers(pool, source), at_s,
                            horizon_s + lookback_s)
    label = replica_label(pool, source)
    for labels, points in series.items():
        pts = sorted((p for p in points if p.value is not None and p.ts_ms <= at_ms),
                     key=lambda p: p.ts_ms)
        for i, p in enumerate(pts):
            events[p.ts_ms].append((labels, p.value))
            expiry = p.ts_ms + life_ms
            nxt = pts[i + 1].ts_ms if i + 1 < len(pts) else None
            if (nxt is None or expiry < nxt) and expiry <= at_ms:
                events[expiry].append((labels, None))

    firsts = [min(p.ts_ms for p in pts if p.value is not None)
              for pts in series.values() if any(p.value is not None for p in pts)]
    read_start_ms = at_ms - duration_ms(horizon_s + lookback_s)
    discovered_until = -math.inf
    if firsts and min(firsts) - read_start_ms > life_ms:
        discovered_until = min(firsts) + duration_ms(discovery_s)

    up: dict[Labels, bool] = {}
    count = 0
    changes: list[ReplicaChange] = []
    for t in sorted(events):
        for labels, value in events[t]:
            if value is None:
                up.pop(labels, None)
            else:
                up[labels] = value == 1.0
        # Replicas, not series: a pod scraped by two jobs has two `up` series.
        new = len({replica_of(labels, label) for labels, is_up in up.items() if is_up})
        discovery = new > count and t <= discovered_until
        if new != count and t > horizon_start_ms and not discovery:
            changes.append(ReplicaChange(t / 1000.0, count, new))
        count = new
    return changes


def last_scale_out_at(
    source: Source,
    pool: PoolConfig,
    at_s: float,
    horizon_s: float,
    *,
    lookback_s: float = LOOKBACK_DELTA_S,
) -> float | None:
    """The last time (Unix seconds) within ``horizon_s`` (use at least the cooldown) at which
    the pool's count of up vLLM targets increased; None if it did not.

    A replica that restarts (up 1 → 0 → 1) also counts: its cache is cold and its queue empty,
    so the pool's signals are as unsettled as after a real scale-out.
    """
    ups = [c.at_s for c in replica_changes(source, pool, at_s, horizon_s, lookback_s=lookback_s)
           if c.after > c.before]
    return ups[-1] if ups else None


def last_scale_in_at(
    source: Source,
    pool: PoolConfig,
    at_s: float,
    horizon_s: float,
    *,
    lookback_s: float = LOOKBACK_DELTA_S,
) -> float | None:
    """The last time (Unix seconds) within ``horizon_s`` at which the pool's count of up vLLM
    targets decreased (a scale-in or a lost replica); None if it did not."""
    downs = [c.at_s for c in replica_changes(source, pool, at_s, horizon_s,
                                             lookback_s=lookback_s)
             if c.after < c.before]
    return downs[-1] if downs else None


def recommend_for_pool(
    source: Source,
    config: Config,
    pool: PoolConfig,
    at_s: float,
    *,
    step_s: float = DEFAULT_STEP_S,
    capacity: CapacitySizing | None = None,
) -> Recommendation:
    """The scaling recommendation for ``pool`` at ``at_s`` (Unix seconds), from ``source``.

    Samples the signals (``pool_signals``), counts the up replicas, finds the last scale-out
    (cooldown) and scale-in (restarts the scale-in hold) from ``up`` over ``max(cooldown,
    scale_in_hold)``, and applies ``slo.scaling.policy.decide``. ``signals`` in the result also
    holds ``kv_cache_usage_max``. ``capacity`` (the pool's capacity profile as a
    ``CapacitySizing``) sizes scale-outs and floors scale-ins by the request rate, which is
    then sampled too.
    """
    scaling = config.scaling
    fit = fit_window_for(scaling)
    sig = pool_signals(
        source, pool, at_s, scaling=scaling, step_s=step_s,
        ttft_window_s=config.engine.window, fit_window_s=fit,
        request_rate=capacity is not None,
    )
    lookback = config.engine.lookback
    horizon = max(float(scaling.cooldown), float(scaling.scale_in_hold))
    changes = replica_changes(source, pool, at_s, horizon, lookback_s=lookback)
    outs = [c.at_s for c in changes if c.after > c.before]
    ins = [c.at_s for c in changes if c.after < c.before]
    rec = decide(
        sig.kv_mean, sig.queue, sig.ttft_p95,
        now=at_s,
        current=current_replicas(source, pool, at_s),
        pool=pool,
        scaling=scaling,
        ttft_threshold_s=ttft_threshold_for(config, pool),
        last_scale_out_at=outs[-1] if outs else None,
        last_scale_in_at=ins[-1] if ins else None,
        fit_window_s=fit,
        max_age_s=lookback,
        request_rate=sig.request_rate,
        capacity=capacity,
    )
    signals = {**rec.signals, "kv_cache_usage_max": latest(sig.kv_max, at_s, lookback)}
    return replace(rec, signals=signals)
