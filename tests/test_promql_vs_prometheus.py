"""Our PromQL primitives against a real Prometheus, at hundreds of evaluation times.

Deterministic synthetic data (seeded) is loaded into Prometheus through promtool-created
blocks (``prometheus_server.py``): counters with resets, gaps, a late-starting replica and
irregular ~15 s jittered scrapes; gauges with gaps longer than the 5-minute lookback and a NaN
sample; vLLM-style TTFT histograms for two replicas with a restart, an idle stretch and a
scrape gap. Every query is evaluated by Prometheus over HTTP and by ``slo.*`` at the same
instant — on a coarse grid, exactly on sample timestamps, exactly one range after a sample
(the left window edge), one lookback after a sample, right after resets and inside gaps.

The server is Debian's Prometheus 2.42, so we compare with ``semantics="2"``; results must
agree to 1e-9 relative (they are in fact expected to be bit-identical) and the same series
must be present on both sides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
from support.fleet import TTFT_LE
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture

from slo.promql.aggregate import divide_vectors, instant_vector, per_series, sum_by
from slo.promql.lookup import eval_time_ms, prepare
from slo.promql.quantile import histogram_quantile_over
from slo.promql.rate import delta, increase, rate
from vigil.model import Labels, labels_of

pytestmark = pytest.mark.slow

REL_TOL = 1e-9
SEED = 20251130
T0_MS = 1_750_000_000_000  # 2025-06-15: fixed, so every run builds identical blocks.
SPAN_MS = 150 * 60 * 1000  # 2.5 h of data

COUNTER = "vigil_test_requests_total"
GAUGE = "vigil_test_queue_depth"
HIST = "vigil_test_ttft_seconds"


Series = dict[Labels, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


# -- synthetic data ----------------------------------------------------------------------------


def _times(rng: np.random.Generator, start_ms: int, end_ms: int,
           gaps: Mapping[int, int]) -> list[int]:
    """Scrape times ~15 s apart with ±2.5 s jitter; ``gaps`` adds extra ms after index i."""
    out: list[int] = []
    t = start_ms
    while t < end_ms:
        out.append(t)
        t += 15_000 + int(rng.integers(-2_500, 2_501)) + gaps.get(len(out) - 1, 0)
    return out


def _counter(rng: np.random.Generator, times: list[int], first: float, mean_inc: float,
             integer: bool, resets: Mapping[int, float]) -> list[float]:
    """Counter values: ``first``, then random increments; at index i in ``resets`` the
    counter restarts from ``resets[i]`` (a replica restart)."""
    values = []
    v = first
    for i in range(len(times)):
        if i in resets:
            v = resets[i]
        elif i > 0:
            inc = rng.exponential(mean_inc)
            v += float(round(inc)) if integer else inc
        values.append(float(v))
    return values


@dataclass
class Dataset:
    prom_series: list[PromSeries] = field(default_factory=list)
    counters: Series = field(default_factory=dict)
    gauges: Series = field(default_factory=dict)
    buckets: Series = field(default_factory=dict)  # labels include le
    counts: Series = field(default_factory=dict)   # HIST_count
    special_times_s: list[float] = field(default_factory=list)

    def add(self, target: Series, name: str, labels: dict[str, str], times: list[int],
            values: list[float]) -> None:
        self.prom_series.append(PromSeries(name, labels, list(zip(times, values, strict=True))))
        ts, vals, stale = prepare(np.array(times, dtype=np.int64), np.array(values))
        target[labels_of(labels)] = (ts, vals, stale)


def build_dataset() -> Dataset:
    rng = np.random.default_rng(SEED)
    ds = Dataset()
    end = T0_MS + SPAN_MS
    marks: list[int] = []  # ms instants worth evaluating at (resets, gap edges, ...)

    # Counters. r0: starts at 0, integer, reset to 0, a 4-min and a 12-min scrape gap.
    # r1: starts high (5000.25), fractional increments, reset to a non-zero value.
    # r2: other pool, two resets 3 scrapes apart, a 70 s gap and a 40-min gap.
    # r3: a replica that starts 40 min in with a small first value, so the zero-point cap of
    #     extrapolation (which differs between 2.42 and 3.x) is exercised.
    specs = [
        ("r0", "chat", T0_MS + 1_234, end, 0.0, 7.0, True, {200: 0.0},
         {120: 240_000, 400: 720_000}),
        ("r1", "chat", T0_MS + 9_876, end, 5000.25, 3.3, False, {300: 2.5}, {}),
        ("r2", "embed", T0_MS + 4_321, end, 17.0, 11.0, True, {150: 1.0, 153: 0.0},
         {60: 70_000, 450: 2_400_000}),
        ("r3", "embed", T0_MS + 40 * 60_000 + 777, end, 0.7 * 9.0, 9.0, True, {}, {}),
    ]
    for instance, pool, start, stop, first, mean_inc, integer, resets, gaps in specs:
        times = _times(rng, start, stop, gaps)
        values = _counter(rng, times, first, mean_inc, integer, resets)
        ds.add(ds.counters, COUNTER, {"instance": instance, "pool": pool}, times, values)
        marks += [times[i] for i in resets]
        marks += [times[i] for i in gaps if i < len(times)]
        marks += [times[0], times[-1]]

    # Gauges: random levels, gaps longer than the lookback (a replica gone quiet), one only
    # ~100 s longer than it, and one NaN sample.
    for instance, gaps, nan_at in (("r0", {100: 600_000, 300: 385_000}, 50),
                                   ("r1", {250: 1_500_000}, None)):
        times = _times(rng, T0_MS + 2_000, end, gaps)
        values = [float(rng.integers(0, 64)) + float(rng.random()) for _ in times]
        if nan_at is not None:
            values[nan_at] = math.nan
        ds.add(ds.gauges, GAUGE, {"instance": instance, "pool": "chat"}, times, values)
        marks += [times[i] for i in gaps]

    # Histograms: per scrape ~Poisson(20) lognormal TTFTs; r1 restarts (all buckets drop at
    # once); both replicas idle for ~10 minutes; r0 misses 8 minutes of scrapes.
    bounds = np.array([float(le) for le in TTFT_LE])
    for instance, gaps, reset_at in (("r0", {330: 480_000}, None), ("r1", {}, 210)):
        times = _times(rng, T0_MS + 5_555, end, gaps)
        cum = np.zeros(len(bounds))
        total_sum = 0.0
        rows: list[np.ndarray] = []
        sums: list[float] = []
        for i, t in enumerate(times):
            if reset_at is not None and i == reset_at:
                cum = np.zeros(len(bounds))
                total_sum = 0.0
            idle = T0_MS + 90 * 60_000 <= t < T0_MS + 100 * 60_000
            k = 0 if idle or i == 0 else int(rng.poisson(20))
            obs = rng.lognormal(mean=math.log(0.3), sigma=1.3, size=k)
            cum = cum + np.array([np.count_nonzero(obs <= b) for b in bounds], dtype=float)
            total_sum += float(obs.sum())
            rows.append(cum.copy())
            sums.append(total_sum)
        grid = np.array(rows)
        for j, le in enumerate(TTFT_LE):
            ds.add(ds.buckets, f"{HIST}_bucket", {"instance": instance, "pool": "chat", "le": le},
                   times, [float(x) for x in grid[:, j]])
        ds.add(ds.counts, f"{HIST}_count", {"instance": instance, "pool": "chat"},
               times, [float(x) for x in grid[:, -1]])
        ds.prom_series.append(PromSeries(f"{HIST}_sum", {"instance": instance, "pool": "chat"},
                                         list(zip(times, sums, strict=True))))
        if reset_at is not None:
            marks.append(times[reset_at])
        marks += [times[i] for i in gaps]

    # Evaluation instants, seconds. Around each mark: on it, 1 ms after, a scrape later, and
    # one 90 s / 5 min / 1 h range (or lookback) later, where the mark is on the window edge.
    special: set[float] = set()
    for m in marks:
        for d in (0, 1, 15_000, 60_000, 90_000, 300_000, 300_001, 3_600_000):
            special.add((m + d) / 1000)
    # Exactly on sample timestamps and exactly one range / one lookback after them, so a
    # sample sits on the left edge of the window (in for 2.42, out for 3.x).
    sample_ts = sorted({int(t) for s in ds.counters.values() for t in s[0]})
    for t in rng.choice(sample_ts, size=40, replace=False):
        for d in (0, 90_000, 90_001, 300_000, 299_999, 3_600_000):
            special.add((int(t) + d) / 1000)
    gauge_ts = sorted({int(t) for s in ds.gauges.values() for t in s[0]})
    for t in rng.choice(gauge_ts, size=15, replace=False):
        for d in (0, 300_000, 300_001):
            special.add((int(t) + d) / 1000)
    # Sub-millisecond times: Prometheus rounds the fraction to ms (half away from zero).
    special |= {(T0_MS + 3_000_000) / 1000 + 0.0005, (T0_MS + 3_000_017) / 1000 + 0.0004999}
    ds.special_times_s = sorted(special)
    return ds


DATA = build_dataset()
GRID_S = [(T0_MS - 60_000 + i * 53_000) / 1000 for i in range(SPAN_MS // 53_000 + 3)]
ALL_TIMES_S = sorted(set(GRID_S) | set(DATA.special_times_s))

prom = prometheus_fixture(lambda: DATA.prom_series)


# -- comparison machinery ----------------------------------------------------------------------


@dataclass
class Tally:
    comparisons: int = 0
    exact: int = 0
    absent_both: int = 0
    max_rel: float = 0.0
    failures: list[str] = field(default_factory=list)


def _rel(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def _compare(tally: Tally, expr: str, at_s: float, ours: Mapping[Labels, float],
             theirs: Mapping[Labels, float]) -> None:
    if not ours and not theirs:
        tally.absent_both += 1
    if set(ours) != set(theirs):
        tally.failures.append(f"{expr} @ {at_s!r}: series differ: ours {sorted(ours)} "
                              f"vs prometheus {sorted(theirs)}")
        return
    for labels, mine in ours.items():
        other = theirs[labels]
        tally.comparisons += 1
        rel = _rel(mine, other)
        if rel == 0.0:
            tally.exact += 1
        tally.max_rel = max(tally.max_rel, rel)
        if rel > REL_TOL:
            tally.failures.append(f"{expr} @ {at_s!r} {dict(labels)}: ours {mine!r} "
                                  f"vs prometheus {other!r} (rel {rel:.3g})")


def _run(prom: PrometheusServer, cases: Iterable[tuple[str, Callable[[float], dict]]],
         times: Iterable[float]) -> Tally:
    tally = Tally()
    times = list(times)
    for expr, ours_at in cases:
        for at_s in times:
            _compare(tally, expr, at_s, ours_at(at_s), prom.query(expr, at_s))
    return tally


def _check(tally: Tally, minimum: int) -> None:
    print(f"\n{tally.comparisons} values compared ({tally.exact} bit-identical), "
          f"{tally.absent_both} instants absent on both sides, max rel error {tally.max_rel:.3g}")
    assert not tally.failures, "\n".join(tally.failures[:30])
    assert tally.comparisons >= minimum, "the comparison ran on too little data"


def _named(name: str, vector: Mapping[Labels, float]) -> dict[Labels, float]:
    """An instant selector keeps the metric name; add it to our (name-less) keys."""
    return {labels_of((*labels, ("__name__", name))): v for labels, v in vector.items()}


# -- tests -------------------------------------------------------------------------------------


def test_prometheus_holds_exactly_the_samples_we_wrote(prom: PrometheusServer) -> None:
    """Guard the harness itself: timestamps (ms) and values survive the round trip exactly."""
    got = prom.query_range_samples(COUNTER, (T0_MS + SPAN_MS + 60_000) / 1000,
                                   (SPAN_MS + 120_000) / 1000)
    want = {labels: [(int(t), float(v)) for t, v in zip(s[0], s[1], strict=True)]
            for labels, s in DATA.counters.items()}
    assert {labels_of([(k, v) for k, v in lab if k != "__name__"]): s
            for lab, s in got.items()} == want


def test_rate_and_increase_match_prometheus(prom: PrometheusServer) -> None:
    sem = prom.semantics()
    c = DATA.counters
    cases = [
        (f"rate({COUNTER}[5m])", lambda t: per_series(rate, c, t, 300, sem)),
        (f"increase({COUNTER}[1h])", lambda t: per_series(increase, c, t, 3600, sem)),
        (f"increase({COUNTER}[90s])", lambda t: per_series(increase, c, t, 90, sem)),
        (f"delta({GAUGE}[5m])", lambda t: per_series(delta, DATA.gauges, t, 300, sem)),
    ]
    _check(_run(prom, cases, ALL_TIMES_S), minimum=5_000)


def test_sums_of_rates_match_prometheus(prom: PrometheusServer) -> None:
    sem = prom.semantics()
    c = DATA.counters
    cases = [
        (f"sum by (pool) (rate({COUNTER}[5m]))",
         lambda t: sum_by(per_series(rate, c, t, 300, sem), ("pool",), sem)),
        (f"sum(increase({COUNTER}[1h]))",
         lambda t: sum_by(per_series(increase, c, t, 3600, sem), (), sem)),
        (f"sum by (instance) (increase({COUNTER}[90s]))",
         lambda t: sum_by(per_series(increase, c, t, 90, sem), ("instance",), sem)),
    ]
    _check(_run(prom, cases, ALL_TIMES_S), minimum=1_500)


def test_histogram_quantiles_match_prometheus(prom: PrometheusServer) -> None:
    sem = prom.semantics()
    b = DATA.buckets

    def quantile(q: float, by: tuple[str, ...]) -> Callable[[float], dict]:
        return lambda t: histogram_quantile_over(q, per_series(rate, b, t, 300, sem), by, sem)

    cases = [
        (f"histogram_quantile({q}, sum by (le) (rate({HIST}_bucket[5m])))", quantile(q, ()))
        for q in (0.5, 0.95, 0.99)
    ]
    cases.append((f"histogram_quantile(0.9, sum by (instance, le) (rate({HIST}_bucket[5m])))",
                  quantile(0.9, ("instance",))))
    _check(_run(prom, cases, GRID_S + DATA.special_times_s[::3]), minimum=800)


def test_good_ratio_matches_prometheus(prom: PrometheusServer) -> None:
    """The TTFT SLI: share of requests with TTFT ≤ 1 s over 5 minutes."""
    sem = prom.semantics()
    le1 = {k: v for k, v in DATA.buckets.items() if ("le", "1.0") in k}

    def ours(t: float) -> dict[Labels, float]:
        good = sum_by(per_series(rate, le1, t, 300, sem), (), sem)
        total = sum_by(per_series(rate, DATA.counts, t, 300, sem), (), sem)
        return divide_vectors(good, total)

    expr = (f'sum(rate({HIST}_bucket{{le="1.0"}}[5m])) / sum(rate({HIST}_count[5m]))')
    _check(_run(prom, [(expr, ours)], ALL_TIMES_S), minimum=300)


def test_instant_gauge_lookups_match_prometheus(prom: PrometheusServer) -> None:
    sem = prom.semantics()
    cases = [
        (GAUGE, lambda t: _named(GAUGE, instant_vector(DATA.gauges, t, 300, sem))),
        (COUNTER, lambda t: _named(COUNTER, instant_vector(DATA.counters, t, 300, sem))),
    ]
    _check(_run(prom, cases, ALL_TIMES_S), minimum=1_500)


def test_evaluation_time_rounding_matches_prometheus(prom: PrometheusServer) -> None:
    """``time=`` fractions are rounded to ms half away from zero (``eval_time_ms``)."""
    base = T0_MS / 1000
    for frac in (0.0, 0.0625, 0.0005, 0.0004999, 0.123, 0.9995, 0.999, 0.5004):
        at = base + frac
        assert prom.query("time()", at) == {(): eval_time_ms(at) / 1000}, at
