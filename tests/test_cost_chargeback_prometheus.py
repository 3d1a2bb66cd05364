"""A month's chargeback read through a real Prometheus holding the same series as the store
gives the same figures, line by line, to the cent (``support.chargeback``'s history)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import chargeback as cb
from support.prometheus import PrometheusServer, prometheus_fixture

from collector.store import Store
from slo.cost.months import month_bounds
from slo.cost.report import cost_report
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource
from slo.sources.request_log import GatewayRecords

pytestmark = pytest.mark.slow

prom = prometheus_fixture(cb.series)


def test_a_month_through_prometheus_equals_the_store(prom: PrometheusServer,
                                                     tmp_path: Path) -> None:
    cb.write_store(tmp_path / "store.sqlite")
    cb.write_records(tmp_path / "records.sqlite")
    config = cb.config(tmp_path)
    at = month_bounds("2026-11", "UTC")[1] - 1
    log = GatewayRecords(tmp_path / "records.sqlite")
    by = ["pool", "tenant", "tier"]
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        local = cost_report(EmbeddedSource(store), config, log, by=by, month="2026-11", at_s=at)
    with PrometheusSource(prom.base_url, semantics="3") as remote:
        far = cost_report(remote, config, log, by=by, month="2026-11", at_s=at)
    assert far["rows"] and far["warnings"] == []
    key = ("pool", "tenant", "tier")
    local_rows = {tuple(r[k] for k in key): r for r in local["rows"]}
    far_rows = {tuple(r[k] for k in key): r for r in far["rows"]}
    assert set(local_rows) == set(far_rows)
    for k, row in local_rows.items():
        assert far_rows[k]["cost"] == row["cost"], k
        assert far_rows[k]["cost_exact"] == pytest.approx(row["cost_exact"], rel=1e-9, abs=1e-9)
        assert far_rows[k]["gpu_hours"] == pytest.approx(row["gpu_hours"], rel=1e-9, abs=1e-12)
        assert far_rows[k]["requests"] == row["requests"]
    assert [p["text"] for p in far["pools"]] == [p["text"] for p in local["pools"]]
    assert far["total"] == local["total"] == pytest.approx(46.8)
