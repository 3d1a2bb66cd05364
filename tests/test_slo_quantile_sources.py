"""Exact quantiles from the gateway's records, honest ones from vLLM's buckets: the same
requests read both ways, hand-computed; the coverage rule; the bucket of each histogram
quantile and how the table and the dashboard show a wide one."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fleet import AT, LATENCY_LE, MODEL, TOKENS_LE, TTFT_LE, Fleet, vllm_labels

from collector.store import Store
from dashboard import format as fmt
from slo.objectives.quantiles import (
    histogram_figures,
    model_quantiles,
    quantile_range,
    records_cover,
)
from slo.promql.quantile import quantile_bounds
from slo.sources.embedded import EmbeddedSource
from vigil.conventions import TOKENS_CHUNKS, TOKENS_USAGE
from vigil.model import RequestRecord
from vigil_shell.slo_status_cli import add_arguments, format_table

WINDOW = 300.0
#: One 15-s step of the fleet: four requests (TTFT, e2e), 128 tokens out, 1000 in each.
STEP = [(0.2, 3.1), (0.2, 3.2), (0.3, 3.2), (0.4, 3.3)]
#: 300 s hold 20 steps: vLLM's increase counts 80 requests.
STEPS = 20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "vigil.db")
    fleet = Fleet(s, span_s=600)
    labels = vllm_labels("chat-0")
    fleet.histogram("vllm:time_to_first_token_seconds", labels, TTFT_LE, [t for t, _ in STEP])
    fleet.histogram("vllm:e2e_request_latency_seconds", labels, LATENCY_LE,
                    [e for _, e in STEP])
    # Requests that never queued: every observation in the first bucket (≤ 0.3 s).
    fleet.histogram("vllm:request_queue_time_seconds", labels, LATENCY_LE, [0.0] * 4)
    fleet.histogram("vllm:request_generation_tokens", labels, TOKENS_LE, [128] * 4)
    fleet.histogram("vllm:request_prompt_tokens", labels, TOKENS_LE, [1000] * 4)
    fleet.flush()
    yield s
    s.close()


def _records(n_steps: int = STEPS, **changes: object) -> list[RequestRecord]:
    """The fleet's requests as the gateway recorded them, ``n_steps`` steps of them."""
    out = []
    for i in range(n_steps):
        for j, (ttft, e2e) in enumerate(STEP):
            r = RequestRecord(f"r{i}-{j}", AT - i * 15.0 - j, "chat", MODEL, "chat", 1000, 128,
                              ttft, e2e, tokens_source=TOKENS_USAGE)
            out.append(r._replace(**changes))  # type: ignore[arg-type]
    return out


class Log:
    def __init__(self, records: list[RequestRecord]) -> None:
        self.rows = records

    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        return [r for r in self.rows if r.pool == pool and at_s - window_s < r.ts_s <= at_s]


def _model(store: Store, records: list[RequestRecord] | None = None, **kw: object
           ) -> dict[str, dict]:
    log = None if records is None else Log(records)
    return model_quantiles(EmbeddedSource(store), "chat", AT, WINDOW, request_log=log,
                           **kw)[MODEL]  # type: ignore[arg-type]


def test_records_and_histograms_on_the_same_requests(store: Store) -> None:
    got = _model(store, _records())
    e2e = got["quantiles"]["e2e_seconds"]
    # 80 records: 20 × 3.1, 40 × 3.2, 20 × 3.3 (sorted indices 0-19, 20-59, 60-79).
    # PromQL's quantile: rank q·79 -> p50 39.5 (3.2, 3.2), p95 75.05 and p99 78.21 (3.3).
    assert (e2e["p50"], e2e["p95"], e2e["p99"]) == (3.2, 3.3, 3.3)
    assert e2e["source"] == "gateway" and e2e["count"] == 80
    # The buckets put all 80 in (2.5, 5]: 2.5 + 2.5 q, whatever the requests took.
    assert histogram_figures(e2e) == {"p50": 3.75, "p95": 4.875, "p99": pytest.approx(4.975)}
    assert e2e["histogram"]["bounds"] == {"p50": [2.5, 5.0], "p95": [2.5, 5.0],
                                          "p99": [2.5, 5.0]}
    ttft = got["quantiles"]["ttft_seconds"]
    # 40 × 0.2, 20 × 0.3, 20 × 0.4: p50 between indices 39 and 40 -> (0.2 + 0.3) / 2
    assert ttft["p50"] == pytest.approx(0.25) and ttft["p95"] == 0.4
    # buckets: 40 in (0.1, 0.25], 40 in (0.25, 0.5]; p95 rank 76 -> 0.25 + 0.25 × 36/40
    assert histogram_figures(ttft)["p95"] == pytest.approx(0.475)
    gen = got["tokens_per_request"]["generated"]
    assert (gen["mean"], gen["p95"], gen["source"]) == (128.0, 128.0, "gateway")
    # 128 tokens each, in the 1-2-5 bucket (100, 200]: rank 0.95 -> 195
    assert gen["histogram"] == {"mean": pytest.approx(128.0), "p95": pytest.approx(195.0),
                                "bounds": {"p95": [100.0, 200.0]}}
    assert got["tokens_per_request"]["prompt"]["p95"] == 1000.0


def test_queue_time_and_itl_stay_with_the_histograms(store: Store) -> None:
    queue = _model(store, _records())["quantiles"]["queue_seconds"]
    # The gateway sees neither vLLM's queue nor each token's gap.
    assert queue["source"] == "histogram"
    assert queue["p50"] == pytest.approx(0.15)
    assert queue["bounds"]["p50"] == [0.0, 0.3]


def test_a_quantile_in_the_first_bucket_is_shown_as_that_bucket(store: Store) -> None:
    queue = _model(store)["quantiles"]["queue_seconds"]
    assert queue["bounds"] == {"p50": [0.0, 0.3], "p95": [0.0, 0.3], "p99": [0.0, 0.3]}
    assert quantile_range(queue, "p50") == (0.0, 0.3)
    assert fmt.quantile(queue, "p50") == "≤ 300 ms"
    gen = _model(store)["tokens_per_request"]["generated"]
    assert fmt.quantile(gen, "p95", "tokens") == "100–200 tokens"


def test_histogram_quantile_bounds() -> None:
    buckets = [(0.3, 10.0), (0.5, 10.0), (1.0, 20.0), (math.inf, 21.0)]
    assert quantile_bounds(0.4, buckets) == (0.0, 0.3)  # rank 8.4 ≤ 10
    assert quantile_bounds(0.5, buckets) == (0.5, 1.0)  # rank 10.5: past (0.3, 0.5], empty
    # rank 20.79 > 20: the +Inf bucket, whose quantile PromQL gives as the highest bound
    assert quantile_bounds(0.99, buckets) == (1.0, math.inf)
    assert quantile_bounds(0.5, [(0.3, 0.0), (math.inf, 0.0)]) is None
    assert quantile_bounds(0.5, [(0.3, 1.0)]) is None  # no +Inf bucket: PromQL's NaN
    assert quantile_bounds(1.5, buckets) is None


def test_a_narrow_bucket_or_an_exact_figure_is_a_number() -> None:
    narrow = {"p95": 4.9, "source": "histogram", "bounds": {"p95": [4.0, 5.0]}}
    assert quantile_range(narrow, "p95") is None  # 1 s wide < 4.9 / 3
    assert fmt.quantile(narrow, "p95") == "4.90 s"
    wide = {"p95": 1.2, "source": "histogram", "bounds": {"p95": [1.0, 2.5]}}
    assert fmt.quantile(wide, "p95") == "1–2.5 s"
    top = {"p99": 60.0, "source": "histogram", "bounds": {"p99": [60.0, None]}}
    assert fmt.quantile(top, "p99") == "> 60.00 s"
    exact = {"p50": 0.15, "source": "gateway", "count": 3}
    assert fmt.quantile(exact, "p50") == "150 ms"


def test_records_that_miss_requests_do_not_cover(store: Store) -> None:
    # vLLM counted 80; 0.9 × 80 − 2 = 70 records are needed.
    assert records_cover(_records()[:70], 80.0)
    assert not records_cover(_records()[:69], 80.0)
    short = _model(store, _records(15))  # 60 of 80: traffic that bypassed the gateway
    assert short["quantiles"]["e2e_seconds"]["source"] == "histogram"
    assert short["quantiles"]["e2e_seconds"]["p50"] == 3.75
    assert short["tokens_per_request"]["generated"]["p95"] == pytest.approx(195.0)
    assert not records_cover([], None)
    assert records_cover(_records(1), None)  # no vLLM data: the records are all there is


def test_requests_without_a_first_token_keep_ttft_on_the_histograms(store: Store) -> None:
    got = _model(store, _records(ttft_s=None))  # not streamed: the gateway sees no token
    assert got["quantiles"]["ttft_seconds"]["source"] == "histogram"
    assert got["quantiles"]["e2e_seconds"]["source"] == "gateway"


def test_token_counts_that_are_lower_bounds_keep_tokens_on_the_histograms(store: Store
                                                                            ) -> None:
    got = _model(store, _records(tokens_source=TOKENS_CHUNKS))
    assert got["tokens_per_request"]["generated"]["source"] == "histogram"
    assert got["quantiles"]["e2e_seconds"]["source"] == "gateway"


def test_failed_and_cached_requests_are_not_latencies(store: Store) -> None:
    extra = [RequestRecord("fail", AT - 1, "chat", MODEL, "chat", 1000, 0, None, 30.0,
                           error=True, error_class="timeout"),
             RequestRecord("hit", AT - 1, "chat", MODEL, "chat", 1000, 128, 0.001, 0.002,
                           cache_hit="l1")]
    e2e = _model(store, _records() + extra)["quantiles"]["e2e_seconds"]
    assert (e2e["count"], e2e["p99"]) == (80, 3.3)


def test_source_histogram_forces_the_prometheus_figures(store: Store) -> None:
    got = _model(store, _records(), quantile_source="histogram")
    assert got["quantiles"]["e2e_seconds"]["p50"] == 3.75
    assert got["quantiles"]["e2e_seconds"]["source"] == "histogram"
    assert got["tokens_per_request"]["generated"]["source"] == "histogram"
    plain = _model(store)
    for key in ("ttft_seconds", "e2e_seconds", "queue_seconds", "itl_seconds"):
        assert got["quantiles"][key] == plain["quantiles"][key]
    assert got["tokens_per_request"] == plain["tokens_per_request"]
    with pytest.raises(ValueError, match="quantile_source"):
        _model(store, quantile_source="gateway")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--config", "x", "--source", "histogram"]).quantile_source == (
        "histogram")
    assert parser.parse_args(["--config", "x"]).quantile_source == "auto"


def _table(block: dict) -> str:
    return format_table({"at": AT, "source": "embedded", "promql_semantics": "3",
                         "window": "5m", "pools": {"chat": {"models": {MODEL: block}}},
                         "slos": []})


def test_the_table_shows_wide_buckets_as_ranges(store: Store) -> None:
    table = _table(_model(store))
    assert f"  {MODEL} (histogram)" in table
    # Every bucket here is wider than a third of its quantile (e.g. 2.5 s > 3.75 s / 3).
    assert ("    TTFT p95 250–500ms p99 250–500ms  e2e p50 2.5–5s p95 2.5–5s"
            "  gen tok/req 128 p95 100–200") in table
    exact = _table(_model(store, _records()))
    assert f"  {MODEL} (gateway)" in exact
    assert ("    TTFT p95 400ms p99 400ms  e2e p50 3.20s p95 3.30s  gen tok/req 128 p95 128"
            in exact)
