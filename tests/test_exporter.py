"""The exporter's exposition parses and holds the expected series; null means absent."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from alerts.exporter import Exporter, Snapshot
from alerts.model import Alert
from alerts.notifier import NotifierCounters
from vigil.model import TargetHealth

MODEL = "m1"
STATUS = {
    "at": 1000.0,
    "pools": {"chat": {
        "models": {MODEL: {"quantiles": {"window": "5m",
                                         "ttft_seconds": {"p50": 0.1, "p95": 0.4, "p99": None},
                                         "e2e_seconds": {"p50": None, "p95": None, "p99": None}},
                           "tokens_per_request": {}}},
        "kv_cache_usage": {"avg": 0.5, "max": 0.7},
        "queue_length": None,
        "cost": {"per_1000_requests": 1.25, "per_million_output_tokens": None},
        "scaling": {"current": 2, "desired": 3, "action": "scale_out", "reasons": []},
    }},
    "slos": [{"name": "chat-ttft", "pool": "chat", "model": MODEL, "objective": 0.95,
              "period": "30d", "period_error_ratio": 0.01, "budget_remaining": None,
              "windows": {"5m": {"error_ratio": 0.02, "burn_rate": 0.4},
                          "1h": {"error_ratio": None, "burn_rate": None}}}],
    "anomalies": [{"kind": "histogram_lower_bound", "pool": "chat", "model": MODEL,
                   "requests_above": 2}],
}


def samples(exp: Exporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(exp.exposition().decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(series: dict, name: str, **labels: str) -> float | None:
    for got, v in series.get(name, []):
        if got == labels:
            return v
    return None


def test_empty_snapshot_exports_no_samples_only_metadata():
    s = samples(Exporter())
    assert s == {}


def test_full_snapshot_series_and_labels():
    exp = Exporter()
    alerts = [Alert({"alertname": "ErrorBudgetBurn", "severity": "page", "pool": "chat"},
                    starts_at=1.0),
              Alert({"alertname": "ErrorBudgetBurn", "severity": "page", "pool": "b"},
                    starts_at=1.0),
              Alert({"alertname": "TargetDown", "severity": "ticket"}, starts_at=1.0,
                    ends_at=2.0)]
    counters = NotifierCounters(delivered=Counter({"oncall": 3}),
                                failed_attempts=Counter({"oncall": 1}), queue_depth=2,
                                oldest_undelivered_age=5.5)
    targets = [TargetHealth("r0", "chat", "vllm", "u", True, 10.0, 0.02, 5, ""),
               TargetHealth("r1", "chat", "vllm", "u", False, 10.0, 1.0, 0, "refused"),
               TargetHealth("r2", "chat", "vllm", "u", False, 0.0, 0.0, 0, "")]
    exp.update(Snapshot(STATUS, alerts, counters, targets, 0.25, 1000.0,
                        routes=("oncall", "tickets")))
    s = samples(exp)
    slo = {"slo": "chat-ttft", "pool": "chat", "model_name": MODEL}
    assert value(s, "vigil_slo_sli_error_ratio", **slo, window="5m") == 0.02
    assert value(s, "vigil_slo_sli_error_ratio", **slo, window="30d") == 0.01
    assert value(s, "vigil_slo_burn_rate_ratio", **slo, window="5m") == 0.4
    # null -> absent, never 0
    assert value(s, "vigil_slo_burn_rate_ratio", **slo, window="1h") is None
    assert "vigil_slo_error_budget_remaining_ratio" not in s
    assert value(s, "vigil_slo_objective_ratio", **slo) == 0.95
    lat = {"pool": "chat", "model_name": MODEL, "signal": "ttft"}
    assert value(s, "vigil_latency_seconds", **lat, quantile="0.95") == 0.4
    assert value(s, "vigil_latency_seconds", **lat, quantile="0.99") is None
    assert not [x for x in s["vigil_latency_seconds"] if x[0]["signal"] == "e2e"]
    assert value(s, "vigil_cost_per_1000_requests_usd", pool="chat") == 1.25
    assert "vigil_cost_per_million_output_tokens_usd" not in s
    assert "vigil_queue_length" not in s
    assert value(s, "vigil_scaling_desired_replicas", pool="chat") == 3
    assert value(s, "vigil_scaling_current_replicas", pool="chat") == 2
    assert value(s, "vigil_scaling_action", pool="chat", action="scale_out") == 1
    assert value(s, "vigil_scaling_action", pool="chat", action="hold") == 0
    assert value(s, "vigil_kv_cache_usage_ratio", pool="chat", stat="max") == 0.7
    assert value(s, "vigil_anomalous_requests", pool="chat", model_name=MODEL,
                 kind="histogram_lower_bound") == 2
    assert value(s, "vigil_alerts_firing", alertname="ErrorBudgetBurn", severity="page") == 2
    assert value(s, "vigil_alerts_firing", alertname="TargetDown", severity="ticket") is None
    assert value(s, "vigil_notifications_delivered_total", route="oncall") == 3
    assert value(s, "vigil_notifications_delivered_total", route="tickets") == 0
    assert value(s, "vigil_notification_failures_total", route="oncall") == 1
    assert value(s, "vigil_notifications_given_up_total", route="oncall") == 0
    assert value(s, "vigil_notification_queue_depth") == 2
    assert value(s, "vigil_notification_oldest_undelivered_age_seconds") == 5.5
    assert value(s, "vigil_target_up", instance="r0", pool="chat", kind="vllm") == 1
    assert value(s, "vigil_target_up", instance="r1", pool="chat", kind="vllm") == 0
    assert value(s, "vigil_target_up", instance="r2", pool="chat", kind="vllm") is None
    assert value(s, "vigil_target_scrape_duration_seconds", instance="r1", pool="chat",
                 kind="vllm") == 1.0
    assert value(s, "vigil_evaluation_duration_seconds") == 0.25
    assert value(s, "vigil_last_evaluation_timestamp_seconds") == 1000.0
    # Every name follows the conventions: vigil_ prefix.
    assert all(name.startswith("vigil_") for name in s)


def test_a_pool_that_disappears_disappears_from_metrics():
    exp = Exporter()
    exp.update(Snapshot(STATUS))
    assert "vigil_scaling_desired_replicas" in samples(exp)
    exp.update(Snapshot({"at": 1.0, "pools": {}, "slos": [], "anomalies": []}))
    assert "vigil_scaling_desired_replicas" not in samples(exp)


def test_registries_are_independent():
    a, b = Exporter(), Exporter()
    a.update(Snapshot(STATUS))
    assert samples(a) and not samples(b)
