"""Vigil's fleet-level claims on real vLLM: routing that raises the engine's own prefix-cache
hit rate, and SLO figures that equal what a benchmark client measured.

Prefix-aware routing is compared with least-outstanding on two real replicas and the same
requests, each mode from cold caches (``POST /reset_prefix_cache``), by vLLM's own counters:
``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``. The trust test runs ``vigil
loadgen`` through the gateway for a minute and holds ``vigil slo status``'s output-token
figures equal to the load generator's, and its TTFT and e2e percentiles at or below the
client's (the gateway cannot see the client's side of the hop) and within 5 % of them plus
that hop, printing every difference. The engine runs on a core of its own
(``real_vllm._cores``): sharing both cores, it delayed the client's reading by up to 0.2 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import httpx
import pytest
from support.gateway import STANDARD
from support.real_vllm import (  # noqa: F401
    MODEL,
    POOL,
    VllmServer,
    monitored_config,
    real_vllm,
    real_vllm_pair,
    run_vigil,
)
from support.shared_gateways import running_gateways, write_config

from serving.sim.testing import sample_values, total

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

#: What a client sees beyond the gateway's clock (seconds): one loopback hop, and the client's
#: event loop parsing the chunk; measured 2-6 ms at p50-p99 on TTFTs of 15-45 ms.
HOP_S = 0.010

_WORDS = ("kernel", "budget", "latency", "replica", "tenant", "contract", "invoice", "policy",
          "schedule", "summary", "customer", "ticket", "refund", "account", "shipment", "order")


def _system_prompt(tenant: int, words: int = 700) -> str:
    """A tenant's system prompt: ``words`` words (about as many tokens) of its own."""
    rng = random.Random(f"tenant-{tenant}")
    return f"You are the assistant of tenant {tenant}. " + " ".join(
        rng.choice(_WORDS) for _ in range(words))


def _prefix_counters(servers: list[VllmServer]) -> list[tuple[float, float]]:
    """(hits, queries) of each server, in tokens."""
    out = []
    for s in servers:
        samples = sample_values(s.metrics())
        out.append((total(samples, "vllm:prefix_cache_hits_total"),
                    total(samples, "vllm:prefix_cache_queries_total")))
    return out


async def _ask(client: httpx.AsyncClient, tenant: int, turn: int) -> None:
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 4,
        "messages": [{"role": "system", "content": _system_prompt(tenant)},
                     {"role": "user", "content": f"question {turn} of tenant {tenant}"}]},
        headers={"Authorization": f"Bearer {STANDARD}"})
    assert r.status_code == 200, r.text


async def _workload(client: httpx.AsyncClient, tenants: int, requests: int,
                    interval_s: float) -> None:
    """``requests`` requests, one every ``interval_s`` seconds whatever the answers, each from
    a tenant drawn at random (seeded: the same sequence in both modes), a few in flight."""
    rng = random.Random(20)
    turns = [0] * tenants
    sent = []
    for _ in range(requests):
        tenant = rng.randrange(tenants)
        sent.append(asyncio.create_task(_ask(client, tenant, turns[tenant])))
        turns[tenant] += 1
        await asyncio.sleep(interval_s)
    await asyncio.gather(*sent)


def _hit_rate(servers: list[VllmServer], folder: Path, routing: str, tenants: int,
              requests: int) -> float:
    """vLLM's prefix-cache hit rate (0-1) over the workload through a gateway with
    ``routing``, both replicas' caches emptied first."""
    for s in servers:
        httpx.post(f"{s.url}/reset_prefix_cache", timeout=30.0).raise_for_status()
    config = write_config(folder, folder / "records.db", [s.url for s in servers],
                          gateway={"routing": routing})
    with running_gateways(config, 1) as (gateway,):
        before = _prefix_counters(servers)

        async def run() -> None:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=120.0) as client:
                await _workload(client, tenants, requests, interval_s=0.15)

        asyncio.run(run())
        after = _prefix_counters(servers)
    deltas = [(h1 - h0, q1 - q0) for (h0, q0), (h1, q1) in zip(before, after, strict=True)]
    print(f"routing {routing}: (hits, queries) per replica {deltas}")
    return sum(h for h, _ in deltas) / sum(q for _, q in deltas)


def test_prefix_aware_routing_raises_vllms_own_prefix_cache_hit_rate(
        real_vllm_pair: list[VllmServer], tmp_path: Path) -> None:  # noqa: F811
    rates = {}
    for routing in ("least_outstanding", "prefix_aware"):
        folder = tmp_path / routing
        folder.mkdir()
        rates[routing] = _hit_rate(real_vllm_pair, folder, routing, tenants=10, requests=50)
    print("routing: vLLM prefix-cache hit rate " + ", ".join(
        f"{k} {v:.1%}" for k, v in rates.items()))
    assert rates["prefix_aware"] > rates["least_outstanding"] + 0.05, rates



def test_slo_status_percentiles_equal_the_load_generators_own(
        real_vllm: VllmServer, tmp_path: Path) -> None:  # noqa: F811
    config = monitored_config(tmp_path, [real_vllm.url])
    with running_gateways(config, 1) as (gateway,):
        started = time.time()
        run_vigil("collect", "--config", str(config), "--once")
        report = json.loads(run_vigil(
            "loadgen", "--url", gateway.url, "--model", MODEL, "--key", f"standard={STANDARD}",
            # Streamed, as a TTFT benchmark is: the gateway sees no first token of an answer
            # that is not streamed, so mixed traffic takes its TTFT from vLLM's histogram.
            "--tier-mix", "standard=1", "--stream-share", "1", "--rate", "1",
            "--num-requests", "60", "--seed", "7",
            "--max-tokens", "16,32,64", "--no-max-tokens-share", "0", "--long-share", "0",
            "--faq-share", "0", "--json", "--quiet"))
        run_vigil("collect", "--config", str(config), "--once")
        at = time.time()
    # The window spans the two scrapes exactly: vLLM's counts are then increase() between two
    # samples at its edges, with nothing extrapolated, and the records are the same requests.
    status = json.loads(run_vigil("slo", "status", "--config", str(config), "--json",
                               "--at", f"{at:.3f}", "--window", f"{at - started:.3f}s"))
    model = status["pools"][POOL]["models"][MODEL]
    quantiles, tokens = model["quantiles"], model["tokens_per_request"]
    figures = {}
    for key, ours in (("ttft_seconds", quantiles["ttft_seconds"]),
                      ("e2e_seconds", quantiles["e2e_seconds"]),
                      ("output_tokens", tokens["generated"])):
        assert ours.get("source") == "gateway", (key, ours)
        # Latencies: p50/p95/p99; tokens per request: mean and p95 (what status reports).
        shown = [p for p in ("mean", "p50", "p95", "p99") if ours.get(p) is not None]
        assert len(shown) >= 2, (key, ours)
        for p in shown:
            figures[f"{key} {p}"] = (ours[p], report[key][p])
    print("engine's histograms: " + "; ".join(
        f"{k} {quantiles[k].get('histogram')}" for k in ("ttft_seconds", "e2e_seconds")))
    print("trust: " + "; ".join(f"{k} vigil {a:.4g} loadgen {b:.4g} ({a / b - 1:+.1%})"
                                for k, (a, b) in figures.items()))
    assert report["completed"] == report["sent"] == 60, report
    for what, (ours_v, theirs_v) in figures.items():
        if what.startswith("output_tokens"):
            # The same requests, the same usage blocks: equal to the token.
            assert ours_v == pytest.approx(theirs_v, rel=1e-9), what
        else:
            # The gateway's clock starts when its handler runs and stops when vLLM's chunk
            # arrives: a client, which also waits for the connection, the request's parsing
            # and its own reading, can only see more, by one loopback hop and a Python event
            # loop at each end (HOP_S). Beyond that, within 5 %. The p99 of 60 requests is one
            # request's, and its hop the largest of 60: a stall of the core the gateway, the
            # client and the collector share, measured up to 14 ms; two hops are allowed there.
            hops = 2 if what.endswith("p99") else 1
            assert 0 < ours_v <= theirs_v, what
            assert theirs_v - ours_v <= 0.05 * theirs_v + hops * HOP_S, (what, figures)
