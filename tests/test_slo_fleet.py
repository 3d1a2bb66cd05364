"""``tests/support/fleet.py`` writes what the collector would: names, labels, cumulative
buckets spelled as vLLM spells ``le``, and counters that grow exactly as specified."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fleet import (
    AT,
    HISTORY_STEPS,
    STEP_S,
    TTFT_LE,
    Fleet,
    busy_pool,
    target_labels,
    vllm_labels,
)

from collector.store import Store
from slo.sources.embedded import EmbeddedSource
from vigil.model import Point


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


# --- the builder writes what the collector would ----------------------------------------------


def test_histogram_buckets_are_cumulative_with_vllm_le_spelling(store: Store) -> None:
    fleet = Fleet(store, span_s=60)
    fleet.histogram("vllm:time_to_first_token_seconds", vllm_labels("chat-0"), TTFT_LE,
                    [0.3, 0.6, 0.9])
    fleet.flush()
    last = store.last_points("vllm:time_to_first_token_seconds_bucket")
    by_le = {k.label("le"): p.value for k, p in last.items()}
    step_counts = {"0.25": 0, "0.5": 1, "0.75": 2, "1.0": 3, "+Inf": 3}
    n = HISTORY_STEPS + fleet.steps - 1
    for le, c in step_counts.items():
        assert by_le[le] == n * c
    assert sorted(by_le) == sorted(TTFT_LE)


def test_every_vllm_series_carries_target_and_vllm_labels(store: Store) -> None:
    fleet = Fleet(store, span_s=30)
    fleet.requests(vllm_labels("chat-0"), {"stop": 1})
    fleet.up("chat-0")
    fleet.flush()
    (key, _), *_ = store.series("vllm:request_success_total")
    assert {"instance", "pool", "kind", "engine", "model_name", "finished_reason"} == set(
        key.as_dict()
    )
    assert store.series("up")[0][0].as_dict() == target_labels("chat-0")


def test_increase_over_whole_steps_is_exactly_rate_times_window(store: Store) -> None:
    fleet = Fleet(store)
    fleet.counter("vllm:generation_tokens_total", vllm_labels("chat-0"), 30.0)
    fleet.flush()
    for sem in ("2", "3"):
        src = EmbeddedSource(store, semantics=sem)
        for window in (300.0, 1800.0, 3600.0):
            got = src.increase("vllm:generation_tokens_total", {}, AT, window)
            assert got == {(): 30.0 * window / STEP_S}


def test_busy_pool_writes_every_series_the_status_reads(store: Store) -> None:
    busy_pool(store, instances=("chat-0",), span_s=60)
    names = set(store.metric_names())
    assert {"up", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
            "vllm:num_requests_running", "vllm:request_success_total",
            "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:e2e_request_latency_seconds_count", "vllm:request_prompt_tokens_sum"} <= names


def test_last_sample_is_at_the_evaluation_time(store: Store) -> None:
    fleet = Fleet(store, span_s=45)
    fleet.gauge("vllm:num_requests_waiting", vllm_labels("chat-0"), 2.0)
    fleet.flush()
    (pts,) = store.points("vllm:num_requests_waiting").values()
    assert pts[-1] == Point(round(AT * 1000), 2.0)
    assert len(pts) == 4
