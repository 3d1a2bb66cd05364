"""Per-model quantiles and tokens per request, hand-computed from vLLM's buckets."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fleet import (
    AT,
    ITL_LE,
    LATENCY_LE,
    MODEL,
    OTHER_MODEL,
    TOKENS_LE,
    TTFT_LE,
    Fleet,
    vllm_labels,
)

from collector.store import Store
from slo.objectives.quantiles import model_quantiles, normalised_e2e, quantile_key, sample_quantile
from slo.sources.embedded import EmbeddedSource
from vigil.model import RequestRecord

TTFT = "vllm:time_to_first_token_seconds"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def _two_models(store: Store) -> None:
    fleet = Fleet(store, span_s=600)
    a, b = vllm_labels("chat-0"), vllm_labels("chat-1", model=OTHER_MODEL)
    fleet.histogram(TTFT, a, TTFT_LE, [0.2] * 10)  # all in (0.1, 0.25]
    fleet.histogram(TTFT, b, TTFT_LE, [3.0] * 4)  # all in (2.5, 5.0]
    fleet.histogram("vllm:e2e_request_latency_seconds", a, LATENCY_LE, [1.2] * 10)
    fleet.histogram("vllm:request_queue_time_seconds", a, LATENCY_LE, [0.1] * 10)
    fleet.histogram("vllm:inter_token_latency_seconds", a, ITL_LE, [0.02] * 10)
    fleet.histogram("vllm:request_generation_tokens", a, TOKENS_LE, [100] * 3 + [300])
    fleet.histogram("vllm:request_prompt_tokens", a, TOKENS_LE, [1000] * 4)
    fleet.flush()


def test_quantile_keys() -> None:
    assert [quantile_key(q) for q in (0.5, 0.95, 0.99, 0.999)] == ["p50", "p95", "p99", "p99.9"]


def test_quantiles_per_model_in_one_pool(store: Store) -> None:
    _two_models(store)
    got = model_quantiles(EmbeddedSource(store), "chat", AT, 300)
    assert sorted(got) == sorted([MODEL, OTHER_MODEL])
    ttft = got[MODEL]["quantiles"]["ttft_seconds"]
    # rank q×N in the bucket (0.1, 0.25] that holds everything: 0.1 + 0.15 × q
    assert ttft == {"p50": pytest.approx(0.175), "p95": pytest.approx(0.2425),
                    "p99": pytest.approx(0.2485), "source": "histogram",
                    "bounds": {"p50": [0.1, 0.25], "p95": [0.1, 0.25], "p99": [0.1, 0.25]}}
    other = got[OTHER_MODEL]["quantiles"]["ttft_seconds"]
    assert other["p50"] == pytest.approx(2.5 + 2.5 * 0.5)
    assert got[MODEL]["quantiles"]["window"] == "5m"
    assert got[MODEL]["quantiles"]["e2e_seconds"]["p50"] == pytest.approx(1.0 + 0.5 * 0.5)
    assert got[MODEL]["quantiles"]["queue_seconds"]["p99"] == pytest.approx(0.3 * 0.99)
    assert got[MODEL]["quantiles"]["itl_seconds"]["p50"] == pytest.approx(0.01 + 0.015 * 0.5)


def test_a_model_without_a_histogram_has_null_quantiles(store: Store) -> None:
    _two_models(store)
    other = model_quantiles(EmbeddedSource(store), "chat", AT, 300)[OTHER_MODEL]
    assert other["quantiles"]["e2e_seconds"] == {
        "p50": None, "p95": None, "p99": None, "source": "histogram",
        "bounds": {"p50": None, "p95": None, "p99": None}}
    assert other["tokens_per_request"]["generated"] == {
        "mean": None, "p95": None, "source": "histogram", "bounds": {"p95": None}}


def test_tokens_per_request_mean_and_p95(store: Store) -> None:
    _two_models(store)
    tokens = model_quantiles(EmbeddedSource(store), "chat", AT, 300)[MODEL]["tokens_per_request"]
    # generated: 3 × 100 + 300 per 4 requests; p95 rank 3.8 falls in (200, 500] holding 1
    assert tokens["generated"]["mean"] == pytest.approx(150.0)
    assert tokens["generated"]["p95"] == pytest.approx(200 + 300 * 0.8)
    assert tokens["generated"]["bounds"] == {"p95": [200.0, 500.0]}
    assert tokens["prompt"] == {"mean": pytest.approx(1000.0), "p95": pytest.approx(975.0),
                                "source": "histogram", "bounds": {"p95": [500.0, 1000.0]}}


def test_configured_model_without_data_appears_with_nulls(store: Store) -> None:
    got = model_quantiles(EmbeddedSource(store), "chat", AT, 300, models=[MODEL])
    assert got == {MODEL: {
        "quantiles": {
            "window": "5m",
            **{k: {"p50": None, "p95": None, "p99": None, "source": "histogram",
                   "bounds": {"p50": None, "p95": None, "p99": None}}
               for k in ("ttft_seconds", "e2e_seconds", "queue_seconds", "itl_seconds")},
        },
        "tokens_per_request": {
            k: {"mean": None, "p95": None, "source": "histogram", "bounds": {"p95": None}}
            for k in ("generated", "prompt")},
    }}


def test_an_idle_window_gives_null_not_zero(store: Store) -> None:
    fleet = Fleet(store, span_s=600)
    fleet.histogram(TTFT, vllm_labels("chat-0"), TTFT_LE, [])  # scraped, nothing observed
    fleet.histogram("vllm:request_generation_tokens", vllm_labels("chat-0"), TOKENS_LE, [])
    fleet.flush()
    got = model_quantiles(EmbeddedSource(store), "chat", AT, 300)[MODEL]
    assert got["quantiles"]["ttft_seconds"]["p95"] is None
    assert got["tokens_per_request"]["generated"]["mean"] is None
    assert got["tokens_per_request"]["generated"]["p95"] is None


def test_other_pools_are_not_mixed_in(store: Store) -> None:
    _two_models(store)
    assert model_quantiles(EmbeddedSource(store), "batch", AT, 300) == {}


def test_sample_quantile_is_promqls_quantile_aggregation() -> None:
    # quantile(0.5, ...) of 1, 2, 3, 4: rank 1.5 -> 2.5; of one value: that value
    assert sample_quantile(0.5, [4.0, 1.0, 3.0, 2.0]) == 2.5
    assert sample_quantile(0.95, [1.0, 2.0, 3.0, 4.0]) == pytest.approx(3.85)
    assert sample_quantile(0.99, [7.0]) == 7.0
    assert sample_quantile(0.5, []) is None
    assert sample_quantile(-0.1, [1.0]) == float("-inf")
    assert sample_quantile(1.1, [1.0]) == float("inf")


def test_e2e_normalised_to_512_tokens_from_gateway_records(store: Store) -> None:
    _two_models(store)

    class Log:
        def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
            return [
                # ttft 0.2 s, then 100 tokens in 1.98 s (0.02 s each) -> 0.2 + 511 × 0.02
                RequestRecord("a", at_s, pool, MODEL, "chat", 10, 100, 0.2, 2.18),
                # 1000 tokens in 0.5 + 999 × 0.01 -> 0.5 + 511 × 0.01
                RequestRecord("b", at_s, pool, MODEL, "chat", 10, 1000, 0.5, 10.49),
                RequestRecord("c", at_s, pool, MODEL, "chat", 10, 1, 0.3, 0.3),  # no rate
                RequestRecord("d", at_s, pool, MODEL, "chat", 10, 50, None, 1.0),  # no ttft
            ]

    got = model_quantiles(EmbeddedSource(store), "chat", AT, 300, request_log=Log())
    q = got[MODEL]["quantiles"]["e2e_seconds_per_512_tokens"]
    a, b = 0.2 + 511 * 0.02, 0.5 + 511 * 0.01
    assert q["p50"] == pytest.approx((a + b) / 2)
    assert q["p99"] == pytest.approx(a + 0.99 * (b - a) if b > a else b + 0.99 * (a - b))
    assert normalised_e2e(RequestRecord("x", 0, "p", MODEL, "chat", 1, 2, 0.1, 0.3,
                                        error=True)) is None
    # without a log the key is absent (the histograms cannot normalise)
    assert "e2e_seconds_per_512_tokens" not in model_quantiles(
        EmbeddedSource(store), "chat", AT, 300)[MODEL]["quantiles"]


def test_e2e_normalised_to_the_configured_output_length(store: Store) -> None:
    _two_models(store)

    class Log:
        def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
            # ttft 0.2 s, then 0.02 s per token: 0.2 + 255 × 0.02 at 256 tokens
            return [RequestRecord("a", at_s, pool, MODEL, "chat", 10, 100, 0.2, 2.18)]

    source = EmbeddedSource(store)
    q = model_quantiles(source, "chat", AT, 300, request_log=Log(),
                        normalised_output_tokens=256)[MODEL]["quantiles"]
    assert q["normalised_output_tokens"] == 256
    assert q["e2e_seconds_normalised"]["p50"] == pytest.approx(0.2 + 255 * 0.02)
    assert "e2e_seconds_per_512_tokens" not in q  # its name would not be true
    default = model_quantiles(source, "chat", AT, 300, request_log=Log())[MODEL]["quantiles"]
    assert default["normalised_output_tokens"] == 512
    assert default["e2e_seconds_per_512_tokens"] == default["e2e_seconds_normalised"]
    assert default["e2e_seconds_normalised"]["p50"] == pytest.approx(0.2 + 511 * 0.02)
