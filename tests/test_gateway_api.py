"""The OpenAI surface through the gateway, with the official client, against the simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from support.gateway import (
    MODEL,
    PREMIUM,
    STANDARD,
    GatewayHandle,
    gateway_config,
    running_gateway,
    wait_until,
)

from collector.exposition import parse
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.sources.protocol import RequestLog
from slo.sources.request_log import GatewayRecords

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What does a KV cache hold?"}]


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(2, scheduling_policy="priority") as f:
        yield f


@pytest.fixture(scope="module")
def gw(fleet: FleetHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    cfg = gateway_config(tmp_path_factory.mktemp("api"), fleet.base_urls)
    with running_gateway(cfg) as handle:
        yield handle


def _sim_samples(fleet: FleetHandle) -> dict:
    out: dict = {}
    for url in fleet.metrics_urls:
        for key, value in sample_values(httpx.get(url, timeout=10).text).items():
            out[key] = out.get(key, 0.0) + value
    return out


def test_chat_non_streaming_with_the_official_client(gw: GatewayHandle) -> None:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=24)
    out = raw.parse()
    assert out.object == "chat.completion" and out.choices[0].message.content
    assert out.usage is not None and out.usage.completion_tokens <= 24
    assert raw.headers["x-vigil-max-tokens"] == "24; decision=client"
    assert raw.headers["x-vigil-replica"] in ("chat-0", "chat-1")
    rec = gw.record(raw.headers["x-vigil-request-id"])
    assert (rec.status, rec.endpoint, rec.tenant, rec.tier, rec.stream) == (
        200, "chat", "acme", "standard", False)
    assert rec.prompt_tokens == out.usage.prompt_tokens
    assert rec.completion_tokens == out.usage.completion_tokens
    assert rec.tokens_source == "usage" and rec.upstream_id == out.id
    assert rec.ttft_s is None and rec.e2e_s is not None and rec.e2e_s > 0
    assert rec.cost_usd is not None and rec.cost_usd > 0
    assert (rec.max_tokens, rec.max_tokens_decision, rec.requested_max_tokens) == (
        24, "client", 24)


def test_chat_streaming_chunk_by_chunk_without_usage(gw: GatewayHandle) -> None:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, stream=True,
        extra_body={"ignore_eos": True})
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for: gone
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    rec = gw.record(raw.headers["x-vigil-request-id"])
    assert rec.completion_tokens == 16 and rec.tokens_source == "usage"
    assert rec.ttft_s is not None and 0 < rec.ttft_s <= rec.e2e_s


def test_streaming_usage_chunk_kept_when_asked(gw: GatewayHandle) -> None:
    stream = gw.client().completions.create(model=MODEL, prompt="Say something", max_tokens=7,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7


def test_sse_events_arrive_as_vllm_sent_them(gw: GatewayHandle) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "stream": True,
            "ignore_eos": True}
    with gw.http() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.read().split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    parsed = [json.loads(e[len(b"data: "):]) for e in events[:-1]]
    assert [p["object"] for p in parsed] == ["chat.completion.chunk"] * len(parsed)
    assert "token_ids" in parsed[1]["choices"][0]  # vLLM's own keys, untouched


def test_completions_and_default_max_tokens(gw: GatewayHandle) -> None:
    raw = gw.client().completions.with_raw_response.create(model=MODEL, prompt="Once upon")
    assert raw.headers["x-vigil-max-tokens"] == "512; decision=default"
    assert raw.parse().object == "text_completion"


def test_default_max_tokens_visible_in_vllm_histogram(gw: GatewayHandle,
                                                      fleet: FleetHandle) -> None:
    name = "vllm:request_params_max_tokens"
    before = _sim_samples(fleet)
    out = gw.client().chat.completions.create(model=MODEL, messages=MESSAGES)
    assert out.choices[0].finish_reason in ("stop", "length")

    def observed() -> bool:
        now = _sim_samples(fleet)
        return total(now, f"{name}_count") == total(before, f"{name}_count") + 1

    wait_until(observed, what="the request in vLLM's histogram")
    after = _sim_samples(fleet)
    assert total(after, f"{name}_sum") - total(before, f"{name}_sum") == 512
    # 512 lands in the bucket le=1000 and not in le=500 (vLLM buckets 1, 2, 5, 10, ...).
    grew = {dict(k[1])["le"] for k, v in after.items()
            if k[0] == f"{name}_bucket" and v > before.get(k, 0.0)}
    assert "500.0" not in grew and "1000.0" in grew


def test_models_lists_the_pools_models(gw: GatewayHandle) -> None:
    models = gw.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    with gw.http(key=None) as c:
        assert c.get("/v1/models").status_code == 401


def test_embeddings_passthrough(gw: GatewayHandle) -> None:
    client = gw.client()
    out = client.embeddings.create(model=MODEL, input=["first text", "second text"])
    assert [d.index for d in out.data] == [0, 1]
    assert len(out.data[0].embedding) == 384
    again = client.embeddings.create(model=MODEL, input="first text", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(out.data[0].embedding, abs=1e-6)
    records = [r for r in gw.all_records() if r.endpoint == "embeddings"]
    assert records and records[0].prompt_tokens > 0 and records[0].max_tokens is None


def test_metrics_and_health(gw: GatewayHandle) -> None:
    raw = gw.client(PREMIUM).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, stream=True)
    assert len(list(raw.parse())) >= 3
    gw.record(raw.headers["x-vigil-request-id"])  # the stream is accounted once it closed
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    families = {f.name: f for f in parse(text)}
    ttft = families["vigil_gateway_time_to_first_token_seconds"]
    les = {s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")}
    assert {"0.8", "8.0"} <= les
    e2e = families["vigil_gateway_e2e_request_latency_seconds"]
    assert {"0.8", "8.0"} <= {s.labels["le"] for s in e2e.samples if s.name.endswith("_bucket")}
    requests = families["vigil_gateway_requests"]
    premium = [s for s in requests.samples if s.labels.get("tier") == "premium"
               and s.labels["status"] == "200" and s.name.endswith("_total")]
    assert premium and premium[0].value >= 1
    tokens = {s.labels["type"] for s in families["vigil_gateway_tokens"].samples}
    assert tokens == {"prompt", "completion"}
    up = [s.value for s in families["vigil_gateway_replica_up"].samples]
    assert up == [1.0, 1.0]
    assert "vigil_gateway_queue_depth" in families
    health = httpx.get(f"{gw.url}/health", timeout=10).json()
    assert health["pools"]["chat"]["healthy_replicas"] == 2


def test_requests_spread_over_replicas(gw: GatewayHandle) -> None:
    client = gw.client()
    seen = {client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=1).headers["x-vigil-replica"]
        for _ in range(6)}
    assert seen == {"chat-0", "chat-1"}


def test_records_feed_the_slo_engine(gw: GatewayHandle) -> None:
    gw.client(STANDARD).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    gw.gateway.records.flush()
    reader = GatewayRecords(gw.cfg.gateway_records_path())
    assert isinstance(reader, RequestLog)
    rows = list(reader.records("chat", 4e9, 4e9))
    assert rows and all(r.pool == "chat" for r in rows)
    assert any(r.endpoint == "chat" and r.tier == "standard" and not r.error for r in rows)
    assert list(reader.records("other-pool", 4e9, 4e9)) == []


def test_wrong_key_is_401_for_the_official_client(gw: GatewayHandle) -> None:
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-wrong").chat.completions.create(model=MODEL, messages=MESSAGES)
