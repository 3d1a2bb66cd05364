"""A client that leaves cancels its upstream request at once, streaming or not, before or after
the first token: the simulator's ``vllm:num_requests_running`` drops to 0 long before the request
could have finished, and the record says what was produced until then."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import httpx
import pytest
from support.gateway import (
    MODEL,
    GatewayHandle,
    gateway_config,
    running_gateway,
    wait_until,
)

from collector.exposition import parse
from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.planning.replica.profiles import get_profile

CHAT = "/v1/chat/completions"
#: Prefill of 400 prompt tokens/s: a 1,600-token prompt spends 4 s before its first token.
#: (Last in this file: the aborted prefill step still occupies the simulated GPU until it ends.)
SLOW_PREFILL = dataclasses.replace(get_profile("small"), prefill_tokens_per_s=400.0)
#: A generation that would take 2000 steps of at least 15 ms: 30 s or more.
LONG = {"max_tokens": 2000, "ignore_eos": True}
#: Safety deadline for the cancellation to show: far below the request's own duration.
DEADLINE = 10.0


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetHandle]:
    with running_fleet(1, profile=SLOW_PREFILL, scheduling_policy="priority") as f:
        yield f


@pytest.fixture(scope="module")
def gw(fleet: FleetHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    cfg = gateway_config(tmp_path_factory.mktemp("cancel"), fleet.base_urls)
    with running_gateway(cfg) as handle:
        yield handle


def _in_flight(fleet: FleetHandle) -> tuple[float, float]:
    s = sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)
    return total(s, "vllm:num_requests_running"), total(s, "vllm:num_requests_waiting")


@pytest.fixture(autouse=True)
def _idle_fleet(fleet: FleetHandle) -> None:
    wait_until(lambda: _in_flight(fleet) == (0, 0), timeout=DEADLINE, what="an idle fleet")


def _cancellations(gw: GatewayHandle, phase: str) -> float:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    fam = {f.name: f for f in parse(text)}.get("vigil_gateway_cancellations")
    if fam is None:
        return 0.0
    return sum(s.value for s in fam.samples
               if s.name.endswith("_total") and s.labels["phase"] == phase)


def _body(prompt: str, stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "stream": stream, **LONG}


def test_streaming_cancel_after_first_token_counts_tokens(gw: GatewayHandle,
                                                          fleet: FleetHandle) -> None:
    stream = gw.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a long story"}], stream=True,
        max_tokens=2000, extra_body={"ignore_eos": True})
    request_id = stream.response.headers["x-vigil-request-id"]
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 5:
            break
    assert _in_flight(fleet)[0] == 1
    stream.close()
    wait_until(lambda: _in_flight(fleet) == (0, 0), timeout=DEADLINE,
               what="the upstream request aborted")
    rec = gw.record(request_id)
    assert (rec.status, rec.error_class) == (499, "client_cancel")
    assert rec.ttft_s is not None
    # Usage never came: the streamed content chunks are counted (at least what we read).
    assert rec.tokens_source == "chunks" and rec.completion_tokens >= 5
    assert rec.completion_tokens < 2000


def test_non_streaming_cancel(gw: GatewayHandle, fleet: FleetHandle) -> None:
    errors: list[BaseException] = []

    def client() -> None:
        # The client gives up after 1.5 s of silence; the answer would take 30 s or more.
        with gw.http() as c:
            try:
                c.post(CHAT, json=_body("a long answer", False),
                       timeout=httpx.Timeout(10, read=1.5))
            except httpx.ReadTimeout as exc:
                errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    wait_until(lambda: _in_flight(fleet)[0] == 1, timeout=DEADLINE, what="the request running")
    thread.join(DEADLINE)
    assert errors and isinstance(errors[0], httpx.ReadTimeout)
    wait_until(lambda: _in_flight(fleet) == (0, 0), timeout=DEADLINE,
               what="the upstream request aborted")
    gw.gateway.records.flush()
    rec = wait_until(lambda: [r for r in gw.all_records()
                              if r.status == 499 and not r.stream], what="the record")[-1]
    assert (rec.error_class, rec.replica, rec.tokens_source) == (
        "client_cancel", "chat-0", "unknown")
    assert rec.cost_usd is not None and rec.cost_usd > 0


def test_streaming_cancel_before_first_token(gw: GatewayHandle, fleet: FleetHandle) -> None:
    before = _cancellations(gw, "before_first_token")
    prompt = "tell me about prefill " * 300  # ~1,650 tokens: ~4 s of prefill
    with gw.http() as c, c.stream("POST", CHAT, json=_body(prompt, True)) as r:
        assert r.status_code == 200
        request_id = r.headers["x-vigil-request-id"]
        wait_until(lambda: _in_flight(fleet)[0] == 1, timeout=DEADLINE, what="prefill")
        # leaving the block closes the connection while vLLM is still in prefill
    wait_until(lambda: _in_flight(fleet) == (0, 0), timeout=DEADLINE,
               what="the upstream request aborted")
    rec = gw.record(request_id)
    assert (rec.status, rec.error_class, rec.error) == (499, "client_cancel", False)
    assert rec.ttft_s is None and rec.completion_tokens == 0
    assert rec.cost_usd is not None and rec.cost_usd > 0  # the prefill was GPU time
    assert _cancellations(gw, "before_first_token") == before + 1
