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

import httpx
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
    # The gateway's request id went to vLLM as X-Request-Id: vLLM's span and its response id
    # carry it, so Vigil's OTLP receiver knows the gateway recorded this request.
    assert engine.attributes["gen_ai.request.id"] == record.upstream_id
    assert record.upstream_id.endswith(request_id)
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


def test_vigils_receiver_records_each_direct_request_once(
        traced: tuple[GatewayHandle, OtlpReceiver], tmp_path: Path) -> None:
    """vLLM's own spans through Vigil's OTLP receiver (``serving.otlp``, over HTTP on
    loopback): a request sent to vLLM directly is one record, with vLLM's own token counts
    and times; the requests the gateway sent (its ``X-Request-Id`` made them
    ``chatcmpl-vgl-...``) are the gateway's records and are not counted again. vLLM 0.32's
    span names no pool: the receiver places it by the host it came from, the one target there.
    """
    from serving.otlp.receiver import OtlpReceiver as VigilReceiver
    from slo.sources.request_log import GatewayRecords
    from vigil.clock import ManualClock
    from vigil.config import parse_config

    _, receiver = traced
    server = FLEET.servers[NAME]
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "count to seven"}],
        "max_tokens": 7, "ignore_eos": True}).json()
    rid, usage = answer["id"], answer["usage"]
    wait_for("vLLM's span of the direct request", lambda: [
        s for s in receiver.spans_named("llm_request")
        if s.attributes.get("gen_ai.request.id") == rid], 60, interval_s=0.5)
    config = parse_config({
        "pools": [{"name": "chat", "model": MODEL}],
        "targets": [{"name": "r0", "url": server.url + "/metrics", "pool": "chat"}],
        "gateway": {"records_path": str(tmp_path / "records.db")},
        "otlp": {"join_window": "2s"}})
    clock = ManualClock()
    ours = VigilReceiver(config, clock=clock, tick_interval=None)
    ours.start()
    try:
        host, port = ours.serve_http("127.0.0.1", 0)
        with receiver.lock:
            bodies = list(receiver.trace_bodies)
        for body in bodies:  # as vLLM sent them, to Vigil's receiver this time
            reply = httpx.post(f"http://{host}:{port}/v1/traces", content=body, timeout=10,
                               headers={"Content-Type": "application/x-protobuf"})
            assert reply.status_code == 200, reply.text
        clock.advance(3.0)
        ours.tick()
        assert ours.flush(10.0)
        counts = ours.counts()
    finally:
        ours.close()
    with GatewayRecords(tmp_path / "records.db") as records:
        rows = records.rows(None, clock() + 1e9, 2e9)
    direct = [r for r in rows if r.upstream_id == rid]
    assert len(direct) == 1, rows
    (row,) = direct
    assert (row.pool, row.replica) == ("chat", "r0")
    assert (row.prompt_tokens, row.completion_tokens) == (usage["prompt_tokens"],
                                                          usage["completion_tokens"])
    assert row.completion_tokens == 7 and row.e2e_s is not None and row.e2e_s > 0
    assert row.ttft_s is not None and 0 < row.ttft_s <= row.e2e_s
    # The requests the gateway sent are left to its records: vLLM's spans of them, and the
    # gateway's own GenAI spans (their response id is vLLM's, ``chatcmpl-vgl-...``).
    ids = [str(s.attributes.get("gen_ai.request.id") or s.attributes.get("gen_ai.response.id")
               or "") for s in receiver.spans_named("")]
    engine_ids = [str(s.attributes.get("gen_ai.request.id", ""))
                  for s in receiver.spans_named("llm_request")]
    assert [i for i in engine_ids if i.startswith("chatcmpl-vgl-")], "the gateway reached vLLM"
    gateway = [i for i in ids if i.startswith("chatcmpl-vgl-")]
    assert counts["elsewhere"] == {"through Vigil's gateway": len(gateway)}
    assert all(not r.upstream_id.startswith("chatcmpl-vgl-") for r in rows)
    assert counts["spans"]["rejected"] == 0, counts
