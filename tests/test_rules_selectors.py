"""Rules for pools chosen by a selector: the series a Prometheus scrapes itself, with the
team's labels only, are read through the pool's selector and grouped by its replica label,
while everything the rules record or alert on still carries ``pool``.

Also the label sets the promtool tests give such a pool's series (``selector_labels``): one
value per matcher that PromQL's matcher accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alerts.rules.pipeline import generate
from alerts.rules.promql import gpu_cost_expr, kv_usage_expr, replica_kv_usage_expr
from alerts.rules.promtool_tests import pool_inputs, pool_labels, selector_labels
from vigil.config import Config, load_config, parse_config
from vigil.conventions import TARGET_LABELS
from vigil.errors import ConfigError
from vigil.selectors import parse_selector

GOLDEN = Path(__file__).resolve().parent / "golden" / "rules"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: A vector selector: metric name and the matchers inside its braces.
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
#: A matcher on `pool` or `kind`.
VIGIL_MATCHER = re.compile(r"(?:^|,)\s*(pool|kind)\s*(=|!=|=~|!~)")


def _raw_selectors(expr: str) -> list[tuple[str, str]]:
    """The selectors of ``expr`` on raw series (not on the rules' own ``slo:``/``vigil:``)."""
    return [(m.group(1), m.group(2)) for m in SELECTOR.finditer(expr)
            if not m.group(1).startswith(("slo:", "vigil:"))]


def _config(selector: str = 'namespace="llm", service="chat-vllm"', **pool: object) -> Config:
    return parse_config({"pools": [{"name": "chat", "model": MODEL, "selector": selector,
                                    "replica_label": "pod", **pool}]})


KUBERNETES = load_config(GOLDEN / "kubernetes" / "vigil.toml")


def test_selector_pools_read_no_vigil_label_and_record_with_pool() -> None:
    result = generate(KUBERNETES)
    selector_pools = {p.name for p in KUBERNETES.pools if p.has_selector}
    assert selector_pools == {"chat", "batch"}
    checked = 0
    for rule in result.rules():
        if rule.origin.pool not in selector_pools:
            continue
        for expr in (rule.expr, rule.standalone):
            for metric, inner in _raw_selectors(expr):
                assert not VIGIL_MATCHER.search(inner), (rule.name, metric, inner)
            assert "by (pool" not in expr and "instance" not in expr, (rule.name, expr)
        assert rule.labels["pool"] == rule.origin.pool, rule.name
        checked += 1
    assert checked > 100


def test_a_pool_without_selector_keeps_vigils_labels() -> None:
    legacy = [r for r in generate(KUBERNETES).rules() if r.origin.pool == "legacy"]
    raw = [inner for r in legacy for _, inner in _raw_selectors(r.standalone)]
    assert len(raw) > 100
    assert all(inner.startswith('pool="legacy"') for inner in raw)


def test_replicas_are_grouped_by_the_replica_label() -> None:
    pool = _config().pools[0]
    chosen = '{namespace="llm", service="chat-vllm"}'
    assert replica_kv_usage_expr(pool) == \
        f"avg by (pod) (vllm:kv_cache_usage_perc{chosen})"
    assert kv_usage_expr(pool, "max") == \
        f"max(avg by (pod) (vllm:kv_cache_usage_perc{chosen}))"
    cost = gpu_cost_expr(pool, 3600, 2, 4.0, default_interval_s=15)
    assert "max by (pod) (clamp_max(sum_over_time(up{namespace=\"llm\", " \
        "service=\"chat-vllm\", pod!=\"\"}[1h]) * 15, 3600))" in cost
    # A series without the replica label is billed on its own, as the engine does.
    assert 'pod=""}[1h]) * 15, 3600)' in cost


def test_per_replica_alerts_name_the_replica_and_the_pool() -> None:
    result = generate(_config())
    alerts = {r.alert: r for r in result.rules() if r.alert and not r.origin.slo}
    kv, down = alerts["KvCacheUsageHigh"], alerts["TargetDown"]
    assert kv.expr.startswith("avg by (pod) (")
    assert down.expr == 'up{namespace="llm", service="chat-vllm"} == 0'
    for rule in (kv, down):
        assert rule.labels["pool"] == "chat"
        # $labels are the expression's: the pool is written out, the replica templated.
        assert "$labels.pool" not in rule.annotations["summary"]
        assert "{{ $labels.pod }}" in rule.annotations["summary"]
    # Every 15s (the collector's default) for 3 scrapes: 30s.
    assert down.for_s == 30


def test_target_down_watches_the_dcgm_selector_too() -> None:
    config = _config(dcgm_selector='namespace="gpu-operator", service="dcgm-exporter"')
    down = next(r for r in generate(config).rules() if r.alert == "TargetDown")
    assert down.expr == ('up{namespace="llm", service="chat-vllm"} == 0\nor\n'
                         'up{namespace="gpu-operator", service="dcgm-exporter"} == 0')


def test_the_cost_per_request_matches_across_the_pool_label() -> None:
    rule = next(r for r in generate(_config()).rules()
                if r.record.startswith("vigil:gpu_cost_usd_per_1000"))
    assert '{pool="chat"}\n/ ignoring(pool)\n' in rule.expr


def test_promtool_series_satisfy_the_selector_and_carry_nothing_of_vigils() -> None:
    for pool in (p for p in KUBERNETES.pools if p.has_selector):
        selector = pool.series("vllm", external=True)
        inputs = pool_inputs(KUBERNETES, pool, [])
        assert inputs
        for s in inputs:
            assert selector.matches(s.labels), s.series()
            assert not set(s.labels) & set(TARGET_LABELS), s.series()
            assert s.labels["pod"]
        pods = {s.labels["pod"] for s in inputs if s.name == "up"}
        assert len(pods) == 2


@pytest.mark.parametrize(("text", "want"), [
    ('namespace="llm"', {"namespace": "llm"}),
    ('container!="istio-proxy"', {"container": "istio-proxy-other"}),
    ('service=~"chat-(vllm|sglang)"', {"service": "chat-vllm"}),
    ('host=~"gpu\\\\.node\\\\.1"', {"host": "gpu.node.1"}),
    ('pod=~"chat-[0-9]{2}-.+"', {"pod": "chat-00-x"}),
    ('job!~"kube-.*"', {"job": "other"}),
    ('zone=~"eu-.*", zone!~"eu-west-.*"', {"zone": "eu-"}),
    ('tier=~"gold|silver", tier!="gold"', {"tier": "silver"}),
    ('zone=~"(?:eu|us)-[a-z]+\\\\d"', {"zone": "eu-a0"}),
    ('pod=~"(?i)Chat-\\\\w{3}"', {"pod": "Chat-aaa"}),
    ('host=~"node-\\\\x41[^x]?"', {"host": "node-A"}),
])
def test_selector_labels_satisfy_every_matcher(text: str, want: dict[str, str]) -> None:
    selector = parse_selector(text)
    got = selector_labels(selector)
    assert got == want
    assert selector.matches(got)


def test_selector_labels_name_the_matcher_they_cannot_satisfy() -> None:
    with pytest.raises(ValueError, match=r'tier=~"a" and tier!~"a"'):
        selector_labels(parse_selector('tier=~"a", tier!~"a"'))
    config = _config('namespace="llm", tier=~"(?:a)", tier!="a"')
    with pytest.raises(ConfigError, match=r"pools\[0\]\.selector.*tier=~"):
        pool_labels(config, config.pools[0])


def test_replica_names_satisfy_a_matcher_on_the_replica_label() -> None:
    config = _config('namespace="llm", pod=~"chat-vllm-[a-z0-9]+"')
    labels = pool_labels(config, config.pools[0])
    first, second = labels.replicas.values()
    assert first != second
    assert all(re.fullmatch("chat-vllm-[a-z0-9]+", v) for v in (first, second))
