"""``slo.status.evaluate``: the whole JSON shape, with numbers where there is data and nulls
where there is none."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from support.fleet import AT, MODEL, busy_pool

from collector.store import Store
from slo.objectives.sli import REASON_NO_REQUEST_DATA
from slo.sources.embedded import EmbeddedSource
from slo.sources.protocol import source_kind
from slo.status import evaluate, json_safe
from vigil.config import parse_config

CONFIG = parse_config({"pools": [
    {"name": "chat", "model": MODEL, "gpu": "H100", "max_replicas": 4},
    {"name": "batch", "model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "L40S"},
]})
WINDOWS = ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]

#: The documented shape: every key must be present (more are welcome).
POOL_KEYS = {"models", "kv_cache_usage", "queue_length", "cost", "scaling"}
MODEL_KEYS = {"quantiles", "tokens_per_request"}
QUANTILE_KEYS = {"window", "ttft_seconds", "e2e_seconds", "queue_seconds", "itl_seconds"}
COST_KEYS = {"window", "per_1000_requests", "per_million_output_tokens", "gpu_hours", "requests"}
SCALING_KEYS = {"current", "desired", "action", "reasons", "next_decision_at"}
SLO_KEYS = {"name", "pool", "model", "endpoint", "indicator", "threshold_seconds", "objective",
            "interpolated", "windows", "period", "sli", "budget_remaining", "alerts"}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


@pytest.fixture(scope="module")
def status(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One evaluation of a busy "chat" pool and an empty "batch" pool, shared (read-only)."""
    with Store(tmp_path_factory.mktemp("status") / "vigil.db") as s:
        busy_pool(s)
        return evaluate(CONFIG, EmbeddedSource(s), AT)


def _check_shape(result: dict[str, Any]) -> None:
    assert {"at", "pools", "slos", "anomalies", "source", "promql_semantics"} <= set(result)
    for pool in result["pools"].values():
        assert set(pool) >= POOL_KEYS
        assert set(pool["kv_cache_usage"]) >= {"avg", "max"}
        assert set(pool["cost"]) >= COST_KEYS
        assert "scaling" in pool
        if pool["scaling"] is not None:
            assert set(pool["scaling"]) >= SCALING_KEYS
            assert pool["scaling"]["action"] in ("scale_out", "scale_in", "hold")
        for block in pool["models"].values():
            assert set(block) >= MODEL_KEYS
            assert set(block["quantiles"]) >= QUANTILE_KEYS
            for key in QUANTILE_KEYS - {"window"}:
                assert set(block["quantiles"][key]) >= {"p50", "p95", "p99", "source"}
            for key in ("generated", "prompt"):
                assert set(block["tokens_per_request"][key]) >= {"mean", "p95", "source"}
    for slo in result["slos"]:
        assert set(slo) >= SLO_KEYS
        assert list(slo["windows"]) == WINDOWS
        for w in slo["windows"].values():
            assert set(w) == {"error_ratio", "burn_rate"}


def test_status_has_every_key_of_the_documented_shape(status: dict[str, Any]) -> None:
    _check_shape(status)
    assert status["at"] == AT
    assert status["source"] == "embedded"
    assert status["promql_semantics"] == "3"
    assert [s["name"] for s in status["slos"]] == [
        "chat-ttft", "chat-e2e", "chat-error-rate", "chat-availability",
        "batch-ttft", "batch-e2e", "batch-error-rate", "batch-availability"]
    json.dumps(status, allow_nan=False)  # valid JSON: no NaN or Infinity anywhere


def test_status_numbers_for_a_busy_pool(status: dict[str, Any]) -> None:
    chat = status["pools"]["chat"]
    assert chat["kv_cache_usage"] == {"avg": pytest.approx(0.5), "max": pytest.approx(0.6)}
    assert chat["queue_length"] == 3.0
    assert chat["cost"]["window"] == "1h"
    assert chat["cost"]["gpu_hours"] == pytest.approx(2.0)
    assert chat["cost"]["requests"] == pytest.approx(2 * 20 * 240)
    assert chat["cost"]["per_1000_requests"] == pytest.approx(2 * 6.88 / 9600 * 1000)
    model = chat["models"][MODEL]
    assert model["quantiles"]["window"] == "5m"
    assert model["quantiles"]["ttft_seconds"]["p50"] == pytest.approx(0.04 + 0.02 * 10 / 12)
    assert model["tokens_per_request"]["generated"]["mean"] == pytest.approx(
        (19 * 150 + 900) / 20)
    assert chat["scaling"] is None or chat["scaling"]["current"] == 2


def test_status_slos_with_data(status: dict[str, Any]) -> None:
    ttft, e2e, errors, avail = status["slos"][:4]
    # per scrape 12 at 0.05 s, 5 at 0.3 s, 3 at 0.9 s: 0.8 s is inside (0.75, 1.0]
    assert ttft["interpolated"] is True
    assert ttft["threshold_seconds"] == 0.8
    assert ttft["windows"]["5m"]["error_ratio"] == pytest.approx(1 - (17 + 3 * 0.2) / 20)
    assert ttft["windows"]["5m"]["burn_rate"] == pytest.approx((1 - 17.6 / 20) / 0.05)
    assert ttft["alerts"] == ["ticket"]  # burn 2.4: above the 1x (3d/6h) row only
    assert errors["windows"]["1h"]["error_ratio"] == pytest.approx(0.05)
    assert errors["windows"]["1h"]["burn_rate"] == pytest.approx(10.0)
    assert errors["alerts"] == ["page", "ticket"]
    assert errors["sli"] == pytest.approx(0.95)
    assert errors["budget_remaining"] == pytest.approx(1 - 0.05 / 0.005)
    assert errors["budget_remaining"] < 0
    # The busy pool's replicas are up but expose no http_requests_total and no gateway sits
    # in front: availability has no request data, and says so rather than report scrapes.
    assert avail["sli"] is None
    assert avail["reason"].startswith("no request data")
    assert avail["windows"]["1d"]["burn_rate"] is None
    assert avail["budget_remaining"] is None
    assert avail["alerts"] == []
    assert e2e["interpolated"] is True


def test_a_pool_without_data_is_all_nulls_never_zeros(status: dict[str, Any]) -> None:
    batch = status["pools"]["batch"]
    assert batch["kv_cache_usage"] == {"avg": None, "max": None}
    assert batch["queue_length"] is None
    for key in ("gpu_hours", "requests", "per_1000_requests", "per_million_output_tokens"):
        assert batch["cost"][key] is None
    quantiles = batch["models"]["Qwen/Qwen2.5-7B-Instruct"]["quantiles"]
    assert quantiles["ttft_seconds"] == {"p50": None, "p95": None, "p99": None,
                                         "source": "histogram",
                                         "bounds": {"p50": None, "p95": None, "p99": None}}
    for slo in status["slos"][4:]:
        assert slo["sli"] is None
        assert slo["budget_remaining"] is None
        assert slo["time_to_exhaustion_seconds"] is None
        assert slo["alerts"] == []
        assert all(w == {"error_ratio": None, "burn_rate": None}
                   for w in slo["windows"].values())
        assert slo["reason"] == ("no data in the window" if slo["indicator"] != "availability"
                                 else REASON_NO_REQUEST_DATA)


def test_status_of_an_empty_store_has_the_full_shape(store: Store) -> None:
    result = evaluate(CONFIG, EmbeddedSource(store, semantics="2"), AT, window_s=60)
    _check_shape(result)
    assert result["promql_semantics"] == "2"
    assert result["window"] == "1m"
    assert result["anomalies"] == []
    assert result["pools"]["chat"]["models"][MODEL]["quantiles"]["window"] == "1m"


def test_scaling_block_comes_from_the_scaling_module_when_present(
    status: dict[str, Any],
) -> None:
    scaling = status["pools"]["chat"]["scaling"]
    try:
        import slo.scaling.signals  # noqa: F401
    except ImportError:
        assert scaling is None
        return
    assert set(scaling) >= SCALING_KEYS


def test_json_safe_turns_nan_and_inf_into_null() -> None:
    assert json_safe({"a": [math.nan, 1.0, math.inf], "b": (True, 2, "x")}) == {
        "a": [None, 1.0, None], "b": [True, 2, "x"]}


def test_source_kind() -> None:
    class PrometheusLike:
        kind = "prometheus"

    class Double:
        """A source without a ``kind``."""

    assert source_kind(PrometheusLike()) == "prometheus"
    assert source_kind(Double()) == "Double"


def test_window_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="window"):
        evaluate(CONFIG, EmbeddedSource(store), AT, window_s=0)
