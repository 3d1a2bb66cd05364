"""The capacity search: Wilson intervals, the verdict of a probe, the doubling-then-bisection
search on synthetic probe functions whose capacity is known, and the profile it makes."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.outcomes import FAILED, ok

from slo.planning.capacity_search import (
    RAMP_LOW,
    Ramp,
    RampRecord,
    estimate_knee,
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


# --- galloping from an estimate ---------------------------------------------------------------
@pytest.mark.parametrize(("start", "calls"), [
    (36, [36, 39]),                  # just below the knee: one step of the precision brackets it
    (37, [37, 40]),
    (30, [30, 33, 39, 36]),          # below: steps of 10 %, 20 %, ... then bisection
    (50, [50, 46, 39, 28, 33, 36]),  # above: down by the same factors
    (38, [38, 35]),                  # just above: one step down brackets it
])
def test_galloping_from_an_estimate_brackets_the_knee(start: int, calls: list[int]) -> None:
    got: list[int] = []
    result = search_sync(synthetic(37, got), max_concurrency=1024, precision=0.10,
                         start=start)
    assert got == calls
    assert result.best is not None and result.best.concurrency <= 37
    assert result.failed is not None and result.failed.concurrency > 37


@given(st.integers(1, 900), st.integers(1, 1024), st.sampled_from([0.01, 0.05, 0.10, 0.25]))
def test_galloping_brackets_any_capacity_from_any_start(capacity: int, start: int,
                                                        precision: float) -> None:
    result = search_sync(synthetic(capacity), max_concurrency=1024, precision=precision,
                         start=start)
    assert result.best is not None and result.best.concurrency <= capacity
    assert result.failed is not None and result.failed.concurrency > capacity
    gap = result.failed.concurrency - result.best.concurrency
    assert gap == 1 or gap / result.best.concurrency <= precision
    # every failure lies above every pass (the bracket is never crossed)
    passed = [p.concurrency for p in result.probes if p.passed]
    assert min(p.concurrency for p in result.probes if not p.passed) > max(passed)


def test_galloping_down_to_one_reports_that_no_level_passes() -> None:
    result = search_sync(synthetic(0), max_concurrency=64, precision=0.1, start=1)
    assert result.best is None and [p.concurrency for p in result.probes] == [1]
    result = search_sync(synthetic(0), max_concurrency=64, precision=0.1, start=4)
    assert result.best is None and [p.concurrency for p in result.probes][-1] == 1


def test_galloping_stops_at_the_maximum() -> None:
    result = search_sync(synthetic(10_000), max_concurrency=100, precision=0.1, start=100)
    assert result.failed is None and [p.concurrency for p in result.probes] == [100]
    result = search_sync(synthetic(10_000), max_concurrency=100, precision=0.1, start=60)
    assert result.failed is None and [p.concurrency for p in result.probes] == [60, 66, 79, 100]


def test_async_galloping_is_the_same_search() -> None:
    sync_probe = synthetic(53)

    async def probe(c: int) -> Probe:
        await asyncio.sleep(0)
        return sync_probe(c)

    a = asyncio.run(search(probe, max_concurrency=512, precision=0.05, start=20))
    b = search_sync(sync_probe, max_concurrency=512, precision=0.05, start=20)
    assert a == b


# --- the opening ramp -------------------------------------------------------------------------
def records(loads: list[float], slow: set[int]) -> list[RampRecord]:
    """A ramp's requests at ``loads``; those whose index is in ``slow`` missed the e2e SLO."""
    return [RampRecord(load, ok(e2e=1.5 if i in slow else 0.5)) for i, load in enumerate(loads)]


def test_the_knee_is_the_highest_load_whose_fitted_miss_rate_meets_the_objective() -> None:
    loads = [float(x) for x in range(1, 61)]
    # misses from load 31 on: the knee is 30
    assert estimate_knee(records(loads, set(range(30, 60))), [E2E]) == 30.0
    # one early miss among many good requests does not pull the estimate down (the fit pools
    # it with the good requests above it: 1 in 26 is within 1 - 0.9)
    assert estimate_knee(records(loads, {4, *range(30, 60)}), [E2E]) == 30.0
    # the order the requests finished in does not matter, only their load
    shuffled = list(reversed(records(loads, set(range(30, 60)))))
    assert estimate_knee(shuffled, [E2E]) == 30.0
    # no miss at all: the highest load seen; every one a miss, or none: 0
    assert estimate_knee(records(loads, set()), [E2E]) == 60.0
    assert estimate_knee(records(loads, set(range(60))), [E2E]) == 0.0
    assert estimate_knee([], [E2E]) == 0.0


def test_the_knee_is_the_lowest_over_the_slos() -> None:
    loads = [float(x) for x in range(1, 41)]
    rs = [RampRecord(x, ok(e2e=1.5 if x > 30 else 0.5, ttft=0.5 if x > 20 else 0.1))
          for x in loads]
    assert estimate_knee(rs, [E2E, TTFT]) == 20.0
    assert estimate_knee(rs, [E2E]) == 30.0


def test_a_request_is_tagged_with_the_mean_load_over_its_life() -> None:
    ramp = Ramp([E2E], max_concurrency=64)
    a = ramp.admit(0.0)
    b = ramp.admit(1.0)
    assert ramp.finish(a, ok(), 2.0) == 1  # one stream added per finished request
    assert ramp.records[0].load == pytest.approx(1.5)  # 1 in flight for 1 s, then 2 for 1 s
    ramp.finish(b, ok(), 3.0)
    assert ramp.records[1].load == pytest.approx(1.5)  # 2 for 1 s, then 1 for 1 s
    with pytest.raises(ValueError):
        ramp.finish(b, ok(), 3.0)


#: The e2e SLO of the synthetic ramps: 7 s for 90 % of requests.
SLOW_E2E = SloTarget("e2e", "e2e", 7.0, 0.9)


def drive_ramp(ramp: Ramp, base_s: float, per_seq_s: float) -> float:
    """Drive ``ramp`` as ``LoadRunner.ramp`` does (one client, one more per finished request)
    against an engine whose every step makes one token of each running request and takes
    ``base_s + per_seq_s x running``. Requests make 50-150 tokens (drawn, as a live probe
    draws them, so that the loop is not in lock step): 100 tokens take ``100 x (base_s +
    per_seq_s x n)`` at a steady ``n`` in flight. Returns the clock when the ramp stopped."""
    rng = random.Random(5)
    running: dict[int, list[float]] = {}  # index -> [tokens left, sent at]
    now = 0.0

    def send() -> None:
        running[ramp.admit(now)] = [float(rng.randint(50, 150)), now]

    send()
    while not ramp.done:
        now += base_s + per_seq_s * len(running)
        to_send = 0
        for i, r in list(running.items()):
            r[0] -= 1
            if r[0] <= 0:
                del running[i]
                to_send += 1 + ramp.finish(i, ok(e2e=now - r[1]), now)
        for _ in range(to_send):
            send()
        assert len(ramp.records) < 10_000, "the ramp never stopped"
    return now


def test_the_ramp_doubles_until_the_slo_is_missed_and_estimates_the_knee() -> None:
    # 90 % of requests make at most 140 tokens, which take 140 x (0.01 + 0.002 n) s at n in
    # flight: the 7 s threshold holds for 90 % up to n = 20, the steady-state knee.
    ramp = Ramp([SLOW_E2E], max_concurrency=1024)
    end = drive_ramp(ramp, 0.01, 0.002)
    summary = ramp.summary()
    assert summary.stopped == "misses" and ramp.done
    assert 20 < summary.streams < 80  # stopped soon after the knee, far below the maximum
    # About one request per load: the estimate is coarse (a 10 % miss rate shows only once
    # misses are frequent), 27 for 20 here; the search from there brackets the knee.
    assert abs(summary.start - 20) <= 8 and summary.start == math.floor(summary.knee + 0.5)
    probes: list[int] = []
    result = search_sync(synthetic(20, probes), max_concurrency=1024, precision=0.1,
                         start=summary.start)
    assert result.best is not None and result.best.concurrency == 20
    doubling: list[int] = []
    search_sync(synthetic(20, doubling), max_concurrency=1024, precision=0.1)
    assert len(probes) < len(doubling)  # and none of them at 1, 2, 4 or 8
    assert summary.requests == len(ramp.records) and summary.seconds == pytest.approx(end)
    # the streams doubled about once per latency: past the knee in a few latencies, where
    # probing 1, 2, 4, 8, 16 one by one takes five probes of 20 requests or more
    assert end < 4 * 7.0
    assert summary.to_dict()["stopped"] == "misses"


def test_a_ramp_that_reaches_the_maximum_starts_the_search_there() -> None:
    ramp = Ramp([SLOW_E2E], max_concurrency=16)
    drive_ramp(ramp, 0.01, 0.0001)
    summary = ramp.summary()
    assert summary.stopped == "max_concurrency" and summary.streams == 16
    assert summary.start == 16


def test_a_ramp_that_misses_at_one_or_two_streams_starts_the_search_at_1() -> None:
    ramp = Ramp([SLOW_E2E], max_concurrency=1024)
    drive_ramp(ramp, 0.1, 0.002)  # 10 s alone: every request too slow
    summary = ramp.summary()
    assert summary.stopped == "misses" and summary.requests == 3  # 3 misses > 10 % of 20
    assert summary.start == 1 and summary.knee < RAMP_LOW
    # and the search from there probes 1 and reports that nothing passes
    result = search_sync(synthetic(0), max_concurrency=1024, precision=0.1,
                         start=summary.start)
    assert result.best is None and [p.concurrency for p in result.probes] == [1]
