"""``rate``, ``increase`` and ``delta`` for one float series, exactly as PromQL computes them.

All three are Prometheus's ``extrapolatedRate`` (promql/functions.go) over the samples the
range selector sees (``slo.promql.lookup.select_range``):

1. fewer than 2 samples → no result (``None``: the series is absent from PromQL's output);
2. ``last - first``, plus, for counters, every value just before a drop (a drop is a reset);
3. extrapolate from the sampled interval towards the window edges: all the way to an edge if
   the gap to it is < 1.1 × the average sample spacing, else by half a spacing; for counters,
   never back past the point where the counter would have been zero;
4. ``rate`` divides by the range in seconds.

Step 3 differs between Prometheus 2.42 and 3.x in *when* the zero-point cap applies (see
``_extrapolation_factor``), and the window edges differ too (``slo.promql.lookup``). The arithmetic
is done in the same order as the Go code, one IEEE operation at a time, so results agree to the
last bit rather than merely to a tolerance.

Units: ``at_s``/``range_s`` seconds; ``rate`` per second; ``increase``/``delta`` in the
series' own unit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from slo.promql.floats import go_div
from slo.promql.lookup import (
    DEFAULT_SEMANTICS,
    BoolArray,
    FloatArray,
    IntArray,
    Semantics,
    SemanticsLike,
    Values,
    duration_ms,
    duration_seconds,
    eval_time_ms,
    prepare,
    semantics_of,
    take_window,
    window_bounds,
)

__all__ = ["delta", "extrapolated_rate", "increase", "rate"]


def _raw_change(vals: FloatArray, is_counter: bool) -> float:
    """``last - first`` plus, for counters, the value before each drop (extrapolatedRate).

    The additions happen in sample order, as Go's loop does them, so the float result is the
    same bit pattern. Only the resets are visited in Python: the scan for them is numpy.
    """
    result = float(vals[-1]) - float(vals[0])
    if is_counter:
        # `if currPoint.V < prevValue { resultValue += prevValue }` — NaN compares false, as in Go.
        drops = np.flatnonzero(vals[1:] < vals[:-1])
        for before in vals[drops]:
            result += float(before)
    return result


def _extrapolation_factor(
    first_t: int,
    last_t: int,
    n: int,
    first_value: float,
    result: float,
    range_start: int,
    range_end: int,
    is_counter: bool,
    semantics: Semantics,
) -> float:
    """The factor ``extrapolatedInterval / sampledInterval`` (not yet divided by the range).

    v2 (2.42 functions.go:112-151): the zero-point cap shortens ``durationToStart`` *before*
    the 1.1× threshold test, so a start gap that the cap brings under the threshold is
    extrapolated all the way to the zero point, and one the cap leaves above it gets half a
    spacing — even when that half spacing reaches below zero.
    v3 (functions.go, since prometheus#13725): the threshold test comes first (a far start
    becomes half a spacing), then the zero-point cap applies to whatever was chosen, so the
    extrapolation never reaches below zero.
    """
    # Go: float64(int64 ms difference) / 1000 — exact integer difference, one rounding.
    duration_to_start = float(first_t - range_start) / 1000
    duration_to_end = float(range_end - last_t) / 1000
    sampled_interval = float(last_t - first_t) / 1000
    average = sampled_interval / float(n - 1)
    threshold = average * 1.1

    if semantics is Semantics.V2:
        if is_counter and result > 0 and first_value >= 0:
            duration_to_zero = sampled_interval * (first_value / result)
            if duration_to_zero < duration_to_start:
                duration_to_start = duration_to_zero
        interval = sampled_interval
        interval += duration_to_start if duration_to_start < threshold else average / 2
        interval += duration_to_end if duration_to_end < threshold else average / 2
        return go_div(interval, sampled_interval)

    if duration_to_start >= threshold:
        duration_to_start = average / 2
    if is_counter:
        duration_to_zero = duration_to_start
        if result > 0 and first_value >= 0:
            duration_to_zero = sampled_interval * (first_value / result)
        if duration_to_zero < duration_to_start:
            duration_to_start = duration_to_zero
    if duration_to_end >= threshold:
        duration_to_end = average / 2
    # Duplicate timestamps would make sampled_interval 0: Go yields NaN/Inf, so do we.
    return go_div(sampled_interval + duration_to_start + duration_to_end, sampled_interval)


def extrapolated_rate(
    ts: IntArray,
    vals: FloatArray,
    range_start_ms: int,
    range_end_ms: int,
    range_seconds: float,
    *,
    is_counter: bool,
    is_rate: bool,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
) -> float | None:
    """Prometheus's ``extrapolatedRate`` over an already-selected window (no stale markers).

    ``ts`` int64 ms and ``vals`` float64 are the window's samples; ``range_start_ms`` and
    ``range_end_ms`` its edges (``t - range`` and ``t``); ``range_seconds`` is
    ``Duration.Seconds()`` of the range. ``None`` for fewer than two samples.
    """
    n = len(ts)
    if n < 2:
        return None
    sem = semantics_of(semantics)
    result = _raw_change(vals, is_counter)
    factor = _extrapolation_factor(
        int(ts[0]), int(ts[-1]), n, float(vals[0]), result,
        range_start_ms, range_end_ms, is_counter, sem,
    )
    if is_rate:
        factor = go_div(factor, range_seconds)
    return result * factor


def _evaluate(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    range_s: float,
    semantics: SemanticsLike,
    stale: Sequence[bool] | BoolArray | None,
    *,
    is_counter: bool,
    is_rate: bool,
) -> float | None:
    sem = semantics_of(semantics)
    ts, vals, mask = prepare(ts_ms, values, stale)
    at_ms = eval_time_ms(at_s)
    range_ms = duration_ms(range_s)
    lo, hi = window_bounds(ts, at_ms, range_ms, sem)
    if hi - lo < 2:
        return None
    t, v = take_window(ts, vals, mask, lo, hi)
    return extrapolated_rate(
        t, v, at_ms - range_ms, at_ms, duration_seconds(range_s),
        is_counter=is_counter, is_rate=is_rate, semantics=sem,
    )


def increase(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    range_s: float,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
    *,
    stale: Sequence[bool] | BoolArray | None = None,
) -> float | None:
    """PromQL ``increase(x[range_s])`` at ``at_s`` (funcIncrease): counter resets handled,
    extrapolated; in the counter's unit. ``None`` when the window has < 2 samples."""
    return _evaluate(ts_ms, values, at_s, range_s, semantics, stale, is_counter=True,
                     is_rate=False)


def rate(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    range_s: float,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
    *,
    stale: Sequence[bool] | BoolArray | None = None,
) -> float | None:
    """PromQL ``rate(x[range_s])`` at ``at_s`` (funcRate): ``increase`` per second of the range.

    ``None`` when the window has < 2 samples."""
    return _evaluate(ts_ms, values, at_s, range_s, semantics, stale, is_counter=True,
                     is_rate=True)


def delta(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    range_s: float,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
    *,
    stale: Sequence[bool] | BoolArray | None = None,
) -> float | None:
    """PromQL ``delta(x[range_s])`` at ``at_s`` (funcDelta): for gauges — no reset handling,
    no zero-point cap. ``None`` when the window has < 2 samples."""
    return _evaluate(ts_ms, values, at_s, range_s, semantics, stale, is_counter=False,
                     is_rate=False)
