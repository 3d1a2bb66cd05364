"""Policies replayed through simulated replicas: replica timelines, spin-up, GPU-hours, SLOs.

The traffic is a step: 3 requests/s for 30 minutes, 20 for an hour, 3 again for an hour, on
the ``small`` calibration (a few requests per second per replica).
"""

from __future__ import annotations

import math

import pytest

from slo.cost.waste import lower_bound_replicas
from slo.planning.policy_replay import (
    LevelBook,
    level_capacity,
    lower_bound_gpu_hours,
    pool_slo_targets,
    rate_function,
    replay_policies,
)
from slo.planning.replica.profiles import get_profile
from vigil.config import Config, parse_config

UP_AT, DOWN_AT, END = 1800.0, 5400.0, 9000.0
STEP = [(0.0, 3.0), (UP_AT, 20.0), (DOWN_AT, 3.0)]


def _config(spinup: str = "3m") -> Config:
    return parse_config({
        "pools": [{"name": "chat", "model": "m", "gpu": "H100", "gpus_per_replica": 2,
                   "min_replicas": 1, "max_replicas": 20}],
        "scaling": {"spinup": spinup},
    })


@pytest.fixture(scope="module")
def book() -> LevelBook:
    cfg = _config()
    return LevelBook(get_profile("small"), pool_slo_targets(cfg, cfg.pools[0]))


@pytest.fixture(scope="module")
def mu(book: LevelBook) -> float:
    return level_capacity(book, max_rps=50)


def test_levels_get_worse_with_load(book: LevelBook, mu: float) -> None:
    light, at, over = book.level(mu / 3), book.level(mu), book.level(mu * 2)
    assert light.kv_usage < at.kv_usage < over.kv_usage
    assert over.queue_length > at.queue_length
    for s in book.slos:
        assert light.within[s.name] >= s.objective and at.within[s.name] >= s.objective
    assert any(over.within[s.name] < s.objective for s in book.slos)
    assert book.level(mu * 1.001) is book.level(mu)  # one grid point, simulated once


def test_capacity_policy_follows_ceil_of_lambda_over_mu(book: LevelBook, mu: float) -> None:
    cfg = _config()
    run = replay_policies(STEP, "small", cfg, cfg.pools[0], mu, end_s=END, book=book,
                          policies=["capacity"])["capacity"]
    low, high = lower_bound_replicas(3.0, mu), lower_bound_replicas(20.0, mu)
    replicas = dict(run.replicas)
    assert replicas[UP_AT - 15] == low
    assert replicas[UP_AT + 15] == high  # ordered at the first tick that saw the step
    # Scale-in only after the target stayed low for the whole 10-minute hold.
    assert replicas[DOWN_AT + 570] == high
    assert replicas[DOWN_AT + 660] == low
    # The step's first tick orders ceil(20/μ); the rising trend then projects past 20 (a
    # line through a step overshoots) and buys headroom, never fewer than ceil(20/μ).
    assert min(n for t, n in run.replicas if UP_AT + 15 <= t < DOWN_AT + 600) == high
    assert max(replicas.values()) > high
    assert replicas[DOWN_AT + 600] == high and replicas[DOWN_AT + 615] == low
    billed_s = sum(n for _, n in run.replicas) * 15.0
    assert run.gpu_hours == pytest.approx(billed_s / 3600 * 2)
    assert run.requests == pytest.approx(3 * 1800 + 20 * 3600 + 3 * 3600)


def test_spinup_delay_costs_latency(book: LevelBook, mu: float) -> None:
    def attainment(spinup: str) -> dict[str, float]:
        cfg = _config(spinup)
        return replay_policies(STEP, "small", cfg, cfg.pools[0], mu, end_s=END, book=book,
                               policies=["capacity"])["capacity"].attainment_by_slo

    quick, slow = attainment("15s"), attainment("15m")
    # 15 minutes of 20 requests/s on too few replicas: the overloaded ticks' requests miss.
    assert all(slow[name] < quick[name] for name in quick)
    assert min(slow.values()) < 0.95


def test_threshold_policy_scales_out_on_the_simulated_signals(book: LevelBook,
                                                              mu: float) -> None:
    cfg = _config()
    runs = replay_policies(STEP, "small", cfg, cfg.pools[0], mu, end_s=END, book=book)
    threshold = runs["threshold"]
    counts = dict(threshold.replicas)
    assert threshold.scale_outs >= 1
    assert max(counts.values()) > counts[0.0]
    assert max(n for t, n in threshold.replicas if t < UP_AT) == counts[0.0]
    lower = lower_bound_gpu_hours(rate_function(STEP, 15.0), 0.0, END, 900.0, mu, 2)
    assert runs["capacity"].gpu_hours >= lower
    assert runs["capacity"].meets_slo


def test_lower_bound_of_a_rate_curve_by_hand() -> None:
    rate = rate_function(STEP, 15.0)
    # μ = 4: ceil(3/4) = 1 replica for 2 steps, ceil(20/4) = 5 for 4, 1 for 4 -> 26 × 0.25 h
    assert lower_bound_gpu_hours(rate, 0.0, END, 900.0, 4.0, 2) == 26 * 0.25 * 2


def test_traffic_shapes() -> None:
    step = rate_function(STEP, 15.0)
    assert (step(-1.0), step(0.0), step(UP_AT), step(DOWN_AT - 1)) == (0.0, 3.0, 20.0, 20.0)
    arrivals = rate_function([0.5, 1.0, 14.0, 15.0, 31.0], 15.0)
    assert (arrivals(3.0), arrivals(20.0), arrivals(40.0)) == (3 / 15, 1 / 15, 1 / 15)
    assert rate_function(math.sqrt, 15.0)(4.0) == 2.0


def test_argument_errors(book: LevelBook) -> None:
    cfg = _config()
    with pytest.raises(ValueError, match="end_s"):
        replay_policies(lambda t: 1.0, "small", cfg, cfg.pools[0], 3.0)
    with pytest.raises(ValueError, match="unknown policy"):
        replay_policies(STEP, "small", cfg, cfg.pools[0], 3.0, end_s=60, book=book,
                        policies=["magic"])  # type: ignore[list-item]
