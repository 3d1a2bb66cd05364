"""``histogram_quantile`` and a bucket fraction for classic (``le``-bucketed) histograms.

``histogram_quantile`` mirrors ``bucketQuantile`` (promql/quantile.go) step by step: sort by
``le``, require a ``+Inf`` bucket, merge equal bounds, force the counts monotonic (2.42:
``ensureMonotonic``; 3.x: ``ensureMonotonicAndIgnoreSmallDeltas`` with tolerance 1e-12), then
binary-search the rank with Go's own ``sort.Search`` and interpolate linearly inside the bucket.

``bucket_fraction_below`` mirrors ``BucketFraction(-Inf, threshold)``, the classic-histogram
``histogram_fraction`` that Prometheus 3.x has (prometheus#16095, first-bucket fix #17424);
2.42's ``histogram_fraction`` only handles native histograms, so there is no 2.42 reference.

Inputs are ``(le, count)`` pairs: ``le`` the bucket's inclusive upper bound (seconds for
latency histograms), ``count`` the cumulative count — or, as in ``histogram_quantile(q,
rate(x_bucket[w]))``, its per-second rate or increase.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from slo.promql.aggregate import sum_by
from slo.promql.floats import go_div
from slo.promql.lookup import DEFAULT_SEMANTICS, Semantics, SemanticsLike, semantics_of
from vigil.model import Labels

__all__ = [
    "SMALL_DELTA_TOLERANCE",
    "Bucket",
    "bucket_fraction_below",
    "histogram_quantile",
    "histogram_quantile_over",
    "parse_le",
    "quantile_bounds",
]

#: ``(le, count)``: inclusive upper bound and cumulative count (or its rate/increase).
Bucket = tuple[float, float]

#: quantile.go ``smallDeltaTolerance`` (3.x): relative bucket differences below this are
#: treated as float noise by ``ensureMonotonicAndIgnoreSmallDeltas``.
SMALL_DELTA_TOLERANCE = 1e-12

_MIN_NORMAL = 2.2250738585072014e-308  # math.Float64frombits(0x0010000000000000)


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    """util/almost ``Equal``: relative difference below ``epsilon`` (NaN equals NaN)."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < epsilon * _MIN_NORMAL
    return diff / min(abs_sum, 1.7976931348623157e308) < epsilon


def _go_search(n: int, f: Callable[[int], bool]) -> int:
    """Go's ``sort.Search``, probe for probe: with NaN counts (non-monotonic predicates) a
    different binary search would land elsewhere."""
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not f(h):
            i = h + 1
        else:
            j = h
    return i


def _sorted_coalesced(buckets: Iterable[Bucket]) -> tuple[list[float], list[float]] | None:
    """Sort by ``le`` and merge equal bounds (``coalesceBuckets``); ``None`` if the highest
    bound is not +Inf (then PromQL answers NaN)."""
    pairs = sorted(((float(le), float(c)) for le, c in buckets), key=lambda b: b[0])
    if not pairs or not (math.isinf(pairs[-1][0]) and pairs[-1][0] > 0):
        return None
    les: list[float] = [pairs[0][0]]
    counts: list[float] = [pairs[0][1]]
    for le, c in pairs[1:]:
        if le == les[-1]:
            counts[-1] += c
        else:
            les.append(le)
            counts.append(c)
    return les, counts


def _ensure_monotonic_v2(counts: list[float]) -> None:
    """2.42 ``ensureMonotonic``: raise each count to the running maximum (the envelope)."""
    top = counts[0]
    for i in range(1, len(counts)):
        c = counts[i]
        if c > top:
            top = c
        elif c < top:
            counts[i] = top


def _ensure_monotonic_v3(counts: list[float]) -> None:
    """3.x ``ensureMonotonicAndIgnoreSmallDeltas``: first absorb relative differences below
    1e-12 in either direction (float noise), then remove decreases. ``prev`` only moves on a
    genuine increase, as in Go."""
    prev = counts[0]
    for i in range(1, len(counts)):
        curr = counts[i]
        if curr == prev:
            continue
        if _almost_equal(prev, curr, SMALL_DELTA_TOLERANCE):
            counts[i] = prev
            continue
        if curr < prev:
            counts[i] = prev
            continue
        prev = curr


def histogram_quantile(
    q: float, buckets: Iterable[Bucket], semantics: SemanticsLike = DEFAULT_SEMANTICS
) -> float:
    """PromQL ``histogram_quantile(q, b)`` for one classic histogram (``bucketQuantile``).

    ``q`` is a ratio 0-1. NaN ``q`` → NaN; ``q < 0`` → -Inf; ``q > 1`` → +Inf; no ``+Inf``
    bucket, fewer than 2 distinct bounds, or 0 observations → NaN. A quantile in the ``+Inf``
    bucket returns the second-highest bound; in the lowest bucket it interpolates from 0 (or
    returns that bucket's bound when it is ≤ 0). Returns the value in ``le``'s unit.
    """
    sem = semantics_of(semantics)
    q = float(q)
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    prepared = _monotonic(buckets, sem)
    if prepared is None:
        return math.nan
    les, counts = prepared
    n = len(les)
    if n < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = _go_search(n - 1, lambda i: counts[i] >= rank)
    if b == n - 1:
        return les[n - 2]
    if b == 0 and les[0] <= 0:
        return les[0]
    bucket_start = 0.0
    bucket_end = les[b]
    count = counts[b]
    if b > 0:
        bucket_start = les[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    # 0/0 is possible (q = 0 with an empty lowest bucket): NaN in Go, an exception in Python.
    return bucket_start + (bucket_end - bucket_start) * go_div(rank, count)


def _monotonic(buckets: Iterable[Bucket], sem: Semantics
               ) -> tuple[list[float], list[float]] | None:
    """The buckets sorted and coalesced, their counts made monotonic as ``sem`` does (the
    preparation ``histogram_quantile`` and ``quantile_bounds`` share); None without +Inf."""
    prepared = _sorted_coalesced(buckets)
    if prepared is None:
        return None
    les, counts = prepared
    if sem is Semantics.V2:
        _ensure_monotonic_v2(counts)
    else:
        _ensure_monotonic_v3(counts)
    return les, counts


def quantile_bounds(
    q: float, buckets: Iterable[Bucket], semantics: SemanticsLike = DEFAULT_SEMANTICS
) -> tuple[float, float] | None:
    """The bucket ``(lo, hi]`` that holds ``histogram_quantile(q, buckets)``: the same rank
    search, so the quantile is somewhere in it and the buckets say no more than that.

    The lowest bucket starts at 0 (as the interpolation does; at -Inf when its bound is ≤ 0);
    a quantile in the ``+Inf`` bucket gives ``(second-highest bound, +Inf)``. ``None`` where
    ``histogram_quantile`` answers NaN or ±Inf (no ``+Inf`` bucket, no observation, ``q``
    outside [0, 1]). Bounds in ``le``'s unit.
    """
    sem = semantics_of(semantics)
    q = float(q)
    if math.isnan(q) or q < 0 or q > 1:
        return None
    prepared = _monotonic(buckets, sem)
    if prepared is None:
        return None
    les, counts = prepared
    n = len(les)
    if n < 2 or counts[-1] == 0 or math.isnan(counts[-1]):
        return None
    rank = q * counts[-1]
    b = _go_search(n - 1, lambda i: counts[i] >= rank)
    if b == n - 1:
        return les[n - 2], math.inf
    if b == 0:
        return (0.0 if les[0] > 0 else -math.inf), les[0]
    return les[b - 1], les[b]


def bucket_fraction_below(threshold: float, buckets: Iterable[Bucket]) -> tuple[float, bool]:
    """Fraction (0-1) of observations ≤ ``threshold``, and whether it was interpolated.

    Mirrors Prometheus 3.x ``BucketFraction(-Inf, threshold, buckets)`` — i.e.
    ``histogram_fraction(-Inf, threshold, x_bucket)`` — including its heuristics: the lowest
    bucket starts at 0 when its bound is > 0 (else at -Inf, where all its observations are
    assumed at -Inf), and a threshold inside a bucket interpolates linearly as
    ``histogram_quantile`` does. As in Prometheus the counts are *not* forced monotonic here.

    ``interpolated`` is False when the answer is read straight off the buckets (``threshold``
    equals a bound, or is at/below the lowest bucket's lower bound) and True when it is an
    estimate from inside a bucket (including the ``+Inf`` bucket, which contributes nothing
    below any finite threshold). NaN results (no ``+Inf`` bucket, 0 observations, NaN
    threshold) report ``interpolated=False``.
    """
    upper = float(threshold)
    prepared = _sorted_coalesced(buckets)
    if prepared is None:
        return math.nan, False
    les, counts = prepared
    count = counts[-1]
    if count == 0 or math.isnan(upper):
        return math.nan, False
    if upper == -math.inf:  # Go's `lower >= upper` check, with lower = -Inf
        return 0.0, False

    # BucketFraction with lower = -Inf: lowerRank is set to 0 at the first bucket (its lower
    # bound is >= -Inf), so only the upper rank is searched for.
    rank = 0.0
    lower_bound = 0.0 if les[0] > 0 else -math.inf
    upper_rank = count
    interpolated = False
    found = False
    for i, (upper_bound, cum) in enumerate(zip(les, counts, strict=True)):
        if i > 0:
            lower_bound = les[i - 1]
        if lower_bound >= upper:
            upper_rank, found = rank, True
            break
        if lower_bound < upper < upper_bound:
            if lower_bound == -math.inf:
                upper_rank = cum
            else:
                # Go: rank + (b.Count-rank)*(v-lowerBound)/(upperBound-lowerBound); counts are
                # cumulative, so the bucket's own weight is cum - rank.
                upper_rank = rank + go_div(
                    (cum - rank) * (upper - lower_bound), upper_bound - lower_bound
                )
            found, interpolated = True, True
            break
        rank = cum
    lower_rank = 0.0
    if lower_rank > count:  # Go clamps both ranks to the count (only bites for counts < 0)
        lower_rank = count
    if not found or upper_rank > count:
        upper_rank = count
    return go_div(upper_rank - lower_rank, count), interpolated


def parse_le(value: str) -> float | None:
    """The ``le`` label as PromQL reads it (``strconv.ParseFloat``); ``None`` if malformed
    (PromQL silently skips such samples)."""
    if "_" in value:  # Python accepts digit separators, Go's ParseFloat (base 10) does not.
        return None
    try:
        return float(value)
    except ValueError:
        return None


def histogram_quantile_over(
    q: float,
    bucket_increases_by_series: Mapping[Labels, float],
    by: Iterable[str] = (),
    semantics: SemanticsLike = DEFAULT_SEMANTICS,
) -> dict[Labels, float]:
    """``histogram_quantile(q, sum by (le, <by>) (rate(x_bucket[w])))`` from per-series values.

    ``bucket_increases_by_series`` maps each bucket series' labels (with ``le``, without the
    metric name) to its ``rate`` or ``increase`` — computed per series first, as PromQL does.
    They are summed by ``by`` + ``le`` (``slo.promql.aggregate.sum_by``, same summation order and
    algorithm as the engine), grouped by ``by``, and each group's quantile is computed. Series
    with a malformed ``le`` are skipped. Keys of the result hold only the ``by`` labels.
    """
    by = tuple(by)
    if "le" in by:
        raise ValueError("'le' is always part of the grouping; do not list it in `by`")
    summed = sum_by(bucket_increases_by_series, (*by, "le"), semantics)
    groups: dict[Labels, list[Bucket]] = {}
    for labels, value in summed.items():
        le_text = next((v for k, v in labels if k == "le"), None)
        le = None if le_text is None else parse_le(le_text)
        if le is None:
            continue
        key = tuple((k, v) for k, v in labels if k != "le")
        groups.setdefault(key, []).append((le, value))
    return {key: histogram_quantile(q, b, semantics) for key, b in groups.items()}
