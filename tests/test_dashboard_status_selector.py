"""``target_states`` lists every replica: the configured targets, the ones ``[[discovery]]``
found (by ``instance``, Vigil's labels) and, in a Prometheus, the replicas of a pool with a
selector, named by its ``replica_label``, from the ``up`` series the selector chooses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.prometheus import PrometheusServer, PromSeries, prometheus_fixture

from collector.store import Store
from dashboard.status_view import TargetState, target_states
from slo.sources.embedded import EmbeddedSource
from slo.sources.prometheus import PrometheusSource
from vigil.config import Config, parse_config
from vigil.model import SeriesKey, TargetHealth

AT = 1_795_000_000.0
AT_MS = round(AT * 1000)
CHAT = 'namespace="llm", service="chat-vllm"'
GPU = 'namespace="gpu-operator", service="dcgm-exporter"'


def _config() -> Config:
    return parse_config({
        "pools": [
            {"name": "chat", "model": "m", "selector": CHAT, "dcgm_selector": GPU,
             "replica_label": "pod"},
            {"name": "batch", "model": "m"},
        ],
        "targets": [
            {"name": "chat-0", "url": "http://10.0.0.1:8000/metrics", "pool": "chat"},
            {"name": "batch-0", "url": "http://10.0.1.1:8000/metrics", "pool": "batch"},
        ],
        "discovery": [{"name": "k8s", "files": ["sd/*.json"], "pool": "batch"}],
    })


def _up(labels: dict[str, str], value: float) -> tuple[SeriesKey, str, int, float]:
    return SeriesKey("up", tuple(sorted(labels.items()))), "gauge", AT_MS - 5000, value


def _health(target: str, pool: str, up: bool) -> TargetHealth:
    return TargetHealth(target, pool, "vllm", f"http://{target}/metrics", up, AT - 5, 0.1,
                        10, "" if up else "connection refused")


# --- the embedded store ---------------------------------------------------------------------
def test_store_lists_the_discovered_targets_with_their_url(tmp_path: Path) -> None:
    config = _config()
    with Store(tmp_path / "vigil.db") as store:
        store.write([
            _up({"instance": "chat-0", "pool": "chat", "kind": "vllm"}, 1.0),
            _up({"instance": "batch-0", "pool": "batch", "kind": "vllm"}, 1.0),
            _up({"instance": "10.0.1.7:8000", "pool": "batch", "kind": "vllm",
                 "zone": "z1"}, 0.0),
            # A pool no longer configured: not a target of this config.
            _up({"instance": "10.9.9.9:8000", "pool": "gone", "kind": "vllm"}, 1.0),
        ])
        store.set_target_health(_health("10.0.1.7:8000", "batch", up=False))
        # Recorded, but silent now (the collector is not running, say).
        store.set_target_health(_health("10.0.1.3:8000", "batch", up=True))
        states = target_states(config, EmbeddedSource(store), AT)
    assert states == [
        # The store's series carry Vigil's labels: a selector does not apply here.
        TargetState("chat-0", "chat", "vllm", "http://10.0.0.1:8000/metrics", "up"),
        TargetState("batch-0", "batch", "vllm", "http://10.0.1.1:8000/metrics", "up"),
        TargetState("10.0.1.3:8000", "batch", "vllm", "http://10.0.1.3:8000/metrics",
                    "no data"),
        TargetState("10.0.1.7:8000", "batch", "vllm", "http://10.0.1.7:8000/metrics", "down"),
    ]


def test_store_without_discovery_lists_the_configured_targets_only(tmp_path: Path) -> None:
    config = parse_config({"pools": [{"name": "chat", "model": "m"}],
                           "targets": [{"name": "chat-0", "url": "http://10.0.0.1:8000/metrics",
                                        "pool": "chat"}]})
    with Store(tmp_path / "vigil.db") as store:
        store.write([_up({"instance": "chat-0", "pool": "chat", "kind": "vllm"}, 0.0)])
        states = target_states(config, EmbeddedSource(store), AT)
    assert states == [TargetState("chat-0", "chat", "vllm", "http://10.0.0.1:8000/metrics",
                                  "down")]


# --- a Prometheus that scrapes the replicas itself ------------------------------------------
def _prom_series() -> list[PromSeries]:
    def up(labels: dict[str, str], value: float) -> PromSeries:
        return PromSeries("up", labels, [(AT_MS - 20_000 + 5000 * i, value) for i in range(4)])

    team = {"namespace": "llm", "service": "chat-vllm", "job": "llm/chat-vllm"}
    gpu = {"namespace": "gpu-operator", "service": "dcgm-exporter", "job": "dcgm"}
    return [
        up({**team, "pod": "chat-vllm-a", "instance": "10.2.0.1:8000"}, 1.0),
        up({**team, "pod": "chat-vllm-b", "instance": "10.2.0.2:8000"}, 0.0),
        up({**gpu, "pod": "dcgm-x", "instance": "10.3.0.1:9400"}, 1.0),
        # Another service of the namespace: not the pool's.
        up({"namespace": "llm", "service": "embed", "pod": "embed-a",
            "instance": "10.2.0.9:8000", "job": "llm/embed"}, 1.0),
        # Vigil's own scrape jobs: a configured and a discovered target of "batch".
        up({"instance": "batch-0", "pool": "batch", "kind": "vllm", "job": "vigil-batch-0"},
           1.0),
        up({"instance": "10.0.1.7:8000", "pool": "batch", "kind": "vllm", "job": "vigil-k8s"},
           0.0),
    ]


prom = prometheus_fixture(_prom_series)


@pytest.fixture(scope="module")
def remote(prom: PrometheusServer) -> Iterator[PrometheusSource]:
    with PrometheusSource(prom.base_url, semantics="2") as source:
        yield source


@pytest.mark.slow
def test_prometheus_lists_a_selector_pools_replicas_by_its_replica_label(
        remote: PrometheusSource) -> None:
    states = target_states(_config(), remote, AT)
    assert states == [
        # chat-0 is left out: Prometheus scrapes chat's replicas under the team's labels.
        TargetState("batch-0", "batch", "vllm", "http://10.0.1.1:8000/metrics", "up"),
        TargetState("chat-vllm-a", "chat", "vllm", "", "up"),
        TargetState("chat-vllm-b", "chat", "vllm", "", "down"),
        TargetState("dcgm-x", "chat", "dcgm", "", "up"),
        TargetState("10.0.1.7:8000", "batch", "vllm", "", "down"),
    ]
    # After the lookback, nothing is left of any `up`: only the configured target remains.
    later = target_states(_config(), remote, AT + 3600)
    assert [(t.name, t.state) for t in later] == [("batch-0", "no data")]
