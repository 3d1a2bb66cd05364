"""A pool's ``up`` series: its selector without the labels only exposed samples carry."""

from __future__ import annotations

import pytest

from alerts.rules.pipeline import generate
from vigil.config import parse_config
from vigil.errors import ConfigError


def _pool(**keys: object) -> dict[str, object]:
    return {"name": "chat", "model": "m", **keys}


def test_up_drops_the_labels_a_target_never_has() -> None:
    config = parse_config({"pools": [_pool(
        selector='namespace="llm", model_name="m", engine="0"',
        dcgm_selector='exported_namespace="llm", exported_pod=~"chat-.*"',
        replica_label="pod")]})
    pool = config.pool("chat")
    assert pool.up_series().inner() == 'namespace="llm"'
    assert pool.series().inner() == 'namespace="llm", model_name="m", engine="0"'
    # A DCGM selector on the GPUs' pods chooses no exporter: no DCGM up at all.
    assert pool.up_series("dcgm") is None
    # The store's own series keep Vigil's labels.
    assert pool.up_series(external=False).inner() == 'pool="chat", kind="vllm"'
    rules = generate(config)
    down = [r for r in rules.rules() if r.alert == "TargetDown"]
    assert [r.expr for r in down] == ['up{namespace="llm"} == 0']
    up_reads = [r.expr for r in rules.rules() if "(up{" in r.expr]
    assert up_reads and all("model_name" not in e.split("(up{", 1)[1].split("}")[0]
                            for e in up_reads), up_reads


def test_a_selector_that_no_up_series_can_match_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"pools\[0\].*target label"):
        parse_config({"pools": [_pool(selector='model_name="m"')]})


def test_replica_label_needs_a_selector() -> None:
    with pytest.raises(ConfigError, match=r"pools\[0\].*replica_label 'pod' without a selector"):
        parse_config({"pools": [_pool(replica_label="pod")]})


def test_a_selector_pool_ignores_discovery_intervals() -> None:
    config = parse_config({
        "pools": [_pool(selector='namespace="llm"', replica_label="pod")],
        "discovery": [{"name": "any", "files": ["t.json"], "pool_label": "team",
                       "scrape_interval": "60s"}],
    })
    assert config.unlisted_scrape_interval(config.pool("chat")) == 15.0
