"""Hand-computed cases for the PromQL primitives (``slo.*``), one rule per test.

Expected values are written as the arithmetic Prometheus performs (same operations, same
order), so ``==`` checks the exact float, not an approximation. Times are small numbers of
seconds; series timestamps are ms. ``tests/test_promql_vs_prometheus.py`` checks the same
functions against a real Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slo.promql.aggregate import divide, divide_vectors, instant_vector, per_series, sum_by
from slo.promql.lookup import (
    duration_ms,
    duration_seconds,
    eval_time_ms,
    instant_value,
    prepare,
    select_range,
    semantics_of,
)
from slo.promql.quantile import (
    bucket_fraction_below,
    histogram_quantile,
    histogram_quantile_over,
    parse_le,
)
from slo.promql.rate import delta, increase, rate

INF = math.inf
BOTH = ("2", "3")


def ms(*seconds: float) -> list[int]:
    return [round(s * 1000) for s in seconds]


# -- time conversion ---------------------------------------------------------------------------


def test_eval_time_is_whole_milliseconds() -> None:
    assert eval_time_ms(1_750_000_000.123) == 1_750_000_000_123
    assert eval_time_ms(60) == 60_000


def test_eval_time_rounds_the_fraction_half_away_from_zero() -> None:
    # Go's math.Round(62.5) is 63; Python's round(62.5) would give 62.
    assert eval_time_ms(10.0625) == 10_063
    assert eval_time_ms(10.0624) == 10_062


def test_durations_convert_like_go_time_duration() -> None:
    assert duration_ms(300) == 300_000
    assert duration_ms(0.1) == 100
    assert duration_seconds(90) == 90.0
    assert duration_seconds(1.5) == 1.5


def test_semantics_must_be_2_or_3() -> None:
    assert semantics_of("2").value == "2"
    with pytest.raises(ValueError, match="'2' or '3'"):
        semantics_of("4")


# -- range selection ---------------------------------------------------------------------------


def test_range_includes_a_sample_on_the_left_edge_in_v2_only() -> None:
    ts, vals = ms(0, 15, 30, 45, 60), [1.0, 2.0, 3.0, 4.0, 5.0]
    v2 = select_range(ts, vals, at_s=60, range_s=60, semantics="2")
    v3 = select_range(ts, vals, at_s=60, range_s=60, semantics="3")
    assert v2.ts_ms.tolist() == ms(0, 15, 30, 45, 60)
    assert v3.ts_ms.tolist() == ms(15, 30, 45, 60)
    assert v3.values.tolist() == [2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("sem", BOTH)
def test_range_includes_the_sample_at_the_evaluation_time(sem: str) -> None:
    w = select_range(ms(10, 20), [1.0, 2.0], at_s=20, range_s=5, semantics=sem)
    assert w.ts_ms.tolist() == ms(20)


@pytest.mark.parametrize("sem", BOTH)
def test_range_ignores_later_samples(sem: str) -> None:
    w = select_range(ms(10, 20, 30), [1.0, 2.0, 3.0], at_s=25, range_s=60, semantics=sem)
    assert w.values.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("sem", BOTH)
def test_range_drops_stale_markers_and_keeps_the_rest(sem: str) -> None:
    w = select_range(ms(10, 20, 30), [1.0, None, 3.0], at_s=30, range_s=60, semantics=sem)
    assert w.ts_ms.tolist() == ms(10, 30)
    assert w.values.tolist() == [1.0, 3.0]


@pytest.mark.parametrize("sem", BOTH)
def test_range_of_an_empty_series_is_empty(sem: str) -> None:
    w = select_range([], [], at_s=30, range_s=60, semantics=sem)
    assert len(w.ts_ms) == 0 and len(w.values) == 0


def test_a_float_array_with_a_stale_mask_is_the_same_as_none_values() -> None:
    vals = np.array([1.0, np.nan, 3.0])
    w = select_range(ms(10, 20, 30), vals, 30, 60, stale=np.array([False, True, False]))
    assert w.values.tolist() == [1.0, 3.0]


def test_prepare_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="equally long"):
        prepare(ms(1, 2), [1.0])


def test_prepare_rejects_unsorted_or_duplicate_timestamps() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        prepare(ms(2, 1), [1.0, 2.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        rate(ms(1, 1, 2), [1.0, 2.0, 3.0], 2, 60)


# -- instant lookups ---------------------------------------------------------------------------


@pytest.mark.parametrize("sem", BOTH)
def test_instant_value_is_the_latest_sample_at_or_before_t(sem: str) -> None:
    ts, vals = ms(0, 100, 200), [1.0, 2.0, 3.0]
    assert instant_value(ts, vals, 150, semantics=sem) == 2.0
    assert instant_value(ts, vals, 200, semantics=sem) == 3.0


def test_lookback_edge_is_closed_in_v2_and_open_in_v3() -> None:
    assert instant_value(ms(0), [7.0], 300, semantics="2") == 7.0
    assert instant_value(ms(0), [7.0], 300, semantics="3") is None
    assert instant_value(ms(0), [7.0], 300.001, semantics="2") is None
    assert instant_value(ms(0), [7.0], 299.999, semantics="3") == 7.0


@pytest.mark.parametrize("sem", BOTH)
def test_instant_value_respects_a_custom_lookback(sem: str) -> None:
    assert instant_value(ms(0), [7.0], 61, lookback_s=60, semantics=sem) is None
    assert instant_value(ms(0), [7.0], 59, lookback_s=60, semantics=sem) == 7.0


@pytest.mark.parametrize("sem", BOTH)
def test_a_stale_marker_ends_the_series_at_once(sem: str) -> None:
    ts, vals = ms(0, 15, 60), [1.0, None, 4.0]
    assert instant_value(ts, vals, 14, semantics=sem) == 1.0
    assert instant_value(ts, vals, 15, semantics=sem) is None
    assert instant_value(ts, vals, 59, semantics=sem) is None  # not the older sample either
    assert instant_value(ts, vals, 60, semantics=sem) == 4.0   # a new sample revives it


@pytest.mark.parametrize("sem", BOTH)
def test_a_nan_sample_is_a_value_not_a_marker(sem: str) -> None:
    got = instant_value(ms(0), [math.nan], 1, semantics=sem)
    assert got is not None and math.isnan(got)


@pytest.mark.parametrize("sem", BOTH)
def test_no_sample_yet_is_absent(sem: str) -> None:
    assert instant_value(ms(10), [1.0], 9.999, semantics=sem) is None
    assert instant_value([], [], 10, semantics=sem) is None


# -- rate / increase / delta -------------------------------------------------------------------


@pytest.mark.parametrize("sem", BOTH)
def test_increase_of_samples_covering_the_window_is_not_extrapolated_beyond_it(sem: str) -> None:
    # v2 sees 0..60 (no gap to either edge); v3 drops t=0 and extrapolates 15 s back instead.
    ts, vals = ms(0, 15, 30, 45, 60), [100.0, 115.0, 130.0, 145.0, 160.0]
    expected = 60.0 if sem == "2" else 45.0 * ((45.0 + 15.0 + 0.0) / 45.0)
    assert increase(ts, vals, 60, 60, sem) == expected


@pytest.mark.parametrize("sem", BOTH)
def test_extrapolates_to_both_edges_when_gaps_are_short(sem: str) -> None:
    # Samples at 5..50 s, window (0, 60]: gaps 5 s and 10 s are < 1.1 × 15 s.
    ts, vals = ms(5, 20, 35, 50), [10.0, 20.0, 30.0, 40.0]
    assert increase(ts, vals, 60, 60, sem) == 30.0 * ((45.0 + 5.0 + 10.0) / 45.0)


@pytest.mark.parametrize("sem", BOTH)
def test_rate_divides_the_extrapolation_factor_by_the_range(sem: str) -> None:
    ts, vals = ms(5, 20, 35, 50), [10.0, 20.0, 30.0, 40.0]
    assert rate(ts, vals, 60, 60, sem) == 30.0 * ((45.0 + 5.0 + 10.0) / 45.0 / 60.0)


@pytest.mark.parametrize("sem", BOTH)
def test_a_far_edge_gets_half_an_average_interval(sem: str) -> None:
    # First sample 30 s after the window start (>= 16.5 s): extrapolate only 7.5 s back.
    ts, vals = ms(30, 45, 60), [100.0, 115.0, 130.0]
    assert increase(ts, vals, 60, 60, sem) == 30.0 * ((30.0 + 7.5 + 0.0) / 30.0)
    # Same at the end: last sample 40 s before the evaluation time.
    assert increase(ms(5, 20), [100.0, 115.0], 60, 60, sem) == 15.0 * ((15.0 + 5.0 + 7.5) / 15.0)


@pytest.mark.parametrize("sem", BOTH)
def test_counter_extrapolation_stops_at_zero(sem: str) -> None:
    # 1 → 31 in 30 s: the counter was 0 one second before the first sample.
    ts, vals = ms(30, 45, 60), [1.0, 16.0, 31.0]
    assert increase(ts, vals, 60, 60, sem) == 30.0 * ((30.0 + 1.0 + 0.0) / 30.0)


def test_zero_point_cap_applies_before_the_threshold_in_v2_and_after_it_in_v3() -> None:
    # First sample 30 s in (>= 16.5 s threshold); zero point 10 s before it (7.5 < 10 < 16.5).
    # 2.42: min(30, 10) = 10 is under the threshold → extrapolate 10 s.
    # 3.x: 30 s is over the threshold → 7.5 s, then min(7.5, 10) = 7.5.
    ts, vals = ms(30, 45, 60), [10.0, 25.0, 40.0]
    assert increase(ts, vals, 60, 60, "2") == 30.0 * ((30.0 + 10.0 + 0.0) / 30.0)
    assert increase(ts, vals, 60, 60, "3") == 30.0 * ((30.0 + 7.5 + 0.0) / 30.0)


@pytest.mark.parametrize("sem", BOTH)
def test_delta_has_no_zero_point_cap(sem: str) -> None:
    ts, vals = ms(30, 45, 60), [1.0, 16.0, 31.0]
    assert delta(ts, vals, 60, 60, sem) == 30.0 * ((30.0 + 7.5 + 0.0) / 30.0)


def test_a_counter_reset_adds_the_value_before_the_drop() -> None:
    ts, vals = ms(0, 15, 30, 45, 60), [10.0, 20.0, 5.0, 15.0, 25.0]
    # v2: 25 - 10 + 20, window edges on samples.
    assert increase(ts, vals, 60, 60, "2") == 25.0 - 10.0 + 20.0
    # v3 loses the sample at t=0: 25 - 20 + 20 over 45 s, extrapolated 15 s back.
    assert increase(ts, vals, 60, 60, "3") == (25.0 - 20.0 + 20.0) * ((45.0 + 15.0 + 0.0) / 45.0)


@pytest.mark.parametrize("sem", BOTH)
def test_every_reset_counts_and_equal_values_are_not_resets(sem: str) -> None:
    ts, vals = ms(5, 20, 35, 50), [8.0, 3.0, 3.0, 1.0]
    result = 1.0 - 8.0 + 8.0 + 3.0
    dz = 45.0 * (8.0 / result)  # 90 s: no cap
    assert dz > 5.0
    assert increase(ts, vals, 60, 60, sem) == result * ((45.0 + 5.0 + 10.0) / 45.0)


@pytest.mark.parametrize("sem", BOTH)
def test_delta_of_a_falling_gauge_has_no_reset_handling(sem: str) -> None:
    ts, vals = ms(10, 25, 40, 55), [10.0, 4.0, 7.0, 1.0]
    assert delta(ts, vals, 60, 60, sem) == -9.0 * ((45.0 + 10.0 + 5.0) / 45.0)
    # The same data as a counter: two resets (10 → 4, 7 → 1).
    assert increase(ts, vals, 60, 60, sem) == 8.0 * ((45.0 + 10.0 + 5.0) / 45.0)


@pytest.mark.parametrize("sem", BOTH)
def test_irregular_intervals_use_the_average_spacing(sem: str) -> None:
    ts, vals = ms(3, 11, 40, 52), [100.0, 104.0, 110.0, 112.0]
    # average 49/3 s, threshold 17.97 s: 3 s and 8 s gaps both extrapolate to the edge.
    assert increase(ts, vals, 60, 60, sem) == 12.0 * ((49.0 + 3.0 + 8.0) / 49.0)


@pytest.mark.parametrize("sem", BOTH)
def test_a_gap_inside_the_window_widens_the_threshold(sem: str) -> None:
    # 10, 25, 40, then nothing until 250 and 265: average 63.75 s, so the 35 s end gap
    # still extrapolates all the way.
    ts, vals = ms(10, 25, 40, 250, 265), [100.0, 101.0, 102.0, 103.0, 104.0]
    assert increase(ts, vals, 300, 300, sem) == 4.0 * ((255.0 + 10.0 + 35.0) / 255.0)


@pytest.mark.parametrize("sem", BOTH)
def test_stale_markers_are_skipped_by_rate(sem: str) -> None:
    with_marker = increase(ms(5, 20, 35, 50), [10.0, None, 30.0, 40.0], 60, 60, sem)
    without = increase(ms(5, 35, 50), [10.0, 30.0, 40.0], 60, 60, sem)
    assert with_marker == without == 30.0 * ((45.0 + 5.0 + 10.0) / 45.0)


@pytest.mark.parametrize("sem", BOTH)
@pytest.mark.parametrize("fn", [rate, increase, delta])
def test_fewer_than_two_samples_is_absent(sem: str, fn: Callable[..., float | None]) -> None:
    assert fn([], [], 60, 60, sem) is None
    assert fn(ms(30), [5.0], 60, 60, sem) is None
    assert fn(ms(30, 45), [5.0, None], 60, 60, sem) is None  # the marker doesn't count
    assert fn(ms(0, 10), [5.0, 6.0], 200, 60, sem) is None   # both older than the window


@pytest.mark.parametrize("sem", BOTH)
def test_a_nan_sample_makes_the_rate_nan(sem: str) -> None:
    got = rate(ms(5, 20, 35, 50), [10.0, math.nan, 30.0, 40.0], 60, 60, sem)
    assert got is not None and not math.isnan(got)  # NaN in the middle: only first/last count
    got = rate(ms(5, 20, 35, 50), [10.0, 20.0, 30.0, math.nan], 60, 60, sem)
    assert got is not None and math.isnan(got)


@pytest.mark.parametrize("sem", BOTH)
def test_range_function_accepts_numpy_inputs(sem: str) -> None:
    ts = np.array(ms(5, 20, 35, 50), dtype=np.int64)
    vals = np.array([10.0, 20.0, 30.0, 40.0])
    assert rate(ts, vals, 60, 60, sem) == rate(list(ts), list(vals), 60, 60, sem)


# -- histogram_quantile ------------------------------------------------------------------------

BUCKETS = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]


@pytest.mark.parametrize("sem", BOTH)
def test_quantile_interpolates_linearly_inside_the_bucket(sem: str) -> None:
    # rank 20 falls in (0.1, 0.5] holding 20 observations, 10 of them below the rank.
    assert histogram_quantile(0.5, BUCKETS, sem) == 0.1 + (0.5 - 0.1) * (10.0 / 20.0)


@pytest.mark.parametrize("sem", BOTH)
def test_the_lowest_bucket_starts_at_zero(sem: str) -> None:
    assert histogram_quantile(0.1, BUCKETS, sem) == 0.0 + (0.1 - 0.0) * (4.0 / 10.0)


@pytest.mark.parametrize("sem", BOTH)
def test_a_non_positive_lowest_bucket_returns_its_bound(sem: str) -> None:
    assert histogram_quantile(0.2, [(-1.0, 5.0), (0.0, 10.0), (INF, 10.0)], sem) == -1.0


@pytest.mark.parametrize("sem", BOTH)
def test_a_quantile_in_the_inf_bucket_returns_the_second_highest_bound(sem: str) -> None:
    assert histogram_quantile(0.5, [(1.0, 10.0), (2.0, 20.0), (INF, 100.0)], sem) == 2.0


@pytest.mark.parametrize("sem", BOTH)
def test_quantile_edge_cases_are_nan(sem: str) -> None:
    assert math.isnan(histogram_quantile(0.5, [(INF, 10.0)], sem))  # only +Inf
    assert math.isnan(histogram_quantile(0.5, [(1.0, 5.0), (2.0, 10.0)], sem))  # no +Inf
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)], sem))  # no observations
    assert math.isnan(histogram_quantile(0.5, [], sem))
    assert math.isnan(histogram_quantile(math.nan, BUCKETS, sem))


@pytest.mark.parametrize("sem", BOTH)
def test_q_0_with_an_empty_lowest_bucket_is_nan(sem: str) -> None:
    # rank 0 lands in the lowest bucket, which holds 0 observations: 0 * (0/0) in Go.
    assert math.isnan(histogram_quantile(0.0, [(1.0, 0.0), (2.0, 5.0), (INF, 5.0)], sem))


@pytest.mark.parametrize("sem", BOTH)
def test_q_outside_0_1_is_infinite_whatever_the_buckets(sem: str) -> None:
    assert histogram_quantile(-0.1, BUCKETS, sem) == -INF
    assert histogram_quantile(1.1, BUCKETS, sem) == INF
    assert histogram_quantile(2.0, [], sem) == INF


@pytest.mark.parametrize("sem", BOTH)
def test_q_0_and_1(sem: str) -> None:
    assert histogram_quantile(0.0, BUCKETS, sem) == 0.0
    assert histogram_quantile(1.0, BUCKETS, sem) == 0.5 + (1.0 - 0.5) * (10.0 / 10.0)


@pytest.mark.parametrize("sem", BOTH)
def test_unsorted_buckets_are_sorted_by_le(sem: str) -> None:
    assert histogram_quantile(0.5, list(reversed(BUCKETS)), sem) == \
        histogram_quantile(0.5, BUCKETS, sem)


@pytest.mark.parametrize("sem", BOTH)
def test_duplicate_bounds_are_merged(sem: str) -> None:
    assert histogram_quantile(0.5, [(1.0, 5.0), (1.0, 5.0), (INF, 20.0)], sem) == 1.0


@pytest.mark.parametrize("sem", BOTH)
def test_non_monotonic_counts_are_raised_to_the_running_maximum(sem: str) -> None:
    b = [(1.0, 10.0), (2.0, 8.0), (3.0, 15.0), (INF, 20.0)]  # 8 is read as 10
    rank = 0.6 * 20.0
    assert histogram_quantile(0.6, b, sem) == 2.0 + (3.0 - 2.0) * ((rank - 10.0) / (15.0 - 10.0))


def test_v3_ignores_float_noise_between_buckets_and_v2_does_not() -> None:
    eps = 1e-11  # relative 5e-14 < 1e-12: noise to 3.x, a real (tiny) bucket to 2.42
    b = [(1.0, 100.0), (2.0, 100.0 + eps), (3.0, 100.0 + eps), (INF, 300.0)]
    q = (100.0 + eps / 2) / 300.0
    rank = q * 300.0
    assert histogram_quantile(q, b, "2") == 1.0 + (2.0 - 1.0) * (
        (rank - 100.0) / ((100.0 + eps) - 100.0))
    # 3.x flattens both to 100, so no bucket below +Inf reaches the rank.
    assert histogram_quantile(q, b, "3") == 3.0


# -- bucket fraction ---------------------------------------------------------------------------

FRAC = [(0.5, 30.0), (1.0, 40.0), (INF, 50.0)]


def test_fraction_at_a_bucket_bound_is_exact() -> None:
    assert bucket_fraction_below(1.0, FRAC) == (40.0 / 50.0, False)
    assert bucket_fraction_below(0.5, FRAC) == (30.0 / 50.0, False)


def test_fraction_inside_a_bucket_is_interpolated() -> None:
    expected = (30.0 + (40.0 - 30.0) * (0.75 - 0.5) / (1.0 - 0.5)) / 50.0
    assert bucket_fraction_below(0.75, FRAC) == (expected, True)


def test_fraction_in_the_lowest_bucket_interpolates_from_zero() -> None:
    assert bucket_fraction_below(0.25, FRAC) == ((0.0 + 30.0 * 0.25 / 0.5) / 50.0, True)


def test_fraction_at_or_below_zero_is_zero() -> None:
    assert bucket_fraction_below(0.0, FRAC) == (0.0, False)
    assert bucket_fraction_below(-1.0, FRAC) == (0.0, False)


def test_fraction_inside_the_inf_bucket_counts_nothing_above_the_last_bound() -> None:
    assert bucket_fraction_below(5.0, FRAC) == (40.0 / 50.0, True)
    assert bucket_fraction_below(INF, FRAC) == (1.0, False)


def test_fraction_with_a_non_positive_lowest_bucket_puts_it_at_minus_inf() -> None:
    # Prometheus (since #17424): a first bucket (-Inf, -1] counts wholly below any threshold
    # inside it.
    assert bucket_fraction_below(-2.0, [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == (0.5, True)


def test_fraction_edge_cases_are_nan() -> None:
    for threshold, buckets in ((1.0, [(1.0, 5.0), (2.0, 10.0)]), (1.0, [(1.0, 0.0), (INF, 0.0)]),
                               (math.nan, FRAC), (1.0, [])):
        value, interpolated = bucket_fraction_below(threshold, buckets)
        assert math.isnan(value) and interpolated is False


def test_fraction_is_the_inverse_of_the_quantile_at_bounds() -> None:
    assert bucket_fraction_below(histogram_quantile(0.8, FRAC), FRAC) == (0.8, False)


# -- vectors and aggregation -------------------------------------------------------------------

A = (("instance", "a"), ("pool", "p"))
B = (("instance", "b"), ("pool", "p"))
C = (("instance", "c"), ("pool", "q"))
D = (("instance", "d"),)


@pytest.mark.parametrize("sem", BOTH)
def test_sum_by_groups_on_the_by_labels_only(sem: str) -> None:
    v = {A: 1.0, B: 2.0, C: 4.0, D: 8.0}
    assert sum_by(v, ("pool",), sem) == {(("pool", "p"),): 3.0, (("pool", "q"),): 4.0, (): 8.0}
    assert sum_by(v, (), sem) == {(): 15.0}
    assert sum_by({}, ("pool",), sem) == {}


def test_sum_is_plain_in_v2_and_compensated_in_v3() -> None:
    v = {A: 1e16, B: 1.0, C: -1e16}  # added in label order a, b, c
    assert sum_by(v, (), "2") == {(): (1e16 + 1.0) - 1e16}  # == 0.0: the 1 is lost
    assert sum_by(v, (), "3") == {(): 1.0}


def test_divide_is_ieee() -> None:
    assert divide(1.0, 0.0) == INF
    assert divide(-1.0, 0.0) == -INF
    assert divide(1.0, -0.0) == -INF
    assert math.isnan(divide(0.0, 0.0))
    assert math.isnan(divide(math.nan, 0.0))
    assert divide(1.0, 4.0) == 0.25


def test_divide_vectors_matches_identical_label_sets() -> None:
    assert divide_vectors({A: 1.0, B: 2.0}, {A: 4.0, C: 1.0}) == {A: 0.25}
    assert divide_vectors({(): 3.0}, {(): 0.0}) == {(): INF}


@pytest.mark.parametrize("sem", BOTH)
def test_per_series_leaves_out_series_without_a_result(sem: str) -> None:
    series = {A: (ms(5, 20, 35, 50), [10.0, 20.0, 30.0, 40.0]), B: (ms(50), [1.0])}
    assert per_series(increase, series, 60, 60, sem) == {
        A: 30.0 * ((45.0 + 5.0 + 10.0) / 45.0)}


@pytest.mark.parametrize("sem", BOTH)
def test_instant_vector_drops_stale_and_old_series(sem: str) -> None:
    series = {A: (ms(0, 10), [1.0, 2.0]), B: (ms(0, 10), [1.0, None]), C: (ms(0), [5.0])}
    assert instant_vector(series, 400, semantics=sem) == {}
    assert instant_vector(series, 20, semantics=sem) == {A: 2.0, C: 5.0}


@pytest.mark.parametrize("sem", BOTH)
def test_histogram_quantile_over_sums_buckets_by_le_first(sem: str) -> None:
    def bucket(instance: str, le: str) -> tuple[tuple[str, str], ...]:
        return (("instance", instance), ("le", le))

    per_replica = {
        bucket("a", "1.0"): 3.0, bucket("a", "2.0"): 4.0, bucket("a", "+Inf"): 4.0,
        bucket("b", "1.0"): 1.0, bucket("b", "2.0"): 4.0, bucket("b", "+Inf"): 4.0,
        bucket("b", "bogus"): 99.0,  # malformed le: ignored, as PromQL does
    }
    # Summed: le 1 → 4, le 2 → 8, +Inf → 8; q=0.75: rank 6 in (1, 2] holding 4, 2 below.
    assert histogram_quantile_over(0.75, per_replica, (), sem) == {
        (): 1.0 + (2.0 - 1.0) * (2.0 / 4.0)}
    per_instance = histogram_quantile_over(0.75, per_replica, ("instance",), sem)
    assert per_instance == {
        (("instance", "a"),): 0.0 + (1.0 - 0.0) * (3.0 / 3.0),
        (("instance", "b"),): 1.0 + (2.0 - 1.0) * (2.0 / 3.0),
    }


def test_histogram_quantile_over_refuses_le_in_by() -> None:
    with pytest.raises(ValueError, match="'le'"):
        histogram_quantile_over(0.5, {}, ("le",))


def test_parse_le_reads_what_go_reads() -> None:
    assert parse_le("+Inf") == INF
    assert parse_le("1.0") == 1.0
    assert parse_le("1e-3") == 0.001
    assert parse_le("1_0") is None
    assert parse_le("") is None


# -- properties (seeded, always run) -----------------------------------------------------------


def _random_counter(rng: np.random.Generator, n: int) -> tuple[list[int], list[float]]:
    ts = np.cumsum(rng.integers(1_000, 30_000, size=n)).tolist()
    vals, v = [], float(rng.integers(0, 1000))
    for _ in range(n):
        v = float(rng.integers(0, 50)) if rng.random() < 0.1 else v + float(rng.integers(0, 40))
        vals.append(v)
    return ts, vals


@pytest.mark.parametrize("sem", BOTH)
def test_counter_rates_are_never_negative_seeded(sem: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        ts, vals = _random_counter(rng, int(rng.integers(2, 40)))
        at = (ts[-1] + int(rng.integers(0, 60_000))) / 1000
        for window in (30, 90, 300):
            r = rate(ts, vals, at, window, sem)
            assert r is None or r >= 0


@pytest.mark.parametrize("sem", BOTH)
def test_quantile_is_monotone_in_q_seeded(sem: str) -> None:
    rng = np.random.default_rng(11)
    qs = np.linspace(0, 1, 41)
    for _ in range(200):
        les = np.sort(rng.choice(np.arange(1, 200) / 10, size=int(rng.integers(1, 12)),
                                 replace=False)).tolist()
        counts = np.cumsum(rng.integers(0, 20, size=len(les) + 1)).astype(float).tolist()
        buckets = [*zip(les, counts[:-1], strict=True), (INF, counts[-1])]
        values = [histogram_quantile(float(q), buckets, sem) for q in qs]
        finite = [v for v in values if not math.isnan(v)]
        assert finite == sorted(finite)


# -- properties (hypothesis) -------------------------------------------------------------------

# Integer-valued counters (request/token counts) keep the arithmetic exact, so the
# property is about the algorithm, not about float rounding.
_steps = st.lists(
    st.tuples(st.integers(1, 60_000), st.integers(0, 1_000), st.booleans(),
              st.integers(0, 50)),
    min_size=1, max_size=60,
)


def _counter_from(steps: list[tuple[int, int, bool, int]]) -> tuple[list[int], list[float]]:
    ts, vals, t, v = [], [], 1_000_000, 0
    for dt, inc, reset, restart in steps:
        t += dt
        v = restart if reset else v + inc
        ts.append(t)
        vals.append(float(v))
    return ts, vals


@settings(max_examples=300, deadline=None, database=None)
@given(steps=_steps, after=st.integers(0, 120_000),
       window=st.sampled_from([15, 30, 90, 300, 3600]), sem=st.sampled_from(BOTH))
def test_property_counter_rate_is_never_negative(
    steps: list[tuple[int, int, bool, int]], after: int, window: int, sem: str
) -> None:
    ts, vals = _counter_from(steps)
    at = (ts[-1] + after) / 1000
    for fn in (rate, increase):
        got = fn(ts, vals, at, window, sem)
        assert got is None or got >= 0


@settings(max_examples=300, deadline=None, database=None)
@given(steps=_steps, after=st.integers(0, 120_000),
       window=st.sampled_from([30, 90, 300]), sem=st.sampled_from(BOTH))
def test_property_rate_is_increase_per_second(
    steps: list[tuple[int, int, bool, int]], after: int, window: int, sem: str
) -> None:
    ts, vals = _counter_from(steps)
    at = (ts[-1] + after) / 1000
    r, i = rate(ts, vals, at, window, sem), increase(ts, vals, at, window, sem)
    assert (r is None) == (i is None)
    if r is not None and i is not None:
        assert math.isclose(r * window, i, rel_tol=1e-12, abs_tol=1e-12)


_histogram = st.lists(st.tuples(st.integers(1, 100_000), st.integers(0, 500)),
                      min_size=1, max_size=25, unique_by=lambda b: b[0])


def _buckets_from(raw: list[tuple[int, int]], inf_extra: int) -> list[tuple[float, float]]:
    total, out = 0.0, []
    for le, n in sorted(raw):
        total += n
        out.append((le / 1000, total))
    return [*out, (INF, total + inf_extra)]


@settings(max_examples=300, deadline=None, database=None)
@given(raw=_histogram, inf_extra=st.integers(0, 500),
       qs=st.lists(st.floats(0, 1), min_size=2, max_size=20), sem=st.sampled_from(BOTH))
def test_property_quantile_is_monotone_in_q(
    raw: list[tuple[int, int]], inf_extra: int, qs: list[float], sem: str
) -> None:
    buckets = _buckets_from(raw, inf_extra)
    values = [histogram_quantile(q, buckets, sem) for q in sorted(qs)]
    finite = [v for v in values if not math.isnan(v)]
    assert finite == sorted(finite)


@settings(max_examples=300, deadline=None, database=None)
@given(raw=_histogram, q=st.floats(0.001, 0.999))
def test_property_fraction_inverts_the_quantile(raw: list[tuple[int, int]], q: float) -> None:
    buckets = _buckets_from([(le, n + 1) for le, n in raw], 0)  # every bucket non-empty
    total = buckets[-1][1]
    assume(len(buckets) >= 2 and q * total < buckets[-2][1])  # below the +Inf bucket
    value = histogram_quantile(q, buckets, "3")
    fraction, _ = bucket_fraction_below(value, buckets)
    assert math.isclose(fraction, q, rel_tol=1e-9, abs_tol=1e-12)
