"""The same backtest through the embedded store and through a real Prometheus holding the
same history gives the same JSON: every alert, missed burn and budget figure (floats to
1e-9, times exactly), with Prometheus answering range queries (``/api/v1/query_range``, in
parts of at most 11,000 steps) and the store computing them itself.

Prometheus is Debian's 2.42, so both sides follow its PromQL rules (semantics "2").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.backtest_history import SHORT_ALERT_TABLE, History, Replica, between, write_store
from support.prometheus import PrometheusServer, run_prometheus

from collector.store import Store
from slo.backtest.run import backtest
from slo.backtest.scorecard import scorecards
from slo.promql.tracks import Grid
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource
from vigil.config import Config, load_config

pytestmark = pytest.mark.slow

HOUR = 3600.0
START = 1_790_000_000.0 - 1_790_000_000.0 % 86400.0
END = START + 14 * HOUR

CONFIG = """
[store]
path = "{store}"

[rules]
interval = "30s"

[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[engine]
# Raw series from both sources: the comparison is of the engine's own arithmetic.
recorded_rules = "off"

{table}
[slo_defaults]
period = "1d"
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Path,
                                                                      PrometheusServer]]:
    folder = tmp_path_factory.mktemp("backtest-prometheus")
    (folder / "vigil.toml").write_text(CONFIG.format(store=folder / "vigil.db",
                                                     table=SHORT_ALERT_TABLE))
    config = load_config(folder / "vigil.toml")
    series = History(
        start=START, end=END, scrape_s=15.0,
        replicas=[Replica("chat-0", restarts=[START + 5 * HOUR + 20]),
                  Replica("chat-1", joined=START + 2 * HOUR,
                          down=[(START + 9 * HOUR, START + 9.5 * HOUR)]),
                  Replica("chat-2", gaps=[(START + 11 * HOUR, START + 11.25 * HOUR)])],
        rate=lambda t: 1.5 + math.sin((t - START) / HOUR),
        ttft_bad=between(START + 3 * HOUR, START + 4 * HOUR, 0.3, 0.005),
        e2e_bad=between(START + 6 * HOUR, START + 10 * HOUR, 0.05),
        errors=between(START + 7 * HOUR, START + 8 * HOUR, 0.04, 0.0005),
        # Scaling signals that cross the policy's thresholds both ways (KV usage 0.8 and
        # 0.3, queue 50 summed over the replicas).
        kv_usage=lambda t: 0.5 + 0.45 * math.sin((t - START) / (1.5 * HOUR)),
        waiting=lambda t: max(0.0, round(30 * math.sin((t - START) / (2.5 * HOUR)))),
    ).build()
    with Store(folder / "vigil.db") as store:
        write_store(store, series)
    with run_prometheus(series) as server:
        yield config, folder / "vigil.db", server


def _close(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a, b)
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, (where, a, b)


def test_the_json_is_the_same_from_both_sources(setup: Any) -> None:
    config, store_path, server = setup
    with Store(store_path, readonly=True) as store:
        embedded = backtest(config, EmbeddedSource(store, semantics="2"), START, END).to_dict()
    with PrometheusSource(server.base_url, semantics="2") as source:
        remote = backtest(config, source, START, END).to_dict()
    assert embedded.pop("source") == "embedded" and remote.pop("source") == "prometheus"
    alerts = sum(len(s["alerts"]) for s in embedded["slos"].values())
    assert alerts >= 4, embedded
    _close(embedded, remote)


def test_the_scaling_scorecard_is_the_same_from_both_sources(setup: Any) -> None:
    config, store_path, server = setup
    with Store(store_path, readonly=True) as store:
        source = EmbeddedSource(store, semantics="2")
        result = backtest(config, source, START, END)
        embedded = {k: c.to_dict() for k, c in scorecards(result, source, config).items()}
    with PrometheusSource(server.base_url, semantics="2") as remote_source:
        result = backtest(config, remote_source, START, END)
        remote = {k: c.to_dict() for k, c in scorecards(result, remote_source,
                                                         config).items()}
    card = embedded["chat"]
    assert card["evaluations"] == 14 * 240 + 1
    assert card["scale_outs"] and card["scale_ins"] and card["burns"], card
    assert {t["firings"] > 0 for t in card["triggers"].values()} == {True}
    _close(embedded, remote)


def test_a_range_longer_than_one_query_is_asked_in_parts(setup: Any) -> None:
    """12,001 steps of 1 s: two ``query_range`` calls (Prometheus refuses more than 11,000
    points per series in one), joined into one track with every step present."""
    _, _, server = setup
    grid = Grid(round((START + 2 * HOUR) * 1000), 1000, 12_001)
    with PrometheusSource(server.base_url, semantics="2") as source:
        tracks = source.avg_over_time_range("up", {"pool": "chat", "kind": "vllm"}, grid,
                                            [60.0])[60.0]
    assert set(dict(k)["instance"] for k in tracks) == {"chat-0", "chat-1", "chat-2"}
    chat0 = next(t for k, t in tracks.items() if dict(k)["instance"] == "chat-0")
    assert chat0.present.all() and (chat0.values == 1.0).all()
    assert chat0.values.size == 12_001
