"""The backtest's SLIs at every instant equal the engine's at that instant, bit for bit.

``slo.promql.tracks`` computes PromQL over a whole grid of evaluation instants at once, and
``slo.backtest.sli.sli_tracks`` composes an SLO's error ratio from those tracks; both claim
to do, element by element, the engine's own arithmetic. These tests hold them to it on
histories with counter resets, scrape gaps, staleness markers, a replica that joins late, a
down replica and missing buckets, under both PromQL semantics.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import numpy as np
import pytest
from support.backtest_history import MODEL, History, Replica, between, write_store
from support.same_numbers import EXACT, same_numbers

from collector.store import Store
from slo.backtest.sli import latency_bounds, sli_tracks
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.promql.aggregate import sum_by
from slo.promql.lookup import Semantics, instant_value
from slo.promql.quantile import bucket_fraction_below
from slo.promql.rate import increase
from slo.promql.tracks import (
    Grid,
    Track,
    avg_tracks,
    fraction_below,
    increase_track,
    instant_track,
    sum_tracks,
)
from slo.sources.embedded import EmbeddedSource, avg_aggregate
from vigil.model import RequestRecord, SeriesKey, labels_of

SEMANTICS = (Semantics.V2, Semantics.V3)
START = 1_790_000_000.0
HOUR = 3600.0


def _random_counter(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An irregularly scraped counter with resets, a NaN sample and staleness markers."""
    ts: list[int] = []
    vals: list[float] = []
    stale: list[bool] = []
    t = 1_000_000
    v = rng.choice([0.0, 5.0, 1e6])
    for _ in range(n):
        t += rng.choice([15_000, 15_000, 15_000, 14_999, 30_000, 1, 120_000])
        r = rng.random()
        if r < 0.03:
            v = rng.choice([0.0, 1.0, 3.5])  # reset
        elif r < 0.035:
            ts.append(t)
            vals.append(math.nan)
            stale.append(True)  # a staleness marker
            continue
        else:
            v += rng.choice([0.0, 1.0, 2.0, 7.0, 0.1])
        ts.append(t)
        vals.append(math.nan if rng.random() < 0.002 else v)
        stale.append(False)
    return np.array(ts, np.int64), np.array(vals), np.array(stale)


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("seed", range(6))
def test_increase_track_is_increase_at_every_instant(semantics: Semantics, seed: int) -> None:
    rng = random.Random(seed)
    ts, vals, stale = _random_counter(rng, 400)
    instants = np.arange(ts[0] - 60_000, ts[-1] + 400_000, 7_000, dtype=np.int64)
    instants = np.concatenate([instants, ts[::17]])  # instants exactly on samples too
    instants.sort()
    for range_ms in (60_000, 300_000, 3_600_000):
        track = increase_track(ts, vals, stale, instants, range_ms, semantics)
        values = [None if s else float(v) for v, s in zip(vals, stale, strict=True)]
        for i, at_ms in enumerate(instants.tolist()):
            want = increase(ts, values, at_ms / 1000, range_ms / 1000, semantics)
            got = float(track.values[i]) if track.present[i] else None
            assert same_numbers(got, want, EXACT), (range_ms, at_ms, got, want)


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("seed", range(3))
def test_instant_track_is_the_instant_selector_at_every_instant(semantics: Semantics,
                                                                 seed: int) -> None:
    rng = random.Random(100 + seed)
    ts, vals, stale = _random_counter(rng, 400)
    instants = np.arange(ts[0] - 60_000, ts[-1] + 400_000, 7_000, dtype=np.int64)
    # On samples, and exactly one lookback after samples (the edge 2.x and 3.x disagree on).
    instants = np.sort(np.concatenate([instants, ts[::17], ts[::13] + 300_000]))
    for lookback_ms in (300_000, 60_000):
        track = instant_track(ts, vals, stale, instants, lookback_ms, semantics)
        for i, at_ms in enumerate(instants.tolist()):
            want = instant_value(ts, vals, at_ms / 1000, lookback_ms / 1000, semantics,
                                 stale=stale)
            got = float(track.values[i]) if track.present[i] else None
            assert same_numbers(got, want, EXACT), (lookback_ms, at_ms, got, want)


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_sum_and_avg_tracks_are_sum_by_and_avg(semantics: Semantics) -> None:
    rng = random.Random(7)
    n = 300
    tracks = []
    for _ in range(6):
        present = np.array([rng.random() < 0.7 for _ in range(n)])
        values = np.array([rng.choice([0.1, 1e16, -1e16, 3.0, 1 / 3, 0.0]) for _ in range(n)])
        tracks.append(Track(np.where(present, values, np.nan), present))
    total = sum_tracks(tracks, n, semantics)
    mean = avg_tracks(tracks, n, semantics)
    for i in range(n):
        vector = {labels_of({"i": f"{k:02d}"}): float(t.values[i])
                  for k, t in enumerate(tracks) if t.present[i]}
        want_sum = sum_by(vector, (), semantics).get(())
        want_avg = avg_aggregate(vector, semantics)
        got_sum = float(total.values[i]) if total.present[i] else None
        got_avg = float(mean.values[i]) if mean.present[i] else None
        assert same_numbers(got_sum, want_sum, EXACT), i
        assert same_numbers(got_avg, want_avg, EXACT), i


@pytest.mark.parametrize("threshold", [0.8, 1.0, 0.001, 0.0005, 100.0, 1e9, -1.0, 0.3])
def test_fraction_below_is_bucket_fraction_below(threshold: float) -> None:
    rng = random.Random(3)
    les = [0.001, 0.3, 0.5, 0.75, 1.0, 2.5, 100.0, math.inf]
    n = 200
    buckets = []
    for le in les:
        present = np.array([rng.random() < 0.95 for _ in range(n)])
        values = np.array([rng.choice([0.0, 1.0, 5.0, 7.5, 100.0]) for _ in range(n)])
        buckets.append((le, Track(np.where(present, values, np.nan), present)))
    got, interpolated = fraction_below(threshold, buckets, n)
    for i in range(n):
        found = [(le, float(t.values[i])) for le, t in buckets if t.present[i]]
        if not found:
            assert not got.present[i]
            continue
        want, want_interp = bucket_fraction_below(threshold, found)
        assert same_numbers(float(got.values[i]), want, EXACT), (i, found)
        assert bool(interpolated[i]) == want_interp, (i, found)


def test_the_bounds_read_give_the_same_fraction() -> None:
    les = [0.001, 0.3, 0.5, 0.75, 1.0, 2.5, math.inf]
    counts = [0.0, 2.0, 2.0, 5.0, 9.0, 9.0, 10.0]
    for threshold in (0.0005, 0.001, 0.4, 0.75, 0.8, 1.0, 3.0):
        chosen = latency_bounds(threshold, les)
        full = bucket_fraction_below(threshold, list(zip(les, counts, strict=True)))
        part = bucket_fraction_below(threshold, [(le, c) for le, c in zip(les, counts,
                                                                           strict=True)
                                                 if le in chosen])
        assert full == part, threshold


def _history() -> History:
    h = History(
        start=START, end=START + 7 * HOUR, scrape_s=30.0,
        replicas=[
            Replica("chat-0", restarts=[START + 2 * HOUR + 15], gaps=[(START + 3 * HOUR,
                                                                      START + 3.2 * HOUR)]),
            Replica("chat-1", joined=START + 1.5 * HOUR,
                    down=[(START + 4 * HOUR, START + 4.5 * HOUR)]),
            Replica("chat-2", gaps=[(START + 5 * HOUR, START + 7 * HOUR)]),
        ],
        rate=lambda t: 1.0 + (t - START) / HOUR * 0.3,
        ttft_bad=between(START + HOUR, START + 2 * HOUR, 0.4, 0.01),
        e2e_bad=between(START + 5 * HOUR, START + 6 * HOUR, 0.2),
        errors=between(START + 2.5 * HOUR, START + 3.5 * HOUR, 0.05, 0.001),
    )
    h.build()
    return h


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path: Path = tmp_path_factory.mktemp("backtest") / "vigil.db"
    s = Store(path)
    write_store(s, _history().series)
    # A staleness marker where chat-2 stopped, and a bucket that a replica lost for a while.
    key = SeriesKey("vllm:time_to_first_token_seconds_bucket", labels_of({
        "instance": "chat-2", "pool": "chat", "kind": "vllm", "engine": "0",
        "model_name": MODEL, "le": "1.0"}))
    s.write([(key, "histogram", round((START + 5 * HOUR) * 1000), None)])
    s.write([(SeriesKey(key.name, labels_of({**dict(key.labels), "instance": "chat-1",
                                             "le": "+Inf"})), "histogram",
              round((START + 6 * HOUR + 7) * 1000), None)])
    return s


def _spec(indicator: str, threshold: float | None = None) -> SloSpec:
    return SloSpec(name=f"chat-{indicator}", pool="chat", model=MODEL, endpoint="all",
                   indicator=indicator, objective=0.99, threshold_seconds=threshold,
                   period_s=86400.0)


@pytest.mark.slow
@pytest.mark.parametrize("semantics", ["2", "3"])
@pytest.mark.parametrize("spec", [
    _spec("ttft", 0.8), _spec("ttft", 1.0), _spec("e2e", 8.0), _spec("error_rate"),
    _spec("availability"), _spec("replica_up"),
], ids=lambda s: f"{s.indicator}-{s.threshold_seconds}")
def test_sli_tracks_equal_error_ratio_at_every_instant(store: Store, semantics: str,
                                                       spec: SloSpec) -> None:
    source = EmbeddedSource(store, semantics=semantics)
    grid = Grid.between(round((START - 600) * 1000), round((START + 7.5 * HOUR) * 1000),
                        450_000)
    windows = [300.0, 1800.0, 6 * 3600.0]
    tracks = sli_tracks(spec, source, grid, windows)
    # 2.42's avg_over_time is a running mean: over a window where `up` was both 0 and 1 the
    # track's exact sum / count may differ from it in the last bits (tracks.py says why).
    exact = not (spec.indicator == "replica_up" and semantics == "2")
    compared = 0
    for w in windows:
        track = tracks[w]
        for i, at_ms in enumerate(grid.instants_ms().tolist()):
            want = error_ratio(spec, source, at_ms / 1000, w).error_ratio
            got = float(track.values[i]) if track.present[i] else None
            if exact or got is None or want is None:
                assert same_numbers(got, want, EXACT), (w, at_ms, got, want)
            else:
                assert got == pytest.approx(want, rel=1e-14, abs=1e-15), (w, at_ms)
            compared += want is not None
    assert compared > 50


class _Log:
    """An in-memory request log: ``RequestLog.records`` over a list of records."""

    def __init__(self, records: list[RequestRecord]) -> None:
        self.all = sorted(records, key=lambda r: r.ts_s)

    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        return [r for r in self.all if r.pool == pool and at_s - window_s < r.ts_s <= at_s]


def _log() -> _Log:
    """Requests of two endpoints with timeouts, 5xx, cancellations and refusals, and an
    hour with no record at all (the engine then falls back to the replicas' 5xx)."""
    rng = random.Random(11)
    records = []
    t = START
    while t < START + 7 * HOUR:
        t += rng.choice([0.5, 2.0, 7.0, 30.0])
        if START + 3 * HOUR <= t < START + 4 * HOUR:
            continue
        kind = rng.random()
        error_class, status, error = "", 200, False
        if kind < 0.03:
            error_class, status, error = "timeout", 504, True
        elif kind < 0.05:
            error_class, status, error = "upstream_5xx", 502, True
        elif kind < 0.08:
            error_class, status = "client_cancel", 499
        elif kind < 0.1:
            error_class, status = "over_cap", 429
        ttft = None if kind < 0.02 else rng.choice([0.1, 0.5, 0.8, 0.9, 2.0])
        records.append(RequestRecord(
            id=f"r{len(records)}", ts_s=round(t, 3), pool="chat",
            model=MODEL if rng.random() < 0.95 else "other", endpoint=rng.choice(
                ["chat", "completions"]), prompt_tokens=10, generated_tokens=20,
            ttft_s=ttft, e2e_s=None if ttft is None else ttft * 10, error=error,
            error_class=error_class, status=status))
    return _Log(records)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    _spec("availability"),
    dataclasses.replace(_spec("availability"), endpoint="chat"),
    dataclasses.replace(_spec("ttft", 0.8), endpoint="chat"),
    dataclasses.replace(_spec("e2e", 8.0), endpoint="completions"),
    dataclasses.replace(_spec("error_rate"), endpoint="chat"),
    dataclasses.replace(_spec("replica_up"), endpoint="chat"),
], ids=lambda s: f"{s.indicator}-{s.endpoint}")
def test_sli_tracks_from_the_request_log_equal_error_ratio(store: Store, spec: SloSpec) -> None:
    source = EmbeddedSource(store)
    log = _log()
    grid = Grid.between(round((START - 600) * 1000), round((START + 7.5 * HOUR) * 1000),
                        197_000)
    windows = [300.0, 1800.0, 6 * 3600.0]
    tracks = sli_tracks(spec, source, grid, windows, request_log=log)
    for w in windows:
        for i, at_ms in enumerate(grid.instants_ms().tolist()):
            want = error_ratio(spec, source, at_ms / 1000, w, request_log=log).error_ratio
            got = float(tracks[w].values[i]) if tracks[w].present[i] else None
            assert same_numbers(got, want, EXACT), (w, at_ms, got, want)
