"""SLIs on hand-computed data: each indicator's error ratio, and ``None`` for no data."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_slo_fleet import (
    AT,
    LATENCY_LE,
    MODEL,
    OTHER_MODEL,
    TTFT_LE,
    Fleet,
    target_labels,
    vllm_labels,
)

from collector.store import Store
from slo.embedded import EmbeddedSource
from slo.sli import (
    REASON_ENDPOINT,
    REASON_NO_DATA,
    REASON_NO_REQUESTS,
    error_ratio,
)
from slo.spec import SloSpec
from vigil.model import RequestRecord

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"


def spec(indicator: str, threshold: float | None = None, objective: float = 0.95,
         endpoint: str = "all", model: str = MODEL) -> SloSpec:
    return SloSpec(f"chat-{indicator}", "chat", model, endpoint, indicator, objective,
                   threshold, 30 * 86400.0)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "vigil.db")
    yield s
    s.close()


@pytest.fixture
def fleet(store: Store) -> Fleet:
    return Fleet(store, span_s=900)


def test_ttft_at_the_default_threshold_is_interpolated_inside_its_bucket(
    store: Store, fleet: Fleet
) -> None:
    # Per scrape: chat-0 serves 6 first tokens at 0.3 s, 2 at 0.6 s, 2 at 0.9 s; chat-1 10 at
    # 0.3 s. 0.8 s lies in the bucket (0.75, 1.0] holding chat-0's 2 slow ones: PromQL assumes
    # they are spread evenly, so 2 × 0.05/0.25 = 0.4 of them count as good.
    fleet.histogram(TTFT, vllm_labels("chat-0"), TTFT_LE, [0.3] * 6 + [0.6] * 2 + [0.9] * 2)
    fleet.histogram(TTFT, vllm_labels("chat-1"), TTFT_LE, [0.3] * 10)
    fleet.flush()
    result = error_ratio(spec("ttft", 0.8), EmbeddedSource(store), AT, 300)
    steps = 300 / 15
    assert result.total == 20 * steps
    assert result.error_ratio == pytest.approx(1 - 18.4 / 20, rel=1e-12)
    assert result.interpolated is True


def test_ttft_at_a_bucket_bound_is_exact(store: Store, fleet: Fleet) -> None:
    fleet.histogram(TTFT, vllm_labels("chat-0"), TTFT_LE, [0.3] * 6 + [0.6] * 2 + [1.5] * 2)
    fleet.flush()
    result = error_ratio(spec("ttft", 1.0), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(0.2, rel=1e-12)
    assert result.interpolated is False


def test_e2e_at_8s_interpolates_between_5_and_10(store: Store, fleet: Fleet) -> None:
    fleet.histogram(E2E, vllm_labels("chat-0"), LATENCY_LE, [2.0] * 3 + [7.0])
    fleet.flush()
    result = error_ratio(spec("e2e", 8.0), EmbeddedSource(store), AT, 600)
    # good = 3 + 1 × (8 - 5)/(10 - 5) = 3.6 of 4
    assert result.error_ratio == pytest.approx(0.1, rel=1e-12)
    assert result.interpolated is True


def test_latency_sli_counts_only_the_slo_model(store: Store, fleet: Fleet) -> None:
    fleet.histogram(TTFT, vllm_labels("chat-0"), TTFT_LE, [0.3] * 4)
    fleet.histogram(TTFT, vllm_labels("chat-0", model=OTHER_MODEL), TTFT_LE, [5.0] * 4)
    fleet.flush()
    result = error_ratio(spec("ttft", 0.8), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == 0.0


def test_error_rate_counts_error_only_and_keeps_aborts_in_the_denominator(
    store: Store, fleet: Fleet
) -> None:
    fleet.requests(vllm_labels("chat-0"), {"stop": 80, "length": 10, "abort": 5, "error": 5})
    fleet.requests(vllm_labels("chat-1"), {"stop": 100})
    fleet.flush()
    result = error_ratio(spec("error_rate", objective=0.995), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(5 / 200, rel=1e-12)
    assert result.total == pytest.approx(200 * 20, rel=1e-12)
    assert result.interpolated is False


def test_error_rate_with_no_finished_request_is_none_not_zero(
    store: Store, fleet: Fleet
) -> None:
    fleet.requests(vllm_labels("chat-0"), {})  # every child exported, all flat at 0
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio is None
    assert result.reason == REASON_NO_REQUESTS


def test_availability_with_a_replica_down_half_the_window(store: Store, fleet: Fleet) -> None:
    fleet.up("chat-0")
    # chat-1 is down for the last 300 s of the 600 s window: 20 of its 40 samples are 0.
    last = fleet.steps - 1
    fleet.up("chat-1", value=lambda i: 0.0 if i > last - 20 else 1.0)
    fleet.gauge("up", target_labels("chat-0-gpu", kind="dcgm"), 0.0)  # not a vLLM target
    fleet.up("other-0", pool="batch", value=0.0)
    fleet.flush()
    result = error_ratio(spec("availability", objective=0.995), EmbeddedSource(store), AT, 600)
    assert result.error_ratio == pytest.approx(0.25, rel=1e-12)
    assert result.total is None


@pytest.mark.parametrize("indicator,threshold", [
    ("ttft", 0.8), ("e2e", 8.0), ("error_rate", None), ("availability", None)])
def test_every_indicator_is_none_without_data(
    store: Store, indicator: str, threshold: float | None
) -> None:
    result = error_ratio(spec(indicator, threshold), EmbeddedSource(store), AT, 300)
    assert result.error_ratio is None
    assert result.reason == REASON_NO_DATA


def test_latency_with_no_request_in_the_window_is_none(store: Store, fleet: Fleet) -> None:
    fleet.histogram(TTFT, vllm_labels("chat-0"), TTFT_LE, [])
    fleet.flush()
    result = error_ratio(spec("ttft", 0.8), EmbeddedSource(store), AT, 300)
    assert (result.error_ratio, result.reason) == (None, REASON_NO_REQUESTS)


def test_one_endpoint_without_a_request_log_is_none_never_all_endpoints(
    store: Store, fleet: Fleet
) -> None:
    fleet.requests(vllm_labels("chat-0"), {"stop": 10, "error": 1})
    fleet.flush()
    result = error_ratio(spec("error_rate", endpoint="chat"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio is None
    assert result.reason == REASON_ENDPOINT


class _Log:
    def __init__(self, records: list[RequestRecord]) -> None:
        self._records = records

    def records(self, pool: str, at_s: float, window_s: float) -> list[RequestRecord]:
        return [r for r in self._records if r.pool == pool and at_s - window_s < r.ts_s <= at_s]


def _rec(i: int, endpoint: str, ttft: float, error: bool = False) -> RequestRecord:
    return RequestRecord(f"r{i}", AT - i, "chat", MODEL, endpoint, 100, 50, ttft, ttft + 2,
                         error)


def test_one_endpoint_with_a_request_log_counts_its_requests_exactly(store: Store) -> None:
    refused = RequestRecord("r5", AT - 5, "chat", MODEL, "chat", 100, 0, None, 0.01,
                            error_class="rejected")
    cancelled = RequestRecord("r6", AT - 6, "chat", MODEL, "chat", 100, 3, 2.5, 3.0,
                              error_class="client_cancel")
    log = _Log([_rec(1, "chat", 0.5), _rec(2, "chat", 0.9), _rec(3, "chat", 0.2, error=True),
                _rec(4, "completions", 3.0), _rec(4000, "chat", 9.0), refused, cancelled])
    src = EmbeddedSource(store)
    # latency: the completed chat requests r1 (good) and r2 (bad); the failure r3 is the
    # error SLO's; a refused or abandoned request is neither good nor bad service
    ttft = error_ratio(spec("ttft", 0.8, endpoint="chat"), src, AT, 300, request_log=log)
    assert (ttft.error_ratio, ttft.total, ttft.interpolated) == (1 / 2, 2.0, False)
    errors = error_ratio(spec("error_rate", endpoint="chat"), src, AT, 300, request_log=log)
    assert (errors.error_ratio, errors.total) == (1 / 3, 3.0)


def test_unknown_indicator_and_bad_window_are_errors(store: Store) -> None:
    src = EmbeddedSource(store)
    with pytest.raises(ValueError, match="indicator"):
        error_ratio(spec("latency"), src, AT, 300)
    with pytest.raises(ValueError, match="window"):
        error_ratio(spec("error_rate"), src, AT, 0)
    with pytest.raises(ValueError, match="threshold_seconds"):
        error_ratio(spec("ttft"), src, AT, 300)
