"""The planner, hand-computed on a four-step synthetic day (plan_step 6 h).

Traffic 2, 10, 25, 5 requests/s; the H100 profile serves 10 requests/s per replica at
$6/GPU-hour, the L40S one 4 requests/s at $2/GPU-hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slo.planning.candidates import gather_candidates
from slo.planning.forecast import TrafficForecast, constant_traffic
from slo.planning.plan import (
    Levers,
    current_identity,
    plan,
    required_slos,
    same_model,
    weakest_basis,
)
from slo.planning.profile_store import ProfileStore
from vigil.capacity import CapacityProfile, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig, Config, parse_config

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STEP = 6 * 3600.0
DAY = (2.0, 10.0, 25.0, 5.0)


def config(profiles_path: str = "vigil-capacity.json", **pool: object) -> Config:
    return parse_config({
        "pools": [{"name": "chat", "model": MODEL, "gpu": "H100", "min_replicas": 1,
                   "max_replicas": 8, **pool}],
        "prices": {"H100": 6.0, "L40S": 2.0},
        "capacity": {"plan_step": "6h", "profiles_path": profiles_path},
        "slo_defaults": {"ttft_threshold_seconds": 0.8, "ttft_objective": 0.95,
                         "e2e_threshold_seconds": 8.0, "e2e_objective": 0.95},
    })


#: As strict as the config's default SLOs.
SLOS = (SloTarget("chat-ttft", "ttft", 0.8, 0.95), SloTarget("chat-e2e", "e2e", 8.0, 0.95))


def profile(gpu: str, mu: float, *, basis: str = "measured", slos: tuple = SLOS,
            model: str = MODEL, output_tokens: int = 0, gpus: int = 1) -> CapacityProfile:
    return CapacityProfile(
        identity=ProfileIdentity(model=model, gpu=gpu, gpus_per_replica=gpus,
                                 output_tokens=output_tokens),
        basis=basis, max_concurrency=32, max_goodput_rps=mu, max_output_tokens_per_s=mu * 200,
        slos=slos)  # type: ignore[arg-type]


def day(basis: str = "observed", net_of_cache: bool = True) -> TrafficForecast:
    return TrafficForecast(profile=DAY, step_s=STEP, basis=basis,  # type: ignore[arg-type]
                           days=7, net_of_cache=net_of_cache)


def test_replicas_curve_and_costs_hand_computed() -> None:
    cfg = config()
    result = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)])
    (c,) = result.candidates
    # ceil(λ/μ) = 1 (0.2), 1, 3 (2.5), 1 (0.5); min_replicas 1.
    assert c.replicas_curve == [(0.0, 1), (21600.0, 1), (43200.0, 3), (64800.0, 1)]
    assert c.gpu_hours_per_day == pytest.approx(6 * 6.0)
    assert c.cost_per_day_usd == pytest.approx(36 * 6.0)
    assert c.cost_per_month_usd == pytest.approx(216.0 * 730 / 24)
    requests = sum(DAY) * STEP
    assert c.requests_per_day == pytest.approx(requests)
    assert c.cost_per_1000_requests == pytest.approx(216.0 / requests * 1000)
    # 10 requests/s on one replica of 10: no headroom left at that step.
    assert c.headroom == pytest.approx(0.0)
    assert c.meets_slo
    assert c.peak_replicas == 3
    assert c.basis == "observed"  # the traffic's, weaker than the measured profile


def test_gpus_per_replica_multiply_gpu_hours() -> None:
    cfg = config()
    (c,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0, gpus=2)]).candidates
    assert c.gpu_hours_per_day == pytest.approx(72.0)


def test_the_cheaper_of_two_profiles_meeting_the_slo_comes_first() -> None:
    cfg = config()
    result = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0), profile("L40S", 4.0)])
    first, second = result.candidates
    # L40S: 1, 3, 7, 2 replicas = 13 × 6 h × $2 = $156; H100 $216.
    assert first.profile.identity.gpu == "L40S"
    assert first.cost_per_day_usd == pytest.approx(156.0)
    assert [n for _, n in first.replicas_curve] == [1, 3, 7, 2]
    assert first.meets_slo and second.meets_slo
    assert result.best is first
    # Today's configuration is the pool's H100.
    assert result.today is not None and result.today.profile.identity.gpu == "H100"


def test_a_profile_judged_against_a_looser_slo_does_not_count() -> None:
    cfg = config()
    loose = (SloTarget("ttft", "ttft", 2.0, 0.95), SloTarget("e2e", "e2e", 8.0, 0.95))
    result = plan(cfg, cfg.pools[0], day(),
                  [profile("L40S", 4.0, slos=loose), profile("H100", 10.0)])
    first, second = result.candidates
    assert first.profile.identity.gpu == "H100" and first.meets_slo
    assert second.profile.identity.gpu == "L40S" and not second.meets_slo
    assert any("looser" in n and "chat-ttft" in n for n in second.notes)


def test_a_lower_objective_is_looser_too() -> None:
    cfg = config()
    lower = (SloTarget("ttft", "ttft", 0.8, 0.90), SloTarget("e2e", "e2e", 8.0, 0.95))
    (c,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0, slos=lower)]).candidates
    assert not c.meets_slo


def test_stricter_profile_targets_count() -> None:
    cfg = config()
    strict = (SloTarget("ttft", "ttft", 0.5, 0.99), SloTarget("e2e", "e2e", 4.0, 0.99))
    (c,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0, slos=strict)]).candidates
    assert c.meets_slo


def test_within_max_replicas_the_peak_may_not_be_served() -> None:
    cfg = config(max_replicas=2)
    unbounded = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)]).candidates[0]
    assert unbounded.meets_slo and unbounded.peak_replicas == 3
    assert any("more than the pool's max_replicas 2" in n for n in unbounded.notes)
    bounded = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)],
                   respect_max_replicas=True).candidates[0]
    assert [n for _, n in bounded.replicas_curve] == [1, 1, 2, 1]
    assert not bounded.meets_slo
    assert bounded.headroom == pytest.approx(1 - 25 / 20)
    assert plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)],
                respect_max_replicas=True).best is None


def test_min_replicas_zero_lets_an_idle_step_cost_nothing() -> None:
    cfg = config(min_replicas=0)
    idle = TrafficForecast(profile=(0.0, 10.0, 25.0, 5.0), step_s=STEP, basis="observed")
    (c,) = plan(cfg, cfg.pools[0], idle, [profile("H100", 10.0)]).candidates
    assert [n for _, n in c.replicas_curve] == [0, 1, 3, 1]


def test_the_batch_lever_pours_batch_requests_into_the_troughs() -> None:
    cfg = config()
    levers = Levers(batch_share=0.2, sources={"batch_share": "gateway records"})
    given = TrafficForecast(profile=DAY, step_s=STEP, basis="measured")  # not from history
    result = plan(cfg, cfg.pools[0], given, [profile("H100", 10.0)], levers=levers)
    # Kept 1.6, 8, 20, 4; the 8.4 moved step-rates raise the two lowest to 7: 7, 8, 20, 7.
    (c,) = result.candidates
    assert [n for _, n in c.replicas_curve] == [1, 1, 2, 1]
    assert c.headroom == pytest.approx(0.0)  # 20 requests/s on 2 replicas of 10
    (effect,) = result.levers
    assert effect.name == "batch_share" and effect.applied
    assert "25 -> 20" in effect.effect
    assert c.requests_per_day == pytest.approx(sum(DAY) * STEP)  # moved, not dropped


def test_the_batch_lever_leaves_a_forecast_from_history_alone() -> None:
    # History already holds the batch requests where the queue released them.
    cfg = config()
    levers = Levers(batch_share=0.2)
    result = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)], levers=levers)
    assert [n for _, n in result.candidates[0].replicas_curve] == [1, 1, 3, 1]
    (effect,) = result.levers
    assert effect.name == "batch_share" and not effect.applied
    assert "history" in effect.effect
    flat = plan(cfg, cfg.pools[0], constant_traffic(25.0, step_s=STEP),
                [profile("H100", 10.0)], levers=levers)
    assert flat.levers[0].applied
    assert {n for _, n in flat.candidates[0].replicas_curve} == {3}  # a flat day has no trough


def test_the_cache_lever_applies_only_to_traffic_with_the_hits() -> None:
    cfg = config()
    levers = Levers(cache_hit_rate=0.5)
    given = constant_traffic(25.0, step_s=STEP)
    (c,) = plan(cfg, cfg.pools[0], given, [profile("H100", 10.0)], levers=levers).candidates
    assert {n for _, n in c.replicas_curve} == {2}  # ceil(12.5 / 10)
    assert c.basis == "measured"
    observed = plan(cfg, cfg.pools[0], day(net_of_cache=True), [profile("H100", 10.0)],
                    levers=levers)
    assert [n for _, n in observed.candidates[0].replicas_curve] == [1, 1, 3, 1]
    assert not observed.levers[0].applied


def test_the_output_tokens_lever_scales_mu_by_the_profiles_output_length() -> None:
    cfg = config()
    levers = Levers(mean_output_tokens=400.0)
    # Measured for 200 output tokens; the traffic's mean is twice that: μ halves.
    (c,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0, output_tokens=200)],
                levers=levers).candidates
    assert c.rps_per_replica == pytest.approx(5.0)
    assert [n for _, n in c.replicas_curve] == [1, 2, 5, 1]
    (unknown,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0)],
                      levers=levers).candidates
    assert unknown.rps_per_replica == 10.0
    assert any("does not say its output tokens" in n for n in unknown.notes)


def test_other_models_and_unpriced_gpus_are_left_out_with_a_note() -> None:
    cfg = config()
    result = plan(cfg, cfg.pools[0], day(), [profile("H100", 10.0, model="Qwen/Qwen2.5-7B"),
                                             profile("B300", 50.0)])
    assert result.candidates == []
    assert result.today is None and result.best is None
    assert any("another model" in n for n in result.notes)
    assert any("no price for GPU 'B300'" in n for n in result.notes)


def test_a_zero_capacity_profile_never_meets_the_slo() -> None:
    cfg = config()
    (c,) = plan(cfg, cfg.pools[0], day(), [profile("H100", 0.0)]).candidates
    assert not c.meets_slo


def test_today_prefers_the_best_basis_of_the_pools_configuration() -> None:
    cfg = config(vllm={"quantization": "fp8"})
    ident = current_identity(cfg.pools[0])
    assert ident.quantization == "fp8" and ident.speculative == ""
    fp8 = CapacityProfile(identity=ProfileIdentity(MODEL, "H100", quantization="fp8"),
                          basis="measured", max_concurrency=8, max_goodput_rps=12.0,
                          max_output_tokens_per_s=1.0, slos=SLOS)
    estimate = CapacityProfile(identity=ProfileIdentity(MODEL, "H100", quantization="fp8"),
                               basis="estimated", max_concurrency=8, max_goodput_rps=20.0,
                               max_output_tokens_per_s=1.0, slos=SLOS)
    result = plan(cfg, cfg.pools[0], day(), [estimate, profile("H100", 10.0), fp8])
    assert result.today is not None and result.today.profile is fp8


def test_required_slos_and_weakest_basis() -> None:
    cfg = config()
    assert {(s.indicator, s.threshold_seconds, s.objective)
            for s in required_slos(cfg, cfg.pools[0])} == {("ttft", 0.8, 0.95),
                                                           ("e2e", 8.0, 0.95)}
    assert weakest_basis("measured", "estimated", "observed") == "estimated"


def test_a_model_named_without_its_organisation_or_in_another_case_is_planned() -> None:
    assert same_model("Llama-3.1-8B-Instruct", MODEL)
    assert same_model("META-LLAMA/llama-3.1-8b-instruct", MODEL)
    assert not same_model("Qwen/Qwen2.5-7B", MODEL)
    cfg = config()
    result = plan(cfg, cfg.pools[0], day(),
                  [profile("H100", 10.0, model="llama-3.1-8b-instruct")])
    assert len(result.candidates) == 1 and result.notes == ()


class _Estimator:
    """Estimates every configuration at 10 requests/s against the SLOs asked."""

    def known_calibrations(self) -> list[tuple[str, str]]:
        return [(MODEL, "H100")]

    def estimated_capacity(self, identity: ProfileIdentity, slos: Sequence[SloTarget],
                           capacity_config: CapacityConfig, *, created_at: float = 0.0
                           ) -> CapacityProfile:
        return CapacityProfile(identity=identity, basis="estimated", max_concurrency=32,
                               max_goodput_rps=10.0, max_output_tokens_per_s=2000.0,
                               slos=tuple(slos), created_at=created_at)


def test_a_measured_profile_of_a_looser_slo_does_not_hide_an_estimate_that_meets_it(
        tmp_path: Path) -> None:
    path = tmp_path / "vigil-capacity.json"
    loose = (SloTarget("chat-ttft", "ttft", 3.0, 0.95), SloTarget("chat-e2e", "e2e", 8.0, 0.95))
    ProfileStore(path).save(profile("H100", 20.0, slos=loose))
    cfg = config(profiles_path=str(path))
    found, _ = gather_candidates(cfg, cfg.pools[0], source=None, at_s=1.0e9, span_s=0.0,
                                 estimator=_Estimator())
    (kept,) = found
    assert kept.basis == "estimated"
    best = plan(cfg, cfg.pools[0], day(), found).best
    assert best is not None and best.profile is kept
    # With today's SLOs covered by both, the measured one wins again.
    ProfileStore(path).save(profile("H100", 20.0))
    found, _ = gather_candidates(cfg, cfg.pools[0], source=None, at_s=1.0e9, span_s=0.0,
                                 estimator=_Estimator())
    assert [p.basis for p in found] == ["measured"]
