"""A Prometheus that keeps less than an SLO's period: the status says so (a warning per SLO
whose budget is computed from the retained part only), read from the server's own
``/api/v1/status/runtimeinfo``, against a real Prometheus started with a 15-day retention."""

from __future__ import annotations

from pathlib import Path

from support.prometheus import require_prometheus, start_prometheus

from slo.sources.prometheus import PrometheusSource
from slo.status import evaluate
from vigil.config import parse_config


def test_a_retention_shorter_than_a_period_is_flagged(tmp_path: Path) -> None:
    prometheus, _ = require_prometheus()
    server = start_prometheus(prometheus, tmp_path, "scrape_configs: []\n", tmp_path / "data",
                              "--storage.tsdb.retention.time=15d")
    try:
        server.wait_ready()
        config = parse_config({
            "pools": [{"name": "chat", "model": "m"}],
            "slos": [{"name": "month", "pool": "chat", "indicator": "ttft", "period": "30d"},
                     {"name": "week", "pool": "chat", "indicator": "ttft", "period": "7d"}]})
        with PrometheusSource(server.base_url, semantics="2") as source:
            assert source.retention_s() == 15 * 86400
            status = evaluate(config, source, 1_800_000_000.0)
    finally:
        server.stop()
    retention, recorded = status["warnings"]
    assert retention == (
        "the server keeps 15d of samples, less than the 30d period of SLO month: its budget "
        "is computed from the retained part only (raise the retention, or let the server "
        "evaluate Vigil's recording rules)")
    # This server runs no rules: both SLOs are computed from raw series, and it says so.
    assert recorded.startswith("SLOs month, week computed from raw series")
