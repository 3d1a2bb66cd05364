"""``OnGrid``: a ``Source`` that answers instant queries at a grid's instants from range reads.

A chart evaluates the engine's own functions at each of its points (``dashboard.timeseries``),
each one instant query after another: 120 points of one histogram's quantiles were 120 reads
of the same series, each of a window that mostly overlaps the one before. A ``RangeSource``
answers the same query at every instant of a ``Grid`` in one read (``/api/v1/query_range``
on a Prometheus; one pass over each series' samples in the embedded store), and each instant's
value is the one the instant query gives there (``slo.sources.protocol.RangeSource``).

``OnGrid`` puts the two together without changing the functions that evaluate a point: it is
the wrapped source with ``increase``, ``bucket_increase``, ``instant`` and ``avg_over_time``
answered, at the grid's instants, from one range query per ``(query, window)``, kept for the
next instant. Anything else, and any other instant, goes to the wrapped source as it is.
``window_arrays`` is for what reads raw samples at each instant (the cost's ``up`` and
running requests, ``slo.cost.pool``): from Vigil's store, one read of the whole span, cut
per instant.

``avg_over_time`` is taken from the range form only under 3.x rules and for integer-valued
series (``up``), where ``slo.promql.tracks.mean_over_time_track`` is exact; otherwise the
instant query answers, as before.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slo.promql.lookup import FloatArray, IntArray, Semantics, duration_ms, window_bounds
from slo.promql.quantile import Bucket
from slo.promql.tracks import Grid, Track
from slo.sources.protocol import Matchers, OwnSamples, RangeSource
from vigil.model import Labels

__all__ = ["OnGrid", "grid_of", "on_grid"]

#: Fewer instants than this are answered instant by instant: a range read of the union of
#: their windows would cost more than the few reads it saves.
MIN_INSTANTS = 3


def grid_of(times_s: Sequence[float]) -> Grid | None:
    """The ``Grid`` through most of ``times_s`` (Unix seconds): its step is their most common
    spacing (whole milliseconds), and it runs from the first to the last time on that step;
    the times off it (a chart's last point, at the range's end) are answered instant by
    instant. ``None`` when fewer than ``MIN_INSTANTS`` times lie on one, or when the grid would
    hold more than twice as many instants as there are times on it (gaps a range read would
    fill with work nobody asked for)."""
    ms = sorted({round(t * 1000) for t in times_s if abs(t * 1000 - round(t * 1000)) <= 1e-3})
    if len(ms) < MIN_INSTANTS:
        return None
    steps = Counter(b - a for a, b in itertools.pairwise(ms))
    step = steps.most_common(1)[0][0]
    phase = Counter(m % step for m in ms).most_common(1)[0][0]
    on = [m for m in ms if m % step == phase]
    n = (on[-1] - on[0]) // step + 1
    if len(on) < MIN_INSTANTS or n > 2 * len(on):
        return None
    return Grid(on[0], step, n)


def _key(matchers: Matchers) -> Any:
    """A hashable form of ``matchers`` (a mapping, or an already hashable ``Selector``)."""
    return tuple(sorted(matchers.items())) if isinstance(matchers, Mapping) else matchers


def _at(tracks: Mapping[Labels, Track], i: int) -> dict[Labels, float]:
    return {labels: float(t.values[i]) for labels, t in tracks.items() if t.present[i]}


class OnGrid:
    """``source`` answering at ``grid``'s instants from range reads (module docs)."""

    def __init__(self, source: RangeSource, grid: Grid) -> None:
        self._source = source
        self._grid = grid
        self._memo: dict[tuple[Any, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        # Everything else (``semantics``, ``external``, ``kind``, ``store``, ``downsampled``,
        # ``samples``...) is the wrapped source's, so that the engine sees the same source.
        return getattr(self._source, name)

    @property
    def wrapped(self) -> RangeSource:
        """The source this one reads through."""
        return self._source

    def _index(self, at_s: float) -> int | None:
        """The grid index of ``at_s``, None when it is not one of the grid's instants."""
        g = self._grid
        offset = round(at_s * 1000) - g.start_ms
        if abs(at_s * 1000 - round(at_s * 1000)) > 1e-3 or offset % g.step_ms:
            return None
        i = offset // g.step_ms
        return i if 0 <= i < g.n else None

    def _once(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = read()
        return self._memo[key]

    # --- the Source protocol ---------------------------------------------------------------
    def increase(self, metric: str, matchers: Matchers, at_s: float, window_s: float,
                 by: Sequence[str] = ()) -> dict[Labels, float]:
        """``Source.increase``; at a grid instant from ``increase_range``."""
        i = self._index(at_s)
        if i is None:
            return self._source.increase(metric, matchers, at_s, window_s, by)
        tracks = self._once(
            ("increase", metric, _key(matchers), window_s, tuple(by)),
            lambda: self._source.increase_range(metric, matchers, self._grid, [window_s],
                                                by)[window_s])
        return _at(tracks, i)

    def bucket_increase(self, metric: str, matchers: Matchers, at_s: float, window_s: float,
                        by: Sequence[str] = ()) -> dict[Labels, list[Bucket]]:
        """``Source.bucket_increase``; at a grid instant from ``bucket_increase_range``."""
        i = self._index(at_s)
        if i is None:
            return self._source.bucket_increase(metric, matchers, at_s, window_s, by)
        groups = self._once(
            ("bucket_increase", metric, _key(matchers), window_s, tuple(by)),
            lambda: self._source.bucket_increase_range(metric, matchers, self._grid,
                                                       [window_s], by)[window_s])
        out: dict[Labels, list[Bucket]] = {}
        for group, buckets in groups.items():
            present = [(le, float(t.values[i])) for le, t in buckets if t.present[i]]
            if present:
                out[group] = present
        return out

    def instant(self, metric: str, matchers: Matchers, at_s: float) -> dict[Labels, float]:
        """``Source.instant``; at a grid instant from ``instant_range``."""
        i = self._index(at_s)
        if i is None:
            return self._source.instant(metric, matchers, at_s)
        tracks = self._once(("instant", metric, _key(matchers)),
                            lambda: self._source.instant_range(metric, matchers, self._grid))
        return _at(tracks, i)

    def window_arrays(self, metric: str, matchers: Matchers, at_s: float, range_s: float
                      ) -> Mapping[Labels, tuple[IntArray, FloatArray]] | None:
        """``OwnSamples.window_arrays``; at a grid instant cut from one read of every
        instant's range together. ``None`` when the wrapped source reads no samples itself
        (a Prometheus: what asks then reads ``samples``, ``slo.cost.pool``)."""
        source = self._source
        if not isinstance(source, OwnSamples):
            return None
        i = self._index(at_s)
        if i is None:
            return source.window_arrays(metric, matchers, at_s, range_s)
        g = self._grid
        range_ms = duration_ms(range_s)
        union = self._once(
            ("window_arrays", metric, _key(matchers), range_s),
            lambda: source.window_arrays(metric, matchers, g.end_ms / 1000.0,
                                         (g.end_ms - g.start_ms) / 1000.0 + range_s) or {})
        at_ms = g.start_ms + i * g.step_ms
        cut: dict[Labels, tuple[IntArray, FloatArray]] = {}
        for labels, (ts, vals) in union.items():
            lo, hi = window_bounds(ts, at_ms, range_ms, source.semantics)
            if hi > lo:
                cut[labels] = (ts[lo:hi], vals[lo:hi])
        return cut

    def avg_over_time(self, metric: str, matchers: Matchers, at_s: float, window_s: float
                      ) -> dict[Labels, float]:
        """``Source.avg_over_time``; at a grid instant under 3.x rules from
        ``avg_over_time_range`` when every series read is integer-valued (module docs)."""
        i = self._index(at_s)
        if i is None or self._source.semantics is not Semantics.V3:
            return self._source.avg_over_time(metric, matchers, at_s, window_s)

        def read() -> Any:
            try:
                return self._source.avg_over_time_range(metric, matchers, self._grid,
                                                        [window_s])[window_s]
            except ValueError:  # a series with other values: the instant query answers
                return None

        tracks = self._once(("avg_over_time", metric, _key(matchers), window_s), read)
        if tracks is None:
            return self._source.avg_over_time(metric, matchers, at_s, window_s)
        return _at(tracks, i)


def on_grid(source: Any, times_s: Sequence[float]) -> Any:
    """``source`` answering at ``times_s`` from range reads (``OnGrid``) when it can answer
    range queries and the times lie on a grid; else ``source`` itself."""
    grid = grid_of(times_s)
    if grid is None or not isinstance(source, RangeSource):
        return source
    return OnGrid(source, grid)
