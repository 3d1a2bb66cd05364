"""Cost per pool, hand-computed: GPU-hours from ``up``, per 1000 requests, idle share.

A replica is billed for the time it ran: each ``up == 1`` sample stands for one scrape
interval, so replicas joining or leaving mid-window, scrape gaps and down stretches each cost
what they ran (hand-computed below).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fleet import AT, MODEL, OTHER_MODEL, Fleet, target_labels, vllm_labels

from collector.store import Store
from dashboard import whatif
from slo.cost.pool import coverage_interval, gpu_hours, pool_cost, tier_costs, up_seconds
from slo.sources.embedded import EmbeddedSource
from vigil.config import Config, parse_config
from vigil.model import RequestRecord, SeriesKey, labels_of

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
    # The cache hit is no request a replica finished: 2 of premium's 3 records count.
    assert premium["requests"] == 2 and premium["cache_hits"] == 1
    assert premium["per_1000_requests"] == pytest.approx(20.64 * 0.75 / 2 * 1000)
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
    assert by_tier["standard"]["requests"] == 1 and by_tier["standard"]["cache_hits"] == 1
    assert by_tier["standard"]["saved_usd"] == pytest.approx(0.002)
    assert by_tier["premium"]["cost_usd"] == pytest.approx(3.0)
    assert by_tier["standard"]["per_1000_requests"] == pytest.approx(1.0 / 1 * 1000)
    assert saved == pytest.approx(0.002)


def _rec(i: int, tier: str, cost: float | None = 0.001, **kw: object) -> RequestRecord:
    """A gateway record of pool "chat" (100 prompt, 50 generated tokens)."""
    return RequestRecord(f"r{i}", AT - 1, "chat", MODEL, "chat", 100, 50, tier=tier,
                         cost_usd=cost, **kw)  # type: ignore[arg-type]


def test_a_tier_counts_the_requests_vllm_counts_and_shows_the_others_beside() -> None:
    # vLLM's request_success_total would count 4 of premium's: 3 completed, 1 engine error
    # (answered with a 500). Not the client's cancels nor the gateway's timeout (both abort
    # the request in vLLM), not the replica's 4xx refusal, not the cache hit (no replica).
    recs = [_rec(0, "premium", status=200), _rec(1, "premium", status=200),
            _rec(2, "premium", status=200),
            _rec(3, "premium", error=True, error_class="upstream_5xx", status=500),
            _rec(4, "premium", 0.002, error_class="client_cancel", status=499),
            _rec(5, "premium", 0.002, error_class="client_cancel", status=499),
            _rec(6, "premium", error=True, error_class="timeout", status=504),
            _rec(7, "premium", 0.0, error_class="upstream_4xx", status=400),
            _rec(8, "premium", 0.0, cache_hit="l1", saved_usd=0.001, status=200),
            _rec(9, "premium", None, error_class="rejected", status=429),
            _rec(10, "batch", status=200)]
    by_tier, _ = tier_costs(recs, 10.0)
    assert by_tier is not None
    premium = by_tier["premium"]
    assert (premium["requests"], premium["cancelled"], premium["timed_out"],
            premium["cache_hits"]) == (4, 2, 1, 1)
    # The cancelled and timed-out requests' GPU time still weighs: 9 of the 10 units.
    assert premium["cost_share"] == pytest.approx(0.009 / 0.010)
    assert premium["per_1000_requests"] == pytest.approx(10.0 * 0.9 / 4 * 1000)
    assert by_tier["batch"]["requests"] == 1 and by_tier["batch"]["cancelled"] == 0


def test_a_tier_with_only_cancels_has_a_cost_but_no_cost_per_request() -> None:
    by_tier, _ = tier_costs([_rec(0, "standard", error_class="client_cancel", status=499)],
                            2.0)
    assert by_tier is not None
    assert by_tier["standard"]["cost_usd"] == pytest.approx(2.0)
    assert by_tier["standard"]["requests"] == 0 and by_tier["standard"]["cancelled"] == 1
    assert by_tier["standard"]["per_1000_requests"] is None


class _OneTierLog:
    """The gateway's view of ``_fleet``'s traffic, all of it standard: the 2400 requests
    chat-0 finished, plus 147 the clients cancelled and 30 cache hits, which vLLM's
    ``request_success_total`` does not count."""

    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        finished = [_rec(i, "standard") for i in range(10 * SAMPLES_PER_HOUR)]
        cancelled = [_rec(10_000 + i, "standard", 0.003, error_class="client_cancel",
                          status=499) for i in range(147)]
        hits = [_rec(20_000 + i, "standard", 0.0, cache_hit="l2", saved_usd=0.001)
                for i in range(30)]
        return finished + cancelled + hits


def test_one_tier_with_all_the_traffic_costs_what_the_pool_does_per_1000(store: Store) -> None:
    _fleet(store)
    cost = pool_cost(EmbeddedSource(store), CONFIG, POOL, AT, request_log=_OneTierLog())
    standard = cost["by_tier"]["standard"]
    assert standard["requests"] == pytest.approx(cost["requests"])  # 2400 both
    assert standard["cancelled"] == 147 and standard["cache_hits"] == 30
    assert standard["cost_usd"] == pytest.approx(cost["cost_usd"])
    assert standard["per_1000_requests"] == pytest.approx(cost["per_1000_requests"])  # $8.60


# --- billed for the time it ran ---------------------------------------------------------------
def _targets_config(*targets: dict[str, object], **pool: object) -> Config:
    """One H100 pool "chat" (1 GPU per replica, $4/GPU-hour) with the given targets."""
    return parse_config({
        "pools": [{"name": "chat", "model": MODEL, **pool}],
        "targets": [{"url": f"http://127.0.0.1:{9 + i}/metrics", "pool": "chat", **t}
                    for i, t in enumerate(targets)],
        "prices": {"H100": 4.0},
    })


SCALED = _targets_config({"name": "chat-0"}, {"name": "chat-1"})


def _up(store: Store, instance: str, times_s: list[float], value: float = 1.0,
        down: range = range(0)) -> None:
    """``up`` of ``instance`` at ``times_s`` (Unix seconds): ``value``, 0 at indexes ``down``."""
    key = SeriesKey("up", labels_of(target_labels(instance)))
    store.write([(key, "gauge", round(t * 1000), 0.0 if i in down else value)
                 for i, t in enumerate(times_s)])


def _every(step_s: float, first_s: float, last_s: float = AT) -> list[float]:
    """Scrape times from ``first_s`` to ``last_s`` (inclusive) every ``step_s`` seconds."""
    n = int((last_s - first_s) // step_s)
    return [first_s + k * step_s for k in range(n + 1)]


def _hours(store: Store, config: Config = SCALED, semantics: str = "3") -> float | None:
    return gpu_hours(EmbeddedSource(store, semantics=semantics), config, config.pools[0], AT,
                     3600.0)


def test_a_replica_joining_half_way_costs_half_the_window(store: Store) -> None:
    # chat-0 all hour: 240 samples in (AT - 1h, AT]; chat-1 started at AT - 30m, first scraped
    # 5 s later: samples AT - 1795 ... AT - 10, 120 of them. 240 + 120 samples × 15 s = 1.5 h
    # (a whole window for each would be 2.0).
    _up(store, "chat-0", _every(15.0, AT - 3900))
    _up(store, "chat-1", _every(15.0, AT - 1795, AT - 10))
    hours = _hours(store)
    assert hours == 1.5
    cost = pool_cost(EmbeddedSource(store), SCALED, SCALED.pools[0], AT)
    assert cost["cost_usd"] == 6.0


def test_a_replica_leaving_half_way_costs_the_half_it_ran(store: Store) -> None:
    # chat-1 scraped from before the window until AT - 1800: in the window AT - 3585 ... AT - 1800,
    # 120 samples = 30 minutes.
    _up(store, "chat-0", _every(15.0, AT - 3900))
    _up(store, "chat-1", _every(15.0, AT - 3900, AT - 1800))
    assert _hours(store) == 1.5


def test_a_replica_joining_is_within_one_scrape_interval_whatever_its_phase(
    store: Store,
) -> None:
    # Started at AT - 1800 + 0.4 s, first scraped at once: samples AT - 1799.6 + 15k, 120 of
    # them: 1800 s billed for 1799.6 s run.
    _up(store, "chat-1", _every(15.0, AT - 1799.6))
    hours = _hours(store)
    assert hours is not None and abs(hours - 1799.6 / 3600) <= 15 / 3600
    assert hours == 120 * 15 / 3600


def test_a_scrape_gap_is_not_billed(store: Store) -> None:
    # No sample in (AT - 2400, AT - 1800]: 40 scrapes missing, 200 left = 50 minutes.
    times = [t for t in _every(15.0, AT - 3900) if not AT - 2400 < t <= AT - 1800]
    _up(store, "chat-0", times)
    assert _hours(store, _targets_config({"name": "chat-0"})) == pytest.approx(200 * 15 / 3600)


def test_down_time_is_not_billed_unless_the_pool_says_so(store: Store) -> None:
    # 20 minutes of up == 0 (80 of the window's 240 samples): 160 × 15 s billed; with
    # bill_down_time every sample is: the whole hour.
    times = _every(15.0, AT - 3900)
    first = times.index(AT - 3585)
    _up(store, "chat-0", times, down=range(first + 100, first + 180))
    assert _hours(store, _targets_config({"name": "chat-0"})) == pytest.approx(160 * 15 / 3600)
    billing = _targets_config({"name": "chat-0"}, bill_down_time=True)
    assert _hours(store, billing) == 1.0


def test_a_target_down_all_window_costs_zero_not_none(store: Store) -> None:
    _up(store, "chat-0", _every(15.0, AT - 3900), value=0.0)
    assert _hours(store, _targets_config({"name": "chat-0"})) == 0.0


def test_each_target_is_billed_at_its_own_interval(store: Store) -> None:
    # chat-1 is scraped every 30 s: 120 samples × 30 s = 1 h, as chat-0's 240 × 15 s.
    config = _targets_config({"name": "chat-0"}, {"name": "chat-1", "scrape_interval": "30s"})
    _up(store, "chat-0", _every(15.0, AT - 3900))
    _up(store, "chat-1", _every(30.0, AT - 3900))
    assert _hours(store, config) == 2.0


def test_gpus_per_replica_multiply_and_price_follows(store: Store) -> None:
    config = _targets_config({"name": "chat-0"}, {"name": "chat-1"}, gpus_per_replica=4)
    _up(store, "chat-0", _every(15.0, AT - 3900))
    _up(store, "chat-1", _every(15.0, AT - 1795, AT - 10))
    cost = pool_cost(EmbeddedSource(store), config, config.pools[0], AT)
    assert cost["gpu_hours"] == 6.0
    assert cost["cost_usd"] == 24.0


def test_the_window_edge_sample_never_bills_more_than_the_window(store: Store) -> None:
    # Prometheus 2's range includes its left edge: 241 samples in [AT - 1h, AT], 3615 s,
    # billed as the window's 3600 s (clamp_max in the rule).
    _up(store, "chat-0", _every(15.0, AT - 3900))
    config = _targets_config({"name": "chat-0"})
    assert _hours(store, config, semantics="2") == 1.0
    assert _hours(store, config, semantics="3") == 1.0


def test_a_series_of_no_configured_target_takes_its_median_spacing(store: Store) -> None:
    # "chat-9" is in no [[targets]] entry (a Prometheus discovered it): every 30 s, with one
    # missed scrape; the median spacing is 30 s, so 119 samples cost 119 × 30 s.
    times = [t for t in _every(30.0, AT - 3900) if t != AT - 1800]
    _up(store, "chat-9", times)
    per = up_seconds(EmbeddedSource(store), SCALED, SCALED.pools[0], AT, 3600.0)
    assert list(per.values()) == [119 * 30.0]


def test_an_unknown_interval_is_never_more_than_the_lookback() -> None:
    every_10m = [k * 600_000 for k in range(6)]
    assert coverage_interval(None, every_10m, 15.0, 300.0) == 300.0
    assert coverage_interval(None, every_10m[:3], 15.0, 300.0) == 15.0  # too few: the default
    assert coverage_interval(30.0, every_10m, 15.0, 300.0) == 30.0  # configured wins


def test_the_what_if_panel_starts_from_the_replicas_that_ran(store: Store) -> None:
    _up(store, "chat-0", _every(15.0, AT - 3900))
    _up(store, "chat-1", _every(15.0, AT - 1795, AT - 10))
    _fleet_requests(store)
    cost = pool_cost(EmbeddedSource(store), SCALED, SCALED.pools[0], AT)
    replicas = whatif.observed_replicas(cost, 3600.0, 1)
    assert replicas == 1.5
    again = whatif.per_1000_requests(requests=cost["requests"], window_s=3600.0,
                                     replicas=replicas, gpus_per_replica=1, usd_per_gpu_hour=4.0)
    assert again == pytest.approx(cost["per_1000_requests"], rel=1e-12)
    assert cost["per_1000_requests"] == pytest.approx(6.0 / 2400 * 1000)


def _fleet_requests(store: Store) -> None:
    fleet = Fleet(store)
    fleet.requests(vllm_labels("chat-0"), {"stop": 10})  # 10 per 15 s: 2400 an hour
    fleet.flush()


def test_downsampled_history_bills_each_kept_sample_for_its_bucket(tmp_path: Path) -> None:
    # 6 h of 15 s scrapes; compaction keeps the last sample per minute of what is older than
    # 2 h: an hour there has 60 samples, each standing for its 60 s bucket, so 1 h still.
    with Store(tmp_path / "v.db", raw_retention_s=7200, resolution_s=60) as s:
        _up(s, "chat-0", _every(15.0, AT - 6 * 3600))
        s.compact(now=AT)
        source = EmbeddedSource(s)
        before_ms, resolution = source.downsampled() or (0, 0.0)
        assert before_ms <= round((AT - 7200) * 1000) and resolution == 60.0
        config = _targets_config({"name": "chat-0"})
        old = AT - 4 * 3600
        assert [len(pts) for pts in source.samples("up", {}, old, 3600.0).values()] == [60]
        assert gpu_hours(source, config, config.pools[0], old, 3600.0) == 1.0
        # Straddling the boundary: raw and kept samples each for what they stand for.
        edge = AT - 7200 + 1800
        assert gpu_hours(source, config, config.pools[0], edge, 3600.0) == 1.0
        assert gpu_hours(source, config, config.pools[0], AT, 3600.0) == 1.0


def test_a_store_that_never_compacted_is_not_downsampled(store: Store) -> None:
    assert EmbeddedSource(store).downsampled() is None
