"""``effective_slos``: the four defaults per pool, or the configured ones with defaults filled."""

from __future__ import annotations

import dataclasses

import pytest

from slo.objectives.spec import SloSpec, effective_slos
from vigil.config import parse_config

POOLS = [
    {"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    {"name": "batch", "model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "L40S"},
]


def test_without_slos_every_pool_gets_the_default_four() -> None:
    specs = effective_slos(parse_config({"pools": POOLS}))
    assert [s.name for s in specs] == [
        "chat-ttft", "chat-e2e", "chat-error-rate", "chat-availability",
        "batch-ttft", "batch-e2e", "batch-error-rate", "batch-availability",
    ]
    ttft, e2e, err, avail = specs[:4]
    assert ttft == SloSpec("chat-ttft", "chat", "meta-llama/Llama-3.1-8B-Instruct", "all",
                           "ttft", 0.95, 0.8, 30 * 86400.0)
    assert (e2e.indicator, e2e.threshold_seconds, e2e.objective) == ("e2e", 8.0, 0.95)
    assert (err.indicator, err.threshold_seconds, err.objective) == ("error_rate", None, 0.995)
    assert (avail.indicator, avail.objective) == ("availability", 0.995)
    assert specs[4].model == "Qwen/Qwen2.5-7B-Instruct"


def test_default_slos_follow_slo_defaults() -> None:
    cfg = parse_config({"pools": POOLS[:1], "slo_defaults": {
        "ttft_threshold_seconds": 0.5, "ttft_objective": 0.99, "period": "7d"}})
    ttft = effective_slos(cfg)[0]
    assert (ttft.threshold_seconds, ttft.objective, ttft.period_s) == (0.5, 0.99, 7 * 86400.0)


def test_configured_slos_replace_the_default_set_and_take_defaults() -> None:
    cfg = parse_config({"pools": POOLS, "slos": [
        {"name": "chat-fast", "pool": "chat", "indicator": "ttft"},
        {"name": "batch-errors", "pool": "batch", "indicator": "error_rate"},
    ]})
    fast, errors = effective_slos(cfg)
    assert fast == SloSpec("chat-fast", "chat", "meta-llama/Llama-3.1-8B-Instruct", "all",
                           "ttft", 0.95, 0.8, 30 * 86400.0)
    assert (errors.model, errors.objective, errors.threshold_seconds) == (
        "Qwen/Qwen2.5-7B-Instruct", 0.995, None)


def test_configured_overrides_win() -> None:
    cfg = parse_config({"pools": POOLS, "slos": [{
        "name": "chat-completions-e2e", "pool": "chat", "indicator": "e2e",
        "model": "my-lora", "endpoint": "completions", "objective": 0.9,
        "threshold_seconds": 10, "period": "1d",
    }]})
    (spec,) = effective_slos(cfg)
    assert spec == SloSpec("chat-completions-e2e", "chat", "my-lora", "completions", "e2e",
                           0.9, 10.0, 86400.0)


def test_spec_is_frozen_and_knows_its_budget() -> None:
    (spec, *_) = effective_slos(parse_config({"pools": POOLS[:1]}))
    assert spec.error_budget == pytest.approx(0.05)
    assert spec.is_latency
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.objective = 0.5  # type: ignore[misc]


def test_no_pools_no_slos() -> None:
    assert effective_slos(parse_config({})) == []


def test_replica_up_is_the_scrape_figure_with_the_availability_objective() -> None:
    cfg = parse_config({"pools": POOLS, "slo_defaults": {"availability_objective": 0.99},
                        "slos": [{"name": "chat-up", "pool": "chat",
                                  "indicator": "replica_up"}]})
    (up,) = effective_slos(cfg)
    assert (up.indicator, up.objective, up.threshold_seconds) == ("replica_up", 0.99, None)


def test_an_availability_slo_warns_that_it_now_counts_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = {"pools": POOLS, "slos": [
        {"name": "chat-avail", "pool": "chat", "indicator": "availability"},
        {"name": "chat-errors", "pool": "chat", "indicator": "error_rate"},
    ]}
    with pytest.warns(DeprecationWarning, match=r"slos\[0\] \('chat-avail'\).*now measures "
                      r"requests.*replica_up") as caught:
        cfg = parse_config(data, file="vigil.toml")
    assert len(caught) == 1
    assert "vigil.toml" in str(caught[0].message)
    assert "replica_up" in caplog.text
    # The SLO keeps its name and objective; its indicator is the request-based one.
    assert [s.indicator for s in effective_slos(cfg)] == ["availability", "error_rate"]


def test_the_default_availability_slo_does_not_warn() -> None:
    # The defaults are not a configuration to migrate (pytest turns warnings into errors).
    specs = effective_slos(parse_config({"pools": POOLS[:1]}))
    assert [s.indicator for s in specs][-1] == "availability"
