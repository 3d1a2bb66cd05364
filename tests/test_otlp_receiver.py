"""The OTLP/HTTP receiver (``serving.otlp.receiver``): spans sent by OpenTelemetry's own SDK and
exporter, shaped like vLLM's, LiteLLM's and Envoy AI Gateway's, become the request records that
``slo.sources.request_log`` reads; OTLP/JSON and gzip by hand; bad spans and bad bodies are
refused the way the OTLP specification says, and every span is counted. Time is a
``ManualClock``: the join window passes when a test moves it."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from support.loopback import wait_for
from support.otlp import T0_NS, json_export, json_span, rotel_collector

from serving.otlp.receiver import JSON, PROTOBUF, OtlpCollector, OtlpReceiver
from slo.sources.open import request_log
from vigil.clock import ManualClock
from vigil.config import Config, parse_config
from vigil.storage.gateway_records import GatewayRecord

MODEL = "llama-8b"
WINDOW_S = 15.0
TENANTS = ["metadata.user_api_key_alias", "litellm.metadata.user_api_key_alias", "user.id",
           "enduser.id", "tenant.id"]


def make_config(tmp_path: Path, **otlp: Any) -> Config:
    return parse_config({
        "pools": [{"name": "chat", "model": MODEL}, {"name": "code", "model": "qwen-coder"}],
        "targets": [{"name": "chat-0", "url": "http://10.0.0.5:8000/metrics", "pool": "chat"},
                    {"name": "code-0", "url": "http://10.0.0.6:8000/metrics", "pool": "code"}],
        "gateway": {"records_path": str(tmp_path / "records.db")},
        "otlp": {"join_window": WINDOW_S, "tenant_attributes": TENANTS, **otlp},
    })


class Harness:
    """A started receiver on a loopback port, its clock and its config."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = ManualClock(T0_NS * 1e-9)
        self.receiver = OtlpReceiver(config, clock=self.clock, tick_interval=None)
        self.receiver.start()
        host, port = self.receiver.serve_http("127.0.0.1", 0)
        self.url = f"http://{host}:{port}/v1/traces"

    def records(self) -> list[GatewayRecord]:
        """Every record, once the join window passed and the writer wrote what it released."""
        self.clock.advance(WINDOW_S + 1)
        self.receiver.tick()
        assert self.receiver.flush()
        log = request_log(self.config)
        assert log is not None
        return log.rows(None, self.clock() + 1e6, 1e10)  # type: ignore[attr-defined,no-any-return]

    def post(self, body: bytes, ctype: str = PROTOBUF, **headers: str) -> httpx.Response:
        return httpx.post(self.url, content=body, headers={"Content-Type": ctype, **headers})


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(make_config(tmp_path))
    yield h
    h.receiver.close()


def accounted(receiver: OtlpReceiver, sent: int) -> dict[str, int]:
    """The spans by outcome, after checking that they add up to what was sent."""
    spans: dict[str, int] = receiver.counts()["spans"]
    assert sum(spans.values()) == sent, spans
    return spans


# --- span makers, shaped like each source (docs/otlp.md has where each attribute comes from) -
def provider(exporter: Any, **resource: Any) -> TracerProvider:
    p = TracerProvider(resource=Resource.create(resource))
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p


def to(url: str, compression: Compression = Compression.NoCompression) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=url, compression=compression)


def vllm_span(tracer: trace.Tracer, request_id: str, start_ns: int, *, prompt: int = 812,
              completion: int = 256, ttft: float = 0.183, queue: float = 0.0125,
              e2e: float = 4.25, parent: trace.Span | None = None, **extra: Any) -> None:
    """vLLM 0.32's ``llm_request``: SERVER, the engine's own counts and times (seconds)."""
    span = tracer.start_span(
        "llm_request", kind=SpanKind.SERVER, start_time=start_ns,
        context=trace.set_span_in_context(parent) if parent is not None else None,
        attributes={"gen_ai.request.id": request_id, "gen_ai.usage.prompt_tokens": prompt,
                    "gen_ai.usage.completion_tokens": completion,
                    "gen_ai.latency.time_to_first_token": ttft,
                    "gen_ai.latency.time_in_queue": queue, "gen_ai.latency.e2e": e2e,
                    "gen_ai.request.max_tokens": 1024, **extra})
    span.end(end_time=start_ns + int(e2e * 1e9))


def litellm_spans(tracer: trace.Tracer, response_id: str, start_ns: int, end_ns: int,
                  **extra: Any) -> None:
    """LiteLLM's proxy span (not a request) and its ``litellm_request`` child (legacy otel)."""
    proxy = tracer.start_span("Received Proxy Server Request", kind=SpanKind.SERVER,
                              start_time=start_ns - 2_000_000)
    span = tracer.start_span(
        "litellm_request", start_time=start_ns, context=trace.set_span_in_context(proxy),
        attributes={"gen_ai.request.model": MODEL, "gen_ai.response.model": MODEL,
                    "gen_ai.system": "hosted_vllm", "gen_ai.usage.input_tokens": 99,
                    "gen_ai.usage.output_tokens": 98, "gen_ai.usage.total_tokens": 197,
                    "gen_ai.response.id": response_id, "litellm.call_id": "9d1c-uuid",
                    "llm.request.type": "acompletion", "llm.is_streaming": "True",
                    "metadata.user_api_key_alias": "acme",
                    "metadata.user_api_key_hash": "88dc28d0f030c55ed4ab77ed8faf098196cb1c05",
                    "metadata.user_api_key_team_id": "", **extra})
    span.end(end_time=end_ns)
    proxy.set_attribute("http.response.status_code", 200)
    proxy.end(end_time=end_ns + 1_000_000)


def encoded(spans: Sequence[ReadableSpan]) -> bytes:
    """Spans as the SDK's OTLP exporter puts them on the wire (protobuf)."""
    return bytes(encode_spans(spans).SerializeToString())


def recorded_spans(make: Any, **resource: Any) -> list[ReadableSpan]:
    """The spans ``make(tracer)`` emits, kept in memory instead of sent."""
    memory = InMemorySpanExporter()
    p = provider(memory, **resource)
    make(p.get_tracer("test"))
    p.shutdown()
    return list(memory.get_finished_spans())


# --- records from the real SDK over HTTP ---------------------------------------------------
def test_vllm_and_litellm_spans_make_one_record(harness: Harness) -> None:
    rid = "chatcmpl-6f1e0c2a9b"
    router_start, router_end = T0_NS, T0_NS + 4_500_000_000
    engine = provider(to(harness.url), **{"service.name": "vllm", "server.address": "10.0.0.5",
                                          "server.port": 8000})
    router = provider(to(harness.url), **{"service.name": "litellm"})
    # LiteLLM does not pass its own span to vLLM: two traces, joined on the request id.
    vllm_span(engine.get_tracer("vllm.tracing.otel"), rid, T0_NS + 100_000_000)
    litellm_spans(router.get_tracer("litellm"), rid, router_start, router_end)
    engine.shutdown()
    router.shutdown()

    (rec,) = harness.records()
    assert rec == GatewayRecord(
        id=f"otlp-{rid}", start_s=router_start * 1e-9, ts_s=router_end * 1e-9, pool="chat",
        model=MODEL, endpoint="chat", tenant="acme", tier="",
        key_id="88dc28d0f030c55ed4ab77ed8faf098196cb1c05", replica="chat-0", status=200,
        stream=True, prompt_tokens=812, completion_tokens=256, tokens_source="usage",
        ttft_s=0.183, e2e_s=router_end * 1e-9 - router_start * 1e-9, queue_s=0.0125,
        error=False, error_class="", cache_hit="", requested_max_tokens=None, max_tokens=None,
        max_tokens_decision="", cost_usd=None, saved_usd=None, upstream_id=rid, batch_id="",
        message="")
    spans = accounted(harness.receiver, 3)
    assert (spans["recorded"], spans["not_request"]) == (2, 1)
    assert harness.receiver.counts()["written"] == 1


def test_envoy_span_and_its_vllm_child_join_gzipped(harness: Harness) -> None:
    """AI Gateway's ``chat <model>`` CLIENT span is the parent of vLLM's (it injects its own
    context upstream); no request id on the gateway's span: joined by the parent link."""
    gateway = provider(to(harness.url, Compression.Gzip), **{"service.name": "ai-gateway"})
    engine = provider(to(harness.url, Compression.Gzip),
                      **{"service.name": "vllm", "vigil.pool": "chat"})
    span = gateway.get_tracer("envoyproxy/ai-gateway").start_span(
        f"chat {MODEL}", kind=SpanKind.CLIENT, start_time=T0_NS,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL,
                    "gen_ai.response.model": MODEL, "gen_ai.provider.name": "openai",
                    "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 7,
                    "tenant.id": "globex"})
    vllm_span(engine.get_tracer("vllm"), "chatcmpl-env-1", T0_NS + 3_000_000, prompt=41,
              completion=8, e2e=0.9, parent=span)
    span.end(end_time=T0_NS + 1_000_000_000)
    gateway.shutdown()
    engine.shutdown()

    (rec,) = harness.records()
    assert (rec.id, rec.pool, rec.tenant, rec.replica) == ("otlp-chatcmpl-env-1", "chat",
                                                           "globex", "")
    assert (rec.prompt_tokens, rec.completion_tokens) == (41, 8)  # the engine's count
    assert rec.e2e_s == (T0_NS + 1_000_000_000) * 1e-9 - T0_NS * 1e-9  # what the client waited
    assert (rec.stream, rec.error, rec.status) == (False, False, 200)
    assert harness.receiver.counts()["joined"] == 1
    assert accounted(harness.receiver, 2)["recorded"] == 2


def test_engine_before_router_and_a_batch_sent_twice_make_one_record(
        harness: Harness) -> None:
    rid = "chatcmpl-twice"
    engine = recorded_spans(lambda t: vllm_span(t, rid, T0_NS + 50_000_000),
                            **{"vigil.pool": "chat"})
    router = recorded_spans(lambda t: litellm_spans(t, rid, T0_NS, T0_NS + 5_000_000_000))
    for body in (encoded(engine), encoded(router), encoded(router), encoded(engine)):
        assert harness.post(body).status_code == 200
    (rec,) = harness.records()
    assert (rec.id, rec.tenant, rec.prompt_tokens, rec.completion_tokens) == (
        f"otlp-{rid}", "acme", 812, 256)
    # After the record was written, both again in one export (two encoded exports one after
    # the other are one export to protobuf): late, and still one record.
    assert harness.post(encoded(engine) + encoded(router)).status_code == 200
    assert [r.id for r in harness.records()] == [f"otlp-{rid}"]
    spans = accounted(harness.receiver, 9)
    assert (spans["recorded"], spans["late"], spans["not_request"]) == (2, 4, 3)


def test_requests_under_one_client_span_stay_apart(harness: Harness) -> None:
    """An agent's calls through LiteLLM with ``forward_traceparent_to_llm_provider``: each
    vLLM span is the child of the client's one span, and each is its own request."""
    def agent(t: trace.Tracer) -> None:
        root = t.start_span("invoke_agent planner", start_time=T0_NS)
        for i in range(3):
            vllm_span(t, f"chatcmpl-step-{i}", T0_NS + i * 1_000_000_000, parent=root)
        root.end(end_time=T0_NS + 5_000_000_000)

    spans = recorded_spans(agent, **{"vigil.pool": "chat"})
    assert harness.post(encoded(spans[:2])).status_code == 200
    assert len(harness.records()) == 2
    # The third arrives after the first two were written: not a late span of theirs.
    assert harness.post(encoded(spans[2:])).status_code == 200
    ids = sorted(r.id for r in harness.records())
    assert ids == [f"otlp-chatcmpl-step-{i}" for i in range(3)]
    counted = accounted(harness.receiver, 4)
    assert (counted["recorded"], counted["not_request"]) == (3, 1)


# --- OTLP/JSON by hand -------------------------------------------------------------------
def test_otlp_json_by_hand_with_a_partial_success(harness: Harness) -> None:
    good = json_span("EEE19B7EC3C1B174", {
        "gen_ai.request.id": "chatcmpl-json", "gen_ai.usage.prompt_tokens": 20,
        "gen_ai.usage.completion_tokens": 5, "gen_ai.latency.e2e": 2.0,
        "gen_ai.latency.time_to_first_token": 0.25})
    bad = json_span("EEE19B7EC3C1B175", {"gen_ai.request.id": "chatcmpl-bad",
                                         "gen_ai.usage.prompt_tokens": "lots",
                                         "gen_ai.latency.e2e": 1.0})
    body = json_export(good, bad, resource={"vigil.pool": "code"})
    r = harness.post(gzip.compress(body), JSON, **{"Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-type"] == JSON
    partial = r.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"  # int64: a string in OTLP/JSON
    assert "1 bad token count" in partial["errorMessage"]
    assert "eee19b7ec3c1b175" in partial["errorMessage"]
    (rec,) = harness.records()
    assert (rec.id, rec.pool, rec.model, rec.prompt_tokens, rec.ttft_s, rec.e2e_s) == (
        "otlp-chatcmpl-json", "code", "", 20, 0.25, 2.0)
    assert accounted(harness.receiver, 2) == {"recorded": 1, "not_request": 0, "rejected": 1,
                                              "late": 0, "throttled": 0, "elsewhere": 0}


# --- refused spans -------------------------------------------------------------------------
def test_bad_spans_are_rejected_counted_and_reported(harness: Harness) -> None:
    def router(span_id: str, **attrs: Any) -> dict[str, Any]:
        return json_span(span_id, {"gen_ai.operation.name": "chat",
                                   "gen_ai.usage.input_tokens": 3, **attrs},
                         name="chat", kind=3)

    spans = [
        router("0000000000000001"),  # no model, no pool, no server
        router("0000000000000002", **{"gen_ai.request.model": "mystery",
                                      "server.address": "10.9.9.9", "server.port": 8000}),
        router("0000000000000003", **{"gen_ai.request.model": MODEL}),
        router("0000000000000004", **{"gen_ai.request.model": MODEL,
                                      "gen_ai.response.time_to_first_chunk": -0.5}),
        router("0000000000000005", **{"gen_ai.request.model": MODEL,
                                      "gen_ai.usage.output_tokens": 2.5}),
        router("0000000000000006", **{"gen_ai.request.model": MODEL, "vigil.pool": "nope"}),
        json_span("0000000000000007", {"http.route": "/health"}, name="GET /health"),
    ]
    spans[2]["endTimeUnixNano"] = str(T0_NS - 1)  # ends before it starts
    r = harness.post(json_export(*spans), JSON)
    assert r.status_code == 200
    partial = r.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "6"
    for reason in ("no model", "no pool", "negative duration", "bad token count",
                   "unknown pool"):
        assert reason in partial["errorMessage"]
    counts = harness.receiver.counts()
    assert counts["rejected"] == {"no model": 1, "no pool": 1, "negative duration": 2,
                                  "bad token count": 1, "unknown pool": 1}
    assert accounted(harness.receiver, 7) == {"recorded": 0, "not_request": 1, "rejected": 6,
                                              "late": 0, "throttled": 0, "elsewhere": 0}
    assert harness.records() == []


def test_rejections_are_logged_once_a_minute_with_ids_only(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    body = json_export(json_span("00000000000000aa", {"gen_ai.request.id": "chatcmpl-secret",
                                                      "gen_ai.usage.prompt_tokens": 1}))
    with caplog.at_level("WARNING", logger="vigil.otlp"):
        for _ in range(3):
            assert harness.post(body, JSON).status_code == 200
        harness.clock.advance(61)
        assert harness.post(body, JSON).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "vigil.otlp"]
    example = "(e.g. trace 5b8efff798038103d269b633813fc60c span 00000000000000aa)"
    # The first at once; the next two within the minute wait, and go with the fourth.
    assert lines == [f"refused 1 spans: no model {example}",
                     f"refused 3 spans: no model {example}"]


# --- refused bodies ------------------------------------------------------------------------
def test_bad_bodies(tmp_path: Path) -> None:
    h = Harness(make_config(tmp_path, max_body=4096))
    try:
        r = h.post(b"\xff\xff\xff not protobuf")
        assert r.status_code == 400 and r.headers["content-type"] == PROTOBUF
        status = Status()
        status.ParseFromString(r.content)
        assert "ExportTraceServiceRequest" in status.message
        r = h.post(b"{not json", JSON)
        assert r.status_code == 400 and "not JSON" in r.json()["message"]
        r = h.post(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "zz", "spanId": "01"}]}]}]}).encode(), JSON)
        assert r.status_code == 400 and "traceId" in r.json()["message"]
        r = h.post(json.dumps({"resourceSpans": "many"}).encode(), JSON)
        assert r.status_code == 400
        assert h.post(b"{}", "text/plain").status_code == 415
        assert h.post(b"{}", JSON, **{"Content-Encoding": "br"}).status_code == 415
        assert h.post(b"x" * 5000).status_code == 413  # refused before it is read
        bomb = gzip.compress(b"\0" * 1_000_000)  # small on the wire, 1 MB inflated
        assert len(bomb) < 4096
        assert h.post(bomb, **{"Content-Encoding": "gzip"}).status_code == 413
        assert h.post(gzip.compress(b"abc" * 100)[:20],
                      **{"Content-Encoding": "gzip"}).status_code == 400  # truncated
        empty = h.post(b"")  # an empty export is a success
        assert empty.status_code == 200
        assert not ExportTraceServiceResponse.FromString(empty.content).HasField(
            "partial_success")
        assert httpx.get(h.url).status_code == 404
        counts = h.receiver.counts()
        assert counts["exports"] == {400: 5, 415: 2, 413: 2, 200: 1}
        assert sum(counts["spans"].values()) == 0
    finally:
        h.receiver.close()


def test_a_full_buffer_answers_503_then_accepts_once_written(tmp_path: Path) -> None:
    h = Harness(make_config(tmp_path, max_buffer=100))
    try:
        def engines(first: int, n: int) -> bytes:
            return encoded(recorded_spans(
                lambda t: [vllm_span(t, f"chatcmpl-{first + i}", T0_NS) for i in range(n)],
                **{"vigil.pool": "chat"}))

        assert h.post(engines(0, 100)).status_code == 200  # held: waiting for other spans
        one = engines(100, 1)
        r = h.post(one)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "max_buffer" in Status.FromString(r.content).message
        assert h.receiver.counts()["spans"]["throttled"] == 1
        assert len(h.records()) == 100  # the window passed: written, the buffer empty again
        assert h.post(one).status_code == 200
        assert len(h.records()) == 101
        counts = h.receiver.counts()
        assert counts["exports"] == {200: 2, 503: 1}
        assert (counts["written"], counts["dropped"]) == (101, 0)
        assert accounted(h.receiver, 102)["recorded"] == 101
    finally:
        h.receiver.close()


def test_close_writes_what_is_held(tmp_path: Path) -> None:
    h = Harness(make_config(tmp_path))
    assert h.post(encoded(recorded_spans(lambda t: vllm_span(t, "chatcmpl-held", T0_NS),
                                         **{"vigil.pool": "chat"}))).status_code == 200
    assert h.receiver.counts()["held"] == 1
    assert h.receiver.close() == 0
    log = request_log(h.config)
    assert log is not None
    assert [r.id for r in log.rows(None, T0_NS * 1e-9 + 100, 1e4)] == [  # type: ignore[attr-defined]
        "otlp-chatcmpl-held"]


def test_counters_as_prometheus_series(harness: Harness) -> None:
    harness.post(json_export(json_span("00000000000000bb", {"gen_ai.usage.prompt_tokens": 1})),
                 JSON)
    families = {f.name: f for f in OtlpCollector(harness.receiver).collect()}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("vigil_otlp_spans_total", (("outcome", "rejected"),
                                               ("reason", "no model")))] == 1.0
    assert samples[("vigil_otlp_exports_total", (("code", "200"),))] == 1.0
    assert samples[("vigil_otlp_buffered_records", ())] == 0.0
    scraped = httpx.get(harness.url.replace("/v1/traces", "/metrics")).text
    assert 'vigil_otlp_spans_total{outcome="rejected",reason="no model"} 1.0' in scraped


def test_otlp_receive_command_is_registered() -> None:
    from vigil_shell.cli import build_parser

    args = build_parser("otlp").parse_args(
        ["otlp", "receive", "--config", "vigil.toml", "--listen", "127.0.0.1:4318"])
    assert (args.otlp_command, args.config, args.listen) == ("receive", "vigil.toml",
                                                             "127.0.0.1:4318")


# --- through a real collector --------------------------------------------------------------
class _Endpoint:
    """What ``rotel_collector`` forwards to: a base URL (it appends ``/v1/traces``)."""

    def __init__(self, url: str) -> None:
        self.url = url


def test_through_the_rotel_collector(harness: Harness, tmp_path: Path) -> None:

    base = harness.url.removesuffix("/v1/traces")
    with rotel_collector(_Endpoint(base), tmp_path) as collector:  # type: ignore[arg-type]
        engine = provider(to(f"{collector}/v1/traces"), **{"vigil.pool": "chat"})
        router = provider(to(f"{collector}/v1/traces"))
        vllm_span(engine.get_tracer("vllm"), "chatcmpl-rotel", T0_NS + 1_000_000)
        litellm_spans(router.get_tracer("litellm"), "chatcmpl-rotel", T0_NS,
                      T0_NS + 3_000_000_000)
        engine.shutdown()
        router.shutdown()
        wait_for("the collector's export", lambda: sum(
            harness.receiver.counts()["spans"].values()) == 3, 30)
    (rec,) = harness.records()
    assert (rec.id, rec.tenant, rec.prompt_tokens, rec.completion_tokens) == (
        "otlp-chatcmpl-rotel", "acme", 812, 256)


def test_a_request_vigils_gateway_recorded_is_counted_elsewhere(harness: Harness) -> None:
    """vLLM's span of a request Vigil's gateway sent (``chatcmpl-vgl-...``, its X-Request-Id)
    is the gateway's record already: counted as ``elsewhere``, not written, not refused."""
    engine = provider(to(harness.url), **{"vigil.pool": "chat"})
    vllm_span(engine.get_tracer("vllm.tracing.otel"),
              "chatcmpl-vgl-5f0c29d1e8aa4e2b9d0c3b1a2f4e6d70", T0_NS)
    engine.shutdown()
    assert harness.records() == []
    counts = harness.receiver.counts()
    assert counts["spans"]["elsewhere"] == 1 and counts["spans"]["rejected"] == 0
    assert counts["elsewhere"] == {"through Vigil's gateway": 1}
