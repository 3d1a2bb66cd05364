"""The scaling policy's decisions over a month of history, in seconds rather than hours.

``slo.planning.replay.replay_decisions`` asks the source about a hundred queries per
evaluation (``slo.scaling.signals.recommend_for_pool`` samples every signal over the last ten
minutes): hundreds of milliseconds each, days for a month at the scrape interval. Consecutive
evaluations share all but one of those samples, so here every signal is read once, as a track
over a grid of sample instants (``RangeSource.instant_range`` for KV-cache usage, queue length
and ``up``; ``bucket_increase_range`` for the TTFT histogram; ``increase_range`` for the request
rate), each sample being the value the per-instant query gives there; the replica changes
(cooldown, scale-in hold) are swept once over the whole history. Each evaluation then hands
``slo.scaling.policy.decide`` the same timelines ``recommend_for_pool`` would have built, so a
decision here is the replay's decision at the same instant (the tests compare them).

The sample grid is the scrape interval (``[collector] scrape_interval``, as serve samples),
aligned to the epoch; decisions are evaluated every ``every_s`` (a multiple of it) on that grid.

Units: Unix seconds, requests, requests per second, ratios 0-1.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from slo.objectives.sli import replica_label, replica_of, vllm_up_matchers
from slo.planning.pool_profile import pool_capacity
from slo.promql.lookup import FloatArray, duration_ms
from slo.promql.quantile import histogram_quantile
from slo.promql.tracks import Grid
from slo.scaling.policy import (
    CapacitySizing,
    Recommendation,
    Timeline,
    decide,
    fit_window_for,
    latest,
)
from slo.scaling.signals import (
    KV_METRIC,
    QUEUE_METRIC,
    REQUEST_METRIC,
    TTFT_METRIC,
    pool_matchers,
    pool_mean_max,
    rate_window_for,
    replica_changes,
    replica_mean,
    sample_times,
    ttft_threshold_for,
)
from slo.sources.protocol import RangeSource
from vigil.config import Config, PoolConfig
from vigil.conventions import SERIES_UP

__all__ = ["SignalTracks", "replay_fast", "signal_tracks"]


@dataclass(frozen=True)
class SignalTracks:
    """A pool's scaling signals at every instant of ``grid`` (NaN: no value there):
    ``kv_mean``/``kv_max`` KV-cache usage (ratio 0-1, mean and max over replicas), ``queue``
    waiting requests (sum), ``ttft`` the TTFT at ``[scaling] scale_out_ttft_quantile`` over
    ``[engine] window`` (seconds), ``rate`` finished requests per second over
    ``rate_window_for(step)`` (None unless asked for), ``replicas`` the up replicas."""

    grid: Grid
    kv_mean: FloatArray
    kv_max: FloatArray
    queue: FloatArray
    ttft: FloatArray
    rate: FloatArray | None
    replicas: np.ndarray

    def index(self, at_s: float) -> int:
        """The grid index of ``at_s`` (which must be a grid instant)."""
        return (round(at_s * 1000) - self.grid.start_ms) // self.grid.step_ms


def signal_tracks(source: RangeSource, config: Config, pool: PoolConfig, grid: Grid, *,
                  request_rate: bool = False) -> SignalTracks:
    """The pool's signals at every instant of ``grid``, each equal to what
    ``slo.scaling.signals`` computes at that instant (``kv_usage_at``, ``queue_length_at``,
    ``ttft_quantile_at``, ``request_rate_at``, ``current_replicas``)."""
    n = grid.n
    matchers = pool_matchers(pool, source)
    label = replica_label(pool, source)

    # KV-cache usage at each instant exactly as kv_usage_at computes it: each replica's
    # replica_mean, then pool_mean_max over replicas.
    per_replica: dict[str, list[FloatArray]] = defaultdict(list)
    for labels, track in source.instant_range(KV_METRIC, matchers, grid).items():
        per_replica[replica_of(labels, label)].append(track.values)
    kv_mean = np.full(n, np.nan)
    kv_max = np.full(n, np.nan)
    if per_replica:
        columns = {r: np.vstack(v) for r, v in sorted(per_replica.items())}
        for i in range(n):
            means = {r: m for r, col in columns.items()
                     if (m := replica_mean(col[:, i].tolist())) is not None}
            pooled = pool_mean_max(means)
            if pooled is not None:
                kv_mean[i], kv_max[i] = pooled

    queue = np.full(n, np.nan)
    waiting = [t.values for t in source.instant_range(QUEUE_METRIC, matchers, grid).values()]
    if waiting:
        stacked = np.vstack(waiting)
        for i in range(n):
            vs = [x for x in stacked[:, i].tolist() if math.isfinite(x)]
            if vs:
                queue[i] = math.fsum(vs)

    q = float(config.scaling.scale_out_ttft_quantile)
    ttft = np.full(n, np.nan)
    window = float(config.engine.window)
    buckets = source.bucket_increase_range(TTFT_METRIC, matchers, grid, [window]).get(window, {})
    group = buckets.get(())
    if group:
        les = [le for le, _ in group]
        values = np.vstack([t.values for _, t in group])
        present = np.vstack([t.present for _, t in group])
        for i in np.flatnonzero(present.any(axis=0)).tolist():
            b = [(le, float(values[j, i])) for j, le in enumerate(les) if present[j, i]]
            value = histogram_quantile(q, b, source.semantics)
            if math.isfinite(value):
                ttft[i] = value

    rate: FloatArray | None = None
    if request_rate:
        step_s = grid.step_ms / 1000
        rate_window = rate_window_for(step_s)
        rate = np.full(n, np.nan)
        finished = source.increase_range(REQUEST_METRIC, matchers, grid,
                                         [rate_window]).get(rate_window, {}).get(())
        if finished is not None:
            with np.errstate(invalid="ignore"):
                ok = finished.present & np.isfinite(finished.values)
            rate[ok] = finished.values[ok] / rate_window

    ups: dict[str, list[np.ndarray]] = defaultdict(list)
    for labels, track in source.instant_range(SERIES_UP, vllm_up_matchers(pool, source),
                                              grid).items():
        ups[replica_of(labels, label)].append(track.present & (track.values == 1.0))
    replicas = (np.sum([np.logical_or.reduce(v) for v in ups.values()], axis=0)
                if ups else np.zeros(n, dtype=np.int64))
    return SignalTracks(grid, kv_mean, kv_max, queue, ttft, rate,
                        np.asarray(replicas, dtype=np.int64).reshape(n))


def _timeline(values: FloatArray, times: Sequence[float], end: int) -> Timeline:
    """``(t, value)`` for the samples ``times`` ending at grid index ``end`` (one index per
    time, oldest first), skipping the instants without a value."""
    first = end - len(times) + 1
    out: Timeline = []
    for k, t in enumerate(times):
        i = first + k
        if i >= 0:
            v = float(values[i])
            if not math.isnan(v):
                out.append((t, v))
    return out


def replay_fast(
    source: RangeSource,
    config: Config,
    pool: PoolConfig,
    start_s: float,
    end_s: float,
    *,
    every_s: float | None = None,
    capacity: CapacitySizing | Literal["saved"] | None = "saved",
) -> tuple[list[tuple[float, Recommendation]], SignalTracks]:
    """``(t, recommendation)`` every ``every_s`` (default and minimum: ``[collector]
    scrape_interval``, of which it must be a multiple) on the epoch-aligned grid from
    ``start_s`` to ``end_s`` (Unix seconds): ``replay_decisions`` at those instants, read in
    bulk. Also the signal tracks it read. ``capacity`` as for ``replay_decisions``."""
    scaling = config.scaling
    step = float(config.collector.scrape_interval)
    every = step if every_s is None else float(every_s)
    step_ms, every_ms = duration_ms(step), duration_ms(every)
    if every_ms <= 0 or every_ms % step_ms:
        raise ValueError(f"the decision interval ({every:g} s) must be a multiple of the "
                         f"scrape interval ({step:g} s)")
    fit = fit_window_for(scaling)
    span = max(float(scaling.scale_in_hold), fit)
    evals = Grid.between(math.ceil(start_s * 1000), math.floor(end_s * 1000), every_ms)
    n_back = math.floor(span / step + 1e-9)
    sample_grid = Grid.between(evals.start_ms - n_back * step_ms, evals.end_ms, step_ms)
    sizing = pool_capacity(config, pool)[1] if isinstance(capacity, str) else capacity
    tracks = signal_tracks(source, config, pool, sample_grid, request_rate=sizing is not None)

    lookback = config.engine.lookback
    horizon = max(float(scaling.cooldown), float(scaling.scale_in_hold))
    first_s, last_s = evals.start_ms / 1000, evals.end_ms / 1000
    changes = replica_changes(source, pool, last_s, last_s - first_s + horizon,
                              lookback_s=lookback)
    out_times = [c.at_s for c in changes if c.after > c.before]
    in_times = [c.at_s for c in changes if c.after < c.before]

    def last_before(times: list[float], at: float) -> float | None:
        # The newest change within (at - horizon, at], as replica_changes at `at` reports it.
        i = bisect.bisect_right(times, at) - 1
        return times[i] if i >= 0 and times[i] > at - horizon else None

    threshold = ttft_threshold_for(config, pool)
    decisions: list[tuple[float, Recommendation]] = []
    for at_ms in evals.instants_ms().tolist():
        at = at_ms / 1000
        i = (at_ms - sample_grid.start_ms) // step_ms
        long_times = sample_times(at, span, step)
        fit_times = sample_times(at, fit, step)
        kv_max = _timeline(tracks.kv_max, long_times, i)
        rec = decide(
            _timeline(tracks.kv_mean, long_times, i),
            _timeline(tracks.queue, long_times, i),
            _timeline(tracks.ttft, fit_times, i),
            now=at, current=int(tracks.replicas[i]), pool=pool, scaling=scaling,
            ttft_threshold_s=threshold,
            last_scale_out_at=last_before(out_times, at),
            last_scale_in_at=last_before(in_times, at),
            fit_window_s=fit, max_age_s=lookback,
            request_rate=(_timeline(tracks.rate, fit_times, i)
                          if tracks.rate is not None else []),
            capacity=sizing,
        )
        signals = {**rec.signals, "kv_cache_usage_max": latest(kv_max, at, lookback)}
        decisions.append((at, replace(rec, signals=signals)))
    return decisions, tracks
