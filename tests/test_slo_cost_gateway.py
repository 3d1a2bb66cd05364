"""End to end: the gateway in front of the simulator, which counts requests as vLLM does. A
tier's cost per 1000 requests counts the requests the replica finished, the ones in its
``vllm:request_success_total``: a request whose client left is not one (the simulator, like
vLLM, records no statistics for an aborted request), nor a semantic-cache hit. So with one
tier carrying all the traffic, the tier's and the pool's cost per 1000 requests are equal.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.gateway import (
    MODEL,
    STANDARD,
    GatewayHandle,
    gateway_config,
    running_gateway,
    wait_until,
)

from serving.sim.testing import FleetHandle, running_fleet, sample_values, total
from slo.cost.pool import tier_costs
from vigil.model import RequestRecord

#: USD the pool's GPUs cost over the test: any value; both figures divide the same cost.
COST_USD = 1.0
#: A generation far longer than the test (2000 steps of at least 15 ms): only a cancel ends it.
LONG = {"max_tokens": 2000, "extra_body": {"ignore_eos": True}}
FINISHED, CANCELLED = 3, 2


@contextlib.contextmanager
def _fleet_and_gateway(tmp_path: Path) -> Iterator[tuple[FleetHandle, GatewayHandle]]:
    """One simulated replica of its own (its counters start at 0, so their values are this
    test's requests) behind a gateway whose semantic cache embeds with it."""
    with running_fleet(1) as fleet:
        cache = {"enabled": True, "embeddings": fleet.base_urls[0], "embedding_model": MODEL}
        with running_gateway(gateway_config(tmp_path, fleet.base_urls,
                                            gateway={"cache": cache})) as gw:
            yield fleet, gw


def _metrics(fleet: FleetHandle) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return sample_values(httpx.get(fleet.metrics_urls[0], timeout=10).text)


def _idle(fleet: FleetHandle) -> bool:
    s = _metrics(fleet)
    return total(s, "vllm:num_requests_running") + total(s, "vllm:num_requests_waiting") == 0


@pytest.mark.timeout(120)
def test_one_tier_counts_what_vllm_counts_with_cancels_and_cache_hits(tmp_path: Path) -> None:
    with _fleet_and_gateway(tmp_path) as (fleet, gw):
        by_tier, vllm_finished = _serve_and_count(fleet, gw)
    assert by_tier is not None and set(by_tier) == {"standard"}
    standard = by_tier["standard"]
    assert standard["requests"] == vllm_finished
    assert (standard["cancelled"], standard["cache_hits"]) == (CANCELLED, 1)
    # The pool's figure: cost_usd / increase(vllm:request_success_total) × 1000.
    assert standard["per_1000_requests"] == pytest.approx(COST_USD / vllm_finished * 1000)


def _serve_and_count(fleet: FleetHandle, gw: GatewayHandle
                     ) -> tuple[dict[str, dict[str, float | None]] | None, float]:
    """Send FINISHED requests, one cache hit and CANCELLED cancelled streams as the standard
    tier; return ``tier_costs`` of the records and the replica's finished requests."""
    client = gw.client(STANDARD)
    for i in range(FINISHED):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"question number {i}"}],
            temperature=0, max_tokens=8)
    gw.call(gw.gateway.cache.drain)  # the answers stored, so the repeat below is a hit
    again = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "question number 0"}],
        temperature=0, max_tokens=8)
    assert again.headers["x-vigil-cache"].startswith("hit")
    for i in range(CANCELLED):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"a long story {i}"}],
            stream=True, **LONG)
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got >= 3:
                break
        stream.close()  # the client leaves mid-generation
        wait_until(lambda: _idle(fleet), timeout=10, what="the upstream request aborted")

    vllm_finished = total(_metrics(fleet), "vllm:request_success_total")
    assert vllm_finished == FINISHED  # the simulator counts as vLLM does: no abort, no hit

    def written() -> list[RequestRecord]:
        gw.gateway.records.flush()
        recs = list(gw.records().records("chat", time.time() + 60, 3600))
        return recs if len(recs) == FINISHED + 1 + CANCELLED else []

    records = wait_until(written, timeout=10, what="every request's record")
    return tier_costs(records, COST_USD)[0], vllm_finished
