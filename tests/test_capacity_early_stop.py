"""A probe spends its requests where the verdict is decided: the latency-margin rule, its
statistics, and ``ProbeWindow`` (which requests count, when a probe ends) on synthetic
outcomes with a hand-driven clock."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import pytest
from support.outcomes import FAILED, ok

from serving.loadgen.probe import probe_request
from slo.planning.capacity_search import (
    Margin,
    ProbeWindow,
    RequestOutcome,
    early_fail_confidence,
    early_looks,
    judge,
    probe_from_outcomes,
    tail_quantile,
    unresolved,
    wilson_interval,
)
from vigil.capacity import SloTarget
from vigil.config import CapacityConfig

# ``ok()``'s defaults (e2e 0.5 s, TTFT 0.1 s) are well within half of these thresholds.
E2E = SloTarget("chat-e2e", "e2e", 1.2, 0.95)
TTFT = SloTarget("chat-ttft", "ttft", 0.3, 0.95)
CAP = CapacityConfig(probe_duration=20.0, min_probe_requests=100, max_probe_requests=2000,
                     clear_margin=0.5, clear_probe_requests=20)


# --- the statistics ---------------------------------------------------------------------------
def test_tail_quantile_is_the_distribution_free_bound_of_the_largest_value() -> None:
    assert tail_quantile(20, 0.95) == pytest.approx(0.8609, abs=5e-5)
    # 59 values are the fewest whose largest bounds the 0.95-quantile at 95 %
    assert tail_quantile(58, 0.95) < 0.95 <= tail_quantile(59, 0.95)
    assert tail_quantile(0, 0.95) == 0.0
    for bad in ((5, 1.0), (5, 0.0), (-1, 0.95)):
        with pytest.raises(ValueError):
            tail_quantile(*bad)


@pytest.mark.parametrize("n", [5, 20, 50])
def test_the_largest_value_bounds_the_tail_quantile_as_often_as_claimed(n: int) -> None:
    # Uniform values: the q-quantile is q itself, so the bound holds when max >= q.
    rng = random.Random(n)
    q = tail_quantile(n, 0.95)
    trials = 20_000
    held = sum(max(rng.random() for _ in range(n)) >= q for _ in range(trials))
    assert held / trials == pytest.approx(0.95, abs=0.006)


def test_the_interval_alone_needs_73_good_requests_to_pass_095() -> None:
    # Why the margin rule exists: however fast, 72 good requests cannot pass 0.95.
    assert wilson_interval(72, 72, 0.95)[0] < 0.95 <= wilson_interval(73, 73, 0.95)[0]
    assert judge([ok()] * 72, [E2E], 0.95).verdict == "unresolved"


# --- judge with the margin ------------------------------------------------------------------
MARGIN = Margin(0.5, 20)


def test_a_fast_sample_passes_on_the_margin_with_few_requests() -> None:
    j = judge([ok(e2e=0.3, ttft=0.05)] * 20, [E2E, TTFT], 0.95, MARGIN)
    assert j.verdict == "pass" and j.on_margin
    assert j.low < 0.95  # the interval alone would have measured on
    assert judge([ok()] * 20, [E2E, TTFT], 0.95).verdict == "unresolved"  # no margin given


@pytest.mark.parametrize("sample", [
    [ok()] * 19,                                  # too few requests
    [ok()] * 19 + [ok(e2e=0.7)],                  # one e2e past half its threshold
    [ok()] * 19 + [ok(ttft=0.2)],                 # one TTFT past half its threshold
    [ok()] * 19 + [FAILED],                       # one failed request
    [ok()] * 19 + [ok(ttft=None)],                # one TTFT not measured: no evidence
])
def test_the_margin_needs_every_request_well_within(sample: list[RequestOutcome]) -> None:
    j = judge(sample, [E2E, TTFT], 0.95, MARGIN)
    assert not j.on_margin and j.verdict == "unresolved"


def test_the_margin_never_overrides_a_failing_interval() -> None:
    j = judge([ok(e2e=2.0)] * 40, [E2E], 0.95, MARGIN)
    assert j.verdict == "fail" and not j.on_margin


def test_margin_of_the_config() -> None:
    assert Margin.of(CAP) == Margin(0.5, 20)
    assert Margin.of(CapacityConfig(clear_margin=0.0)) is None
    with pytest.raises(ValueError, match="clear_margin"):
        CapacityConfig(clear_margin=1.0)


def test_a_margin_pass_is_not_reported_as_a_point_estimate() -> None:
    clear = probe_from_outcomes(1, [ok()] * 20, 6.0, [E2E], 0.95, MARGIN)
    assert clear.passed and clear.requests == 20 and not unresolved(clear, [E2E], 0.95)
    near = probe_from_outcomes(1, [ok()] * 19 + [ok(e2e=2.0)], 6.0, [E2E], 0.95, MARGIN)
    assert near.passed and unresolved(near, [E2E], 0.95)  # 19/20 on its point estimate


# --- ProbeWindow ----------------------------------------------------------------------------
def closed_loop(window: ProbeWindow, outcome: Callable[[int], RequestOutcome],
                concurrency: int = 1) -> float:
    """Drive ``window`` as ``concurrency`` clients do: each sends its next request when its
    last ends, and a request takes its e2e (or 0.5 s). ``outcome(i)``: the i-th request sent.
    Returns the clock when the probe is over (seconds)."""
    ends: list[tuple[float, int, int | None, RequestOutcome]] = []  # (end, sent, index, o)
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        index = window.admit(now)
        o = outcome(sent)
        heapq.heappush(ends, (now + (o.e2e_s or 0.5), sent, index, o))
        sent += 1

    for _ in range(concurrency):
        send(0.0)
    now = 0.0
    while not window.done:
        now, _, index, o = heapq.heappop(ends)
        if index is not None:
            window.finish(index, o, now)
        send(now)
        assert sent < 10_000, "the probe never ended"
    return now


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_clearly_passing_level_stops_at_clear_probe_requests(concurrency: int) -> None:
    window = ProbeWindow([E2E, TTFT], CAP, concurrency)
    end = closed_loop(window, lambda i: ok(e2e=0.3), concurrency)
    n = len(window.outcomes)
    # 20, and the ones still in flight when the 20th in send order had finished
    assert 20 <= n <= 20 + concurrency - 1
    assert end < CAP.probe_duration  # the duration is not waited for
    assert window.duration_s == pytest.approx(n * 0.3 / concurrency)


@pytest.mark.parametrize(("e2e", "verdict"), [
    (0.9, "pass"),  # every request good, but past half the threshold: no margin
    (3.0, "fail"),  # every request too slow: the interval, not a margin, decides a failure
])
def test_a_level_the_margin_does_not_pass_runs_the_full_probe(e2e: float,
                                                             verdict: str) -> None:
    # Without the early fail (below), a failing level runs its full probe too.
    window = ProbeWindow([E2E], CAP.model_copy(update={"early_fail": False}), 1)
    closed_loop(window, lambda i: ok(e2e=e2e))
    assert len(window.outcomes) == 100
    assert judge(window.outcomes, [E2E], 0.95).verdict == verdict


def test_an_unresolved_level_is_extended_in_chunks_until_resolved() -> None:
    # 1 request in 25 too slow: 96 % against 0.95, unresolved until the sample is large
    def outcome(i: int) -> RequestOutcome:
        return ok(e2e=2.0) if i % 25 == 0 else ok(e2e=0.9)

    window = ProbeWindow([E2E], CAP.model_copy(update={"indifference": 0.0}), 1)
    closed_loop(window, outcome)
    n = len(window.outcomes)
    assert n > 100 and (n - 100) % 50 == 0  # checkpoints every min_probe_requests / 2
    j = judge(window.outcomes, [E2E], 0.95)
    assert j.verdict != "unresolved" or n == CAP.max_probe_requests


def test_the_interval_waits_for_min_probe_requests_finished() -> None:
    # Four in flight: when the 100th request is counted only ~96 have finished, so the first
    # look at the interval comes a few requests later, on min_probe_requests finished (not a
    # whole chunk later: no look was taken before).
    window = ProbeWindow([E2E], CAP, 4)
    closed_loop(window, lambda i: ok(e2e=0.9), concurrency=4)
    assert 100 + 3 <= len(window.outcomes) <= 100 + 4 + 4
    assert judge(window.outcomes, [E2E], 0.95).verdict == "pass"


def test_the_duration_applies_to_levels_the_margin_does_not_decide() -> None:
    fast_requests = CapacityConfig(probe_duration=20.0, min_probe_requests=100,
                                   clear_margin=0.0)
    window = ProbeWindow([E2E], fast_requests, 1)
    end = closed_loop(window, lambda i: ok(e2e=0.05))
    assert end >= 20.0 and len(window.outcomes) >= 20.0 / 0.05 - 1


def test_the_warm_up_and_the_cap() -> None:
    capped = CapacityConfig(min_probe_requests=10, max_probe_requests=30, clear_margin=0.0,
                            probe_duration=1.0, indifference=0.0)
    window = ProbeWindow([E2E], capped, 4)
    assert [window.admit(0.0) for _ in range(4)] == [None] * 4  # the warm-up
    assert window.admit(0.0) == 0
    # every other request too slow against an objective of 0.5: the interval straddles it
    window = ProbeWindow([SloTarget("e2e", "e2e", 1.0, 0.5)], capped, 1)
    closed_loop(window, lambda i: ok(e2e=2.0 if i % 2 else 0.5))
    assert len(window.outcomes) == 30  # 50 % against 0.5 never resolves: the cap ends it


def test_the_verdict_is_taken_in_send_order_not_finish_order() -> None:
    # The first counted request is slow (within the threshold but beyond the margin) and
    # finishes after the 20 sent behind it. Judging by finish order would see 20 fast
    # requests first and pass on the margin; in send order the slow one is in the sample.
    window = ProbeWindow([E2E], CAP, 4)
    for _ in range(4):
        assert window.admit(0.0) is None  # warm-up
    slow = window.admit(0.0)
    for k in range(20):
        i = window.admit(0.1 * k)
        assert i is not None
        window.finish(i, ok(e2e=0.1), 0.1 * k + 0.1)
        assert not window.closed
    assert slow is not None
    window.finish(slow, ok(e2e=0.9), 2.0)
    assert not window.closed and not window.done  # 0.9 s is past the margin: measure on


def test_an_in_flight_request_past_the_margin_opens_the_window_again() -> None:
    window = ProbeWindow([E2E], CAP, 2)
    window.admit(0.0), window.admit(0.0)  # warm-up
    now = 0.0
    indexes = [window.admit(now) for _ in range(2)]
    # 20 fast requests finish one after another while one more stays in flight
    late = indexes[1]
    assert indexes[0] is not None and late is not None
    window.finish(indexes[0], ok(e2e=0.1), 0.1)
    for k in range(19):
        i = window.admit(0.1 * (k + 1))
        assert i is not None
        window.finish(i, ok(e2e=0.1), 0.1 * (k + 2))
    # index 1 (sent second) is still out: the judged prefix is one request long
    assert not window.closed
    window.finish(late, ok(e2e=0.2), 2.0)
    # now 21 requests in send order, all within the margin: closed and done
    assert window.closed and window.done and len(window.outcomes) == 21

    window = ProbeWindow([E2E], CAP, 2)
    window.admit(0.0), window.admit(0.0)
    first = [window.admit(0.0) for _ in range(21)]
    assert None not in first
    for k, i in enumerate(first[:20]):
        window.finish(i, ok(e2e=0.1), 0.1 * (k + 1))  # type: ignore[arg-type]
    assert window.closed and not window.done  # settled on 20, one still in flight
    assert window.admit(2.0) is None  # closed: the load goes on uncounted
    window.finish(first[20], ok(e2e=0.8), 2.5)  # type: ignore[arg-type]
    assert not window.closed and not window.done  # past the 0.6 s margin: open again
    assert window.admit(2.5) == 21


def test_a_window_closed_on_a_send_with_nothing_in_flight_is_done_at_once() -> None:
    # At concurrency 1 the interval closes the window as the next request is sent, when every
    # counted request has finished: the runner must not wait for a finish that never comes.
    lenient = SloTarget("e2e", "e2e", 1.2, 0.5)
    window = ProbeWindow([lenient], CapacityConfig(min_probe_requests=10, probe_duration=1.0,
                                                   clear_margin=0.0), 1)
    assert window.admit(0.0) is None  # warm-up
    for k in range(10):
        i = window.admit(float(k))
        assert i == k
        window.finish(i, ok(), k + 1.0)
    assert not window.done
    assert window.admit(10.0) is None and window.closed and window.done


def test_finishing_a_request_twice_is_refused() -> None:
    window = ProbeWindow([E2E], CAP, 1)
    window.admit(0.0)
    i = window.admit(0.0)
    assert i is not None
    window.finish(i, ok(), 0.3)
    with pytest.raises(ValueError):
        window.finish(i, ok(), 0.6)
    with pytest.raises(ValueError):
        ProbeWindow([E2E], CAP, 0)


# --- the live probe's requests ---------------------------------------------------------------
def test_a_live_probe_draws_its_lengths_around_the_asked_ones() -> None:
    # Identical requests keep a closed loop in lock step; vllm bench serve's range ratio 0.5.
    rng = random.Random(3)
    bodies = [probe_request("m", 512, 128, i, rng).body for i in range(300)]
    outputs = [b["max_tokens"] for b in bodies]
    prompts = [len(b["messages"][0]["content"]) for b in bodies]
    assert min(outputs) >= 64 and max(outputs) <= 192
    assert len(set(outputs)) > 50 and 115 < sum(outputs) / len(outputs) < 141
    assert max(prompts) > 2 * min(prompts)
    assert all(b["ignore_eos"] and b["stream"] for b in bodies)
    # No two prompts share a cacheable prefix: each opens with its own number.
    assert len({b["messages"][0]["content"].split(" ", 1)[0] for b in bodies}) == 300


# --- warm levels: which requests a level changed from a running loop counts -------------------
def test_going_up_skips_only_the_burst_of_added_streams() -> None:
    # 8 streams running, the level is 12: the 4 new streams' first requests are left out
    window = ProbeWindow([E2E], CAP, 12, warm_up=4)
    assert [window.admit(0.0) for _ in range(4)] == [None] * 4
    assert window.admit(0.1) == 0
    # going down (or a level kept): the next request already runs at the level
    window = ProbeWindow([E2E], CAP, 8, warm_up=0)
    assert window.admit(0.0) == 0
    with pytest.raises(ValueError):
        ProbeWindow([E2E], CAP, 8, warm_up=-1)


def test_a_warm_level_keeps_the_little_law_accounting_of_its_own_requests() -> None:
    window = ProbeWindow([E2E], CAP, 4, warm_up=0)
    end = closed_loop(window, lambda i: ok(e2e=0.3), concurrency=4)
    n = len(window.outcomes)
    assert 20 <= n <= 23 and end < 20.0  # a margin pass, without the cold wave
    assert window.duration_s == pytest.approx(n * 0.3 / 4)


# --- early fail ---------------------------------------------------------------------------------
def test_the_early_looks_wait_for_a_turnover_and_double_below_min_probe_requests() -> None:
    assert early_looks(1, CAP) == (20, 40, 80)
    assert early_looks(32, CAP) == (32, 64)
    assert early_looks(128, CAP) == (128,)
    assert early_looks(4, CAP.model_copy(update={"early_fail": False})) == ()
    assert early_fail_confidence(0.95, 3) == pytest.approx(1 - 0.05 / 3)
    assert early_fail_confidence(0.95, 1) == pytest.approx(0.95)


def test_a_clearly_failing_level_stops_at_the_first_look() -> None:
    window = ProbeWindow([E2E], CAP, 1)
    end = closed_loop(window, lambda i: ok(e2e=3.0))
    assert window.early_failed and len(window.outcomes) == 20
    assert end < CAP.probe_duration * 4  # 20 requests of 3 s, not 100
    p = probe_from_outcomes(1, window.outcomes, window.duration_s, [E2E], 0.95, MARGIN)
    assert not p.passed and not unresolved(p, [E2E], 0.95)


def test_an_early_fail_waits_for_a_full_turnover_of_the_loop() -> None:
    # 40 streams, every request a miss: not judged before 40 have finished
    window = ProbeWindow([E2E], CAP, 40)
    closed_loop(window, lambda i: ok(e2e=3.0), concurrency=40)
    assert window.early_failed and window.done
    assert len(window.outcomes) == 40  # judged and over at once: those in flight left out


def test_a_level_near_its_objective_is_not_failed_early() -> None:
    # 1 request in 25 too slow (96 % against 0.95): the early looks cannot call it a failure
    window = ProbeWindow([E2E], CAP, 1)
    closed_loop(window, lambda i: ok(e2e=2.0) if i % 25 == 0 else ok(e2e=0.9))
    assert not window.early_failed and len(window.outcomes) >= 100


def test_a_level_exactly_at_its_objective_is_failed_early_rarely() -> None:
    # Independent requests, each good with probability 0.95 (the objective): the corrected
    # looks together fail such a level in at most 1 - confidence of the runs (Bonferroni).
    rng = random.Random(11)
    short = CAP.model_copy(update={"max_probe_requests": 100, "clear_margin": 0.0})
    trials = 1000
    failed = 0
    for _ in range(trials):
        window = ProbeWindow([E2E], short, 1)
        closed_loop(window, lambda i: ok(e2e=2.0) if rng.random() < 0.05 else ok(e2e=0.9))
        failed += window.early_failed
    assert failed / trials <= 0.05


# --- a level at its objective -------------------------------------------------------------------
def test_a_level_at_its_objective_ends_once_its_share_is_pinned_near_it() -> None:
    # 1 request in 20 too slow: exactly 0.95, which no interval resolves however long it runs.
    def outcome(i: int) -> RequestOutcome:
        return ok(e2e=2.0) if i % 20 == 0 else ok(e2e=0.9)

    window = ProbeWindow([E2E], CAP, 1)
    closed_loop(window, outcome)
    n = len(window.outcomes)
    assert 100 < n <= 400 and (n - 100) % 50 == 0  # at a checkpoint, far below the cap
    j = judge(window.outcomes, [E2E], 0.95)
    assert j.verdict == "unresolved"
    assert j.high - j.low <= 2 * 0.025  # ±2.5 points: half the miss share either side
    p = probe_from_outcomes(1, window.outcomes, window.duration_s, [E2E], 0.95)
    assert unresolved(p, [E2E], 0.95)  # the profile's notes name it
    # without the band only the cap ends it
    window = ProbeWindow([E2E], CAP.model_copy(update={"indifference": 0.0}), 1)
    closed_loop(window, outcome)
    assert len(window.outcomes) == CAP.max_probe_requests
