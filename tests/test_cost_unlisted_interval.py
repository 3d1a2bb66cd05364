"""The interval a replica no ``[[targets]]`` entry lists is billed for: the same in the engine
and in the generated cost rule, whatever the spacing of its samples."""

from __future__ import annotations

import pytest

from alerts.rules.pipeline import generate
from slo.cost.pool import up_seconds
from slo.promql.lookup import semantics_of
from slo.sources.protocol import Matchers
from vigil.config import parse_config
from vigil.model import Labels, Point
from vigil.selectors import as_selector

T0 = 1_800_000_000.0


class _Prometheus:
    """A source that says it is a Prometheus (``external``): ``up`` of two pods, scraped every
    20 s although nothing in the config says so."""

    kind = "prometheus"
    external = True
    semantics = semantics_of("2")

    def __init__(self) -> None:
        self.series: dict[Labels, list[Point]] = {}
        for pod in ("chat-0", "chat-1"):
            labels = (("namespace", "llm"), ("pod", pod), ("service", "chat-vllm"))
            self.series[labels] = [Point(int((T0 - 600 + 20 * i) * 1000), 1.0)
                                   for i in range(1, 31)]

    def samples(self, metric: str, matchers: Matchers, at_s: float,
                range_s: float) -> dict[Labels, list[Point]]:
        assert metric == "up"
        chosen = as_selector(matchers)
        return {k: v for k, v in self.series.items() if chosen.matches(dict(k))}


def _config(**pool: object) -> object:
    return parse_config({
        "collector": {"scrape_interval": "15s"},
        "pools": [{"name": "chat", "model": "m", "selector": 'namespace="llm", '
                   'service="chat-vllm"', "replica_label": "pod", **pool}],
    })


@pytest.mark.parametrize(("pool", "interval"), [({}, 15.0), ({"scrape_interval": "20s"}, 20.0)])
def test_selector_replicas_are_billed_at_the_interval_the_rule_uses(pool, interval) -> None:
    config = _config(**pool)
    billed = up_seconds(_Prometheus(), config, config.pool("chat"), T0, 600)
    # 30 samples each: the pool's interval (else [collector]'s), not the measured 20 s spacing.
    assert billed == {(("pod", "chat-0"),): 30 * interval, (("pod", "chat-1"),): 30 * interval}
    cost_rules = [r for r in generate(config).rules() if r.origin.kind == "gpu_cost"]
    assert cost_rules and all(f"* {interval:g}" in r.expr for r in cost_rules), \
        [r.expr for r in cost_rules]


def test_discovery_interval_is_the_default_of_unlisted_replicas() -> None:
    config = parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "k8s", "files": ["t.json"], "pool": "chat",
                       "scrape_interval": "30s"}],
    })
    assert config.unlisted_scrape_interval(config.pool("chat")) == 30.0
    two = parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "a", "files": ["a.json"], "scrape_interval": "30s"},
                      {"name": "b", "files": ["b.json"], "scrape_interval": "10s"}],
    })
    # Two intervals could feed the pool: unknown, so the engine measures the spacing.
    assert two.unlisted_scrape_interval(two.pool("chat")) is None
