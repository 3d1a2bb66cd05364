"""PromQL over many evaluation instants at once: what a range query or a rule evaluated every
interval gives, one array per series instead of one call per instant.

A ``Track`` is one series' (or one group's) value at each instant of an ascending array of
evaluation times (Unix ms), with ``present`` False where PromQL's result would not hold the
series at that instant (fewer than two samples in an ``increase`` window, an empty group).

Each function here does, element by element, the same IEEE operations in the same order as
its one-instant counterpart (``slo.promql.rate.increase``, ``slo.promql.aggregate.sum_by``,
``slo.sources.embedded.avg_aggregate``, ``slo.promql.quantile.bucket_fraction_below``), so a
track's value at an instant is bit for bit the value the engine computes at that instant; the
tests hold them to that. Only what numpy cannot express without a per-instant branch (windows
holding a counter reset, instants whose buckets differ from the rest) is visited in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from slo.promql.lookup import BoolArray, FloatArray, IntArray, Semantics
from slo.promql.quantile import Bucket, bucket_fraction_below

__all__ = [
    "Grid",
    "Track",
    "TrackSum",
    "absent",
    "avg_tracks",
    "fraction_below",
    "increase_track",
    "instant_track",
    "mean_over_time_track",
    "sum_tracks",
]


class Grid(NamedTuple):
    """Evaluation instants ``start_ms + k × step_ms`` for ``k < n`` (Unix ms): a range query's
    steps, or a rule group's evaluations."""

    start_ms: int
    step_ms: int
    n: int

    @property
    def end_ms(self) -> int:
        """The last instant (Unix ms)."""
        return self.start_ms + (self.n - 1) * self.step_ms

    def instants_ms(self) -> IntArray:
        """Every instant, ascending (int64 ms)."""
        return self.start_ms + self.step_ms * np.arange(self.n, dtype=np.int64)

    @classmethod
    def between(cls, start_ms: int, end_ms: int, step_ms: int) -> Grid:
        """The instants at multiples of ``step_ms`` from the first at or after ``start_ms`` to
        the last at or before ``end_ms``, as a rule group evaluated every ``step_ms``
        (aligned to the epoch) would see them."""
        if step_ms <= 0:
            raise ValueError(f"the step must be positive, not {step_ms} ms")
        first = -(-start_ms // step_ms) * step_ms
        last = end_ms // step_ms * step_ms
        if last < first:
            raise ValueError("no evaluation instant between the start and the end")
        return cls(first, step_ms, (last - first) // step_ms + 1)


class Track(NamedTuple):
    """Values at each evaluation instant (NaN where absent) and where the series is present."""

    values: FloatArray
    present: BoolArray


def absent(n: int) -> Track:
    """A track with no value at any of ``n`` instants."""
    return Track(np.full(n, np.nan), np.zeros(n, dtype=np.bool_))


def _bounds(ts: IntArray, instants_ms: IntArray, range_ms: int,
            semantics: Semantics) -> tuple[IntArray, IntArray]:
    """Per instant, the index slice ``[lo, hi)`` of the samples its range holds
    (``slo.promql.lookup.window_bounds`` for every instant)."""
    mint = instants_ms - range_ms
    lo = np.searchsorted(ts, mint, side="left" if semantics is Semantics.V2 else "right")
    hi = np.maximum(np.searchsorted(ts, instants_ms, side="right"), lo)
    return lo.astype(np.int64), hi.astype(np.int64)


def increase_track(ts: IntArray, vals: FloatArray, stale: BoolArray | None,
                   instants_ms: IntArray, range_ms: int, semantics: Semantics) -> Track:
    """``increase(x[range])`` of one counter series at every instant: ``ts`` int64 ms
    ascending, ``vals`` float64, ``stale`` the staleness-marker mask (markers are skipped, as
    range selectors skip them); ``range_ms`` the window in ms."""
    if stale is not None and stale.any():
        keep = ~stale
        ts, vals = ts[keep], vals[keep]
    n_inst = instants_ms.size
    if range_ms <= 0 or ts.size < 2:
        return absent(n_inst)
    lo, hi = _bounds(ts, instants_ms, range_ms, semantics)
    n = hi - lo
    present = n >= 2
    first = np.where(present, lo, 0)
    last = np.where(present, hi - 1, 1)
    first_t, last_t = ts[first], ts[last]
    first_v = vals[first]
    with np.errstate(all="ignore"):
        result = vals[last] - first_v
        # Resets: `result += before` for each drop, in sample order (Go's loop). Only windows
        # that hold a drop are visited, one addition at a time.
        drops = np.flatnonzero(vals[1:] < vals[:-1])
        if drops.size:
            # A drop after sample j is in the window when lo <= j and j + 1 <= hi - 1.
            start = np.searchsorted(drops, first, side="left")
            stop = np.searchsorted(drops, last - 1, side="right")
            for i in np.flatnonzero(present & (stop > start)):
                r = float(result[i])
                for j in drops[start[i]:stop[i]]:
                    r += float(vals[j])
                result[i] = r
        # slo.promql.rate._extrapolation_factor, element by element.
        mint = instants_ms - range_ms
        to_start = (first_t - mint).astype(np.float64) / 1000
        to_end = (instants_ms - last_t).astype(np.float64) / 1000
        sampled = (last_t - first_t).astype(np.float64) / 1000
        average = sampled / (n - 1).astype(np.float64)
        threshold = average * 1.1
        zero_capped = (result > 0) & (first_v >= 0)
        if semantics is Semantics.V2:
            to_zero = sampled * (first_v / result)
            to_start = np.where(zero_capped & (to_zero < to_start), to_zero, to_start)
            interval = sampled + np.where(to_start < threshold, to_start, average / 2)
            interval = interval + np.where(to_end < threshold, to_end, average / 2)
            factor = interval / sampled
        else:
            to_start = np.where(to_start >= threshold, average / 2, to_start)
            to_zero = np.where(zero_capped, sampled * (first_v / result), to_start)
            to_start = np.where(to_zero < to_start, to_zero, to_start)
            to_end = np.where(to_end >= threshold, average / 2, to_end)
            factor = (sampled + to_start + to_end) / sampled
        values = result * factor
    return Track(np.where(present, values, np.nan), present)


def instant_track(ts: IntArray, vals: FloatArray, stale: BoolArray | None,
                  instants_ms: IntArray, lookback_ms: int, semantics: Semantics) -> Track:
    """An instant selector ``x`` of one series at every instant
    (``slo.promql.lookup.instant_value``): the newest sample at or before the instant, within
    the lookback (2.x: ``ts >= t - lookback``, 3.x: ``ts > t - lookback``), absent when that
    sample is a staleness marker. A NaN sample is present as NaN."""
    n_inst = instants_ms.size
    if ts.size == 0:
        return absent(n_inst)
    i = np.searchsorted(ts, instants_ms, side="right") - 1
    safe = np.maximum(i, 0)
    newest = ts[safe]
    oldest = instants_ms - lookback_ms
    present = (i >= 0) & ((newest > oldest) if semantics is Semantics.V3
                          else (newest >= oldest))
    if stale is not None:
        present &= ~stale[safe]
    return Track(np.where(present, vals[safe], np.nan), present)


class TrackSum:
    """The running ``sum`` of one group's series at every one of ``n`` instants, fed in
    label-set order (the order ``sum_by`` adds them in): plain addition for 2.42,
    Kahan–Neumaier for 3.x; each instant's sum starts with its first present series. Kept
    as a running sum so that a month of a histogram's series need not be held at once."""

    def __init__(self, n: int, semantics: Semantics) -> None:
        self.semantics = semantics
        self.total = np.full(n, np.nan)
        self.comp = np.zeros(n)
        self.started = np.zeros(n, dtype=np.bool_)

    def add(self, track: Track) -> None:
        """Add the next series (``slo.promql.aggregate._kahan_inc`` element by element)."""
        values, present = track
        total, comp = self.total, self.comp
        first = present & ~self.started
        more = present & self.started
        with np.errstate(all="ignore"):
            added = total + values
            if self.semantics is not Semantics.V2:
                kept = np.abs(total) >= np.abs(values)
                comp_new = np.where(np.isinf(added), 0.0,
                                    np.where(kept, comp + ((total - added) + values),
                                             comp + ((values - added) + total)))
                self.comp = np.where(more, comp_new, comp)
        self.total = np.where(first, values, np.where(more, added, total))
        self.started |= present

    def result(self) -> Track:
        """The sum; absent where no series was present."""
        out = self.total if self.semantics is Semantics.V2 else self.total + self.comp
        return Track(np.where(self.started, out, np.nan), self.started.copy())


def sum_tracks(tracks: Sequence[Track], n: int, semantics: Semantics) -> Track:
    """``sum`` of a group's series at every instant, ``tracks`` in label-set order
    (``TrackSum``). Absent where no series is present."""
    acc = TrackSum(n, semantics)
    for track in tracks:
        acc.add(track)
    return acc.result()


def avg_tracks(tracks: Sequence[Track], n: int, semantics: Semantics) -> Track:
    """PromQL ``avg`` of a vector at every instant, ``tracks`` in label-set order
    (``slo.sources.embedded.avg_aggregate``): 2.42's running mean (the group starts at its
    first value), 3.x's compensated sum divided by the count. Finite values only (the means
    of ``up``); absent where no series is present."""
    mean = np.full(n, np.nan)
    comp = np.zeros(n)
    count = np.zeros(n)
    started = np.zeros(n, dtype=np.bool_)
    with np.errstate(all="ignore"):
        for values, present in tracks:
            first = present & ~started
            more = present & started
            count = count + present
            if semantics is Semantics.V2:
                stepped = mean + (values / count - mean / count)
                mean = np.where(first, values, np.where(more, stepped, mean))
            else:
                added = mean + values
                kept = np.abs(mean) >= np.abs(values)
                comp_new = np.where(np.isinf(added), 0.0,
                                    np.where(kept, comp + ((mean - added) + values),
                                             comp + ((values - added) + mean)))
                mean = np.where(first, values, np.where(more, added, mean))
                comp = np.where(more, comp_new, comp)
            started |= present
        if semantics is not Semantics.V2:
            mean = mean / count + comp / count
    return Track(np.where(started, mean, np.nan), started)


def mean_over_time_track(ts: IntArray, vals: FloatArray, stale: BoolArray | None,
                         instants_ms: IntArray, range_ms: int, semantics: Semantics) -> Track:
    """``avg_over_time(x[range])`` of one series whose samples are integers (``up``) at every
    instant: the window's exact sum over its count, which is 3.x's compensated mean exactly
    and 2.42's running mean whenever the window's samples are all equal (the running mean
    may differ from it in the last bits otherwise). Absent for an empty window."""
    if stale is not None and stale.any():
        keep = ~stale
        ts, vals = ts[keep], vals[keep]
    if range_ms <= 0 or ts.size == 0:
        return absent(instants_ms.size)
    if not np.all(np.isfinite(vals)) or np.any(vals != np.round(vals)):
        raise ValueError("mean_over_time_track reads integer-valued series only")
    lo, hi = _bounds(ts, instants_ms, range_ms, semantics)
    sums = np.concatenate(([0.0], np.cumsum(vals)))
    count = (hi - lo).astype(np.float64)
    present = count > 0
    with np.errstate(all="ignore"):
        mean = (sums[hi] - sums[lo]) / count
    return Track(np.where(present, mean, np.nan), present)


def fraction_below(threshold: float, buckets: Sequence[tuple[float, Track]],
                   n: int) -> tuple[Track, BoolArray]:
    """``histogram_fraction(-Inf, threshold, ...)`` at every instant of buckets given as
    ``(le, track)`` (``slo.promql.quantile.bucket_fraction_below``), and whether each
    instant's answer was interpolated. NaN (present) where PromQL gives NaN (no +Inf bucket,
    no observation); absent where no bucket is present.

    Instants where every bucket is present share one set of bounds, so the bucket that holds
    the threshold is found once for all of them; the others are answered one by one."""
    ordered = sorted(buckets, key=lambda b: b[0])
    values = np.full(n, np.nan)
    interpolated = np.zeros(n, dtype=np.bool_)
    if not ordered:
        return Track(values, np.zeros(n, dtype=np.bool_)), interpolated
    stacked = np.vstack([t.present for _, t in ordered])
    anywhere: BoolArray = np.asarray(stacked.any(axis=0), dtype=np.bool_)
    complete: BoolArray = np.asarray(stacked.all(axis=0), dtype=np.bool_)
    les = [le for le, _ in ordered]
    if complete.any() and len(set(les)) == len(les):
        _fill_complete(threshold, ordered, complete, values, interpolated)
    for i in np.flatnonzero(anywhere & ~complete):
        found: list[Bucket] = [(le, float(t.values[i])) for le, t in ordered if t.present[i]]
        values[i], interpolated[i] = bucket_fraction_below(threshold, found)
    if len(set(les)) != len(les):  # equal bounds are merged: the one-instant path does it
        for i in np.flatnonzero(complete):
            found = [(le, float(t.values[i])) for le, t in ordered]
            values[i], interpolated[i] = bucket_fraction_below(threshold, found)
    return Track(values, anywhere), interpolated


def _fill_complete(threshold: float, ordered: Sequence[tuple[float, Track]],
                   where: BoolArray, values: FloatArray, interpolated: BoolArray) -> None:
    """``bucket_fraction_below`` at the instants ``where`` every bucket of ``ordered`` (sorted,
    distinct bounds) is present, vectorised: the loop over buckets depends on the bounds and
    the threshold only, so it is run once."""
    les = [le for le, _ in ordered]
    upper = float(threshold)
    if not (np.isinf(les[-1]) and les[-1] > 0) or np.isnan(upper):
        return  # NaN everywhere (already)
    count = ordered[-1][1].values
    if upper == -np.inf:
        values[where] = np.where(count[where] == 0, np.nan, 0.0)
        return
    rank: FloatArray = np.zeros(count.shape)
    lower_bound = 0.0 if les[0] > 0 else -np.inf
    upper_rank: FloatArray = count
    found = inside = False
    with np.errstate(all="ignore"):
        for i, (upper_bound, track) in enumerate(ordered):
            cum = track.values
            if i > 0:
                lower_bound = les[i - 1]
            if lower_bound >= upper:
                upper_rank, found = rank, True
                break
            if lower_bound < upper < upper_bound:
                if lower_bound == -np.inf:
                    upper_rank = cum
                else:
                    upper_rank = rank + ((cum - rank) * (upper - lower_bound)) / (
                        upper_bound - lower_bound)
                found = inside = True
                break
            rank = cum
        # Go clamps both ranks to the count (only bites for counts < 0).
        lower_rank = np.where(count < 0.0, count, 0.0)
        if not found:
            upper_rank = count
        upper_rank = np.where(upper_rank > count, count, upper_rank)
        fraction = (upper_rank - lower_rank) / count
    empty = count == 0
    values[where] = np.where(empty, np.nan, fraction)[where]
    interpolated[where] = (inside & ~empty)[where]
