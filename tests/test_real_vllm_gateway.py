"""The gateway in front of a real vLLM server: what it promises, measured by the engine.

The official ``openai`` client talks to a ``vigil gateway`` process whose pool is the session's
real vLLM server (``tests/support/real_vllm.py``: ``max_num_seqs`` 4, priority scheduling). Each
claim is read back from the engine's own ``/metrics``: the default max_tokens is what vLLM was asked
for, a client's cancel stops vLLM's generation, and under saturation vLLM's priority scheduler
serves premium requests before the batch ones that were already waiting.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.gateway import BATCH, PREMIUM, STANDARD
from support.loopback import wait_for
from support.real_vllm import MODEL, VllmServer, real_vllm  # noqa: F401
from support.shared_gateways import GatewayProcess, running_gateways, write_config

from serving.sim.testing import sample_values, total
from slo.sources.request_log import GatewayRecords
from vigil.conventions import HEADER_REQUEST_ID

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

#: Outputs of one engine step reach the gateway together, within this (seconds).
STEP_S = 0.05
#: [gateway] default_max_tokens in these tests: small, so a request without max_tokens is quick.
DEFAULT_MAX_TOKENS = 24


@dataclass
class Front:
    """A gateway process in front of the real server, and where its records are."""

    gateway: GatewayProcess
    server: VllmServer
    records: Path

    def engine(self, name: str, **labels: str) -> float:
        """The sum of the engine's samples named ``name`` with ``labels``, now."""
        return total(sample_values(self.server.metrics()), name, **labels)

    def rows(self) -> list:
        now = time.time()
        return GatewayRecords(self.records).rows(None, now + 1, 3600)


@pytest.fixture(scope="module")
def front(real_vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
          ) -> Iterator[Front]:
    folder = tmp_path_factory.mktemp("gateway-real-vllm")
    records = folder / "records.db"
    config = write_config(folder, records, [real_vllm.url], gateway={
        "default_max_tokens": DEFAULT_MAX_TOKENS,
        # Batch keys on the synchronous endpoints go straight to vLLM: the test is about
        # vLLM's own priority scheduling, not the gateway's headroom rule.
        "batch": {"headroom_kv_usage": 1.0, "headroom_queue_length": 1000}})
    with running_gateways(config, 1) as (gateway,):
        yield Front(gateway, real_vllm, records)


def _idle(front: Front) -> None:
    wait_for("the engine idle", lambda: front.engine("vllm:num_requests_running") == 0
             and front.engine("vllm:num_requests_waiting") == 0, timeout_s=120)


def test_streaming_and_non_streaming_with_the_official_client(front: Front) -> None:
    client = front.gateway.client(STANDARD, timeout=120.0)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "say something"}], max_tokens=12,
        extra_body={"ignore_eos": True})
    assert answer.model == MODEL
    assert answer.usage is not None and answer.usage.completion_tokens == 12
    assert answer.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "say something else"}],
        max_tokens=12, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    ids = {answer.id, chunks[0].id}
    rows = wait_for("both records", lambda: [r for r in front.rows() if r.upstream_id in ids]
                    if len([r for r in front.rows() if r.upstream_id in ids]) == 2 else None)
    for r in rows:
        assert (r.tier, r.status, r.completion_tokens, r.tokens_source) == (
            "standard", 200, 12, "usage"), r
    (streamed,) = [r for r in rows if r.stream]
    assert streamed.ttft_s is not None and 0 < streamed.ttft_s <= streamed.e2e_s


def test_the_default_max_tokens_is_what_vllm_was_asked_for(front: Front) -> None:
    _idle(front)
    before = front.engine("vllm:request_params_max_tokens_sum")
    client = front.gateway.client(STANDARD, timeout=120.0)
    answer = client.completions.create(model=MODEL, prompt="no limit given",
                                       extra_body={"ignore_eos": True})
    assert answer.usage is not None and answer.usage.completion_tokens == DEFAULT_MAX_TOKENS
    # vLLM's own record of the request's max_tokens parameter.
    assert front.engine("vllm:request_params_max_tokens_sum") - before == DEFAULT_MAX_TOKENS


def _stream_then_hang_up(port: int, body: dict, chunks: int) -> int:
    """POST a streamed request on a raw socket, read until ``chunks`` SSE events carried
    content, then close the socket (a FIN the gateway cannot miss); the events read."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + STANDARD.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        seen = b""
        while seen.count(b'"content":"') + seen.count(b'"content": "') < chunks:
            data = sock.recv(65536)
            assert data, f"the stream ended early: {seen[-300:]!r}"
            seen += data
        assert seen.startswith(b"HTTP/1.1 200"), seen[:200]
        return seen.count(b"data: ")


def test_a_client_cancel_stops_generation_in_the_engine(front: Front) -> None:
    _idle(front)
    asked = 1800
    generated_before = front.engine("vllm:generation_tokens_total")
    received = _stream_then_hang_up(front.gateway.port, {
        "model": MODEL, "messages": [{"role": "user", "content": "a long story, please"}],
        "max_tokens": asked, "stream": True, "ignore_eos": True}, chunks=5)
    closed_at = time.monotonic()  # the client went away mid-generation
    wait_for("the engine to drop the request",
             lambda: front.engine("vllm:num_requests_running") == 0, timeout_s=30,
             interval_s=0.01)
    stopped_after_s = time.monotonic() - closed_at
    settled = front.engine("vllm:generation_tokens_total")
    time.sleep(1.0)  # at ~100 tokens/s a running request would add ~100 tokens meanwhile
    generated = front.engine("vllm:generation_tokens_total") - generated_before
    assert front.engine("vllm:generation_tokens_total") == settled, "still generating"
    print(f"cancel: engine dropped the request {stopped_after_s * 1000:.0f} ms after the "
          f"client closed; {generated:.0f} of {asked} tokens generated, {received} events read")
    cancelled = wait_for("the cancel's record", lambda: [
        r for r in front.rows() if r.error_class == "client_cancel"])
    # Stopped well before the end. Usually ~0.1 s after the hang-up (a few tokens); seen once
    # at 1.9 s (390 tokens) with the machine's two cores shared by the engine, the gateway and
    # the client: the bound is the end of the generation, not a latency target.
    assert generated < asked / 2, (generated, front.gateway.log()[-3000:])
    # vLLM counts no aborted request as finished; the gateway records it as a cancel.
    assert cancelled[-1].status == 499


async def _stream_one(client: httpx.AsyncClient, key: str, max_tokens: int,
                      content: str) -> str:
    """One streamed chat completion through the gateway, read to the end; its request id."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            await r.aread()
            raise AssertionError(f"HTTP {r.status_code}: {r.text}")
        await r.aread()  # to the end: the request's record is written once it is complete
        return r.headers[HEADER_REQUEST_ID]


def test_premium_requests_overtake_waiting_batch_ones_in_vllms_queue(front: Front) -> None:
    _idle(front)
    seqs = 4  # tests/support/real_vllm.py PROFILE's max_num_seqs

    async def run() -> tuple[list[str], list[str], float]:
        async with httpx.AsyncClient(base_url=front.gateway.url, timeout=300.0) as client:
            # max_num_seqs 4: four batch requests run and eight wait in vLLM's queue. Two
            # waves waiting, not one: should the premium requests reach the gateway late (the
            # client, the gateway and the engine share two cores), the second still waits.
            batch = [asyncio.create_task(_stream_one(client, BATCH, 800, f"batch job {i}"))
                     for i in range(3 * seqs)]
            deadline = time.monotonic() + 120
            while total(sample_values((await client.get(f"{front.server.url}/metrics")).text),
                        "vllm:num_requests_waiting") < seqs:
                assert time.monotonic() < deadline, "no batch request waiting in vLLM's queue"
                assert not any(t.done() for t in batch), "a batch request ended early"
                await asyncio.sleep(0.05)
            sent = time.time()
            premium = [asyncio.create_task(_stream_one(client, PREMIUM, 16, f"premium {i}"))
                       for i in range(seqs)]
            return (list(await asyncio.gather(*batch)), list(await asyncio.gather(*premium)),
                    sent)

    batch_ids, premium_ids, sent = asyncio.run(run())
    # The records writer batches its writes: wait until every request of the test is stored.
    rows = wait_for("every record of the test", lambda: (
        found if set(batch_ids + premium_ids) <= set(found := {r.id: r for r in front.rows()})
        else None))
    first = {i: rows[i].start_s + rows[i].ttft_s for i in batch_ids + premium_ids}
    # The batch requests still without a token when the last premium request reached the
    # gateway: those waiting in vLLM's queue (all times by the gateway's clock; the client's
    # own loop may pass them on a little late, so its send time is not the arrival).
    arrived = max(rows[i].start_s for i in premium_ids)
    waiting = [i for i in batch_ids if first[i] > arrived]
    assert waiting, ("every batch request had started before the premium requests arrived",
                     f"{arrived - sent:.2f} s after the send",
                     [round(first[i] - arrived, 2) for i in batch_ids])
    premium_wait = sorted(rows[i].ttft_s for i in premium_ids)
    batch_wait = sorted(first[i] - arrived for i in waiting)
    print(f"priority: premium TTFT {[round(w, 2) for w in premium_wait]} s; the batch "
          f"requests already waiting got their first token {[round(w, 2) for w in batch_wait]}"
          f" s after the last premium one arrived ({arrived - sent:.2f} s after the send)")
    # vLLM's priority scheduler takes every premium request before the batch ones that were
    # already waiting when the premium ones arrived: at the latest in the same engine step,
    # whose outputs leave together (a step here takes 10-20 ms). Under FCFS the waiting batch
    # requests would come a whole wave, seconds, earlier.
    assert max(first[i] for i in premium_ids) <= min(first[i] for i in waiting) + STEP_S

