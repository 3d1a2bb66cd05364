"""The semantic cache inside the gateway: hits answered without the GPU (streaming or not),
marked with ``X-Vigil-Cache``, recorded with cost 0 and the cost they saved; bypasses and
other tenants go upstream. Embeddings come from the simulator's ``/v1/embeddings`` (the cache's
remote embedder): exact repeats are what these tests need; paraphrases are the cache's own
tests (tests/test_cache_*.py, real all-MiniLM-L6-v2)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from support.gateway import (
    MODEL,
    OTHER,
    STANDARD,
    GatewayHandle,
    gateway_config,
    running_gateway,
)

from collector.exposition import parse
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, scheduling_policy="priority") as f:
        yield f


@pytest.fixture
def gw(fleet: FleetHandle, tmp_path) -> Iterator[GatewayHandle]:
    cfg = gateway_config(tmp_path, fleet.base_urls, gateway={"cache": {
        "enabled": True, "embeddings": fleet.base_urls[0], "embedding_model": MODEL}})
    with running_gateway(cfg) as handle:
        yield handle


def _served(fleet: FleetHandle) -> float:
    """Requests the simulated replica finished."""
    return total(sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text),
                 "vllm:request_success_total")


def _drain(gw: GatewayHandle) -> None:
    gw.call(gw.gateway.cache.drain)


def _stores(gw: GatewayHandle) -> int:
    return int(gw.gateway.cache._cache.stats().stores)


def _wait_stored(gw: GatewayHandle, before: int, timeout: float = 10.0) -> None:
    """Wait until the cache stored one more answer: a stream's store starts after its last
    chunk went out, so the client may be done before the gateway has begun storing."""
    deadline = time.monotonic() + timeout
    while _stores(gw) <= before:
        assert time.monotonic() < deadline, "the streamed answer was never stored"
        _drain(gw)
        time.sleep(0.01)


def test_repeat_is_answered_from_the_cache(gw: GatewayHandle, fleet: FleetHandle) -> None:
    client = gw.client(STANDARD)
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    assert first.headers["x-vigil-cache"] == "miss"
    _drain(gw)
    served = _served(fleet)
    again = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    assert again.headers["x-vigil-cache"] == "hit-l1"
    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert again.parse().id != first.parse().id
    assert _served(fleet) == served  # no GPU work
    miss = gw.record(first.headers["x-vigil-request-id"])
    hit = gw.record(again.headers["x-vigil-request-id"])
    assert miss.cache_hit == "" and miss.cost_usd is not None and miss.cost_usd > 0
    assert (hit.cache_hit, hit.cost_usd, hit.replica) == ("l1", 0.0, "")
    assert hit.saved_usd == pytest.approx(miss.cost_usd)
    assert hit.completion_tokens == miss.completion_tokens and hit.status == 200


def test_hit_streams_back_to_a_streaming_client(gw: GatewayHandle) -> None:
    client = gw.client(STANDARD)
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                           max_tokens=9)
    _drain(gw)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=9, stream=True,
        stream_options={"include_usage": True})
    assert raw.headers["x-vigil-cache"] == "hit-l1"
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage is not None
    assert gw.record(raw.headers["x-vigil-request-id"]).ttft_s is not None


def test_a_streamed_answer_is_stored_too(gw: GatewayHandle) -> None:
    client = gw.client(STANDARD)
    question = [{"role": "user", "content": "Name three prime numbers."}]
    before = _stores(gw)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=question, temperature=0, max_tokens=7, stream=True) if c.choices)
    _wait_stored(gw, before)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=question, temperature=0, max_tokens=7)
    assert raw.headers["x-vigil-cache"] == "hit-l1"
    assert raw.parse().choices[0].message.content == streamed


def test_other_tenant_sampling_and_personal_requests_go_upstream(gw: GatewayHandle) -> None:
    gw.client(STANDARD).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                                max_tokens=5)
    _drain(gw)
    other = gw.client(OTHER).chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=5)
    assert other.headers["x-vigil-cache"] == "miss"  # another tenant's partition
    sampled = gw.client(STANDARD).chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0.7, max_tokens=5)
    assert sampled.headers["x-vigil-cache"] == "bypass"
    personal = gw.client(STANDARD).chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=5, user="u-42")
    assert personal.headers["x-vigil-cache"] == "bypass"
    opted_out = gw.client(STANDARD).chat.completions.with_raw_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=5,
        extra_headers={"X-Vigil-Cache": "off"})
    assert opted_out.headers["x-vigil-cache"] == "bypass"
    metrics = {f.name: f for f in parse(httpx.get(f"{gw.url}/metrics").text)}
    results = {s.labels["result"]: s.value for s in metrics["vigil_gateway_cache_lookups"].samples
               if s.name.endswith("_total")}
    assert results == {"miss": 2.0, "bypass": 3.0}
    lookups = metrics["vigil_gateway_cache_lookup_seconds"]
    assert [s.value for s in lookups.samples if s.name.endswith("_count")] == [2.0]


def test_no_header_when_the_cache_is_off(fleet: FleetHandle, tmp_path) -> None:
    with running_gateway(gateway_config(tmp_path, fleet.base_urls)) as gw:
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=2)
        names = {f.name for f in parse(httpx.get(f"{gw.url}/metrics").text)}
    assert "x-vigil-cache" not in raw.headers
    assert not {"vigil_gateway_cache_entries", "vigil_gateway_cache_shared_entries"} & names


def test_an_answer_stored_by_one_gateway_is_a_hit_on_another(fleet: FleetHandle,
                                                              tmp_path) -> None:
    # Two instances on one database; only the explicit syncs below read it.
    cfg = gateway_config(tmp_path, fleet.base_urls, gateway={"cache": {
        "enabled": True, "embeddings": fleet.base_urls[0], "embedding_model": MODEL,
        "sync_interval": "1h"}})
    with running_gateway(cfg) as a, running_gateway(cfg) as b:
        first = a.client(STANDARD).chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=11)
        assert first.headers["x-vigil-cache"] == "miss"
        _drain(a)
        a.call(a.gateway.cache._cache.sync_now)
        b.call(b.gateway.cache._cache.sync_now)
        served = _served(fleet)
        again = b.client(STANDARD).chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=11)
        assert again.headers["x-vigil-cache"] == "hit-l1"
        assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
        assert _served(fleet) == served  # no GPU work
        hit = b.record(again.headers["x-vigil-request-id"])
        assert (hit.cache_hit, hit.cost_usd, hit.replica) == ("l1", 0.0, "")
        assert hit.saved_usd is None  # what it cost is known on A only
        # Each instance says on /metrics what it shared: A wrote its answer, B applied it.
        for gw, outcome in ((a, "written"), (b, "applied")):
            samples = sample_values(httpx.get(f"{gw.url}/metrics").text)
            assert total(samples, "vigil_gateway_cache_shared_entries_total",
                         outcome=outcome) == 1.0, (gw.url, outcome)
            assert total(samples, "vigil_gateway_cache_shared_entries_total",
                         outcome="rejected") == 0.0
            assert total(samples, "vigil_gateway_cache_entries") == 1.0
