"""What a window of one series' samples comes to, for ``increase()`` and ``avg_over_time()``.

``CounterWindow``: what ``extrapolatedRate`` reads of a range (count, first and last sample,
the value before each drop); ``GaugeWindow``: what an exact ``avg_over_time`` may use (counts,
the sum of the integer samples, min and max). Both come from the rollup's rows
(``collector.store.rollup_reads``), from raw points as stored (``summarize``,
``gauge_of_points``) or from decoded arrays (``window_of_arrays``, ``gauge_of_arrays``, and
``edge_stats`` for many series' chunks at once, in numpy); two windows of adjacent samples
join into one (``concat``, ``gauge_concat``).

Every way gives the same numbers as the samples would: drops are IEEE comparisons of values
(NaN starts or ends none), staleness markers are left out, and only REALs count as numbers
(the TEXT ``'NaN'`` of a stored NaN is none; ``collector.store.codec``).

Units: timestamps are Unix **milliseconds** (int).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from collector.store.codec import stored_float
from collector.store.sealed import Arrays

__all__ = [
    "CounterWindow",
    "GaugeWindow",
    "Sample",
    "concat",
    "edge_stats",
    "gauge_concat",
    "gauge_of_arrays",
    "gauge_of_points",
    "summarize",
    "window_of_arrays",
]

#: One sample: ``(ts_ms, value)``.
Sample = tuple[int, float]


class CounterWindow(NamedTuple):
    """One series' window as ``extrapolatedRate`` sees it (staleness markers excluded).

    ``n``: number of samples; ``first_ts``/``last_ts``: Unix ms; ``first_value``/
    ``last_value``: the samples' values (NaN possible); ``resets``: the value before each drop
    (``current < previous``), in sample order.
    """

    n: int
    first_ts: int
    first_value: float
    last_ts: int
    last_value: float
    resets: tuple[float, ...] = ()


def window_of_arrays(a: Arrays) -> CounterWindow | None:
    """The ``CounterWindow`` of one series' samples as arrays (``sealed.Arrays``); ``None``
    when none is a sample. (``summarize`` over arrays: IEEE comparisons, so NaN starts or
    ends no drop.)"""
    ts, vals, stale = a
    live = ~stale
    if not live.all():
        ts, vals = ts[live], vals[live]
    if not ts.size:
        return None
    drop = np.flatnonzero(vals[1:] < vals[:-1])
    return CounterWindow(int(ts.size), int(ts[0]), float(vals[0]), int(ts[-1]),
                         float(vals[-1]), tuple(vals[drop].tolist()))


def summarize(points: Iterable[tuple[int, object]]) -> CounterWindow | None:
    """The ``CounterWindow`` of raw points ``(ts_ms, value)`` in time order (``None`` is a
    staleness marker, the TEXT ``'NaN'`` a NaN as stored); ``None`` when none is a sample."""
    pts = [(t, stored_float(v)) for t, v in points if v is not None]
    if not pts:
        return None
    # `if currPoint.V < prevValue { resultValue += prevValue }` (extrapolatedRate)
    drops = tuple(a for (_, a), (_, b) in pairwise(pts) if b < a)
    return CounterWindow(len(pts), pts[0][0], pts[0][1], pts[-1][0], pts[-1][1], drops)


def concat(head: CounterWindow | None, tail: CounterWindow | None) -> CounterWindow | None:
    """The window of ``head``'s samples followed by ``tail``'s (all of ``tail`` later): counts
    add, the drop between ``head``'s last and ``tail``'s first sample is inserted in order."""
    if head is None or tail is None:
        return head if tail is None else tail
    joint = (head.last_value,) if tail.first_value < head.last_value else ()
    return CounterWindow(
        head.n + tail.n, head.first_ts, head.first_value, tail.last_ts, tail.last_value,
        head.resets + joint + tail.resets,
    )


def edge_stats(
    chunks: Mapping[int, Arrays], edges: Sequence[tuple[int, int]], whole: tuple[int, int],
) -> tuple[dict[int, int], dict[int, Sample], dict[int, Sample]]:
    """Per series, of its chunk in ``chunks``: how many non-stale samples lie in the ``edges``
    ranges ``[lo, hi)`` (ms), and the first and the last non-stale sample in ``whole``.

    All series at once: the chunks are laid end to end, each series' timestamps shifted into
    its own 2**42 ms slot of one sorted key, so that every bound is one ``searchsorted`` over
    all series and the counts come from one running sum (a loop over series, a few numpy
    calls each, cost more than the decoding)."""
    if not chunks:
        return {}, {}, {}
    sids = list(chunks)
    parts = [chunks[sid] for sid in sids]
    ts = np.concatenate([a[0] for a in parts])
    vals = np.concatenate([a[1] for a in parts])
    live = ~np.concatenate([a[2] for a in parts])
    sizes = np.fromiter((a[0].size for a in parts), dtype=np.int64, count=len(parts))
    slot = 1 << 42  # ~139 years of ms: every chunk's samples fit in one slot
    base = int(ts.min())
    rows = np.arange(len(sids), dtype=np.int64) * slot
    key = ts - base + np.repeat(rows, sizes)

    def bound(t: int) -> npt.NDArray[np.int64]:
        return np.searchsorted(key, rows + min(max(t - base, 0), slot - 1))

    cum = np.concatenate(([0], np.cumsum(live, dtype=np.int64)))
    counts = np.zeros(len(sids), dtype=np.int64)
    for lo, hi in edges:
        if lo < hi:
            counts += cum[bound(hi)] - cum[bound(lo)]
    i, j = bound(whole[0]), bound(whole[1])
    pos = np.arange(ts.size, dtype=np.int64)
    nxt = np.minimum.accumulate(np.where(live, pos, ts.size)[::-1])[::-1]
    nxt = np.concatenate((nxt, [ts.size]))[i]
    prv = np.maximum.accumulate(np.where(live, pos, -1))[np.maximum(j - 1, 0)]
    has_first = nxt < j
    has_last = (j > i) & (prv >= i)
    firsts, lasts = {}, {}
    for k in np.flatnonzero(has_first).tolist():
        firsts[sids[k]] = (int(ts[nxt[k]]), float(vals[nxt[k]]))
    for k in np.flatnonzero(has_last).tolist():
        lasts[sids[k]] = (int(ts[prv[k]]), float(vals[prv[k]]))
    return dict(zip(sids, counts.tolist(), strict=True)), firsts, lasts


class GaugeWindow(NamedTuple):
    """What an exact ``avg_over_time`` may use of one series' window without its samples.

    ``n``: non-stale samples; ``nint``: of which integer-valued REALs with ``|v| <= 2**31``;
    ``total``: their sum (an exact integer); ``vmin``/``vmax``: over the REAL samples
    (``None`` when there is none).
    """

    n: int
    nint: int
    total: float
    vmin: float | None
    vmax: float | None

    def mean(self, running_mean: bool) -> float | None:
        """``avg_over_time`` of the window when it is provably PromQL's float, else ``None``
        (read the samples). ``running_mean``: Prometheus 2's incremental mean (exact here
        only when every sample is the same integer); else Prometheus 3's ``sum / count``
        (exact when every sample is an integer). Signed zeros are not distinguished."""
        if self.n == 0 or self.nint != self.n:
            return None
        if self.vmin is not None and self.vmin == self.vmax:
            return float(self.vmin)
        if running_mean:
            return None
        return self.total / self.n


def gauge_concat(a: GaugeWindow | None, b: GaugeWindow | None) -> GaugeWindow | None:
    """The window of ``a``'s samples and ``b``'s together (order does not matter here)."""
    if a is None or b is None:
        return a if b is None else b
    lows = [v for v in (a.vmin, b.vmin) if v is not None]
    highs = [v for v in (a.vmax, b.vmax) if v is not None]
    return GaugeWindow(
        a.n + b.n, a.nint + b.nint, math.fsum((a.total, b.total)),
        min(lows) if lows else None, max(highs) if highs else None,
    )


def gauge_of_arrays(a: Arrays) -> GaugeWindow | None:
    """The ``GaugeWindow`` of one series' samples as arrays; ``None`` when none is a sample.
    (As the gauge rollup's SQL counts them: NaN is no REAL, ±Inf no integer.)"""
    _, vals, stale = a
    v = vals[~stale] if stale.any() else vals
    if not v.size:
        return None
    real = v[~np.isnan(v)]
    ints = real[(np.abs(real) <= 2.0**31) & (real == np.trunc(real))] if real.size else real
    return GaugeWindow(int(v.size), int(ints.size), float(ints.sum()) if ints.size else 0.0,
                       float(real.min()) if real.size else None,
                       float(real.max()) if real.size else None)


def gauge_of_points(points: Iterable[tuple[int, object]]) -> GaugeWindow | None:
    """The ``GaugeWindow`` of raw points ``(ts_ms, value)`` (``None`` is a staleness marker,
    the TEXT ``'NaN'`` a NaN as stored); ``None`` when none is a sample."""
    n = nint = 0
    ints: list[float] = []
    reals: list[float] = []
    for _, v in points:
        if v is None:
            continue
        n += 1
        if type(v) is float or type(v) is int:
            f = float(v)
            if math.isfinite(f):
                reals.append(f)
                if f == int(f) and abs(f) <= 2**31:
                    nint += 1
                    ints.append(f)
            elif not math.isnan(f):
                reals.append(f)
    if not n:
        return None
    return GaugeWindow(n, nint, math.fsum(ints), min(reals, default=None),
                       max(reals, default=None))
