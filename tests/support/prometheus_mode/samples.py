"""What each system of the Prometheus-mode run holds, and the premise of the comparison.

Both sides' samples of the pool's vLLM series are read through the same ``Source.samples``
the engine uses (``read_samples``) into ``Sides``, which evaluates windows by the same PromQL
rules on either side. ``Spread`` is the range of ``rho(s) = k_ours(s) / k_theirs(s)``, the
ratio of the two sides' extrapolation factors, over the series a number is made of (those with
a raw change in the window). ``edge_violations`` checks the premise: nothing happened between
the two systems' scrapes at any window edge or probe instant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slo.objectives.burn_rate import burn_windows
from slo.objectives.spec import effective_slos
from slo.promql.lookup import instant_value, select_range
from slo.promql.quantile import Bucket, histogram_quantile, parse_le
from slo.promql.rate import increase
from slo.scaling.policy import fit_window_for
from slo.scaling.signals import sample_times
from slo.sources.protocol import Source
from vigil.config import Config
from vigil.conventions import (
    KIND_VLLM,
    LABEL_INSTANCE,
    LABEL_JOB,
    LABEL_KIND,
    LABEL_LE,
    LABEL_MODEL_NAME,
    LABEL_POOL,
    SERIES_UP,
    SUFFIX_BUCKET,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
    VLLM_TTFT,
)
from vigil.model import Labels, labels_of

__all__ = [
    "COUNTERS",
    "GAUGES",
    "Samples",
    "SeriesId",
    "Sides",
    "Spread",
    "edge_violations",
    "first_scrapes",
    "grid_jitter",
    "idle_share_bound",
    "label",
    "probe_times",
    "raw_change",
    "read_samples",
    "status_windows",
]

#: The histograms the status reads (base names) and every counter series they and the cost
#: figures are made of; the gauges it reads.
HISTOGRAMS = (VLLM_TTFT, VLLM_E2E, VLLM_QUEUE_TIME, VLLM_ITL, VLLM_PROMPT_TOKENS_HIST,
              VLLM_GENERATION_TOKENS_HIST)
COUNTERS = (VLLM_REQUEST_SUCCESS, VLLM_GENERATION_TOKENS,
            *(h + s for h in HISTOGRAMS for s in (SUFFIX_BUCKET, SUFFIX_SUM, SUFFIX_COUNT)))
GAUGES = (SERIES_UP, VLLM_KV_CACHE_USAGE, VLLM_REQUESTS_WAITING, VLLM_REQUESTS_RUNNING)


# --- the samples each side holds ------------------------------------------------------------
SeriesId = tuple[str, Labels]
Samples = dict[SeriesId, tuple[np.ndarray, np.ndarray]]


def read_samples(source: Source, pool: str, at_s: float, span_s: float) -> Samples:
    """Every sample of the pool's vLLM series the status reads, through ``source`` (the same
    ``Source.samples`` the engine uses), over ``span_s`` seconds before ``at_s``. Without
    ``job``: Prometheus adds it (the scrape job's name), the store has none, and nothing the
    status computes tells series apart by it."""
    out: Samples = {}
    for metric in (*COUNTERS, *GAUGES):
        found = source.samples(metric, {LABEL_POOL: pool, LABEL_KIND: KIND_VLLM}, at_s, span_s)
        for labels, points in found.items():
            ts = [p.ts_ms for p in points if p.value is not None]
            values = [float(p.value) for p in points if p.value is not None]
            key = labels_of({k: v for k, v in labels if k != LABEL_JOB})
            out[(metric, key)] = (np.array(ts, dtype=np.int64), np.array(values))
    return out


def label(labels: Labels, name: str) -> str:
    """The value of label ``name`` ("" when absent)."""
    return dict(labels).get(name, "")


def raw_change(vals: np.ndarray) -> float | None:
    """A counter's change between its first and last sample with resets added (a drop adds the
    value before it), no extrapolation: ``slo.objectives.anomaly.raw_increase`` on arrays, since the
    premise check runs it tens of thousands of times. None with fewer than 2 samples."""
    if len(vals) < 2:
        return None
    change = float(vals[-1] - vals[0])
    for i in np.flatnonzero(vals[1:] < vals[:-1]):
        change += float(vals[i])
    return change


@dataclass
class Sides:
    """The two systems' samples of the same pool: ``ours`` (the embedded store), ``theirs``
    (Prometheus), and the PromQL rules both evaluate by. Results are cached per instant and
    window: the comparisons ask for the same ones many times."""

    ours: Samples
    theirs: Samples
    semantics: str
    lookback_s: float
    _cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def side(self, which: str) -> Samples:
        return self.ours if which == "ours" else self.theirs

    def window(self, which: str, key: SeriesId, at_s: float,
               w: float) -> tuple[np.ndarray, np.ndarray]:
        ts, vals = self.side(which)[key]
        win = select_range(ts, vals, at_s, w, self.semantics)
        return win.ts_ms, win.values

    def counters(self, metrics: Iterable[str] = COUNTERS, **match: str) -> list[SeriesId]:
        """The counter series of ``metrics`` whose labels include ``match``."""
        wanted = set(metrics)
        return sorted(k for k in self.theirs if k[0] in wanted
                      and all(label(k[1], n) == v for n, v in match.items()))

    def buckets_at(self, base: str, le: float, **match: str) -> list[SeriesId]:
        """The ``base_bucket`` series of bound ``le`` (parsed, so ``1`` is ``1.0``)."""
        return [k for k in self.counters((base + SUFFIX_BUCKET,), **match)
                if parse_le(label(k[1], LABEL_LE)) == le]

    def change(self, which: str, key: SeriesId, at_s: float,
               w: float) -> tuple[float | None, float | None]:
        """``(raw change, extrapolated increase)`` of one counter series in the window."""
        cache_key = ("change", which, key, at_s, w)
        if cache_key not in self._cache:
            ts, vals = self.window(which, key, at_s, w)
            self._cache[cache_key] = (raw_change(vals),
                                      increase(ts, vals, at_s, w, self.semantics))
        result: tuple[float | None, float | None] = self._cache[cache_key]
        return result

    def spread(self, at_s: float, w: float, series: Iterable[SeriesId]) -> Spread:
        """The range of ``k_ours / k_theirs`` (the two sides' extrapolation factors) over the
        ``series`` with a raw change in the window (see ``Spread``)."""
        keys = tuple(series)
        key = ("spread", at_s, w, keys)
        if key not in self._cache:
            rhos = []
            for one in keys:
                raw_o, inc_o = self.change("ours", one, at_s, w)
                raw_t, inc_t = self.change("theirs", one, at_s, w)
                if raw_o and raw_t and inc_o is not None and inc_t is not None:
                    rhos.append((inc_o / raw_o) / (inc_t / raw_t))
            self._cache[key] = Spread(min(rhos), max(rhos)) if rhos else Spread(1.0, 1.0)
        spread: Spread = self._cache[key]
        return spread

    def buckets(self, which: str, base: str, at_s: float, w: float,
                model: str | None = None) -> list[Bucket]:
        """``sum by (le) (increase(base_bucket[w]))`` from one side's samples (per model or
        pool-wide), in ``le`` order."""
        match = {} if model is None else {LABEL_MODEL_NAME: model}
        sums: dict[float, float] = {}
        for series in self.counters((base + SUFFIX_BUCKET,), **match):
            le = parse_le(label(series[1], LABEL_LE))
            _, inc = self.change(which, series, at_s, w)
            if le is not None and inc is not None:
                sums[le] = sums.get(le, 0.0) + inc
        return sorted(sums.items())

    def quantile_bounds(self, q: float, base: str, at_s: float, w: float,
                        model: str | None = None) -> tuple[float, float, float] | None:
        """``(theirs, lo, hi)``: Prometheus's quantile recomputed from its samples and the
        interval ours must lie in; None without data.

        Each cumulative bucket count of ours is Prometheus's times a factor within the spread
        of its own series, and so is the total (the ``+Inf`` bucket): every bucket fraction
        lies within ``[lo_le / hi_inf, hi_le / lo_inf]`` of Prometheus's. The quantile falls
        as fractions rise, so the two extreme corners bound it."""
        match = {} if model is None else {LABEL_MODEL_NAME: model}
        buckets = self.buckets("theirs", base, at_s, w, model)
        if not buckets or buckets[-1][1] <= 0:
            return None
        value = histogram_quantile(q, buckets, self.semantics)
        if not math.isfinite(value):
            return None
        total = self.spread(at_s, w, self.buckets_at(base, math.inf, **match))
        up, down = [], []
        for le, count in buckets:
            if math.isinf(le):
                up.append((le, count))
                down.append((le, count))
                continue
            s = self.spread(at_s, w, self.buckets_at(base, le, **match))
            up.append((le, min(buckets[-1][1], count * s.hi / total.lo)))
            down.append((le, count * s.lo / total.hi))
        return (value, histogram_quantile(q, up, self.semantics),
                histogram_quantile(q, down, self.semantics))

    def bucket_bounds(self, bases: Iterable[str]) -> set[float]:
        """The finite ``le`` bounds of the given histograms."""
        names = {b + SUFFIX_BUCKET for b in bases}
        out = {parse_le(label(labels, LABEL_LE)) for metric, labels in self.theirs
               if metric in names}
        return {le for le in out if le is not None and math.isfinite(le)}

    def gauge(self, which: str, key: SeriesId, at_s: float) -> float | None:
        ts, vals = self.side(which)[key]
        return instant_value(ts, vals, at_s, self.lookback_s, self.semantics)


@dataclass(frozen=True)
class Spread:
    """``lo <= k_ours(s) / k_theirs(s) <= hi`` for every counter series ``s`` of a window."""

    lo: float
    hi: float

    @property
    def ratio_widening(self) -> float:
        """How far a ratio of two sums of increases may move: a factor in ``[1/x, x]``."""
        return self.hi / self.lo


# --- the premise: nothing happened between the two systems' scrapes -------------------------
def edge_violations(sides: Sides, at_s: float, windows: Iterable[float],
                    probes: Iterable[float] = (), metrics: Iterable[str] = COUNTERS) -> list[str]:
    """Where the paused-world premise fails at ``at_s``: a series of ``metrics`` whose raw
    change in a window differs between the two systems (something happened between their
    scrapes at an edge), a series on one side only, or a gauge with different values at one
    of the ``probes`` instants."""
    out: list[str] = []
    if set(sides.ours) != set(sides.theirs):
        only = sorted(set(sides.ours) ^ set(sides.theirs))[:5]
        out.append(f"the two systems hold different series, e.g. {only}")
        return out
    for w in windows:
        for key in sides.counters(metrics):
            raw_o, _ = sides.change("ours", key, at_s, w)
            raw_t, _ = sides.change("theirs", key, at_s, w)
            if raw_o != raw_t:
                out.append(f"{key[0]}{dict(key[1])} over {w:g}s at {at_s:.3f}: raw change "
                           f"{raw_o} in the store, {raw_t} in Prometheus")
    for p in probes:
        for key in sorted(k for k in sides.theirs if k[0] in GAUGES):
            ours, theirs = sides.gauge("ours", key, p), sides.gauge("theirs", key, p)
            if ours != theirs:
                out.append(f"{key[0]}{dict(key[1])} at {p:.3f}: {ours} in the store, "
                           f"{theirs} in Prometheus")
    return out


def grid_jitter(ts_ms: np.ndarray, interval_s: float) -> float:
    """The largest distance (seconds) of a scrape instant from its scrape grid (the first
    instant plus whole intervals): both systems schedule on a grid, so this is their jitter."""
    step = interval_s * 1000
    offsets = (ts_ms - ts_ms[0] + step / 2) % step - step / 2
    return float(np.max(np.abs(offsets))) / 1000 if len(ts_ms) else 0.0


def idle_share_bound(sides: Sides, at_s: float, w: float, interval_s: float) -> float:
    """How far the two idle shares may differ at ``at_s`` over ``w``.

    The share is (samples with ``num_requests_running == 0``) / (samples). Both systems scrape
    each target on a grid of ``interval_s`` with jitter ``E`` (measured here), so in any
    stretch of time their sample counts differ by at most ``2 + ceil(4E / interval)``. Merging
    a target's samples of both sides in time order, the idle samples form runs; each run moves
    the difference of the idle counts by at most that much, and the totals differ by ``dn``:
    ``|z1/n1 - z2/n2| <= (|z1 - z2| + |n1 - n2|) / min(n1, n2)``.
    """
    runs = n_ours = n_theirs = 0
    jitter = 0.0
    for key in sorted(k for k in sides.theirs if k[0] == VLLM_REQUESTS_RUNNING):
        merged = []
        for which, tag in (("ours", 0), ("theirs", 1)):
            jitter = max(jitter, grid_jitter(sides.side(which)[key][0], interval_s))
            ts, vals = sides.window(which, key, at_s, w)
            merged += [(int(t), tag, float(v) == 0.0) for t, v in zip(ts, vals, strict=True)]
            if tag:
                n_theirs += len(ts)
            else:
                n_ours += len(ts)
        previous = False
        for _, _, idle in sorted(merged):
            runs += idle and not previous
            previous = idle
    n = min(n_ours, n_theirs)
    if n == 0:
        return 0.0
    per_run = 2 + math.ceil(4 * jitter / interval_s)
    return (per_run * runs + abs(n_ours - n_theirs)) / n


def status_windows(config: Config) -> list[float]:
    """Every window the status evaluates (seconds): burn windows, periods, the current, cost
    and anomaly windows, and the 1 h of the time to exhaustion."""
    windows = set(burn_windows(config.engine.burn_rate_alerts))
    windows |= {s.period_s for s in effective_slos(config)}
    windows |= {config.engine.window, config.engine.cost_window, config.anomaly.window, 3600.0}
    return sorted(windows)


def probe_times(config: Config, at_s: float) -> list[float]:
    """The instants the status reads gauges at: ``at_s`` and the scaling timelines' points."""
    span = max(float(config.scaling.scale_in_hold), fit_window_for(config.scaling))
    return sample_times(at_s, span, config.collector.scrape_interval)


def first_scrapes(samples: Samples) -> dict[str, int]:
    """Per target (``instance``), its first ``up`` sample (Unix ms)."""
    return {label(labels, LABEL_INSTANCE): int(ts[0])
            for (metric, labels), (ts, _) in samples.items() if metric == SERIES_UP and len(ts)}

