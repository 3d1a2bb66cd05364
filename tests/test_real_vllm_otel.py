"""One trace from the client through the gateway into real vLLM: the gateway's GenAI span
(``[gateway.otel]``) and vLLM's own ``llm_request`` span, both received by an OTLP/HTTP endpoint
on loopback, share the trace, and vLLM's span is the gateway span's child.

A vLLM server of its own, started with ``--otlp-traces-endpoint`` (``[pools.vllm]
otlp_traces_endpoint``, through ``vigil vllm-args``) and stopped at the module's end; its tokens
agree with the gateway's span attributes.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gateway import STANDARD, GatewayHandle, gateway_config, running_gateway
from support.loopback import wait_for
from support.otlp import OtlpReceiver, Span, otlp_receiver
from support.real_vllm import FLEET, MODEL, PROFILE

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

CLIENT_SPAN = "b7ad6b7169203331"
NAME = "otel"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[GatewayHandle, OtlpReceiver]]:
    with otlp_receiver() as receiver:
        server = FLEET.server(NAME, cpu_bind="0", **PROFILE,
                              otlp_traces_endpoint=receiver.url + "/v1/traces")
        try:
            folder = tmp_path_factory.mktemp("otel-real-vllm")
            cfg = gateway_config(folder, [server.url], model=MODEL, gateway={"otel": {
                "enabled": True, "endpoint": receiver.url, "export_interval": "1h"}})
            with running_gateway(cfg) as gw:
                yield gw, receiver
        finally:
            FLEET.stop(NAME)


def _pair(receiver: OtlpReceiver, request_id: str) -> tuple[Span, Span]:
    (ours,) = [s for s in receiver.spans_named("chat ")
               if s.attributes.get("vigil.request.id") == request_id]

    def theirs() -> Span | None:
        found = [s for s in receiver.spans_named("llm_request")
                 if s.trace_id == ours.trace_id]
        return found[0] if found else None

    # vLLM's BatchSpanProcessor exports every 5 s.
    engine = wait_for("vLLM's llm_request span", theirs, 60, interval_s=0.5)
    return ours, engine


@pytest.mark.parametrize("stream", [False, True])
def test_vllms_span_joins_the_gateways_trace(traced: tuple[GatewayHandle, OtlpReceiver],
                                             stream: bool) -> None:
    gw, receiver = traced
    trace_id = secrets.token_hex(16)  # a trace of its own per request
    client = gw.client(STANDARD, timeout=120.0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "say something"}], max_tokens=10,
        stream=stream, extra_body={"ignore_eos": True},
        extra_headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"},
        **({"stream_options": {"include_usage": True}} if stream else {}))
    if stream:
        list(raw.parse())
    else:
        raw.parse()
    request_id = raw.headers["x-vigil-request-id"]
    record = gw.record(request_id)
    otel = gw.gateway.otel
    assert otel is not None and otel.force_flush(10.0)
    ours, engine = _pair(receiver, request_id)
    # One trace: the client's, continued by the gateway, continued by vLLM.
    assert ours.trace_id == engine.trace_id == trace_id
    assert ours.parent_span_id == CLIENT_SPAN
    assert engine.parent_span_id == ours.span_id
    # vLLM's span nests in the gateway's, and says what the gateway recorded.
    assert ours.start_ns <= engine.start_ns and engine.end_ns <= ours.end_ns + 50_000_000
    assert engine.attributes["gen_ai.usage.completion_tokens"] == record.completion_tokens == 10
    assert engine.attributes["gen_ai.usage.prompt_tokens"] == record.prompt_tokens
    assert ours.attributes["gen_ai.usage.output_tokens"] == 10
    assert ours.attributes["vigil.replica"] == record.replica
    # The engine's own latency breakdown comes with it: its TTFT is within the gateway's.
    engine_ttft = engine.attributes.get("gen_ai.latency.time_to_first_token")
    assert engine_ttft is not None and engine_ttft > 0
    if stream:
        assert record.ttft_s is not None and engine_ttft <= record.ttft_s


def test_the_launch_profile_gives_vllm_the_flag(tmp_path: Path) -> None:
    server = FLEET.servers.get(NAME)
    assert server is not None, "the module's server is running"
    argv = server.argv
    assert argv[argv.index("--otlp-traces-endpoint") + 1].endswith("/v1/traces")
