"""``[gateway.otel]``: the gateway's GenAI spans and metrics sent to a real OpenTelemetry
collector on loopback (rotel, from PyPI), which passes them on to an OTLP/HTTP endpoint that
decodes them with OpenTelemetry's own protobuf classes: names, units, bucket boundaries,
attributes and span names are checked on what the collector passed on. W3C trace context is
sent to the replica, and taken from the client. (vLLM's own span joining the trace is
``tests/test_real_vllm_otel.py``.)"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.gateway import (
    MODEL,
    STANDARD,
    GatewayHandle,
    gateway_config,
    running_gateway,
    scripted_upstream,
)
from support.loopback import LoopbackServer, wait_for
from support.otlp import OtlpReceiver, Point, Span, otlp_receiver, rotel_collector

from serving.gateway.upstream.http_client import ReplicaConnections
from serving.sim.testing import FleetHandle, running_fleet
from vigil.config import parse_config
from vigil.conventions import (
    OTEL_REQUEST_DURATION_BUCKETS,
    OTEL_TOKEN_BUCKETS,
    OTEL_TPOT_BUCKETS,
    OTEL_TTFT_BUCKETS,
)
from vigil.errors import ConfigError

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1) as f:
        yield f


@pytest.fixture
def traced(fleet: FleetHandle, tmp_path: Path) -> Iterator[tuple[GatewayHandle, OtlpReceiver]]:
    with otlp_receiver() as receiver, rotel_collector(receiver, tmp_path) as collector:
        cfg = gateway_config(tmp_path, fleet.base_urls, gateway={"otel": {
            "enabled": True, "endpoint": collector, "export_interval": "1h",
            "service_name": "gw-test"}})
        with running_gateway(cfg) as gw:
            yield gw, receiver


def _flush(gw: GatewayHandle) -> None:
    otel = gw.gateway.otel
    assert otel is not None
    assert otel.force_flush(10.0)


def _span(receiver: OtlpReceiver, request_id: str) -> Span:
    """The span of the request ``request_id``, once the collector passed it on."""
    def found() -> Span | None:
        spans = [s for s in receiver.spans
                 if s.attributes.get("vigil.request.id") == request_id]
        return spans[0] if spans else None
    return wait_for(f"the span of {request_id}", found, 30)


def _points(receiver: OtlpReceiver, metric: str, count: int) -> list[Point]:
    """The latest points of ``metric`` once they count ``count`` observations in all."""
    def enough() -> list[Point] | None:
        points = receiver.latest_points(metric)
        return points if sum(p.count for p in points) >= count else None

    return wait_for(f"{count} observations of {metric}", enough, 30)


def _chat(gw: GatewayHandle, **kw: Any) -> Any:
    return gw.client(STANDARD).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=8,
        **kw)


def test_a_span_per_request_named_and_attributed_as_the_conventions_say(
        traced: tuple[GatewayHandle, OtlpReceiver]) -> None:
    gw, receiver = traced
    unary = _chat(gw)
    streamed = _chat(gw, stream=True, stream_options={"include_usage": True})
    chunks = list(streamed.parse())
    _flush(gw)
    one = _span(receiver, unary.headers["x-vigil-request-id"])
    record = gw.record(unary.headers["x-vigil-request-id"])
    assert one.name == f"chat {MODEL}"
    assert one.kind == 2  # SERVER
    assert one.resource["service.name"] == "gw-test"
    a = one.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.request.stream"] is False
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        record.prompt_tokens, record.completion_tokens)
    assert a["gen_ai.response.id"] == unary.parse().id
    assert (a["vigil.pool"], a["vigil.tier"], a["vigil.replica"]) == (
        "chat", "standard", record.replica)
    assert a["http.response.status_code"] == 200 and "error.type" not in a
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", gw.cfg.gateway.port)
    assert one.status == 0 and one.end_ns > one.start_ns
    two = _span(receiver, streamed.headers["x-vigil-request-id"])
    assert two.attributes["gen_ai.request.stream"] is True
    assert two.attributes["gen_ai.usage.output_tokens"] == chunks[-1].usage.completion_tokens


def test_the_client_trace_is_continued_and_the_replica_gets_the_gateways_span(
        traced: tuple[GatewayHandle, OtlpReceiver], fleet: FleetHandle) -> None:
    gw, receiver = traced
    reply = _chat(gw, extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    _flush(gw)
    span = _span(receiver, reply.headers["x-vigil-request-id"])
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PARENT_ID)


def test_refusals_and_failures_carry_error_type(
        traced: tuple[GatewayHandle, OtlpReceiver]) -> None:
    gw, receiver = traced
    bad = gw.http(STANDARD).post("/v1/chat/completions", json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 404
    _flush(gw)
    span = _span(receiver, bad.headers["x-vigil-request-id"])
    assert span.name == "chat no-such-model"
    assert span.attributes["error.type"] == "bad_request"
    assert span.attributes["http.response.status_code"] == 404
    assert span.status == 0  # a client's error is not the server's


def test_an_upstream_failure_is_an_error_span_and_an_errored_duration(tmp_path: Path) -> None:
    with (otlp_receiver() as receiver, rotel_collector(receiver, tmp_path) as collector,
          scripted_upstream() as upstream):
        upstream.mode = "error_500"
        cfg = gateway_config(tmp_path, [upstream.url], gateway={"otel": {
            "enabled": True, "endpoint": collector, "export_interval": "1h"}})
        with running_gateway(cfg) as gw:
            failed = gw.http(STANDARD).post(
                "/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "x"}]})
            assert failed.status_code == 500, failed.text
            record = gw.record(failed.headers["x-vigil-request-id"])
            _flush(gw)
            span = _span(receiver, record.id)
            (point,) = _points(receiver, "gen_ai.server.request.duration", 1)
        assert span.status == 2  # ERROR
        assert span.attributes["error.type"] == record.error_class == "upstream_5xx"
        assert point.attributes["error.type"] == "upstream_5xx" and point.count == 1
        assert not receiver.latest_points("gen_ai.server.time_to_first_token")


def test_genai_metrics_with_the_advised_buckets_and_units(
        traced: tuple[GatewayHandle, OtlpReceiver]) -> None:
    gw, receiver = traced
    ids = []
    for _ in range(3):
        r = _chat(gw, stream=True, stream_options={"include_usage": True})
        list(r.parse())
        ids.append(r.headers["x-vigil-request-id"])
    ids.append(_chat(gw).headers["x-vigil-request-id"])
    _flush(gw)
    records = [gw.record(i) for i in ids]
    expected = {
        "gen_ai.server.request.duration": (OTEL_REQUEST_DURATION_BUCKETS, "s",
                                           [r.e2e_s for r in records]),
        "gen_ai.server.time_to_first_token": (OTEL_TTFT_BUCKETS, "s",
                                              [r.ttft_s for r in records if r.stream]),
        "gen_ai.server.time_per_output_token": (OTEL_TPOT_BUCKETS, "s", [
            (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1) for r in records
            if r.stream and r.completion_tokens > 1]),
    }
    for metric, (bounds, unit, values) in expected.items():
        (point,) = _points(receiver, metric, len(values))
        assert point.unit == unit and point.bounds == tuple(float(b) for b in bounds), metric
        assert point.count == len(values), metric
        assert math.isclose(point.sum, math.fsum(values), rel_tol=1e-9), metric
        assert point.attributes["gen_ai.operation.name"] == "chat"
        assert point.attributes["gen_ai.provider.name"] == "vllm"
        assert point.attributes["gen_ai.request.model"] == MODEL
        assert point.attributes["vigil.tier"] == "standard"
    usage = {p.attributes["gen_ai.token.type"]: p
             for p in _points(receiver, "gen_ai.client.token.usage", 2 * len(records))}
    assert usage["input"].unit == "{token}"
    assert usage["input"].bounds == tuple(float(b) for b in OTEL_TOKEN_BUCKETS)
    assert usage["input"].sum == sum(r.prompt_tokens for r in records)
    assert usage["output"].sum == sum(r.completion_tokens for r in records)


def test_an_unreachable_collector_costs_the_requests_nothing(
        fleet: FleetHandle, tmp_path: Path) -> None:
    with LoopbackServer() as dead:
        url = dead.url
    cfg = gateway_config(tmp_path, fleet.base_urls, gateway={"otel": {
        "enabled": True, "endpoint": url, "export_interval": "0.2s"}})
    with running_gateway(cfg) as gw:
        for _ in range(5):
            assert _chat(gw).status_code == 200


def test_off_by_default_and_checked_when_on(fleet: FleetHandle, tmp_path: Path) -> None:
    cfg = gateway_config(tmp_path, fleet.base_urls)
    with running_gateway(cfg) as gw:
        assert gw.gateway.otel is None
        assert _chat(gw).status_code == 200
    with pytest.raises(ConfigError, match="needs an endpoint"):
        parse_config({"gateway": {"otel": {"enabled": True}}})
    with pytest.raises(ConfigError, match=r"gateway\.otel\.endpoint"):
        parse_config({"gateway": {"otel": {"enabled": True, "endpoint": "localhost:4318"}}})
    with pytest.raises(ConfigError, match=r"gateway\.otel\.colour"):
        parse_config({"gateway": {"otel": {"colour": "red"}}})


def test_trace_headers_go_on_the_request_to_the_replica() -> None:
    line = f"traceparent: 00-{TRACE_ID}-{PARENT_ID}-01\r\n".encode()

    async def send_two(url: str) -> None:
        conns = ReplicaConnections(url, connect_timeout=2, read_timeout=5, keepalive=5,
                                   headers={"authorization": "Bearer k"})
        for extra in (line, b""):
            response = await conns.post("/v1/chat/completions", b"{}", extra=extra)
            await response.read_all(1 << 20)
            response.close()

    with LoopbackServer() as upstream:
        asyncio.run(send_two(upstream.url))
        wait_for("both requests", lambda: len(upstream.recorded()) == 2, 5)
        first, second = upstream.recorded()
    assert first.headers["traceparent"] == f"00-{TRACE_ID}-{PARENT_ID}-01"
    assert first.headers["authorization"] == "Bearer k"
    assert "traceparent" not in second.headers
    assert first.body == second.body == b"{}"
