"""Scale-outs sized by a capacity profile (``slo.scaling.policy.decide(..., capacity=...)``) on
synthetic timelines, the request-rate signal from a real store, and the status naming the
profile it used."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from collector.store import Store
from slo.planning.profile_store import ProfileStore
from slo.scaling.policy import (
    SIGNAL_CAPACITY,
    SIGNAL_CAPACITY_FLOOR,
    SIGNAL_COOLDOWN,
    SIGNAL_KV,
    SIGNAL_MAX_REPLICAS,
    SIGNAL_MIN_REPLICAS,
    SIGNAL_PROPORTIONAL,
    SIGNAL_REQUEST_RATE,
    CapacitySizing,
    Recommendation,
    Timeline,
    decide,
)
from slo.scaling.signals import pool_signals, rate_window_for, recommend_for_pool, request_rate_at
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.capacity import Basis, CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig, Config, PoolConfig, ScalingConfig
from vigil.model import SeriesKey

NOW = 1_795_000_000.0
MIN = 60.0
STEP = 15.0
POOL = PoolConfig(name="chat", model="llama", gpu="H100", min_replicas=1, max_replicas=8)
SCALING = ScalingConfig()
TTFT_SLO = 0.8
MEASURED = CapacitySizing(4.2, "measured", "abc123")


def times(minutes: float, now: float = NOW) -> list[float]:
    span = minutes * MIN
    n = round(span / STEP)
    return [now - k * STEP for k in range(n, -1, -1)]


def flat(value: float, minutes: float = 10, now: float = NOW) -> Timeline:
    return [(t, value) for t in times(minutes, now)]


def ramp(v0: float, v1: float, minutes: float = 5) -> Timeline:
    span = minutes * MIN
    return [(t, v0 + (v1 - v0) * (t - (NOW - span)) / span) for t in times(minutes)]


def run(
    kv: Timeline | None = None,
    queue: Timeline | None = None,
    *,
    rate: Timeline | None = None,
    capacity: CapacitySizing | None = MEASURED,
    current: int = 2,
    pool: PoolConfig = POOL,
    last_out: float | None = None,
) -> Recommendation:
    return decide(
        kv, queue, None, now=NOW, current=current, pool=pool, scaling=SCALING,
        ttft_threshold_s=TTFT_SLO, last_scale_out_at=last_out,
        request_rate=rate, capacity=capacity,
    )


def reason(rec: Recommendation, signal: str) -> str:
    found = [r.text for r in rec.reasons if r.signal == signal]
    assert found, f"no {signal} reason in {[r.text for r in rec.reasons]}"
    return found[0]


# --- sizing a scale-out -----------------------------------------------------------------------


def test_a_scale_out_is_sized_by_the_request_rate() -> None:
    # Proportional sizing would ask ceil(2 × 0.90 / 0.80) = 3; 14.2 / 4.2 = 3.38 -> 4.
    rec = run(flat(0.90), flat(0), rate=flat(14.2))
    assert (rec.action, rec.current, rec.desired) == ("scale_out", 2, 4)
    assert [r.signal for r in rec.reasons] == [SIGNAL_KV, SIGNAL_CAPACITY]
    assert reason(rec, SIGNAL_CAPACITY) == (
        "sized by capacity: 14.2 req/s now / 4.2 req/s per replica (measured) = 4")
    assert rec.signals[SIGNAL_REQUEST_RATE] == pytest.approx(14.2)


def test_a_rising_rate_is_sized_for_its_projection_over_the_spinup() -> None:
    # 10 -> 14 req/s over 5 min: 4/300 req/s per s, 14 + 180 × 4/300 = 16.4 req/s in 3 min;
    # 16.4 / 4.0 = 4.1 -> 5 (the rate now, 14 / 4 = 3.5, would give 4).
    rec = run(flat(0.90), flat(0), rate=ramp(10.0, 14.0),
              capacity=CapacitySizing(4.0, "estimated"))
    assert rec.desired == 5
    sized = next(r for r in rec.reasons if r.signal == SIGNAL_CAPACITY)
    assert sized.projected == pytest.approx(16.4)
    assert sized.horizon_s == SCALING.spinup
    assert sized.trend_per_s == pytest.approx(4.0 / 300.0)
    assert sized.text == (
        "sized by capacity: 16.4 req/s projected / 4.0 req/s per replica (estimated) = 5")


def test_a_falling_rate_is_sized_for_now() -> None:
    rec = run(flat(0.90), flat(0), rate=ramp(20.0, 14.2))
    sized = next(r for r in rec.reasons if r.signal == SIGNAL_CAPACITY)
    assert sized.projected is None
    assert rec.desired == 4


def test_a_scale_out_adds_at_least_one_replica() -> None:
    rec = run(flat(0.90), flat(0), rate=flat(1.0), current=4)
    assert rec.desired == 5
    assert reason(rec, SIGNAL_CAPACITY).endswith("(measured) = 1")


def test_a_capacity_need_above_max_replicas_is_capped_and_said() -> None:
    rec = run(flat(0.90), flat(0), rate=flat(100.0), capacity=CapacitySizing(4.0, "observed"))
    assert rec.desired == 8
    assert reason(rec, SIGNAL_CAPACITY).endswith("(observed) = 25")
    assert reason(rec, SIGNAL_MAX_REPLICAS) == "above max_replicas: 25 replicas > 8"


def test_at_max_replicas_capacity_changes_nothing() -> None:
    rec = run(flat(0.90), flat(0), rate=flat(100.0), current=8)
    assert (rec.action, rec.desired) == ("hold", 8)
    assert reason(rec, SIGNAL_MAX_REPLICAS) == "at max_replicas: 8 replicas >= 8"


def test_below_min_replicas_a_trigger_is_sized_by_capacity() -> None:
    pool = PoolConfig(name="chat", model="llama", min_replicas=3, max_replicas=8)
    rec = run(flat(0.90), flat(0), rate=flat(14.2), current=2, pool=pool)
    assert rec.desired == 4
    assert [r.signal for r in rec.reasons] == [SIGNAL_MIN_REPLICAS, SIGNAL_KV, SIGNAL_CAPACITY]


def test_the_cooldown_still_holds() -> None:
    rec = run(flat(0.90), flat(0), rate=flat(14.2), last_out=NOW - 60)
    assert (rec.action, rec.desired) == ("hold", 2)
    assert [r.signal for r in rec.reasons] == [SIGNAL_COOLDOWN, SIGNAL_KV]


def test_no_trigger_no_scale_out_whatever_the_rate() -> None:
    # The rate alone never triggers: the same triggers as without a profile.
    rec = run(flat(0.50), flat(0), rate=flat(100.0))
    assert rec.action == "hold"


def test_without_a_rate_the_proportional_rule_sizes() -> None:
    rec = run(flat(0.90), flat(0), rate=None)
    assert rec.desired == 3  # ceil(2 × 0.90 / 0.80)
    assert rec.signals[SIGNAL_REQUEST_RATE] is None
    stale = run(flat(0.90), flat(0), rate=flat(14.2, minutes=5, now=NOW - 10 * MIN))
    assert stale.desired == 3


def test_a_saturated_pool_is_sized_by_its_queue_not_by_what_it_finishes() -> None:
    # 4 replicas finish 24 req/s with 500 waiting and TTFT p95 5 s: the finished rate says
    # ceil((24 + 500 / 180 s) / 5) = 6; the queue says 4 × 500 / 50 = 40 (TTFT: 4 × 5 / 0.64
    # = 32); the larger holds, as without a profile.
    pool = PoolConfig(name="chat", model="llama", gpu="H100", min_replicas=1, max_replicas=64)
    args = dict(now=NOW, current=4, pool=pool, scaling=SCALING, ttft_threshold_s=TTFT_SLO,
                last_scale_out_at=None)
    plain = decide(flat(1.0), flat(500), flat(5.0), **args)
    rec = decide(flat(1.0), flat(500), flat(5.0), **args, request_rate=flat(24.0),
                 capacity=CapacitySizing(5.0, "measured"))
    assert plain.desired == 40
    assert (rec.action, rec.desired) == ("scale_out", 40)
    assert reason(rec, SIGNAL_CAPACITY) == (
        "sized by capacity: (24.0 req/s now finished + 500 queued / 3m) / 5.0 req/s per "
        "replica (measured) = 6")
    assert reason(rec, SIGNAL_PROPORTIONAL) == (
        "sized by queue length: 4 replicas × 10.00 = 40 (the proportional rule, above the "
        "capacity sizing)")
    detail = next(x for x in rec.to_dict()["reason_details"] if x["signal"] == SIGNAL_CAPACITY)
    assert (detail["queued"], detail["drain_s"], detail["queue_growth_per_s"]) == (
        500.0, SCALING.spinup, None)


def test_a_growing_queue_adds_its_slope_and_backlog_to_the_rate() -> None:
    # 6 req/s finished, the queue 0 -> 90 over 5 min (0.3 req/s not finished) and 90 waiting
    # (0.5 req/s to drain them within the 3-min spin-up): 6.8 / 1.0 -> 7 replicas; the rate
    # alone would say 6, the queue's proportional rule (projected 90 + 0.3 × 180 = 144)
    # ceil(2 × 144 / 50) = 6.
    rec = run(flat(0.5), ramp(0.0, 90.0), rate=flat(6.0),
              capacity=CapacitySizing(1.0, "measured"))
    assert rec.desired == 7
    sized = next(r for r in rec.reasons if r.signal == SIGNAL_CAPACITY)
    assert sized.queue_growth_per_s == pytest.approx(0.3)
    assert (sized.queued, sized.replicas) == (pytest.approx(90.0), 7)
    assert sized.text == (
        "sized by capacity: (6.0 req/s now finished + 0.3 req/s queue growth + 90 queued / "
        "3m) / 1.0 req/s per replica (measured) = 7")
    assert not [r for r in rec.reasons if r.signal == SIGNAL_PROPORTIONAL]


def test_kv_usage_alone_does_not_raise_a_capacity_sizing() -> None:
    # A full cache with an empty queue is served: the finished rate is the load.
    rec = run(flat(1.0), flat(0), rate=flat(4.0), capacity=CapacitySizing(1.0, "measured"),
              current=2)
    assert rec.desired == 4
    assert [r.signal for r in rec.reasons] == [SIGNAL_KV, SIGNAL_CAPACITY]


# --- the scale-in floor ----------------------------------------------------------------------


def test_a_scale_in_never_goes_below_what_the_rate_needs() -> None:
    one = CapacitySizing(1.0, "measured")
    held = run(flat(0.10), flat(0), rate=flat(3.5), capacity=one, current=4)
    assert (held.action, held.desired) == ("hold", 4)
    assert reason(held, SIGNAL_CAPACITY_FLOOR) == (
        "sized by capacity: 3.5 req/s now / 1.0 req/s per replica (measured) = 4, "
        "no scale-in below it")
    allowed = run(flat(0.10), flat(0), rate=flat(2.5), capacity=one, current=4)
    assert (allowed.action, allowed.desired) == ("scale_in", 3)
    assert not [r for r in allowed.reasons if r.signal == SIGNAL_CAPACITY_FLOOR]


def test_a_small_capacity_keeps_its_digits_in_the_reason() -> None:
    rec = run(flat(0.90), flat(0), rate=flat(0.7), capacity=CapacitySizing(0.35, "measured"))
    assert reason(rec, SIGNAL_CAPACITY) == (
        "sized by capacity: 0.7 req/s now / 0.35 req/s per replica (measured) = 2")
    assert rec.desired == 3  # current + 1


def test_a_scale_in_stays_one_replica_at_a_time() -> None:
    rec = run(flat(0.10), flat(0), rate=flat(0.5), capacity=CapacitySizing(1.0, "measured"),
              current=6)
    assert rec.desired == 5


# --- without a profile: what it always was ---------------------------------------------------


@pytest.mark.parametrize("kv, queue", [
    (flat(0.90), flat(0)), (flat(0.10), flat(0)), (flat(0.50), flat(70)), (None, None),
])
def test_without_capacity_the_rate_changes_nothing(kv: Timeline | None,
                                                   queue: Timeline | None) -> None:
    plain = run(kv, queue, capacity=None)
    with_rate = run(kv, queue, rate=flat(50.0), capacity=None)
    assert with_rate == plain
    assert json.dumps(with_rate.to_dict()) == json.dumps(plain.to_dict())
    assert "capacity" not in plain.to_dict()
    assert SIGNAL_REQUEST_RATE not in plain.signals


def test_the_recommendation_names_its_capacity() -> None:
    d = run(flat(0.90), flat(0), rate=flat(14.2)).to_dict()
    assert d["capacity"] == {"rps_per_replica": 4.2, "basis": "measured", "source": "abc123"}
    detail = next(x for x in d["reason_details"] if x["signal"] == SIGNAL_CAPACITY)
    assert (detail["basis"], detail["replicas"]) == ("measured", 4)
    json.dumps(d)


def test_capacity_sizing_rounds_float_noise_and_refuses_nonsense() -> None:
    tenth = CapacitySizing(0.1, "measured")
    assert 0.30000000000000004 / 0.1 > 3  # without rounding ceil() would say 4
    assert tenth.replicas_for(0.30000000000000004) == 3
    assert tenth.replicas_for(0.0) == 0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rps_per_replica"):
            CapacitySizing(bad, "measured")


def test_capacity_sizing_from_a_profile() -> None:
    saved = profile(4.2, basis="observed")
    assert CapacitySizing.from_profile(saved) == CapacitySizing(4.2, "observed", saved.key)
    assert CapacitySizing.from_profile(profile(0.0)) is None
    assert CapacitySizing.from_profile(None) is None


# --- the request rate from a real store ------------------------------------------------------

AT = 1_795_000_200.0


def key(name: str, instance: str, **extra: str) -> SeriesKey:
    labels = {"instance": instance, "pool": "chat", "kind": "vllm", **extra}
    return SeriesKey(name, tuple(sorted(labels.items())))


def write_replica(store: Store, instance: str, *, kv: float, per_scrape: float,
                  minutes: float = 20) -> None:
    """A replica scraped every 15 s: ``per_scrape`` more finished requests each scrape (split
    over two ``finished_reason`` series), from a counter already at 1000."""
    vllm = {"engine": "0", "model_name": "llama"}
    rows = []
    for i, t in enumerate(times(minutes, AT)):
        ms = round(t * 1000)
        rows.append((key("up", instance), "gauge", ms, 1.0))
        rows.append((key("vllm:kv_cache_usage_perc", instance, **vllm), "gauge", ms, kv))
        rows.append((key("vllm:num_requests_waiting", instance, **vllm), "gauge", ms, 0.0))
        for why, share in (("stop", 0.75), ("length", 0.25)):
            rows.append((key("vllm:request_success_total", instance, finished_reason=why,
                             **vllm), "counter", ms, 1000.0 + i * per_scrape * share))
    store.write(rows)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def test_request_rate_is_the_pools_rate_of_finished_requests(store: Store) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)  # 2 req/s
    write_replica(store, "r2", kv=0.85, per_scrape=15)  # 1 req/s
    source = EmbeddedSource(store)
    assert request_rate_at(source, POOL, AT, 60.0) == pytest.approx(3.0)
    assert request_rate_at(source, PoolConfig(name="nobody", model="m"), AT) is None
    assert rate_window_for(15.0) == 60.0 and rate_window_for(30.0) == 120.0
    sig = pool_signals(source, POOL, AT, scaling=SCALING, request_rate=True)
    assert [t for t, _ in sig.request_rate] == times(5, AT)
    assert all(v == pytest.approx(3.0) for _, v in sig.request_rate)
    assert pool_signals(source, POOL, AT, scaling=SCALING).request_rate == []


def test_recommend_for_pool_sizes_by_capacity(store: Store) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    source = EmbeddedSource(store)
    config = Config(pools=[POOL])
    plain = recommend_for_pool(source, config, POOL, AT)
    assert plain.desired == 3  # ceil(2 × 0.85 / 0.80)
    sized = recommend_for_pool(source, config, POOL, AT,
                               capacity=CapacitySizing(1.0, "measured"))
    assert sized.desired == 4  # 4 req/s / 1 req/s per replica
    assert sized.signals[SIGNAL_REQUEST_RATE] == pytest.approx(4.0)
    assert "kv_cache_usage_max" in sized.signals


# --- the status names the pool's profile ----------------------------------------------------


def profile(rps: float, basis: Basis = "measured", pool: str = "chat") -> CapacityProfile:
    return CapacityProfile(
        identity=ProfileIdentity(model="llama", gpu="H100"), basis=basis,
        max_concurrency=16, max_goodput_rps=rps, max_output_tokens_per_s=rps * 200,
        slos=(SloTarget("ttft", "ttft", 0.8, 0.99), SloTarget("e2e", "e2e", 8.0, 0.95)),
        source="http://127.0.0.1:8000",
        pool=pool, created_at=NOW,
    )


def status_config(path: Path) -> Config:
    return Config(pools=[POOL], capacity=CapacityConfig(profiles_path=str(path)))


def test_the_status_sizes_by_the_saved_profile_and_names_it(store: Store,
                                                            tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    path = tmp_path / "vigil-capacity.json"
    saved = profile(1.0)
    ProfileStore(path).save(saved)
    ProfileStore(path).save(profile(0.5, basis="estimated"))  # a worse basis is not chosen
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert scaling["desired"] == 4
    assert scaling["profile"]["key"] == saved.key
    assert scaling["profile"]["basis"] == "measured"
    assert scaling["profile"]["rps_per_replica"] == 1.0
    assert scaling["capacity"] == {"rps_per_replica": 1.0, "basis": "measured",
                                   "source": saved.key}
    assert "sized by capacity: 4.0 req/s now / 1.0 req/s per replica (measured) = 4" in (
        scaling["reasons"])
    json.dumps(scaling)


def test_the_status_without_a_profile_file_sizes_as_before(store: Store,
                                                           tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    config = status_config(tmp_path / "none.json")
    scaling = evaluate(config, EmbeddedSource(store), AT)["pools"]["chat"]["scaling"]
    assert (scaling["desired"], scaling["profile"]) == (3, None)
    assert "capacity" not in scaling and "profile_error" not in scaling
    assert "request_rate" not in scaling["signals"]


def test_a_malformed_profile_file_is_reported_not_used(store: Store, tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    path = tmp_path / "vigil-capacity.json"
    path.write_text("{not json", encoding="utf-8")
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert (scaling["desired"], scaling["profile"]) == (3, None)
    assert str(path) in scaling["profile_error"]


def test_a_profile_that_serves_nothing_is_named_but_not_used(store: Store,
                                                             tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    path = tmp_path / "vigil-capacity.json"
    ProfileStore(path).save(profile(0.0))
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert scaling["profile"]["rps_per_replica"] == 0.0
    assert scaling["desired"] == 3 and "capacity" not in scaling


def test_a_profile_judged_against_a_looser_slo_is_reported_not_used(store: Store,
                                                                     tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    path = tmp_path / "vigil-capacity.json"
    loose = replace(profile(1.0), slos=(SloTarget("ttft", "ttft", 3.0, 0.99),
                                        SloTarget("e2e", "e2e", 8.0, 0.95)))
    ProfileStore(path).save(loose)
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert (scaling["desired"], scaling["profile"]) == (3, None)  # the proportional rule
    assert "capacity" not in scaling
    error = scaling["profile_error"]
    assert f"profile {loose.key}" in error and "not used" in error
    assert "ttft <= 0.8s" in error and "judged against 3s for 0.99" in error
    # A covering profile of a worse basis is used, and the looser one still named.
    covering = profile(0.5, basis="estimated")
    ProfileStore(path).save(covering)
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert scaling["profile"]["key"] == covering.key
    assert scaling["profile"]["basis"] == "estimated"
    assert f"profile {loose.key}" in scaling["profile_error"]


def test_a_profile_saved_for_the_pool_on_another_gpu_is_not_used(store: Store,
                                                                 tmp_path: Path) -> None:
    write_replica(store, "r1", kv=0.85, per_scrape=30)
    write_replica(store, "r2", kv=0.85, per_scrape=30)
    path = tmp_path / "vigil-capacity.json"
    old_gpu = replace(profile(1.0), identity=ProfileIdentity(model="llama", gpu="A100"))
    ProfileStore(path).save(old_gpu)
    scaling = evaluate(status_config(path), EmbeddedSource(store), AT)["pools"]["chat"][
        "scaling"]
    assert (scaling["desired"], scaling["profile"]) == (3, None)
