"""Every alert condition fires and resolves on synthetic status dicts (no store, no clock)."""

from __future__ import annotations

from typing import Any

from alerts.conditions import ConditionState, evaluate_conditions
from vigil.config import parse_config
from vigil.conventions import (
    ALERT_ERROR_BUDGET_BURN,
    ALERT_ERROR_BUDGET_LOW,
    ALERT_KV_CACHE_HIGH,
    ALERT_SCALING_CHANGED,
    ALERT_TARGET_DOWN,
    ALERT_TOKEN_ANOMALY,
)
from vigil.model import TargetHealth

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CFG = parse_config({
    "pools": [{"name": "chat", "model": MODEL}],
    "targets": [{"name": "r0", "url": "http://127.0.0.1:1/metrics", "pool": "chat"}],
    "slos": [{"name": "chat-ttft", "pool": "chat", "indicator": "ttft",
              "threshold_seconds": 0.5, "objective": 0.99}],
    "alerts": {"dashboard_url": "http://dash.example", "target_down_scrapes": 3,
               "kv_usage_high_for": "0s"},
})
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


def slo(burn: float | None = None, budget: float | None = 0.9,
        alerts: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": "chat-ttft", "pool": "chat", "model": MODEL, "indicator": "ttft",
        "objective": 0.99, "period": "30d", "budget_remaining": budget,
        "windows": {w: {"error_ratio": None if burn is None else burn * 0.01, "burn_rate": burn}
                    for w in WINDOWS},
        "alerts": alerts or [],
    }


def status(*, slos: list[dict[str, Any]] | None = None, kv_max: float | None = 0.5,
           action: str = "hold", desired: int = 1,
           anomalies: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "at": 0.0,
        "pools": {"chat": {
            "kv_cache_usage": {"avg": kv_max, "max": kv_max},
            "queue_length": 0.0,
            "scaling": {"current": 1, "desired": desired, "action": action,
                        "reasons": ["queue 80 > 50"] if action != "hold" else []},
        }},
        "slos": slos if slos is not None else [slo()],
        "anomalies": anomalies or [],
    }


def health(up: bool, at: float) -> TargetHealth:
    return TargetHealth("r0", "chat", "vllm", "http://127.0.0.1:1/metrics", up, at, 0.01,
                        10 if up else 0, "" if up else "connection refused")


UP = [health(True, 1.0)]


def names(alerts: list[Any], firing: bool = True) -> list[str]:
    return sorted(a.name for a in alerts if a.firing is firing)


def run(sequence: list[tuple[dict[str, Any], list[TargetHealth], dict[str, Any]]],
        config: Any = CFG) -> list[list[Any]]:
    state = ConditionState()
    out = []
    for i, (st, targets, kw) in enumerate(sequence):
        alerts, state = evaluate_conditions(config, st, targets, state, 100.0 + i * 30, **kw)
        out.append(alerts)
    return out


def test_nothing_fires_on_a_healthy_fleet():
    (alerts,) = run([(status(), UP, {})])
    assert alerts == []


def test_burn_page_and_ticket_fire_keep_starts_at_and_resolve():
    burning = status(slos=[slo(burn=20.0, alerts=["page", "ticket"])])
    steps = run([(status(), UP, {}), (burning, UP, {}), (burning, UP, {}),
                 (status(), UP, {})])
    assert steps[0] == []
    fired = {a.labels["severity"]: a for a in steps[1]}
    assert set(fired) == {"page", "ticket"}
    page = fired["page"]
    assert page.name == ALERT_ERROR_BUDGET_BURN
    assert dict(page.labels) == {"alertname": ALERT_ERROR_BUDGET_BURN, "severity": "page",
                                 "pool": "chat", "model": MODEL, "slo": "chat-ttft"}
    assert page.starts_at == 130.0 and page.ends_at is None
    assert "burn rate 20 over 1h and 20 over 5m > 14.4" in page.annotations["description"]
    assert page.annotations["dashboard_url"] == "http://dash.example"
    # Still firing: same fingerprint, same startsAt.
    again = {a.labels["severity"]: a for a in steps[2]}
    assert again["page"].fingerprint == page.fingerprint
    assert again["page"].starts_at == 130.0
    # Resolved: returned once with endsAt, then gone.
    resolved = {a.labels["severity"]: a for a in steps[3]}
    assert resolved["page"].ends_at == 190.0 and not resolved["page"].firing
    assert resolved["page"].starts_at == 130.0


def test_budget_low_fires_below_the_ratio_and_resolves():
    low = status(slos=[slo(budget=0.05)])
    steps = run([(low, UP, {}), (status(slos=[slo(budget=0.5)]), UP, {})])
    (a,) = steps[0]
    assert a.name == ALERT_ERROR_BUDGET_LOW and a.labels["severity"] == "ticket"
    assert "5.0 %" in a.annotations["description"]
    assert names(steps[1], firing=False) == [ALERT_ERROR_BUDGET_LOW]
    # A null budget (no data) never fires.
    assert run([(status(slos=[slo(budget=None)]), UP, {})]) == [[]]


def test_kv_high_is_per_replica():
    kv = {("chat", "r0"): 0.95, ("chat", "r1"): 0.50}
    steps = run([(status(), UP, {"kv_usage": kv}),
                 (status(), UP, {"kv_usage": {("chat", "r0"): 0.4, ("chat", "r1"): 0.5}})])
    (a,) = steps[0]
    assert a.name == ALERT_KV_CACHE_HIGH and a.labels["instance"] == "r0"
    assert "95.0 %" in a.annotations["description"]
    assert names(steps[1], firing=False) == [ALERT_KV_CACHE_HIGH]


def test_kv_high_waits_for_its_hold_like_the_rules_for():
    """``kv_usage_high_for`` = 60 s, evaluations every 30 s from t = 100: pending at 100 and
    130, firing at 160 with startsAt 100 (Prometheus's activeAt); a dip resets the hold."""
    held = CFG.model_copy(update={"alerts": CFG.alerts.model_copy(
        update={"kv_usage_high_for": 60.0})})
    hot, cool = {("chat", "r0"): 0.95}, {("chat", "r0"): 0.40}
    steps = run([(status(), UP, {"kv_usage": hot}), (status(), UP, {"kv_usage": hot}),
                 (status(), UP, {"kv_usage": hot}), (status(), UP, {"kv_usage": hot})], held)
    assert steps[0] == [] and steps[1] == []
    (fired,) = steps[2]
    assert fired.name == ALERT_KV_CACHE_HIGH and fired.starts_at == 100.0 and fired.firing
    assert steps[3][0].starts_at == 100.0
    dipped = run([(status(), UP, {"kv_usage": hot}), (status(), UP, {"kv_usage": cool}),
                  (status(), UP, {"kv_usage": hot}), (status(), UP, {"kv_usage": hot}),
                  (status(), UP, {"kv_usage": hot})], held)
    assert dipped[:4] == [[], [], [], []]
    assert [a.starts_at for a in dipped[4]] == [160.0]


def test_kv_high_falls_back_to_the_pool_max():
    (alerts,) = run([(status(kv_max=0.93), UP, {})])
    assert names(alerts) == [ALERT_KV_CACHE_HIGH]
    # Exactly at the threshold does not fire (strictly above).
    assert run([(status(kv_max=0.90), UP, {})]) == [[]]


def test_token_anomaly_grouped_per_model():
    anomalies = [
        {"kind": "histogram_lower_bound", "pool": "chat", "model": MODEL, "window": "1h",
         "mean_tokens_per_request": 200.0, "token_multiplier": 10.0,
         "threshold_tokens": 2000.0, "requests_above": 3},
        {"kind": "request", "pool": "chat", "model": MODEL, "id": "req-1",
         "threshold_tokens": 2000.0, "request_tokens": 9000},
    ]
    steps = run([(status(anomalies=anomalies), UP, {}), (status(), UP, {})])
    (a,) = steps[0]
    assert a.name == ALERT_TOKEN_ANOMALY and a.labels["model"] == MODEL
    assert "4 request(s)" in a.annotations["summary"]
    assert "2000 tokens" in a.annotations["description"]
    assert names(steps[1], firing=False) == [ALERT_TOKEN_ANOMALY]


def test_target_down_after_n_failed_scrapes_from_the_counter():
    steps = run([(status(), [health(False, 10.0)], {}), (status(), [health(False, 20.0)], {}),
                 (status(), [health(False, 20.0)], {}),  # no new scrape: still 2
                 (status(), [health(False, 30.0)], {}), (status(), [health(True, 40.0)], {})])
    assert [names(s) for s in steps[:3]] == [[], [], []]
    (a,) = steps[3]
    assert a.name == ALERT_TARGET_DOWN and a.labels["instance"] == "r0"
    assert "connection refused" in a.annotations["description"]
    assert names(steps[4], firing=False) == [ALERT_TARGET_DOWN]


def test_target_down_from_streaks():
    down = [health(False, 10.0)]
    steps = run([(status(), down, {"down_streaks": {"r0": 2}}),
                 (status(), down, {"down_streaks": {"r0": 3}})])
    assert steps[0] == [] and names(steps[1]) == [ALERT_TARGET_DOWN]


def test_scaling_change_fires_while_not_hold_and_resolves():
    steps = run([(status(), UP, {}), (status(action="scale_out", desired=2), UP, {}),
                 (status(action="scale_out", desired=3), UP, {}), (status(), UP, {})])
    assert steps[0] == []
    (a,) = steps[1]
    assert a.name == ALERT_SCALING_CHANGED and "scale_out from 1 to 2" in a.annotations["summary"]
    (b,) = steps[2]
    assert b.starts_at == a.starts_at and "was scale_out to 2" in b.annotations["description"]
    assert names(steps[3], firing=False) == [ALERT_SCALING_CHANGED]
