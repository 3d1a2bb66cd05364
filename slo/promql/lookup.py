"""Which samples PromQL sees: range selectors (``x[5m]``) and instant lookups (``x``).

Everything here mirrors the Prometheus engine (``promql/engine.go``) for one series at one
evaluation time, in two flavours (see ``docs/promql-semantics.md`` for citations):

* ``Semantics.V2`` — Prometheus 2.42 (Debian bookworm's build, our bit-for-bit reference):
  a range ``[r]`` at ``t`` holds the samples with ``t - r <= ts <= t`` (left-closed), and an
  instant lookup takes the newest sample with ``t - 5m <= ts <= t``.
* ``Semantics.V3`` — Prometheus 3.x (the default): both are left-open, ``t - r < ts <= t`` and
  ``t - 5m < ts <= t``; a sample exactly on the left edge is not seen.

In both, staleness markers are skipped by range selectors and end an instant lookup.

Units: stored timestamps are Unix **milliseconds** (``int``); evaluation times and durations are
**seconds** (``float``) at the API and are converted once, with the same rounding Prometheus's
HTTP API and duration types apply, so "evaluate at ``t``" here means exactly what
``/api/v1/query?time=t`` means there. The evaluation time is always passed in, never read
from a clock.

A series is given as ``ts_ms`` (ascending, unique) and ``values``: floats with ``None`` for a
staleness marker (our store's encoding, ``vigil.model.STALE``). A real NaN sample is a value,
not a marker. For hot loops, convert once with ``prepare`` and pass the float array plus its
``stale`` mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from slo.promql.floats import go_round

__all__ = [
    "DEFAULT_SEMANTICS",
    "LOOKBACK_DELTA_S",
    "Semantics",
    "SemanticsLike",
    "Window",
    "duration_ms",
    "duration_seconds",
    "eval_time_ms",
    "instant_value",
    "prepare",
    "select_range",
    "semantics_of",
    "take_window",
    "window_bounds",
]


class Semantics(StrEnum):
    """Which Prometheus's PromQL to reproduce."""

    V2 = "2"  #: Prometheus 2.42 (left-closed ranges and lookback).
    V3 = "3"  #: Prometheus 3.x (left-open ranges and lookback).


#: A ``Semantics`` or its value, ``"2"`` or ``"3"``.
SemanticsLike = Semantics | Literal["2", "3"]

DEFAULT_SEMANTICS = Semantics.V3

#: Prometheus's default ``--query.lookback-delta`` (engine.go ``defaultLookbackDelta``), seconds.
LOOKBACK_DELTA_S = 300.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: Sample values as accepted by the public functions: floats, ``None`` for a stale marker.
Values = Sequence[float | None] | npt.NDArray[np.generic]


def semantics_of(semantics: SemanticsLike | str) -> Semantics:
    """Normalise ``"2"``/``"3"``/``Semantics`` to ``Semantics``; anything else is a ValueError."""
    try:
        return Semantics(str(semantics))
    except ValueError:
        raise ValueError(f"semantics must be '2' or '3', not {semantics!r}") from None


def eval_time_ms(at_s: float) -> int:
    """The engine timestamp (Unix ms) that Prometheus evaluates at for ``time=at_s``.

    Mirrors ``parseTime`` in web/api/v1/api.go (split into seconds and a fraction, the fraction
    rounded to ms) followed by ``timestamp.FromTime``, so ``eval_time_ms(t)`` is what
    ``/api/v1/query?time=<repr(t)>`` uses.
    """
    at_s = float(at_s)
    if not math.isfinite(at_s):
        raise ValueError(f"evaluation time must be finite, not {at_s!r}")
    frac, whole = math.modf(at_s)
    frac = go_round(frac * 1000) / 1000
    # time.Unix(sec, int64(frac*1e9)): int64() truncates toward zero, then Unix normalises the
    # nanoseconds into [0, 1e9) and FromTime floors them to milliseconds.
    total_ns = int(whole) * 1_000_000_000 + int(frac * 1e9)
    sec, nsec = divmod(total_ns, 1_000_000_000)
    return sec * 1000 + nsec // 1_000_000


def _duration_ns(d_s: float) -> int:
    d_s = float(d_s)
    if not math.isfinite(d_s) or d_s < 0:
        raise ValueError(f"duration must be a finite number of seconds >= 0, not {d_s!r}")
    # PromQL durations are whole milliseconds or coarser; rounding to ns only absorbs the
    # binary representation error of e.g. 0.1 s.
    return round(d_s * 1e9)


def duration_ms(d_s: float) -> int:
    """``durationMilliseconds(time.Duration)`` (engine.go) for a duration given in seconds."""
    return _duration_ns(d_s) // 1_000_000


def duration_seconds(d_s: float) -> float:
    """``time.Duration.Seconds()`` for a duration given in seconds: whole + fractional part.

    Identical to ``d_s`` for whole seconds; spelled out so ``rate`` divides by exactly the
    float Go divides by.
    """
    ns = _duration_ns(d_s)
    sec, nsec = divmod(ns, 1_000_000_000)
    return float(sec) + float(nsec) / 1e9


def prepare(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    stale: Sequence[bool] | BoolArray | None = None,
) -> tuple[IntArray, FloatArray, BoolArray | None]:
    """Convert a series once: ``(ts int64 ms, values float64, stale mask or None)``.

    ``values`` may hold ``None`` (a staleness marker); it becomes NaN in the float array and
    ``True`` in the mask. A float array has no markers unless ``stale`` says so. The mask is
    ``None`` when there is no marker at all (the fast path everywhere). Raises ValueError for
    unequal lengths or timestamps that are not strictly increasing.
    """
    ts = np.asarray(ts_ms, dtype=np.int64)
    if isinstance(values, np.ndarray) and values.dtype.kind in "fiu":
        vals = values.astype(np.float64, copy=False)
        mask = None if stale is None else np.asarray(stale, dtype=np.bool_)
    else:
        seq = list(values)
        marker = np.fromiter((v is None for v in seq), dtype=np.bool_, count=len(seq))
        vals = np.fromiter(
            (math.nan if v is None else float(v) for v in seq), dtype=np.float64, count=len(seq)
        )
        if stale is not None:
            marker |= np.asarray(stale, dtype=np.bool_)
        mask = marker
    if ts.shape != vals.shape or ts.ndim != 1:
        raise ValueError(
            f"ts_ms and values must be 1-d and equally long: {ts.shape} vs {vals.shape}"
        )
    if ts.size > 1 and not bool(np.all(ts[1:] > ts[:-1])):
        # searchsorted on unsorted input would silently pick the wrong window.
        raise ValueError("ts_ms must be strictly increasing (one sample per millisecond)")
    if mask is not None:
        if mask.shape != vals.shape:
            raise ValueError("stale mask must be as long as values")
        if not mask.any():
            mask = None
    return ts, vals, mask


def window_bounds(
    ts: IntArray, at_ms: int, range_ms: int, semantics: Semantics
) -> tuple[int, int]:
    """Index slice ``[lo, hi)`` of the samples in the range ending at ``at_ms``.

    Mirrors ``matrixIterSlice`` (engine.go): v2 keeps ``ts >= mint`` (2.42 engine.go:1900, :1913),
    v3 keeps ``ts > mint``; both keep ``ts <= maxt`` (the sought sample ``t == maxt``).
    """
    mint = at_ms - range_ms
    if semantics is Semantics.V2:
        lo = int(np.searchsorted(ts, mint, side="left"))
    else:
        if mint == at_ms:  # v3: "Empty range: return the empty slices."
            return 0, 0
        lo = int(np.searchsorted(ts, mint, side="right"))
    hi = int(np.searchsorted(ts, at_ms, side="right"))
    return lo, max(lo, hi)


class Window(NamedTuple):
    """The samples a range selector sees, stale markers dropped."""

    ts_ms: IntArray  #: Unix milliseconds, ascending.
    values: FloatArray  #: Sample values (NaN only for a real NaN sample).


def take_window(
    ts: IntArray, vals: FloatArray, mask: BoolArray | None, lo: int, hi: int
) -> tuple[IntArray, FloatArray]:
    """Samples ``[lo, hi)`` of a prepared series (see ``window_bounds``), stale markers dropped."""
    t, v = ts[lo:hi], vals[lo:hi]
    if mask is not None:
        # matrixIterSlice: `if value.IsStaleNaN(v) { continue loop }` — markers are skipped,
        # the samples around them are kept.
        keep = ~mask[lo:hi]
        if not keep.all():
            t, v = t[keep], v[keep]
    return t, v


def select_range(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    range_s: float,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
    *,
    stale: Sequence[bool] | BoolArray | None = None,
) -> Window:
    """The samples ``x[range_s]`` sees when evaluated at ``at_s`` (seconds), stale markers dropped.

    Returns ``Window(ts_ms, values)`` (int64 ms, float64). ``ts_ms`` must be ascending.
    """
    sem = semantics_of(semantics)
    ts, vals, mask = prepare(ts_ms, values, stale)
    lo, hi = window_bounds(ts, eval_time_ms(at_s), duration_ms(range_s), sem)
    return Window(*take_window(ts, vals, mask, lo, hi))


def instant_value(
    ts_ms: Sequence[int] | npt.NDArray[np.integer],
    values: Values,
    at_s: float,
    lookback_s: float = LOOKBACK_DELTA_S,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
    *,
    stale: Sequence[bool] | BoolArray | None = None,
) -> float | None:
    """The value an instant selector ``x`` returns at ``at_s``; ``None`` when the series is absent.

    Mirrors ``vectorSelectorSingle`` (engine.go): the newest sample at or before ``at_s``,
    provided it is within the lookback delta (v2: ``ts >= t - lookback``, v3: ``ts > t -
    lookback``) and is not a staleness marker. A NaN sample is returned as NaN.
    """
    sem = semantics_of(semantics)
    ts, vals, mask = prepare(ts_ms, values, stale)
    at_ms = eval_time_ms(at_s)
    i = int(np.searchsorted(ts, at_ms, side="right")) - 1
    if i < 0:
        return None
    oldest = at_ms - duration_ms(lookback_s)
    t = int(ts[i])
    if t < oldest or (sem is Semantics.V3 and t == oldest):
        return None
    if mask is not None and mask[i]:
        return None
    return float(vals[i])
