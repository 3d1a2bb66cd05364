"""Vectors: per-series evaluation, ``sum by``, and vector division, as the PromQL engine does them.

PromQL computes ``rate``/``increase`` **per series first** and aggregates afterwards
(``sum by (pool) (rate(x[5m]))``); summing the raw counters first would turn every replica
restart into a huge negative "reset". These helpers keep that order.

A vector is a ``dict[Labels, float]`` (``vigil.model.Labels``: sorted ``(name, value)``
pairs, metric name not included — range functions drop it in PromQL too). A series absent
from the result (e.g. fewer than two samples in the window) is absent from the dict.

Float sums depend on the order and the algorithm, and the two Prometheus versions differ:
2.42 adds plainly in series order (engine.go ``aggregation``: ``group.value += s.V``), 3.x
uses Kahan–Neumaier compensated summation (``kahanSumInc``) and adds the compensation at the
end. The engine visits series in label-set order (the TSDB index is sorted), so we do too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from slo.promql.floats import go_div
from slo.promql.lookup import (
    DEFAULT_SEMANTICS,
    LOOKBACK_DELTA_S,
    BoolArray,
    Semantics,
    SemanticsLike,
    Values,
    instant_value,
    semantics_of,
)
from vigil.model import Labels

__all__ = [
    "SeriesData",
    "divide",
    "divide_vectors",
    "instant_vector",
    "per_series",
    "sum_by",
]

#: One series' samples: ``(ts_ms, values)`` or ``(ts_ms, values, stale_mask)``.
SeriesData = (
    tuple[Sequence[int] | npt.NDArray[np.integer], Values]
    | tuple[Sequence[int] | npt.NDArray[np.integer], Values, BoolArray | None]
)


def _unpack(data: SeriesData) -> tuple[Sequence[int] | npt.NDArray[np.integer], Values,
                                       BoolArray | None]:
    if len(data) == 3:
        return data[0], data[1], data[2]
    return data[0], data[1], None


def per_series(
    fn: Callable[..., float | None],
    series: Mapping[Labels, SeriesData],
    at_s: float,
    range_s: float,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
) -> dict[Labels, float]:
    """``fn(x[range_s])`` for every series at ``at_s`` — e.g. ``per_series(rate, ...)`` is the
    instant vector ``rate(x[5m])``. Series without a result are left out, as in PromQL."""
    sem = semantics_of(semantics)
    out: dict[Labels, float] = {}
    for labels, data in series.items():
        ts, values, stale = _unpack(data)
        value = fn(ts, values, at_s, range_s, sem, stale=stale)
        if value is not None:
            out[labels] = value
    return out


def instant_vector(
    series: Mapping[Labels, SeriesData],
    at_s: float,
    lookback_s: float = LOOKBACK_DELTA_S,
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
) -> dict[Labels, float]:
    """The instant selector ``x`` at ``at_s``: each series' latest value within the lookback,
    absent series (too old, or ended by a staleness marker) left out."""
    sem = semantics_of(semantics)
    out: dict[Labels, float] = {}
    for labels, data in series.items():
        ts, values, stale = _unpack(data)
        value = instant_value(ts, values, at_s, lookback_s, sem, stale=stale)
        if value is not None:
            out[labels] = value
    return out


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """``kahanSumInc`` (3.x promql): Neumaier's variant; the compensation resets on ±Inf."""
    t = total + inc
    if math.isinf(t):
        c = 0.0
    elif abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def sum_by(
    results: Mapping[Labels, float],
    by: Iterable[str] = (),
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
) -> dict[Labels, float]:
    """PromQL ``sum by (<by>) (v)`` of a vector; ``by=()`` is plain ``sum(v)`` (key ``()``).

    The output labels are the ``by`` labels a series has (a missing label groups as empty and
    is not in the key). Series are added in label-set order with the chosen version's
    algorithm, so the float result is the engine's, bit for bit. An empty input gives ``{}``
    (PromQL returns no series, not 0).
    """
    sem = semantics_of(semantics)
    keep = frozenset(by)
    totals: dict[Labels, list[float]] = {}  # key -> [sum, kahan compensation]
    for labels in sorted(results):
        value = float(results[labels])
        key = tuple((k, v) for k, v in labels if k in keep)
        acc = totals.get(key)
        if acc is None:
            totals[key] = [value, 0.0]  # the group starts with its first sample's value
        elif sem is Semantics.V2:
            acc[0] += value
        else:
            acc[0], acc[1] = _kahan_inc(value, acc[0], acc[1])
    if sem is Semantics.V2:
        return {key: acc[0] for key, acc in totals.items()}
    return {key: acc[0] + acc[1] for key, acc in totals.items()}


def divide(a: float, b: float) -> float:
    """IEEE-754 ``a / b`` as Go computes it: x/0 is ±Inf, 0/0 and NaN/x are NaN (Python raises
    ZeroDivisionError instead). For ratios such as good/total."""
    return go_div(a, b)


def divide_vectors(lhs: Mapping[Labels, float], rhs: Mapping[Labels, float]) -> dict[Labels, float]:
    """``lhs / rhs`` with PromQL's default one-to-one matching on identical label sets; series
    with no partner are dropped (e.g. ``sum(a) / sum(b)`` matches the two ``{}`` series)."""
    return {labels: divide(value, rhs[labels]) for labels, value in lhs.items() if labels in rhs}
