"""SLIs on hand-computed data: each indicator's error ratio, and ``None`` for no data."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fleet import (
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
from slo.objectives.sli import (
    REASON_ENDPOINT,
    REASON_ENDPOINT_REPLICA_UP,
    REASON_NO_DATA,
    REASON_NO_REQUEST_DATA,
    REASON_NO_REQUESTS,
    error_ratio,
)
from slo.objectives.spec import SloSpec
from slo.sources.embedded import EmbeddedSource
from vigil.model import RequestRecord

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
HTTP = "http_requests_total"
CHAT_HANDLER = "/v1/chat/completions"


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


def http(fleet: Fleet, instance: str, per_step: dict[str, float], *,
         handler: str = CHAT_HANDLER, method: str = "POST", pool: str = "chat") -> None:
    """vLLM's ``http_requests_total`` of one replica, one counter per status."""
    for status, n in per_step.items():
        fleet.counter(HTTP, {**target_labels(instance, pool), "handler": handler,
                             "method": method, "status": status}, n)


def test_error_rate_without_http_requests_total_is_the_finished_requests_ratio(
    store: Store, fleet: Fleet
) -> None:
    # An older vLLM or another server: no http_requests_total, the figure stays as it was.
    fleet.requests(vllm_labels("chat-0"), {"stop": 95, "error": 5})
    fleet.up("chat-0")
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert (result.error_ratio, result.total) == (5 / 100, 100 * 20)


def test_error_rate_counts_a_non_streamed_error_once_though_it_is_also_a_500(
    store: Store, fleet: Fleet
) -> None:
    # Per step 5 requests finish with reason error, unstreamed: vLLM answers each with a 500.
    fleet.requests(vllm_labels("chat-0"), {"stop": 95, "error": 5})
    http(fleet, "chat-0", {"2xx": 95, "5xx": 5})
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(5 / 100, rel=1e-12)
    assert result.total == pytest.approx(100 * 20, rel=1e-12)


def test_error_rate_counts_a_streamed_error_after_its_200(store: Store, fleet: Fleet) -> None:
    # Streamed: the 200 was sent before the error, which vLLM reports inside the stream.
    fleet.requests(vllm_labels("chat-0"), {"stop": 95, "error": 5})
    http(fleet, "chat-0", {"2xx": 100})
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(5 / 100, rel=1e-12)


def test_error_rate_adds_5xx_answers_that_never_finished_in_the_engine(
    store: Store, fleet: Fleet
) -> None:
    # 100 finished fine; 10 got a 500 or 503 with no finished request (engine dead, an
    # exception before generation): 10 bad of 110 served. A 4xx is not a server failure.
    fleet.requests(vllm_labels("chat-0"), {"stop": 100})
    http(fleet, "chat-0", {"200": 100, "500": 6, "503": 4, "400": 3})
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(10 / 110, rel=1e-12)
    assert result.total == pytest.approx(110 * 20, rel=1e-12)


def test_error_rate_of_a_dead_engine_answering_only_500s_is_one(
    store: Store, fleet: Fleet
) -> None:
    fleet.requests(vllm_labels("chat-0"), {})
    http(fleet, "chat-0", {"5xx": 7})
    fleet.flush()
    result = error_ratio(spec("error_rate"), EmbeddedSource(store), AT, 300)
    assert (result.error_ratio, result.total) == (1.0, 7 * 20)


def test_availability_is_the_5xx_share_of_post_answers(store: Store, fleet: Fleet) -> None:
    # chat-0: 90 ok, 5 refused by vLLM (4xx: an answer, not a server error), 5 server errors;
    # chat-1: 100 ok; GET /v1/models polls are not requests for service; batch is elsewhere.
    http(fleet, "chat-0", {"2xx": 90, "4xx": 5, "5xx": 5})
    http(fleet, "chat-1", {"2xx": 100})
    http(fleet, "chat-0", {"2xx": 1000}, handler="/v1/models", method="GET")
    http(fleet, "batch-0", {"5xx": 50}, pool="batch")
    fleet.up("chat-0", value=0.0)  # scrapes are not requests
    fleet.flush()
    result = error_ratio(spec("availability", objective=0.995), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(5 / 200, rel=1e-12)
    assert result.total == pytest.approx(200 * 20, rel=1e-12)


def test_availability_reads_ungrouped_statuses(store: Store, fleet: Fleet) -> None:
    # should_group_status_codes=False: 200, 500 and 503 apart; 5.. matches both 5xx.
    http(fleet, "chat-0", {"200": 90, "500": 6, "503": 4})
    fleet.flush()
    result = error_ratio(spec("availability"), EmbeddedSource(store), AT, 300)
    assert result.error_ratio == pytest.approx(10 / 100, rel=1e-12)


def test_availability_without_a_5xx_series_is_zero(store: Store, fleet: Fleet) -> None:
    http(fleet, "chat-0", {"2xx": 10})  # vLLM creates the 5xx series at the first 5xx
    fleet.flush()
    assert error_ratio(spec("availability"), EmbeddedSource(store), AT, 300).error_ratio == 0.0


def test_availability_without_request_data_is_none_not_scrapes(
    store: Store, fleet: Fleet
) -> None:
    fleet.up("chat-0", value=0.0)
    fleet.requests(vllm_labels("chat-0"), {"stop": 10})
    fleet.flush()
    result = error_ratio(spec("availability"), EmbeddedSource(store), AT, 300)
    assert (result.error_ratio, result.reason) == (None, REASON_NO_REQUEST_DATA)


def test_availability_with_no_post_in_the_window_is_none(store: Store, fleet: Fleet) -> None:
    http(fleet, "chat-0", {"2xx": 0})
    fleet.flush()
    result = error_ratio(spec("availability"), EmbeddedSource(store), AT, 300)
    assert (result.error_ratio, result.reason) == (None, REASON_NO_REQUESTS)


def _answer(i: int, status: int, error_class: str = "", *, error: bool = False,
            endpoint: str = "chat") -> RequestRecord:
    return RequestRecord(f"a{i}", AT - i, "chat", MODEL, endpoint, 100, 10, 0.1, 1.0,
                         error, error_class=error_class, status=status)


def test_availability_from_the_gateway_records_counts_every_server_failure(
    store: Store, fleet: Fleet
) -> None:
    log = _Log([
        _answer(1, 200), _answer(2, 200), _answer(3, 200, endpoint="completions"),
        _answer(4, 400, "bad_request"),  # an answer: the client's fault
        _answer(5, 429, "rejected"),  # shed with Retry-After: an answer, not a 5xx
        _answer(6, 502, "upstream_5xx", error=True),  # connection refused or reset
        _answer(7, 504, "timeout", error=True),
        _answer(8, 503, "rejected"),  # no healthy replica
        _answer(9, 200, "upstream_5xx", error=True),  # a stream that broke after its 200
        _answer(10, 200, "client_cancel"),  # left before the answer: neither
    ])
    http(fleet, "chat-0", {"2xx": 100})  # the records win where they exist
    fleet.flush()
    src = EmbeddedSource(store)
    result = error_ratio(spec("availability"), src, AT, 300, request_log=log)
    assert (result.error_ratio, result.total) == (4 / 9, 9.0)
    chat = error_ratio(spec("availability", endpoint="chat"), src, AT, 300, request_log=log)
    assert (chat.error_ratio, chat.total) == (4 / 8, 8.0)
    # Records of another pool only: vLLM's counters answer.
    other = _Log([RequestRecord("b", AT - 1, "batch", MODEL, "chat", 1, 1, status=500)])
    assert error_ratio(spec("availability"), src, AT, 300, request_log=other).error_ratio == 0.0


def test_replica_up_with_a_replica_down_half_the_window(store: Store, fleet: Fleet) -> None:
    fleet.up("chat-0")
    # chat-1 is down for the last 300 s of the 600 s window: 20 of its 40 samples are 0.
    last = fleet.steps - 1
    fleet.up("chat-1", value=lambda i: 0.0 if i > last - 20 else 1.0)
    fleet.gauge("up", target_labels("chat-0-gpu", kind="dcgm"), 0.0)  # not a vLLM target
    fleet.up("other-0", pool="batch", value=0.0)
    fleet.flush()
    result = error_ratio(spec("replica_up", objective=0.995), EmbeddedSource(store), AT, 600)
    assert result.error_ratio == pytest.approx(0.25, rel=1e-12)
    assert result.total is None
    log = _Log([_answer(1, 200)])
    per_endpoint = error_ratio(spec("replica_up", endpoint="chat"), EmbeddedSource(store), AT,
                               600, request_log=log)
    assert (per_endpoint.error_ratio, per_endpoint.reason) == (None, REASON_ENDPOINT_REPLICA_UP)


@pytest.mark.parametrize("indicator,threshold", [
    ("ttft", 0.8), ("e2e", 8.0), ("error_rate", None), ("replica_up", None)])
def test_every_indicator_is_none_without_data(
    store: Store, indicator: str, threshold: float | None
) -> None:
    result = error_ratio(spec(indicator, threshold), EmbeddedSource(store), AT, 300)
    assert result.error_ratio is None
    assert result.reason == REASON_NO_DATA
    empty = error_ratio(spec("availability"), EmbeddedSource(store), AT, 300)
    assert (empty.error_ratio, empty.reason) == (None, REASON_NO_REQUEST_DATA)


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
