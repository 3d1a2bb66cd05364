"""``EmbeddedSource``: the ``Source`` protocol over the embedded SQLite store.

Every method reads only the samples of its window from the store (``Store.points`` with
``[t - range, t]``; the left edge is then trimmed by ``select_range`` for the chosen semantics)
and evaluates it with the PromQL-exact primitives of ``slo.promql``, in PromQL's order:
``rate``/``increase`` per series first, then ``sum by``. ``increase`` reads, instead of the
samples, what ``extrapolatedRate`` needs from them (``Store.counter_windows``), which the
store's rollup answers with a few lookups however long the window.

Besides the protocol, this module holds the two means PromQL computes, because neither is in
``slo.promql.aggregate`` yet and they differ between Prometheus versions:

* ``avg_over_time`` of one series' samples (``funcAvgOverTime``);
* the ``avg`` aggregation across series (``aggregation``, case ``AVG``).

Units: times are Unix seconds (float), windows seconds; results are in the series' own unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from collector.store import counter_like

# kahanSumInc as 3.x has it (compensation reset on ±Inf); shared with sum_by on purpose.
from slo.promql.aggregate import _kahan_inc, instant_vector, sum_by
from slo.promql.lookup import (
    FloatArray,
    IntArray,
    Semantics,
    SemanticsLike,
    Window,
    duration_ms,
    eval_time_ms,
    select_range,
    semantics_of,
)
from slo.promql.quantile import Bucket, parse_le

# The extrapolation step of extrapolatedRate, shared so that the rollup path below cannot
# drift from slo.promql.rate's arithmetic.
from slo.promql.rate import _extrapolation_factor, increase
from slo.promql.tracks import (
    Grid,
    Track,
    TrackSum,
    increase_track,
    instant_track,
    mean_over_time_track,
)
from slo.sources.protocol import BucketTracks, LeChoice, Matchers, Tracks
from vigil.conventions import LABEL_LE, SOURCE_EMBEDDED, SUFFIX_BUCKET
from vigil.model import Labels, Point, SeriesKey

if TYPE_CHECKING:
    from collector.store import CounterWindow, Store

__all__ = ["EmbeddedSource", "avg_aggregate", "avg_over_time_value"]


def _kahan_inc_v2(inc: float, total: float, c: float) -> tuple[float, float]:
    """2.42 ``kahanSumInc`` (functions.go:779-788): Neumaier, without 3.x's reset on ±Inf."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def _v2_incremental_mean(values: Iterable[float], *, kahan: bool) -> float | None:
    """Prometheus 2.42's running mean: ``mean += v/n - mean/n``.

    ``avg_over_time`` (functions.go:449-479) adds the step with ``kahanSumInc`` and returns
    ``mean + c``; the ``avg`` aggregation (engine.go:2466-2486, the group starts at its first
    value) adds it plainly. Both keep an infinite mean when the next value cannot change it.
    """
    mean, c, count = 0.0, 0.0, 0.0
    seen = False
    for v in values:
        v = float(v)
        count += 1
        if not seen:
            seen = True
            if not kahan:  # the aggregation group starts with its first value, count 1
                mean = v
                continue
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        step = v / count - mean / count
        if kahan:
            mean, c = _kahan_inc_v2(step, mean, c)
        else:
            mean += step
    if not seen:
        return None
    if not kahan or math.isinf(mean):
        return mean
    return mean + c


def _v3_mean(values: Iterable[float]) -> float | None:
    """Prometheus 3.x's mean (``avg_over_time`` and ``avg``): a Kahan–Neumaier sum divided by
    the count, switching to an incremental mean only if the sum would overflow
    (prometheus#16714: the direct mean is usually the more accurate)."""
    it = iter(values)
    try:
        total = float(next(it))
    except StopIteration:
        return None
    count, c, mean = 1.0, 0.0, 0.0
    incremental = False
    for v in it:
        v = float(v)
        count += 1
        if not incremental:
            new_total, new_c = _kahan_inc(v, total, c)
            if not math.isinf(new_total):
                total, c = new_total, new_c
                continue
            incremental = True
            mean = total / (count - 1)
            c /= count - 1
        q = (count - 1) / count
        mean, c = _kahan_inc(v / count, q * mean, q * c)
    if incremental:
        return mean + c
    return total / count + c / count


def avg_over_time_value(values: Sequence[float], semantics: SemanticsLike) -> float | None:
    """``avg_over_time`` of one window's sample values (stale markers already dropped);
    ``None`` for an empty window (the series is absent from PromQL's result)."""
    if semantics_of(semantics) is Semantics.V2:
        return _v2_incremental_mean(values, kahan=True)
    return _v3_mean(values)


def avg_aggregate(vector: Mapping[Labels, float], semantics: SemanticsLike) -> float | None:
    """PromQL ``avg(v)`` of an instant vector (series visited in label-set order, like
    ``sum_by``); ``None`` for an empty vector (PromQL returns no series)."""
    values = [vector[k] for k in sorted(vector)]
    if semantics_of(semantics) is Semantics.V2:
        return _v2_incremental_mean(values, kahan=False)
    return _v3_mean(values)


def _increase_of(
    w: CounterWindow, range_start_ms: int, range_end_ms: int, semantics: Semantics
) -> float | None:
    """``increase`` of one series from its window summary (``Store.counter_windows``): the
    same IEEE operations, in the same order, as ``slo.promql.rate.extrapolated_rate`` on the samples
    (``is_counter=True, is_rate=False``), so the float is identical.
    """
    if w.n < 2:
        return None
    # _raw_change: `last - first`, then `+= before` for each reset in sample order.
    result = float(w.last_value) - float(w.first_value)
    for before in w.resets:
        result += before
    factor = _extrapolation_factor(
        w.first_ts, w.last_ts, w.n, float(w.first_value), result,
        range_start_ms, range_end_ms, True, semantics,
    )
    return result * factor


def _le_of(labels: Labels) -> float | None:
    text = next((v for k, v in labels if k == LABEL_LE), None)
    return None if text is None else parse_le(text)


def _le_track_groups(summed: Mapping[Labels, Track],
                     by: Sequence[str]) -> dict[Labels, list[tuple[float, Track]]]:
    """``_le_groups`` for tracks: ``sum by (by, le)`` results as ``(le, track)`` per group."""
    keep = frozenset(by)
    groups: dict[Labels, list[tuple[float, Track]]] = {}
    for labels, track in summed.items():
        le = _le_of(labels)
        if le is None:
            continue
        key = tuple((k, v) for k, v in labels if k in keep)
        groups.setdefault(key, []).append((le, track))
    return groups


def _le_groups(
    summed: Mapping[Labels, float], by: Sequence[str]
) -> dict[Labels, list[Bucket]]:
    """``sum by (<by>, le)`` results regrouped by ``<by>`` as ``(le, value)`` buckets; series
    whose ``le`` does not parse are skipped, as ``histogram_quantile`` skips them."""
    keep = frozenset(by)
    groups: dict[Labels, list[Bucket]] = {}
    for labels, value in summed.items():
        le_text = next((v for k, v in labels if k == LABEL_LE), None)
        le = None if le_text is None else parse_le(le_text)
        if le is None:
            continue
        key = tuple((k, v) for k, v in labels if k in keep)
        groups.setdefault(key, []).append((le, value))
    return groups


class EmbeddedSource:
    """The ``Source`` protocol answered from a ``collector.store.Store``.

    ``semantics``: the PromQL rules to follow ("3" default, "2" for Prometheus 2.x);
    ``lookback_s``: the instant-selector lookback in seconds (Prometheus's
    ``--query.lookback-delta``, 300 by default).
    """

    #: What ``slo.status`` reports as ``"source"``.
    kind = SOURCE_EMBEDDED
    #: The store's series carry the labels Vigil's collector set (``pool``, ``kind``,
    #: ``instance``): a pool is read by those (``PoolConfig.series(external=False)``).
    external: bool = False
    #: Answer long ``increase`` windows from the store's rollup (``Store.counter_windows``).
    #: The result is bit-identical either way; off only to measure the difference.
    use_rollup: bool = True

    def __init__(
        self, store: Store, *, semantics: SemanticsLike = "3", lookback_s: float = 300.0
    ) -> None:
        if lookback_s <= 0 or not math.isfinite(lookback_s):
            raise ValueError(f"lookback_s must be a positive number of seconds, not {lookback_s!r}")
        self.store = store
        self.semantics: Semantics = semantics_of(semantics)
        self.lookback_s = float(lookback_s)

    def __repr__(self) -> str:
        return (
            f"EmbeddedSource({self.store.path}, semantics={self.semantics.value!r}, "
            f"lookback_s={self.lookback_s:g})"
        )

    # --- reading ---------------------------------------------------------------------------
    def _read(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> dict[SeriesKey, list[Point]]:
        """The stored points of ``metric{matchers}`` with ``t - range <= ts <= t`` (ms).

        Inclusive on the left so that semantics "2" sees its edge sample; ``select_range`` /
        ``instant_value`` drop it again for "3". Nothing outside the window is read.
        """
        at_ms = eval_time_ms(at_s)
        return self.store.points(metric, matchers, at_ms - duration_ms(range_s), at_ms)

    def _window_ms(self, at_s: float, range_s: float) -> tuple[int, int, int]:
        """``(mint, first_ms, at_ms)`` of ``x[range]`` at ``at_s``: the range's start, the
        first sample time it keeps (``select_range``'s left edge: 2.x keeps ``ts == mint``,
        3.x does not) and its end, Unix ms."""
        at_ms = eval_time_ms(at_s)
        mint = at_ms - duration_ms(range_s)
        return mint, (mint if self.semantics is Semantics.V2 else mint + 1), at_ms

    def counter_windows(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float
    ) -> dict[SeriesKey, CounterWindow] | None:
        """What the samples of ``metric{matchers}[window]`` at ``at_s`` hold for
        ``increase``: per series, their count, first and last sample and the value before
        each drop (``Store.counter_windows``: from the rollup, without decoding every
        sample). ``None`` while the store has no rollup (read the samples then)."""
        if not self.use_rollup:
            return None
        _, first_ms, at_ms = self._window_ms(at_s, window_s)
        return self.store.counter_windows(metric, matchers, first_ms, at_ms)

    def window_arrays(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> dict[Labels, tuple[IntArray, FloatArray]]:
        """``samples(metric, matchers, at_s, range_s)`` as arrays per series: times (Unix ms)
        and values (NaN samples kept), staleness markers left out; series without a sample
        absent. One read of the store's arrays, no ``Point`` per sample: what reads a month
        of a fleet's scrapes (the cost's ``up``) reads it this way."""
        _, first_ms, at_ms = self._window_ms(at_s, range_s)
        out: dict[Labels, tuple[IntArray, FloatArray]] = {}
        for key, _, ts, vals, stale in self.store.series_arrays(metric, matchers, first_ms,
                                                                at_ms):
            if stale.any():
                ts, vals = ts[~stale], vals[~stale]
            if ts.size:
                out[key.labels] = (ts, vals)
        return out

    def _series_increases(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float
    ) -> dict[Labels, float]:
        """``increase(metric{matchers}[window])`` per series, keyed by its labels.

        The one place counter increases are computed. Once the store has its rollup
        (``collector.store.rollup``, built by ``compact()``), the window's first and last samples,
        sample count and resets come from ``Store.counter_windows`` — lookups for the
        rolled-up part, raw samples only for what the write head still holds — instead of
        every sample; before that, from the raw samples. Both give the same float64. Series
        with fewer than two samples in the window are absent, as in PromQL.
        """
        out: dict[Labels, float] = {}
        windows = self.counter_windows(metric, matchers, at_s, window_s)
        if windows is not None:
            mint, _, at_ms = self._window_ms(at_s, window_s)
            for key, w in windows.items():
                value = _increase_of(w, mint, at_ms, self.semantics)
                if value is not None:
                    out[key.labels] = value
            return out
        for key, pts in self._read(metric, matchers, at_s, window_s).items():
            value = increase(
                [p.ts_ms for p in pts], [p.value for p in pts], at_s, window_s, self.semantics
            )
            if value is not None:
                out[key.labels] = value
        return out

    # --- the Source protocol ---------------------------------------------------------------
    def increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, float]:
        """``sum by (by) (increase(metric{matchers}[window]))`` at ``at_s``."""
        return sum_by(
            self._series_increases(metric, matchers, at_s, window_s), by, self.semantics
        )

    def bucket_increase(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float,
        by: Sequence[str] = (),
    ) -> dict[Labels, list[Bucket]]:
        """Per ``by`` group, the ``(le, increase)`` buckets of
        ``sum by (by, le) (increase(metric_bucket{matchers}[window]))``."""
        by = tuple(by)
        if LABEL_LE in by:
            raise ValueError("'le' is always part of the grouping; do not list it in `by`")
        per_series = self._series_increases(metric + SUFFIX_BUCKET, matchers, at_s, window_s)
        summed = sum_by(per_series, (*by, LABEL_LE), self.semantics)
        return _le_groups(summed, by)

    def instant(self, metric: str, matchers: Matchers, at_s: float) -> dict[Labels, float]:
        """``metric{matchers}`` at ``at_s``: each series' latest value within the lookback; a
        series whose latest sample is a staleness marker is absent."""
        series = {
            key.labels: ([p.ts_ms for p in pts], [p.value for p in pts])
            for key, pts in self._read(metric, matchers, at_s, self.lookback_s).items()
        }
        return instant_vector(series, at_s, self.lookback_s, self.semantics)

    def avg_over_time(
        self, metric: str, matchers: Matchers, at_s: float, window_s: float
    ) -> dict[Labels, float]:
        """``avg_over_time(metric{matchers}[window])`` per series (same window edges as
        ``select_range``; stale markers skipped; a series with no sample is absent)."""
        out: dict[Labels, float] = {}
        slow: set[Labels] | None = None
        if self.use_rollup:
            # The store's gauge rollup gives the mean exactly when every sample is an integer
            # (3.x) or all are equal (2.x) — always so for `up`; other series read samples.
            _, first_ms, at_ms = self._window_ms(at_s, window_s)
            windows = self.store.gauge_windows(metric, matchers, first_ms, at_ms)
            if windows is not None:
                slow = set()
                running = self.semantics is Semantics.V2
                for key, w in windows.items():
                    mean = w.mean(running)
                    if mean is None:
                        slow.add(key.labels)
                    else:
                        out[key.labels] = mean
                if not slow and not any(
                    counter_like(t, k.name) for k, t in self.store.series(metric, matchers)
                ):
                    return out
        for labels, window in self._windows(metric, matchers, at_s, window_s):
            if slow is not None and labels in out:
                continue
            value = avg_over_time_value(window.values.tolist(), self.semantics)
            if value is not None:
                out[labels] = value
        return out

    def samples(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> dict[Labels, list[Point]]:
        """The raw samples of ``metric{matchers}[range]`` at ``at_s``, stale markers dropped;
        series with no sample in the range are absent."""
        out: dict[Labels, list[Point]] = {}
        for labels, window in self._windows(metric, matchers, at_s, range_s):
            if window.ts_ms.size:
                out[labels] = [
                    Point(int(t), float(v))
                    for t, v in zip(window.ts_ms.tolist(), window.values.tolist(), strict=True)
                ]
        return out

    # --- ranges (slo.sources.protocol.RangeSource) ------------------------------------------
    def _range_tracks(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str], *, keep: Callable[[Labels], bool] | None = None,
    ) -> Tracks:
        """``sum by (by)`` of each series' ``increase`` track, per window: every series read
        once (one at a time, in label order) for all windows, and added to its group's
        running sum as ``sum_by`` adds it."""
        instants = grid.instants_ms()
        ranges = {w: duration_ms(w) for w in windows_s}
        lo = grid.start_ms - max(ranges.values(), default=0)
        keep_by = frozenset(by)
        sums: dict[float, dict[Labels, TrackSum]] = {w: {} for w in windows_s}
        chosen = None if keep is None else (lambda key: keep(key.labels))
        for key, _, ts, vals, stale in self.store.series_arrays(metric, matchers, lo,
                                                                grid.end_ms, chosen):
            group = tuple((k, v) for k, v in key.labels if k in keep_by)
            for w, range_ms in ranges.items():
                track = increase_track(ts, vals, stale, instants, range_ms, self.semantics)
                if track.present.any():
                    acc = sums[w].get(group)
                    if acc is None:
                        acc = sums[w][group] = TrackSum(grid.n, self.semantics)
                    acc.add(track)
        return {w: {g: acc.result() for g, acc in groups.items()}
                for w, groups in sums.items()}

    def increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (),
    ) -> Tracks:
        """``sum by (by) (increase(metric{matchers}[w]))`` at every instant of ``grid``."""
        return self._range_tracks(metric, matchers, grid, windows_s, by)

    def bucket_increase_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
        by: Sequence[str] = (), *, les: LeChoice | None = None,
    ) -> BucketTracks:
        """Per ``by`` group, the ``(le, track)`` buckets of ``sum by (by, le)
        (increase(metric_bucket{matchers}[w]))`` at every instant of ``grid``. ``les``, given
        every bound the series have (ascending), names the bounds worth computing."""
        by = tuple(by)
        if LABEL_LE in by:
            raise ValueError("'le' is always part of the grouping; do not list it in `by`")
        name = metric + SUFFIX_BUCKET
        keep: Callable[[Labels], bool] | None = None
        if les is not None:
            bounds = sorted({le for key, _ in self.store.series(name, matchers)
                             if (le := _le_of(key.labels)) is not None})
            wanted = frozenset(les(bounds))
            keep = lambda labels: _le_of(labels) in wanted  # noqa: E731
        summed = self._range_tracks(name, matchers, grid, windows_s, (*by, LABEL_LE), keep=keep)
        return {w: _le_track_groups(groups, by) for w, groups in summed.items()}

    def avg_over_time_range(
        self, metric: str, matchers: Matchers, grid: Grid, windows_s: Sequence[float],
    ) -> Tracks:
        """``avg_over_time(metric{matchers}[w])`` per series at every instant of ``grid``, for
        integer-valued series such as ``up`` (``slo.promql.tracks.mean_over_time_track``)."""
        instants = grid.instants_ms()
        ranges = {w: duration_ms(w) for w in windows_s}
        lo = grid.start_ms - max(ranges.values(), default=0)
        out: Tracks = {w: {} for w in windows_s}
        for key, _, ts, vals, stale in self.store.series_arrays(metric, matchers, lo,
                                                                grid.end_ms):
            for w, range_ms in ranges.items():
                track = mean_over_time_track(ts, vals, stale, instants, range_ms,
                                             self.semantics)
                if track.present.any():
                    out[w][key.labels] = track
        return out

    def instant_range(self, metric: str, matchers: Matchers, grid: Grid) -> dict[Labels, Track]:
        """``metric{matchers}`` per series at every instant of ``grid``: each series' latest
        value within the lookback (``slo.promql.tracks.instant_track``), as ``instant`` gives
        it instant by instant."""
        instants = grid.instants_ms()
        lookback_ms = duration_ms(self.lookback_s)
        out: dict[Labels, Track] = {}
        for key, _, ts, vals, stale in self.store.series_arrays(
                metric, matchers, grid.start_ms - lookback_ms, grid.end_ms):
            track = instant_track(ts, vals, stale, instants, lookback_ms, self.semantics)
            if track.present.any():
                out[key.labels] = track
        return out

    def downsampled(self) -> tuple[int, float] | None:
        """``(before_ms, resolution_s)``: the store keeps one sample per ``resolution_s``
        bucket below ``before_ms`` (``slo.sources.protocol.Downsampled``); ``None`` while it keeps
        all."""
        before = self.store.downsampled_before_ms()
        return None if before is None else (before, self.store.resolution_s)

    def _windows(
        self, metric: str, matchers: Matchers, at_s: float, range_s: float
    ) -> Iterable[tuple[Labels, Window]]:
        for key, pts in self._read(metric, matchers, at_s, range_s).items():
            yield key.labels, select_range(
                [p.ts_ms for p in pts], [p.value for p in pts], at_s, range_s, self.semantics
            )

