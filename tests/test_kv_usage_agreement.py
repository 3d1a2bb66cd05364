"""Per-replica KV-cache usage has one answer (``slo.scaling.signals.kv_usage_by_replica``):
the status, the scaling signals, `vigil serve`'s KvCacheUsageHigh and the dashboard's agree on
the same data, each replica counted once with the mean of its engines."""

from __future__ import annotations

import math
from pathlib import Path

from support.fleet import AT, Fleet, target_labels, vllm_labels

from collector.store import Store
from dashboard.alerts_view import evaluated_alerts
from serve.evaluation import StoreEvaluator
from slo.scaling.signals import kv_usage_at, kv_usage_by_replica
from slo.sources.embedded import EmbeddedSource
from slo.status import evaluate
from vigil.config import parse_config

#: (replica, engine) -> KV-cache usage: chat-0's engines average 0.95 (above 0.9), chat-1's
#: 0.85; chat-2's one engine reports NaN (no value, never an alert).
USAGE = {("chat-0", "0"): 0.9, ("chat-0", "1"): 1.0, ("chat-1", "0"): 0.8,
         ("chat-1", "1"): 0.9, ("chat-2", "0"): float("nan")}
CHAT_0 = math.fsum([0.9, 1.0]) / 2
CHAT_1 = math.fsum([0.8, 0.9]) / 2


def test_serve_the_dashboard_and_the_status_agree(tmp_path: Path) -> None:
    store_path = tmp_path / "vigil.db"
    with Store(store_path) as store:
        fleet = Fleet(store, span_s=300.0)
        for replica in ("chat-0", "chat-1", "chat-2"):
            fleet.gauge("up", target_labels(replica), 1.0)
        for (replica, engine), value in USAGE.items():
            fleet.gauge("vllm:kv_cache_usage_perc", vllm_labels(replica, engine=engine), value)
        fleet.flush()
    config = parse_config({
        "store": {"path": str(store_path)},
        "pools": [{"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct"}],
        "alerts": {"kv_usage_high_for": "0s", "outbox_path": str(tmp_path / "outbox.db")},
    })
    pool = config.pools[0]
    with Store(store_path, readonly=True) as store:
        source = EmbeddedSource(store)
        per = kv_usage_by_replica(source, pool, AT)
        assert per == {"chat-0": CHAT_0, "chat-1": CHAT_1}
        assert kv_usage_at(source, pool, AT) == (math.fsum([CHAT_0, CHAT_1]) / 2, CHAT_0)
        status = evaluate(config, source, AT)
        dashboard = evaluated_alerts(config, status, source, AT)
    assert status["pools"]["chat"]["kv_cache_usage"] == {
        "avg": math.fsum([CHAT_0, CHAT_1]) / 2, "max": CHAT_0}
    served = StoreEvaluator(config)
    try:
        result = served.evaluate(AT, [])
    finally:
        served.close()
    assert result.kv_usage == {("chat", "chat-0"): CHAT_0, ("chat", "chat-1"): CHAT_1}
    kv_alerts = [a for a in dashboard if a["alert"] == "KvCacheUsageHigh"]
    assert [a["subject"] for a in kv_alerts] == ["chat-0"], dashboard
