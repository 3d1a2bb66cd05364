"""Cost per pool, hand-computed: GPU-hours from ``up``, per 1000 requests, idle share."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_slo_fleet import AT, MODEL, OTHER_MODEL, Fleet, vllm_labels

from collector.store import Store
from slo.cost import pool_cost, tier_costs
from slo.embedded import EmbeddedSource
from vigil.config import parse_config
from vigil.model import RequestRecord

CONFIG = parse_config({
    "pools": [{"name": "chat", "model": MODEL, "gpu": "H100", "gpus_per_replica": 2}],
    "prices": {"H100": 6.88},
})
POOL = CONFIG.pools[0]
SAMPLES_PER_HOUR = 240  # one every 15 s


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def _fleet(store: Store) -> None:
    """chat-0 up all hour and serving; chat-1 up the first half hour only, serving nothing."""
    fleet = Fleet(store)
    last = fleet.steps - 1
    fleet.up("chat-0")
    fleet.up("chat-1", value=lambda i: 0.0 if i > last - SAMPLES_PER_HOUR // 2 else 1.0)
    a = vllm_labels("chat-0")
    fleet.requests(a, {"stop": 8, "length": 1, "abort": 1})  # 10 finished requests per scrape
    fleet.counter("vllm:generation_tokens_total", a, 2000.0)
    # idle (0 running) for the last quarter hour
    fleet.gauge("vllm:num_requests_running", a, lambda i: 0.0 if i > last - 60 else 12.0)
    fleet.flush()


def test_cost_per_1000_requests_with_one_replica_down_half_the_window(store: Store) -> None:
    _fleet(store)
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT)
    # (1 + 0.5) replica-hours × 2 GPUs = 3 GPU-hours at $6.88
    assert cost["window"] == "1h"
    assert cost["gpu_hours"] == pytest.approx(3.0)
    assert cost["cost_usd"] == pytest.approx(20.64)
    assert cost["requests"] == pytest.approx(10 * SAMPLES_PER_HOUR)
    assert cost["per_1000_requests"] == pytest.approx(20.64 / 2400 * 1000)  # $8.60
    assert cost["output_tokens"] == pytest.approx(2000 * SAMPLES_PER_HOUR)
    assert cost["per_million_output_tokens"] == pytest.approx(20.64 / 0.48)  # $43.00


def test_idle_share_counts_samples_with_nothing_running(store: Store) -> None:
    _fleet(store)
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT)
    assert cost["idle_share"] == pytest.approx(60 / 240)
    assert cost["idle_cost_usd"] == pytest.approx(20.64 / 4)


def test_cost_has_per_model_counts_and_null_gateway_seams(store: Store) -> None:
    _fleet(store)
    fleet = Fleet(store)
    fleet.requests(vllm_labels("chat-0", model=OTHER_MODEL), {"stop": 1})
    fleet.flush()
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT)
    assert cost["models"][MODEL]["requests"] == pytest.approx(2400)
    assert cost["models"][OTHER_MODEL] == {"requests": pytest.approx(240),
                                           "output_tokens": None}
    assert cost["by_tier"] is None
    assert cost["cache_savings_usd"] is None


def test_an_up_but_idle_pool_costs_money_and_has_no_per_request_cost(store: Store) -> None:
    fleet = Fleet(store)
    fleet.up("chat-0")
    fleet.requests(vllm_labels("chat-0"), {})  # scraped, but nothing finished
    fleet.flush()
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT)
    assert cost["gpu_hours"] == pytest.approx(2.0)
    assert cost["requests"] == 0.0
    assert cost["per_1000_requests"] is None
    assert cost["per_million_output_tokens"] is None


def test_no_data_is_null_not_zero(store: Store) -> None:
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT)
    for key in ("gpu_hours", "cost_usd", "requests", "output_tokens", "per_1000_requests",
                "per_million_output_tokens", "idle_share", "idle_cost_usd"):
        assert cost[key] is None, key


def test_cost_window_can_be_overridden(store: Store) -> None:
    _fleet(store)
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT, window_s=900)
    # the last 15 minutes: chat-1 is down, chat-0 up -> 0.25 h × 2 GPUs
    assert cost["window"] == "15m"
    assert cost["gpu_hours"] == pytest.approx(0.5)
    assert cost["idle_share"] == 1.0


class _Log:
    """Gateway records: premium took 3 of 4 GPU-cost units, batch 1; one cache hit."""

    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        def rec(i: int, tier: str, cost: float | None, **kw: object) -> RequestRecord:
            return RequestRecord(f"r{i}", at_s - i, pool, MODEL, "chat", 100, 50, 0.1, 1.0,
                                 tier=tier, tenant="t", cost_usd=cost, **kw)  # type: ignore[arg-type]

        return [rec(0, "premium", 0.02), rec(1, "premium", 0.01), rec(2, "batch", 0.01),
                rec(3, "premium", 0.0, cache_hit="l2", saved_usd=0.015)]


def test_with_gateway_records_the_cost_splits_by_tier_and_counts_cache_savings(
    store: Store,
) -> None:
    _fleet(store)
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT, request_log=_Log())
    premium, batch = cost["by_tier"]["premium"], cost["by_tier"]["batch"]
    assert premium["cost_share"] == pytest.approx(0.75)
    assert premium["cost_usd"] == pytest.approx(20.64 * 0.75)  # tiers add up to the pool
    assert batch["cost_usd"] == pytest.approx(20.64 * 0.25)
    assert premium["requests"] == 3 and premium["cache_hits"] == 1
    assert premium["per_1000_requests"] == pytest.approx(20.64 * 0.75 / 3 * 1000)
    assert cost["cache_savings_usd"] == pytest.approx(0.015)


def test_tier_costs_fall_back_to_output_tokens_without_gateway_costs() -> None:
    recs = [RequestRecord("a", 0, "chat", MODEL, "chat", 10, 30, tier="premium"),
            RequestRecord("b", 0, "chat", MODEL, "chat", 10, 10, tier="standard")]
    by_tier, savings = tier_costs(recs, 8.0)
    assert by_tier is not None and savings is None
    assert by_tier["premium"]["cost_usd"] == pytest.approx(6.0)
    assert by_tier["standard"]["cost_usd"] == pytest.approx(2.0)
    assert tier_costs([], 8.0) == (None, None)


def test_tier_costs_skip_refused_requests_and_sum_savings_per_tier() -> None:
    recs = [RequestRecord("a", 0, "chat", MODEL, "chat", 10, 10, tier="standard", cost_usd=0.001),
            RequestRecord("b", 0, "chat", MODEL, "chat", 10, 10, tier="premium", cost_usd=0.003),
            RequestRecord("c", 0, "chat", MODEL, "chat", 10, 10, tier="standard", cost_usd=0.0,
                          cache_hit="l2", saved_usd=0.002),
            RequestRecord("d", 0, "chat", MODEL, "chat", 10, 0, tier="standard",
                          error_class="rejected"),
            RequestRecord("e", 0, "chat", MODEL, "chat", 10, 0, tier="batch",
                          error_class="over_cap")]
    by_tier, saved = tier_costs(recs, 4.0)
    assert by_tier is not None and set(by_tier) == {"standard", "premium"}  # refusals: none
    assert by_tier["standard"]["requests"] == 2 and by_tier["standard"]["cache_hits"] == 1
    assert by_tier["standard"]["saved_usd"] == pytest.approx(0.002)
    assert by_tier["premium"]["cost_usd"] == pytest.approx(3.0)
    assert by_tier["standard"]["per_1000_requests"] == pytest.approx(1.0 / 2 * 1000)
    assert saved == pytest.approx(0.002)
