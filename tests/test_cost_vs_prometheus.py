"""GPU cost on a changing fleet: the generated cost rules on a real Prometheus 2.42, the
engine on the store and the engine on that Prometheus give the same number, and it is the
GPU time that ran, within one scrape interval per replica.

The fleet (jittered scrapes, as a real scraper's): ``chat-0`` up all along with a 20-minute
down stretch; ``chat-1`` joining at the half of the last hour; ``chat-2`` scraped every 30 s,
leaving 20 minutes before the end; ``chat-3`` with a 10-minute scrape gap; ``chat-9``, a
target of no ``[[targets]]`` entry scraped at the default interval. Pool ``held`` bills down
time (``bill_down_time``): its replica is down for 30 minutes and still costs the hour.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from support.fleet import MODEL, OTHER_MODEL
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture

from alerts.rules.pipeline import Rule, generate
from collector.store import Store
from slo.cost.pool import pool_cost
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource
from vigil.config import parse_config
from vigil.model import SeriesKey, labels_of

pytestmark = pytest.mark.slow

T0_MS = 1_760_000_000_000
END_MS = T0_MS + 2 * 3600_000
HALF_MS = END_MS - 1800_000
JITTER_MS = 400

CONFIG = parse_config({
    "pools": [
        {"name": "chat", "model": MODEL},
        {"name": "held", "model": OTHER_MODEL, "gpu": "L40S", "gpus_per_replica": 2,
         "bill_down_time": True},
    ],
    "targets": [
        {"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "pool": "chat"},
        {"name": "chat-1", "url": "http://127.0.0.1:10/metrics", "pool": "chat"},
        {"name": "chat-2", "url": "http://127.0.0.1:11/metrics", "pool": "chat",
         "scrape_interval": "30s"},
        {"name": "chat-3", "url": "http://127.0.0.1:12/metrics", "pool": "chat"},
        {"name": "held-0", "url": "http://127.0.0.1:13/metrics", "pool": "held"},
    ],
    "engine": {"promql_semantics": "2"},
})
RESULT = generate(CONFIG)
#: Evaluation times (s): the end, the half (chat-1 just joined), mid-down, inside the gap.
TIMES_S = [END_MS / 1000 - 3.3, HALF_MS / 1000 + 20.0, (END_MS - 2_700_000) / 1000,
           (END_MS - 3_000_000) / 1000 + 7.7]


def _scrapes(rng: np.random.Generator, start_ms: int, end_ms: int, step_ms: int,
             skip: tuple[int, int] | None = None) -> list[int]:
    """Scrape times every ``step_ms`` with ±JITTER_MS, none inside ``skip``."""
    out = []
    for k in range((end_ms - start_ms) // step_ms + 1):
        t = start_ms + k * step_ms + int(rng.integers(-JITTER_MS, JITTER_MS + 1))
        if skip is None or not skip[0] <= t < skip[1]:
            out.append(t)
    return [t for t in out if start_ms <= t <= end_ms]


def _down(times: list[int], lo_ms: int, hi_ms: int) -> list[float]:
    return [0.0 if lo_ms <= t < hi_ms else 1.0 for t in times]


def build() -> list[PromSeries]:
    rng = np.random.default_rng(20261201)
    series = []

    def up(instance: str, pool: str, times: list[int], values: list[float] | None = None) -> None:
        labels = {"instance": instance, "pool": pool, "kind": "vllm"}
        series.append(PromSeries("up", labels, list(zip(
            times, values if values is not None else [1.0] * len(times), strict=True))))

    t0 = _scrapes(rng, T0_MS + 1_000, END_MS, 15_000)
    up("chat-0", "chat", t0, _down(t0, END_MS - 3000_000, END_MS - 1800_000))
    up("chat-1", "chat", _scrapes(rng, HALF_MS + 2_000, END_MS, 15_000))
    up("chat-2", "chat", _scrapes(rng, T0_MS + 5_000, END_MS - 1200_000, 30_000))
    up("chat-3", "chat", _scrapes(rng, T0_MS + 3_000, END_MS, 15_000,
                                  skip=(END_MS - 3300_000, END_MS - 2700_000)))
    up("chat-9", "chat", _scrapes(rng, T0_MS + 7_000, END_MS, 15_000))
    th = _scrapes(rng, T0_MS + 4_000, END_MS, 15_000)
    up("held-0", "held", th, _down(th, END_MS - 2400_000, END_MS - 600_000))
    for instance, pool, model in (("chat-0", "chat", MODEL), ("held-0", "held", OTHER_MODEL)):
        labels = {"instance": instance, "pool": pool, "kind": "vllm", "engine": "0",
                  "model_name": model, "finished_reason": "stop"}
        series.append(PromSeries("vllm:request_success_total", labels,
                                 [(t, 7.0 * i) for i, t in enumerate(t0)]))
    return series


SERIES = build()
prom = prometheus_fixture(lambda: SERIES)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with Store(tmp_path_factory.mktemp("cost-vs-prom") / "vigil.db") as s:
        s.write([(SeriesKey(p.name, labels_of(p.labels)),
                  "gauge" if p.name == "up" else "counter", ts, v)
                 for p in SERIES for ts, v in p.samples])
        yield s


def _cost_rules() -> list[Rule]:
    rules = [r for r in RESULT.rules() if r.origin.kind in ("gpu_cost", "gpu_cost_per_1000")]
    assert len(rules) == 4
    return rules


def test_the_cost_rule_on_prometheus_equals_the_engine(prom: PrometheusServer,
                                                       store: Store) -> None:
    embedded = EmbeddedSource(store, semantics="2")
    compared = 0
    for rule in _cost_rules():
        pool = CONFIG.pool(rule.origin.pool)
        key = "cost_usd" if rule.origin.kind == "gpu_cost" else "per_1000_requests"
        for at in TIMES_S:
            ours = pool_cost(embedded, CONFIG, pool, at)[key]
            theirs = list(prom.query(rule.standalone, at).values())
            assert theirs == ([] if ours is None else [pytest.approx(ours, rel=1e-12)]), \
                f"{rule.record} at {at}"
            compared += ours is not None
    assert compared >= 12


def test_the_engine_on_prometheus_equals_the_engine_on_the_store(prom: PrometheusServer,
                                                                 store: Store) -> None:
    embedded = EmbeddedSource(store, semantics="2")
    with PrometheusSource(prom.base_url, semantics="2") as remote:
        for pool in CONFIG.pools:
            for at in TIMES_S:
                ours = pool_cost(embedded, CONFIG, pool, at)
                theirs = pool_cost(remote, CONFIG, pool, at)
                for key in ("gpu_hours", "cost_usd", "per_1000_requests"):
                    assert theirs[key] == ours[key], f"{pool.name}.{key} at {at}"


def test_gpu_hours_are_the_time_that_ran_within_one_interval_per_replica(
    store: Store,
) -> None:
    at = END_MS / 1000 - 3.3
    cost = pool_cost(EmbeddedSource(store, semantics="2"), CONFIG, CONFIG.pool("chat"), at)
    # Up in the last hour: chat-0 40 min (20 down), chat-1 30 min (joined at the half),
    # chat-2 40 min (left 20 min before the end), chat-3 50 min (a 10-minute gap), chat-9 60.
    ran_h = (40 + 30 + 40 + 50 + 60) / 60
    assert abs(cost["gpu_hours"] - ran_h) <= 5 * 30 / 3600
    assert cost["cost_usd"] == pytest.approx(cost["gpu_hours"] * CONFIG.prices["H100"])
    held = pool_cost(EmbeddedSource(store, semantics="2"), CONFIG, CONFIG.pool("held"), at)
    # Down 30 minutes of the hour, billed anyway: 1 replica-hour × 2 GPUs.
    assert abs(held["gpu_hours"] - 2.0) <= 2 * 15 / 3600


def test_the_rule_names_only_the_targets_off_the_default_interval() -> None:
    chat = next(r for r in _cost_rules() if r.origin.kind == "gpu_cost"
                and r.origin.pool == "chat")
    assert 'instance="chat-2"' in chat.expr and "* 30, 3600)" in chat.expr
    assert "instance=" not in chat.expr.split("or")[-1]
    held = next(r for r in _cost_rules() if r.origin.kind == "gpu_cost"
                and r.origin.pool == "held")
    assert "count_over_time(up{" in held.expr and "sum_over_time" not in held.expr
