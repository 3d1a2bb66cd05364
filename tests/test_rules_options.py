"""``alerts.rules.pipeline.rules_options``: which config keys become the generator's options."""

from __future__ import annotations

from typing import Any

from alerts.rules.pipeline import RulesOptions, generate, rules_options
from alerts.rules.promtool_tests import eval_time_for
from vigil.config import AlertsConfig, Config, parse_config
from vigil.conventions import ALERT_KV_CACHE_HIGH

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _config(**extra: Any) -> Config:
    base: dict[str, Any] = {
        "pools": [{"name": "chat", "model": MODEL}],
        "targets": [{"name": "chat-0", "url": "http://127.0.0.1:8000/metrics", "pool": "chat"}],
    }
    return parse_config({**base, **extra})


def _kv_rule(config: Config) -> dict[str, Any]:
    for group in generate(config).alert_groups:
        for rule in group.rules:
            if rule.alert == ALERT_KV_CACHE_HIGH:
                return rule.to_dict()
    raise AssertionError("no KvCacheUsageHigh rule")


def test_the_kv_hold_defaults_to_one_minute() -> None:
    assert AlertsConfig().kv_usage_high_for == 60.0 == RulesOptions().kv_alert_for_s
    assert rules_options(_config()) == RulesOptions()
    assert _kv_rule(_config())["for"] == "1m"


def test_the_kv_hold_comes_from_the_alerts_section() -> None:
    config = _config(alerts={"kv_usage_high_for": "2m30s"})
    assert rules_options(config).kv_alert_for_s == 150.0
    rule = _kv_rule(config)
    assert rule["for"] == "2m30s" and "above 0.9 for 2m30s" in rule["annotations"]["description"]


def test_a_zero_hold_fires_at_once_and_writes_no_for() -> None:
    assert "for" not in _kv_rule(_config(alerts={"kv_usage_high_for": "0s"}))


def test_the_promtool_test_expects_the_kv_alert_only_after_its_hold() -> None:
    # The fleet's KV usage is above the threshold from time 0: with a hold longer than the
    # test's evaluation time, promtool must expect no KvCacheUsageHigh at all.
    at_s = eval_time_for(RulesOptions().interval_s)
    config = _config(alerts={"kv_usage_high_for": f"{int(at_s) + 60}s"})
    tests = generate(config).tests
    kv = [t for group in tests["tests"] for t in group["alert_rule_test"]
          if t["alertname"] == ALERT_KV_CACHE_HIGH]
    assert kv and all(t["exp_alerts"] == [] for t in kv)
