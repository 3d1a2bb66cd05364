"""Token anomalies from vLLM's histograms: a lower bound, and exact with a request log."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.fleet import AT, MODEL, TOKENS_LE, Fleet, vllm_labels

from collector.store import Store
from slo.objectives.anomaly import histogram_count_above, pool_anomalies, raw_increase
from slo.sources.embedded import EmbeddedSource
from vigil.config import parse_config
from vigil.model import Point, RequestRecord

CONFIG = parse_config({"pools": [{"name": "chat", "model": MODEL}]})
POOL = CONFIG.pools[0]
STEPS_IN_HOUR = 240


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


def _traffic(store: Store, outlier_prompt: float, outlier_generated: float = 100.0) -> None:
    """Per scrape: 49 requests of 100 prompt + 50 generated tokens, and one outlier."""
    fleet = Fleet(store)
    labels = vllm_labels("chat-0")
    fleet.histogram("vllm:request_prompt_tokens", labels, TOKENS_LE, [100] * 49 + [outlier_prompt])
    fleet.histogram("vllm:request_generation_tokens", labels, TOKENS_LE,
                    [50] * 49 + [outlier_generated])
    fleet.flush()


def test_requests_in_buckets_wholly_above_10x_the_mean_are_a_lower_bound(store: Store) -> None:
    _traffic(store, outlier_prompt=60_000)
    (a,) = pool_anomalies(EmbeddedSource(store), CONFIG, POOL, AT)
    mean = (49 * 150 + 60_100) / 50  # 1349 tokens per request
    assert a["kind"] == "histogram_lower_bound"
    assert (a["pool"], a["model"], a["window"], a["tokens"]) == (
        "chat", MODEL, "1h", "prompt+generated")
    assert a["mean_tokens_per_request"] == pytest.approx(mean)
    assert a["threshold_tokens"] == pytest.approx(10 * mean)
    # The outlier's bucket (50000, 100000] lies above 13490; counted from the first to the
    # last sample of the hour (239 scrape intervals), never extrapolated: a lower bound.
    assert a["requests_above"] == STEPS_IN_HOUR - 1
    assert a["by_histogram"]["prompt"] == {"requests_above": STEPS_IN_HOUR - 1,
                                           "bucket_lower_bound_tokens": 20000.0}
    assert a["by_histogram"]["generated"]["requests_above"] == 0
    assert a["requests"] == pytest.approx(50 * STEPS_IN_HOUR)


def test_the_bucket_containing_the_threshold_is_not_counted(store: Store) -> None:
    # mean (49 × 150 + 5000) / 50 = 247, threshold 2470: the 4900-token outlier is above it
    # but shares the bucket (2000, 5000] with requests that may be below: not counted.
    _traffic(store, outlier_prompt=4900)
    assert pool_anomalies(EmbeddedSource(store), CONFIG, POOL, AT) == []


def test_a_request_in_both_histograms_is_counted_once(store: Store) -> None:
    _traffic(store, outlier_prompt=60_000, outlier_generated=30_000)
    (a,) = pool_anomalies(EmbeddedSource(store), CONFIG, POOL, AT)
    assert a["by_histogram"]["prompt"]["requests_above"] == STEPS_IN_HOUR - 1
    assert a["by_histogram"]["generated"]["requests_above"] == STEPS_IN_HOUR - 1
    assert a["requests_above"] == STEPS_IN_HOUR - 1  # max, not the sum


def test_no_traffic_no_anomaly(store: Store) -> None:
    assert pool_anomalies(EmbeddedSource(store), CONFIG, POOL, AT) == []


@pytest.mark.parametrize("semantics", ["3", "2"])
def test_the_rollup_answers_as_the_samples_do_through_a_restart(store: Store,
                                                                semantics: str) -> None:
    # Four hours of two replicas, each with outliers; chat-1 restarts half way (its counters
    # drop to 0). Compacted, the store's rollup gives each bucket's first and last sample and
    # drops: the same raw increases, so the same anomalies, as reading every sample.
    fleet = Fleet(store, span_s=4 * 3600 + 900)
    for base, values in (("vllm:request_prompt_tokens", [100] * 49 + [60_000]),
                         ("vllm:request_generation_tokens", [50] * 49 + [30_000])):
        fleet.histogram(base, vllm_labels("chat-0"), TOKENS_LE, values)
    restart = fleet.steps // 2
    labels = vllm_labels("chat-1")
    for base, values in (("vllm:request_prompt_tokens", [100] * 48 + [60_000, 70_000]),
                         ("vllm:request_generation_tokens", [50] * 50)):
        per_step = {f"{base}_bucket{le}": float(sum(1 for v in values if v <= float(le)))
                    for le in TOKENS_LE}
        for le in TOKENS_LE:
            fleet.series(f"{base}_bucket", {**labels, "le": le}, "histogram",
                         lambda i, n=per_step[f"{base}_bucket{le}"]:
                         (i if i < restart else i - restart) * n)
        for suffix, n in (("_sum", math.fsum(values)), ("_count", float(len(values)))):
            fleet.series(base + suffix, labels, "histogram",
                         lambda i, n=n: (i if i < restart else i - restart) * n)
    fleet.flush()
    store.compact(now=AT + 7200)
    assert store.counter_windows("vllm:request_prompt_tokens_bucket", {}, 0,
                                 round(AT * 1000)) is not None
    rolled = EmbeddedSource(store, semantics=semantics)
    raw = EmbeddedSource(store, semantics=semantics)
    raw.use_rollup = False
    # A whole hour, a window off the hours holding the restart, and one ending at it.
    for at, window in ((AT, 3600.0), (AT - 1234.5, 12600.0), (AT - 3600, 5400.0)):
        expected = pool_anomalies(raw, CONFIG, POOL, at, window_s=window)
        assert expected and expected[0]["requests_above"] > 0
        assert pool_anomalies(rolled, CONFIG, POOL, at, window_s=window) == expected


def test_histogram_count_above_picks_the_first_bound_at_or_above_the_threshold() -> None:
    buckets = {100.0: 5.0, 1000.0: 8.0, 10000.0: 9.0, math.inf: 10.0}
    assert histogram_count_above(buckets, 1000.0) == (2, 1000.0)
    assert histogram_count_above(buckets, 1000.5) == (1, 10000.0)
    assert histogram_count_above(buckets, 20000.0) == (0, None)
    assert histogram_count_above({100.0: 1.0}, 50.0) == (0, None)  # no +Inf bucket


def test_raw_increase_handles_resets_without_extrapolating() -> None:
    pts = [Point(0, 10.0), Point(15_000, 14.0), Point(30_000, 2.0), Point(45_000, None),
           Point(60_000, 5.0)]
    assert raw_increase(pts) == (5.0 - 10.0) + 14.0
    assert raw_increase(pts[:1]) is None


class _Log:
    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        normal = [RequestRecord(f"r{i}", at_s - i, pool, MODEL, "chat", 100, 50)
                  for i in range(30)]
        # Long completions: 20x a chat turn, but normal for their endpoint.
        long = [RequestRecord(f"c{i}", at_s - i, pool, MODEL, "completions", 1000, 2000)
                for i in range(5)]
        big = RequestRecord("big", at_s - 1, pool, MODEL, "chat", 40_000, 10, tier="batch",
                            tenant="acme", cost_usd=0.02)
        return [*normal, *long, big]


def test_with_a_request_log_each_anomalous_request_is_reported(store: Store) -> None:
    (a,) = pool_anomalies(EmbeddedSource(store), CONFIG, POOL, AT, request_log=_Log())
    mean = (30 * 150 + 40_010) / 31  # of its model and endpoint (chat)
    assert a["kind"] == "request"
    assert (a["id"], a["endpoint"], a["request_tokens"]) == ("big", "chat", 40_010)
    assert (a["tier"], a["tenant"], a["cost_usd"], a["ts"]) == ("batch", "acme", 0.02, AT - 1)
    assert a["threshold_tokens"] == pytest.approx(10 * mean)
