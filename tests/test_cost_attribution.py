"""The attribution rule (``slo.cost.attribution``) and the prices it bills at
(``slo.cost.prices``): hand-computed cases, and a property over random histories: every
request's cost + idle + unattributed = the pool's cost, nothing negative."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo.cost.attribution import Run, attribute, cents, merge_intervals
from slo.cost.prices import PoolPrices, pool_prices
from vigil.config import parse_config

#: $3.60 a GPU-hour, one GPU: $0.001 a replica-second.
FLAT = PoolPrices(1, ((-math.inf, 3.6),), (), ())


def test_requests_share_a_moment_by_what_they_ask_per_second() -> None:
    # 0-100: a in decode (1 token/s) and b in decode (3 tokens/s): a pays 1/4 of the time.
    runs = [Run(1, "r", 0, 0.0, 100, 0.0, 100.0), Run(2, "r", 0, 0.0, 100, 0.0, 300.0)]
    got = attribute(0, 100, {"r": [(0, 100)]}, FLAT, runs)
    assert got.cost[1] == pytest.approx(0.025) and got.cost[2] == pytest.approx(0.075)
    assert got.idle_cost == 0.0 and got.total_cost == pytest.approx(0.1)


def test_cached_prompt_tokens_cost_less_than_computed_ones() -> None:
    # The same 1000-token prompts side by side; one had 900 from the prefix cache.
    pw, cw = 0.25, 0.025
    computed = Run(1, "r", 0, 10.0, 10.0 + 1e-9, 1000 * pw, 0.0)
    cached = Run(2, "r", 0, 10.0, 10.0 + 1e-9, 100 * pw + 900 * cw, 0.0)
    got = attribute(0, 10, {"r": [(0, 10)]}, FLAT, [computed, cached])
    assert got.cost[1] / got.cost[2] == pytest.approx(250 / 47.5)


def test_a_request_with_unknown_tokens_asks_the_mean_and_alone_pays_the_moment() -> None:
    known = Run(1, "r", 0, None, 10, 5.0, 15.0)  # 2 units/s
    unknown = Run(2, "r", 0, None, 20, None, None)  # asks the mean, 2 units/s
    got = attribute(0, 20, {"r": [(0, 20)]}, FLAT, [known, unknown])
    assert got.cost[1] == pytest.approx(0.005) and got.cost[2] == pytest.approx(0.015)


def test_unbilled_time_costs_nobody_and_a_runs_named_replica_must_be_billed() -> None:
    # r billed 0-10 and 20-30 (a scrape gap between): run 1 (5-25, 0.1 units/s) pays a
    # third of 5-10 beside run 2 (0.2 units/s), nothing in the gap, all of 20-25.
    runs = [Run(1, "r", 5, None, 25, 1.0, 1.0), Run(2, "elsewhere", 0, None, 10, 1.0, 1.0)]
    got = attribute(0, 30, {"r": [(0, 10), (20, 30)]}, FLAT, runs)
    assert got.cost[1] == pytest.approx(5 * 0.001 / 3 + 0.005)
    assert got.respread_runs == 1  # 'elsewhere' was never billed: spread over r
    assert math.fsum(got.cost.values()) + got.idle_cost == pytest.approx(got.total_cost)


def test_counters_above_the_records_are_unattributed_never_idle() -> None:
    # 0-300 nothing recorded but vLLM counted work: unattributed; 300-600 idle.
    counters = {"r": [(t, 10.0) for t in range(15, 301, 15)]}
    got = attribute(0, 600, {"r": [(0, 600)]}, FLAT, [], counters, step_s=300)
    assert got.unattributed_cost == pytest.approx(0.3) and got.idle_cost == pytest.approx(0.3)
    # Counted a little above the records (within the tolerance): no unattributed line.
    runs = [Run(1, "r", 0, None, 300, 0.0, 3000.0)]
    near = {"r": [(t, 10.3) for t in range(15, 301, 15)]}
    got = attribute(0, 300, {"r": [(0, 300)]}, FLAT, runs, near, step_s=300, tolerance=0.05)
    assert got.unattributed_cost == 0.0 and got.cost[1] == pytest.approx(0.3)


def test_prices_change_mid_window_reserved_and_spot() -> None:
    config = parse_config({
        "pools": [{"name": "chat", "model": "m", "gpu": "H100", "gpus_per_replica": 2}],
        "prices": {"H100": 3.6},
        "cost": {"prices": [
            {"pool": "chat", "since": "2026-11-15", "per_gpu_hour": 7.2},
            {"pool": "chat", "since": "2026-11-01", "capacity": "reserved", "replicas": 2,
             "per_gpu_hour": 1.8},
            {"pool": "chat", "since": "2026-11-01", "capacity": "spot",
             "replica_match": "spot-.*", "per_gpu_hour": 0.9}]},
    })
    prices = pool_prices(config, config.pools[0])
    mid = prices.changes(0, 2e9)[-1]
    before, after = prices.rates(mid - 1, ["a", "b", "c", "spot-1"]), prices.rates(
        mid, ["a", "b", "c", "spot-1"])
    per_gpu_s = 2 / 3600
    # Three regular replicas on two reserved: each at the blend (2 × 1.8 + 3.6) / 3.
    assert before.per_replica["a"] == pytest.approx((2 * 1.8 + 3.6) / 3 * per_gpu_s)
    assert after.per_replica["a"] == pytest.approx((2 * 1.8 + 7.2) / 3 * per_gpu_s)
    assert after.per_replica["spot-1"] == pytest.approx(0.9 * per_gpu_s)
    # One regular replica running: the other reservation is paid, idle.
    one = prices.rates(mid, ["a"])
    assert one.per_replica["a"] == pytest.approx(1.8 * per_gpu_s)
    assert one.unused_reserved_per_s == pytest.approx(1.8 * per_gpu_s)


def test_a_spot_price_needs_its_replicas_and_a_reserved_one_its_count() -> None:
    from vigil.errors import ConfigError

    base = {"pools": [{"name": "chat", "model": "m"}]}
    with pytest.raises(ConfigError, match="replica_match"):
        parse_config({**base, "cost": {"prices": [
            {"pool": "chat", "since": "2026-11-01", "capacity": "spot", "per_gpu_hour": 1.0}]}})
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config({**base, "cost": {"prices": [
            {"pool": "nope", "since": "2026-11-01", "per_gpu_hour": 1.0}]}})
    with pytest.raises(ConfigError, match="ISO date"):
        parse_config({**base, "cost": {"prices": [
            {"pool": "chat", "since": "15/11/2026", "per_gpu_hour": 1.0}]}})


def test_cents_add_up_to_the_rounded_total() -> None:
    assert cents([0.333, 0.333, 0.334], 1.0) == pytest.approx([0.33, 0.33, 0.34])
    parts = [1 / 3] * 3
    assert sum(round(c * 100) for c in cents(parts, 1.0)) == 100
    assert merge_intervals([(5, 10), (0, 6), (20, 30)], 2, 25) == [(2, 10), (20, 25)]


_runs = st.lists(st.tuples(
    st.sampled_from(["a", "b", ""]), st.floats(0, 900), st.floats(0.5, 300),
    st.one_of(st.none(), st.floats(0, 1)), st.one_of(st.none(), st.floats(0, 500)),
    st.one_of(st.none(), st.floats(0, 500))), max_size=25)
_spans = st.lists(st.tuples(st.floats(0, 1000), st.floats(1, 400)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(runs=_runs, spans_a=_spans, spans_b=_spans,
       extra=st.lists(st.floats(0, 50), min_size=0, max_size=30),
       lo=st.floats(0, 300), length=st.floats(60, 1200), step=st.sampled_from([60.0, 300.0]))
def test_every_history_adds_up(runs: list[tuple[str, float, float, float | None, float | None,
                                                 float | None]],
                               spans_a: list[tuple[float, float]],
                               spans_b: list[tuple[float, float]], extra: list[float],
                               lo: float, length: float, step: float) -> None:
    billing = {"a": [(s, s + d) for s, d in spans_a], "b": [(s, s + d) for s, d in spans_b]}
    made = []
    for i, (replica, start, dur, first, pre, dec) in enumerate(runs):
        first_s = None if first is None else start + first * dur
        made.append(Run(i, replica, start, first_s, start + dur, pre,
                        None if pre is None else dec))
    counters = {"a": [(lo + 15.0 * (k + 1), w) for k, w in enumerate(extra)]}
    got = attribute(lo, lo + length, billing, FLAT, made, counters, step_s=step)
    parts = [*got.cost.values(), got.idle_cost, got.unattributed_cost]
    assert all(p >= -1e-12 for p in parts)
    assert math.fsum(parts) == pytest.approx(got.total_cost, rel=1e-9, abs=1e-12)
    billed = math.fsum(b - a for spans in billing.values()
                       for a, b in merge_intervals(spans, lo, lo + length))
    assert got.total_cost == pytest.approx(billed * 0.001, rel=1e-9, abs=1e-12)
    assert math.fsum(got.gpu_hours.values()) + got.idle_gpu_hours + \
        got.unattributed_gpu_hours == pytest.approx(billed / 3600, rel=1e-9, abs=1e-12)
