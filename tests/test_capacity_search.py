"""The capacity search: Wilson intervals, the verdict of a probe, the doubling-then-bisection
search on synthetic probe functions whose capacity is known, and the profile it makes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.outcomes import FAILED, ok

from slo.planning.capacity_search import (
    judge,
    probe_from_outcomes,
    profile_from_search,
    search,
    search_sync,
    unresolved,
    wilson_interval,
)
from vigil.capacity import Probe, ProfileIdentity, SloTarget

E2E = SloTarget("chat-e2e", "e2e", 1.0, 0.9)
TTFT = SloTarget("chat-ttft", "ttft", 0.2, 0.95)






# --- Wilson -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("successes", "n", "low", "high"), [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", method 3
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_published_values(successes: int, n: int, low: float,
                                         high: float) -> None:
    got = wilson_interval(successes, n, 0.95)
    assert got == (pytest.approx(low, abs=5e-5), pytest.approx(high, abs=5e-5))


def test_wilson_edges() -> None:
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)
    low, high = wilson_interval(10, 10, 0.95)
    assert high == 1.0 and low == pytest.approx(0.7225, abs=5e-5)
    assert wilson_interval(8, 10, 0.99)[0] < wilson_interval(8, 10, 0.90)[0]
    for bad in ((11, 10, 0.95), (-1, 10, 0.95), (1, 10, 1.0), (1, 10, 0.0)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


# --- judge ----------------------------------------------------------------------------------
def test_judge_pass_fail_unresolved() -> None:
    assert judge([ok()] * 100, [E2E], 0.95).verdict == "pass"
    assert judge([ok(e2e=2.0)] * 100, [E2E], 0.95).verdict == "fail"
    # 90 of 100 within: the point estimate is the objective, the interval straddles it
    mixed = [ok()] * 90 + [ok(e2e=2.0)] * 10
    j = judge(mixed, [E2E], 0.95)
    assert j.verdict == "unresolved" and j.attainment == 0.9 and j.low < 0.9 < j.high
    # few requests leave even a perfect sample unresolved
    assert judge([ok()] * 10, [E2E], 0.95).verdict == "unresolved"
    assert judge([], [E2E], 0.95).verdict == "unresolved"


def test_judge_each_slo_against_its_own_objective() -> None:
    # every e2e within, TTFT too slow for 1 in 5: the TTFT SLO fails the level alone
    outcomes = [ok(ttft=0.1)] * 80 + [ok(ttft=0.5)] * 20
    j = judge(outcomes, [E2E, TTFT], 0.95)
    assert j.by_slo == {"chat-e2e": 1.0, "chat-ttft": 0.8}
    assert j.verdict == "fail" and j.attainment == 0.8


def test_judge_counts_errors_as_bad_and_missing_ttft_by_success() -> None:
    j = judge([ok(ttft=None)] * 50 + [FAILED] * 50, [E2E, TTFT], 0.95)
    assert j.by_slo == {"chat-e2e": 0.5, "chat-ttft": 0.5} and j.verdict == "fail"


# --- probe_from_outcomes ----------------------------------------------------------------
def test_probe_rates_and_percentiles() -> None:
    outcomes = [ok(e2e=0.5, tokens=10)] * 90 + [ok(e2e=2.0, tokens=10)] * 5 + [FAILED] * 5
    p = probe_from_outcomes(8, outcomes, 10.0, [E2E], 0.95)
    assert (p.concurrency, p.requests, p.errors, p.duration_s) == (8, 100, 5, 10.0)
    assert p.goodput_rps == pytest.approx(9.0) and p.throughput_rps == pytest.approx(9.5)
    assert p.output_tokens_per_s == pytest.approx(95.0)
    assert p.e2e_s["p50"] == 0.5 and p.e2e_s["p99"] == pytest.approx(2.0)
    assert p.ttft_s == {"p50": 0.1, "p95": 0.1, "p99": 0.1}
    assert p.attainment_by_slo == {"chat-e2e": 0.9}


def test_an_unresolved_probe_is_decided_on_the_point_estimate() -> None:
    at = [ok()] * 91 + [ok(e2e=2.0)] * 9
    below = [ok()] * 89 + [ok(e2e=2.0)] * 11
    p_at = probe_from_outcomes(4, at, 5.0, [E2E], 0.95)
    p_below = probe_from_outcomes(4, below, 5.0, [E2E], 0.95)
    assert p_at.passed and not p_below.passed
    assert unresolved(p_at, [E2E], 0.95) and unresolved(p_below, [E2E], 0.95)
    clear = probe_from_outcomes(4, [ok()] * 100, 5.0, [E2E], 0.95)
    assert clear.passed and not unresolved(clear, [E2E], 0.95)


# --- search -----------------------------------------------------------------------------
def synthetic(capacity: int, calls: list[int] | None = None):
    """A probe whose e2e grows with concurrency up to 0.9 s at ``capacity`` and jumps to
    1.5 s (over the 1 s threshold) above it."""

    def probe(c: int) -> Probe:
        if calls is not None:
            calls.append(c)
        e2e = 0.9 * c / max(capacity, 1)
        slow = e2e if c <= capacity else max(e2e, 1.5)
        outcomes = [ok(e2e=slow)] * 200
        return probe_from_outcomes(c, outcomes, 200 * slow / c, [E2E], 0.95)

    return probe


def test_search_finds_the_step_to_the_precision_with_the_probes_it_needs() -> None:
    calls: list[int] = []
    result = search_sync(synthetic(37, calls), max_concurrency=1024, precision=0.10)
    assert calls == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38]
    assert result.best is not None and result.failed is not None
    assert (result.best.concurrency, result.failed.concurrency) == (36, 38)
    assert [p.concurrency for p in result.probes] == calls
    assert result.best.goodput_rps == pytest.approx(36 / (0.9 * 36 / 37))


@given(st.integers(1, 900), st.sampled_from([0.01, 0.05, 0.10, 0.25]))
def test_search_brackets_any_capacity(capacity: int, precision: float) -> None:
    result = search_sync(synthetic(capacity), max_concurrency=1024, precision=precision)
    assert result.best is not None and result.best.concurrency <= capacity
    assert result.failed is not None and result.failed.concurrency > capacity
    gap = result.failed.concurrency - result.best.concurrency
    assert gap == 1 or gap / result.best.concurrency <= precision
    assert len(result.probes) <= 2 * 11  # doubling to 1024 plus bisecting 512 to 1


def test_search_when_even_one_request_fails() -> None:
    result = search_sync(synthetic(0), max_concurrency=64, precision=0.1)
    assert result.best is None and [p.concurrency for p in result.probes] == [1]


def test_search_stops_at_the_maximum() -> None:
    result = search_sync(synthetic(10_000), max_concurrency=100, precision=0.1)
    assert result.failed is None and result.best is not None
    assert [p.concurrency for p in result.probes] == [1, 2, 4, 8, 16, 32, 64, 100]


def test_async_search_is_the_same_search() -> None:
    sync_probe = synthetic(53)

    async def probe(c: int) -> Probe:
        await asyncio.sleep(0)
        return sync_probe(c)

    a = asyncio.run(search(probe, max_concurrency=512, precision=0.05))
    b = search_sync(sync_probe, max_concurrency=512, precision=0.05)
    assert a == b


def test_search_refuses_bad_bounds() -> None:
    with pytest.raises(ValueError):
        search_sync(synthetic(5), max_concurrency=0, precision=0.1)
    with pytest.raises(ValueError):
        search_sync(synthetic(5), max_concurrency=8, precision=0.0)


# --- profile_from_search ----------------------------------------------------------------
IDENTITY = ProfileIdentity(model="m", gpu="L4", prompt_tokens=64, output_tokens=6)


def test_profile_carries_the_best_probe_and_every_probe() -> None:
    result = search_sync(synthetic(37), max_concurrency=1024, precision=0.10)
    prof = profile_from_search(IDENTITY, "measured", result, [E2E], source="http://x",
                               pool="chat", created_at=1.0, confidence=0.95, precision=0.1)
    assert prof.max_concurrency == 36 and prof.basis == "measured"
    assert prof.max_goodput_rps == result.best.goodput_rps
    assert prof.max_output_tokens_per_s == result.best.output_tokens_per_s
    assert prof.probes == result.probes and prof.slos == (E2E,) and prof.notes == ()
    assert type(prof).from_dict(prof.to_dict()) == prof


def test_profile_notes_say_what_limits_the_figures() -> None:
    none = profile_from_search(IDENTITY, "measured", search_sync(synthetic(0), max_concurrency=8,
                               precision=0.1), [E2E], source="", pool="", created_at=0,
                               confidence=0.95, precision=0.1)
    assert none.max_concurrency == 0 and none.max_goodput_rps == 0.0
    assert "even concurrency 1" in none.notes[0]
    top = profile_from_search(IDENTITY, "estimated", search_sync(synthetic(99), max_concurrency=8,
                              precision=0.1), [E2E], source="", pool="", created_at=0,
                              confidence=0.95, precision=0.1)
    assert top.max_concurrency == 8 and "may be higher" in top.notes[0]
