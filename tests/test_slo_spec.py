"""``effective_slos``: the four defaults per pool, or the configured ones with defaults filled."""

from __future__ import annotations

import dataclasses

import pytest

from slo.spec import SloSpec, effective_slos
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
