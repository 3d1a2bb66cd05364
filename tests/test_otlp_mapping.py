"""Request spans to request records (``serving.otlp``): what a vLLM ``llm_request`` span, a
LiteLLM ``litellm_request`` span and an Envoy AI Gateway ``chat <model>`` span each give, how
a request's spans are joined, and what is refused. The attribute sets are the sources' own
(docs/otlp.md cites where each comes from)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from serving.otlp.join import Joiner
from serving.otlp.mapping import Part, Placer, Rejected, merge, part_of
from serving.otlp.spans import ENGINE, ROUTER, RequestSpan, kind_of, request_spans
from vigil.config import Config, parse_config

CONFIG = """
[[pools]]
name = "chat"
model = "meta-llama/Llama-3.1-8B-Instruct"

[[pools]]
name = "batch"
model = "Qwen/Qwen2.5-7B-Instruct"

[[pools]]
name = "batch-b"
model = "Qwen/Qwen2.5-7B-Instruct"

[[targets]]
name = "chat-0"
url = "http://10.0.0.5:8000/metrics"
pool = "chat"
"""
T0 = 1_790_000_000_000_000_000  # ns
TRACE = "0af7651916cd43dd8448eb211c80319c"


def _config(**otlp: Any) -> Config:
    data = tomllib.loads(CONFIG)
    if otlp:
        data["otlp"] = otlp
    return parse_config(data, file="vigil.toml")


def _span(name: str, attributes: dict[str, Any], *, span_id: str = "b7ad6b7169203331",
          parent: str = "", kind: int = 2, start_ms: int = 0, end_ms: int = 1500,
          status: int = 0, trace: str = TRACE) -> RequestSpan:
    return RequestSpan(trace, span_id, parent, name, kind, T0 + start_ms * 1_000_000,
                       T0 + end_ms * 1_000_000, status, "", attributes)


def _vllm(request_id: str = "chatcmpl-abc", **extra: Any) -> RequestSpan:
    """vLLM 0.32's llm_request: no model, no server, the engine's own figures (seconds)."""
    attributes = {"gen_ai.request.id": request_id, "gen_ai.usage.prompt_tokens": 812,
                  "gen_ai.usage.completion_tokens": 129,
                  "gen_ai.latency.time_to_first_token": 0.125,
                  "gen_ai.latency.time_in_queue": 0.02, "gen_ai.latency.e2e": 1.4,
                  "vigil.pool": "chat", **extra}
    return _span("llm_request", attributes, span_id=extra.pop("span_id", "1111111111111111"),
                 start_ms=50, end_ms=1450)


def _litellm(response_id: str = "chatcmpl-abc", **extra: Any) -> RequestSpan:
    attributes = {"gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
                  "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
                  "gen_ai.system": "hosted_vllm", "gen_ai.usage.input_tokens": 812,
                  "gen_ai.usage.output_tokens": 129, "gen_ai.response.id": response_id,
                  "llm.is_streaming": "True", "metadata.user_api_key_alias": "team-a-key",
                  "metadata.user_api_key_hash": "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778"
                  "539800c9f1243fe6b4b", **extra}
    return _span("litellm_request", attributes, span_id="2222222222222222", kind=1,
                 start_ms=0, end_ms=1500)


def test_each_source_is_recognised_and_others_are_skipped() -> None:
    assert kind_of(_vllm()) == ENGINE
    assert kind_of(_litellm()) == ROUTER
    envoy = _span("chat llama", {"gen_ai.operation.name": "chat"}, kind=3)
    assert kind_of(envoy) == ROUTER
    assert kind_of(_span("POST /v1/chat/completions", {"http.route": "/v1"})) is None
    assert kind_of(_span("Overall Loading", {"code.function": "load"})) is None
    assert part_of(_span("postgres", {"db.system": "postgresql"}), Placer(_config())) is None


def test_vllm_alone_is_a_record_with_the_engines_figures() -> None:
    part = part_of(_vllm(), Placer(_config()))
    assert isinstance(part, Part)
    record = merge([part])
    assert record.id == "otlp-chatcmpl-abc"
    assert (record.pool, record.prompt_tokens, record.completion_tokens) == ("chat", 812, 129)
    assert (record.ttft_s, record.queue_s, record.e2e_s) == (0.125, 0.02, 1.4)
    assert record.tokens_source == "usage" and record.status == 200 and not record.error
    assert record.upstream_id == "chatcmpl-abc"


def test_router_and_engine_spans_of_one_request_are_one_record() -> None:
    """LiteLLM's span (tenant, key, what the client waited) and vLLM's (tokens, TTFT, queue)
    joined by the request id, whichever arrives first."""
    placer = Placer(_config())
    for order in ((_vllm(), _litellm()), (_litellm(), _vllm())):
        joiner = Joiner(15.0)
        for i, span in enumerate(order):
            part = part_of(span, placer)
            assert isinstance(part, Part)
            assert joiner.add(part, now=100.0 + i) == []
        assert joiner.due(now=114.0) == []
        (record,) = joiner.due(now=115.0)
        assert joiner.joined == 1 and len(joiner) == 0
        assert record.tenant == "team-a-key" and record.key_id.startswith("88dc28")
        assert (record.prompt_tokens, record.ttft_s, record.queue_s) == (812, 0.125, 0.02)
        assert record.e2e_s == pytest.approx(1.5)  # the router's span: what its client waited
        assert record.stream and record.model == "meta-llama/Llama-3.1-8B-Instruct"
        assert record.id == "otlp-chatcmpl-abc"


def test_an_engine_span_joins_the_gateway_span_it_is_the_child_of() -> None:
    """Envoy AI Gateway injects its span as vLLM's parent: same trace, no shared id."""
    placer = Placer(_config())
    gateway = _span("chat llama", {"gen_ai.operation.name": "chat",
                                   "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
                                   "gen_ai.usage.input_tokens": 10,
                                   "gen_ai.usage.output_tokens": 5},
                    span_id="3333333333333333", kind=3)
    engine = _vllm(request_id="")
    engine = replace(engine, span_id="4444444444444444", parent_id="3333333333333333")
    joiner = Joiner(5.0)
    for span in (engine, gateway):
        part = part_of(span, placer)
        assert isinstance(part, Part)
        joiner.add(part, now=0.0)
    (record,) = joiner.due(now=5.0)
    assert record.prompt_tokens == 812  # the engine's own count
    assert record.id == f"otlp-{TRACE}-3333333333333333"


def test_a_repeat_or_a_late_span_is_counted_not_written_twice() -> None:
    placer = Placer(_config())
    joiner = Joiner(10.0)
    part = part_of(_vllm(), placer)
    assert isinstance(part, Part)
    joiner.add(part, now=0.0)
    joiner.add(part, now=1.0)  # the collector retried the batch
    assert joiner.late == 1
    assert len(joiner.due(now=10.0)) == 1
    late = part_of(_litellm(), placer)
    assert isinstance(late, Part)
    assert joiner.add(late, now=12.0) == [] and joiner.late == 2
    assert joiner.due(now=30.0) == []


@pytest.mark.parametrize(("span", "reason"), [
    (_span("chat x", {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}),
     "no model"),
    (_span("chat x", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-9"}),
     "no pool"),
    (_span("chat x", {"gen_ai.operation.name": "chat",
                      "gen_ai.request.model": "Qwen/Qwen2.5-7B-Instruct"}), "ambiguous model"),
    (_vllm(**{"vigil.pool": "nowhere"}), "unknown pool"),
    (_vllm(**{"gen_ai.latency.time_in_queue": -0.5}), "negative duration"),
    (_vllm(**{"gen_ai.usage.prompt_tokens": 12.5}), "bad token count"),
    (_vllm(**{"gen_ai.usage.completion_tokens": "many"}), "bad token count"),
    (_span("llm_request", {"gen_ai.latency.e2e": 1.0, "vigil.pool": "chat"}, start_ms=10,
           end_ms=5), "negative duration"),
])
def test_bad_spans_are_refused_with_a_reason(span: RequestSpan, reason: str) -> None:
    got = part_of(span, Placer(_config()))
    assert isinstance(got, Rejected) and got.reason == reason, got


def test_the_engine_address_places_the_span_and_names_the_replica() -> None:
    span = _span("chat m", {"gen_ai.operation.name": "chat", "server.address": "10.0.0.5",
                            "server.port": 8000, "gen_ai.request.model": "other"})
    part = part_of(span, Placer(_config()))
    assert isinstance(part, Part) and (part.pool, part.replica) == ("chat", "chat-0")


def test_pools_behind_vigils_gateway_are_left_to_it() -> None:
    got = part_of(_vllm(), Placer(_config(pools=["batch"])))
    assert isinstance(got, Rejected) and got.reason == "pool not read from spans"


def test_errors_are_the_servers_and_a_4xx_is_the_clients() -> None:
    placer = Placer(_config())
    timed_out = replace(_litellm(**{"error.type": "APITimeoutError"}), status=2,
                        status_message="timed out")
    failed = part_of(timed_out, placer)
    assert isinstance(failed, Part)
    assert failed.error and failed.error_class == "timeout" and failed.status == 500
    limited = part_of(_litellm(**{"http.response.status_code": 429}), placer)
    assert isinstance(limited, Part)
    assert not limited.error and limited.status == 429 and limited.error_class == "rejected"


def test_an_export_is_flattened_with_resource_attributes_under_the_spans() -> None:
    def kv(key: str, value: Any) -> KeyValue:
        v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(
            string_value=value)
        return KeyValue(key=key, value=v)

    span = Span(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex("1111111111111111"),
                name="llm_request", kind=2, start_time_unix_nano=T0,
                end_time_unix_nano=T0 + 10**9, status=Status(code=0),
                attributes=[kv("gen_ai.usage.prompt_tokens", 7), kv("vigil.pool", "batch")])
    export = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource={"attributes": [kv("vigil.pool", "chat"), kv("service.name", "vllm")]},
        scope_spans=[ScopeSpans(spans=[span])])])
    (flat,) = request_spans(export)
    assert flat.trace_id == TRACE and flat.parent_id == ""
    assert flat.attributes["vigil.pool"] == "batch"  # the span's own wins
    assert flat.attributes["service.name"] == "vllm"
    assert kind_of(flat) == ENGINE


def test_a_request_vigils_gateway_sent_is_left_to_its_record() -> None:
    """The gateway sends its request id as X-Request-Id; vLLM answers ``chatcmpl-vgl-...``
    and names its span so: the gateway's record is the request's, the span is not counted
    again (and not reported to the sender as refused)."""
    got = part_of(_vllm(request_id="chatcmpl-vgl-5f0c29d1e8aa4e2b9d0c3b1a2f4e6d70"),
                  Placer(_config()))
    assert isinstance(got, Rejected) and got.reason == "through Vigil's gateway"
    assert not got.refused


def test_an_engine_span_naming_nothing_is_placed_by_the_host_it_came_from() -> None:
    """vLLM 0.32's span names no pool, model or server; it is exported from the engine's
    own host, the one target at 10.0.0.5."""
    bare = _span("llm_request", {"gen_ai.latency.e2e": 1.0, "gen_ai.usage.prompt_tokens": 3})
    placer = Placer(_config())
    refused = part_of(bare, placer)
    assert isinstance(refused, Rejected) and refused.reason == "no model"
    part = part_of(bare, placer, peer="10.0.0.5")
    assert isinstance(part, Part) and (part.pool, part.replica) == ("chat", "chat-0")
    assert isinstance(part_of(bare, placer, peer="10.0.0.9"), Rejected)


def test_the_gateways_own_span_is_left_to_its_record() -> None:
    """[gateway.otel] exports the gateway's GenAI span (``vigil.request.id``): even one
    without a response id (a refusal, a cache hit) is the gateway's record already."""
    span = _span("chat llama", {"gen_ai.operation.name": "chat", "vigil.pool": "chat",
                                "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct",
                                "vigil.request.id": "vgl-00ff"}, kind=2)
    got = part_of(span, Placer(_config()))
    assert isinstance(got, Rejected) and got.reason == "through Vigil's gateway"
    assert not got.refused


def test_a_discovered_target_places_spans_once_known() -> None:
    """`vigil serve` hands the receiver its collector's targets, discovered ones included:
    a replica discovery adds is known to the placer from its next reading."""
    from vigil.config import TargetConfig

    now: list[TargetConfig] = []
    placer = Placer(_config(), targets=lambda: now)
    span = _span("chat m", {"gen_ai.operation.name": "chat", "server.address": "10.1.2.3",
                            "server.port": 8000})
    assert isinstance(part_of(span, placer), Rejected)
    now.append(TargetConfig(name="pod-7", url="http://10.1.2.3:8000/metrics", pool="batch"))
    placer._read_at = float("-inf")  # the next reading is due (it is paced to once a second)
    part = part_of(span, placer)
    assert isinstance(part, Part) and (part.pool, part.replica) == ("batch", "pod-7")


def test_cached_prompt_tokens_are_kept_when_a_span_says() -> None:
    """The GenAI conventions' ``gen_ai.usage.cache_read.input_tokens`` (Envoy AI Gateway,
    LiteLLM's semconv mode) is the record's ``cached_tokens``; none said is None."""
    placer = Placer(_config())
    part = part_of(_litellm(**{"gen_ai.usage.cache_read.input_tokens": 640}), placer)
    assert isinstance(part, Part)
    assert merge([part]).cached_tokens == 640
    plain = part_of(_vllm(), placer)
    assert isinstance(plain, Part) and merge([plain]).cached_tokens is None
    bad = part_of(_litellm(**{"gen_ai.usage.cache_read.input_tokens": -3}), placer)
    assert isinstance(bad, Rejected) and bad.reason == "bad token count"
