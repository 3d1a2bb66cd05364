"""Prefix-aware routing: a prompt goes where its prefix was sent, within the load bound, the
KV limit and the pool's TTFT SLO; traffic sharing no prefix is routed as least outstanding;
a replica that restarts (or comes back from down) has no affinity left."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_gateway_support import (
    MODEL,
    OTHER,
    STANDARD,
    GatewayHandle,
    ScriptedUpstream,
    gateway_config,
    running_gateway,
    scripted_upstream,
    wait_until,
)

from serving.gateway.prefix import CHUNK_CHARS, CHUNK_TOKENS, MAX_PREFIX_CHARS, prompt_key
from serving.gateway.routing import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    LOAD_RATIO,
    LOAD_SLACK,
    ReplicaRouting,
    Sent,
    load_bound,
)
from serving.sim.testing import running_fleet, sample_values, total
from vigil.config import Config, SloConfig

CHAT = "/v1/chat/completions"
#: Two tenants' system prompts: long enough for a few dozen chunks, different from the start.
SYSTEM_A = "".join(f"Rule {i} of Acme's support desk: answer politely. " for i in range(80))
SYSTEM_B = "".join(f"Globex policy line {i}: be brief and exact. " for i in range(80))


def _chat(system: str, user: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": user}], **kw}


def _post(gw: GatewayHandle, body: dict[str, Any], key: str = STANDARD) -> str:
    """The replica that answered ``body``."""
    with gw.http(key=key) as c:
        r = c.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    return r.headers["x-vigil-replica"]


def _outstanding(gw: GatewayHandle) -> dict[str, int]:
    return {r.name: r.outstanding for r in gw.gateway.upstreams.replicas()}


@contextlib.contextmanager
def _holding(gw: GatewayHandle) -> Iterator[Any]:
    """``hold(body) -> replica name``: send a request that stays in flight (its upstream
    hangs) until the block ends, when its client connection closes."""
    socks: list[socket.socket] = []
    port = int(gw.url.rsplit(":", 1)[1])

    def hold(body: dict[str, Any], key: str = STANDARD) -> str:
        before = _outstanding(gw)
        data = json.dumps(body).encode()
        s = socket.create_connection(("127.0.0.1", port))
        socks.append(s)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (CHAT.encode(), key.encode(), len(data), data))
        grown = wait_until(lambda: [n for n, k in _outstanding(gw).items() if k > before[n]],
                           what="the held request to reach a replica")
        return str(grown[0])

    try:
        yield hold
    finally:
        for s in socks:
            s.close()
        wait_until(lambda: not any(_outstanding(gw).values()), what="held requests to end")


@contextlib.contextmanager
def _replicas(tmp_path: Path, n: int, *, routing: str = "prefix_aware",
              slo_ttft_s: float | None = None, **gateway: Any
              ) -> Iterator[tuple[GatewayHandle, list[ScriptedUpstream]]]:
    with contextlib.ExitStack() as stack:
        ups = [stack.enter_context(scripted_upstream()) for _ in range(n)]
        cfg = gateway_config(tmp_path, [u.url for u in ups],
                             gateway={"routing": routing, **gateway})
        if slo_ttft_s is not None:
            cfg = _with_ttft_slo(cfg, slo_ttft_s)
        with running_gateway(cfg) as gw:
            yield gw, ups


def _with_ttft_slo(cfg: Config, threshold_s: float) -> Config:
    slo = SloConfig(name="chat-ttft", pool="chat", indicator="ttft",
                    threshold_seconds=threshold_s)
    return cfg.model_copy(update={"slos": [slo]})


def _by_name(gw: GatewayHandle, ups: list[ScriptedUpstream]) -> dict[str, ScriptedUpstream]:
    return {r.name: ups[i] for i, r in enumerate(gw.gateway.upstreams.pools["chat"])}


# --- the prompt's chunks ---------------------------------------------------------------------

def test_same_system_prompt_shares_leading_chunks() -> None:
    a1 = prompt_key("chat", _chat(SYSTEM_A, "Where is my order?"))
    a2 = prompt_key("chat", _chat(SYSTEM_A, "Cancel my subscription, please."))
    b = prompt_key("chat", _chat(SYSTEM_B, "Where is my order?"))
    assert a1 is not None and a2 is not None and b is not None
    shared = len(SYSTEM_A) // CHUNK_CHARS
    assert a1.hashes[:shared] == a2.hashes[:shared]
    assert not set(a1.hashes) & set(b.hashes)
    assert a1.tokens == pytest.approx(len(SYSTEM_A) / 4, abs=10)


def test_short_prompt_and_embeddings_have_no_key() -> None:
    assert prompt_key("chat", _chat("be nice", "hi")) is None
    assert prompt_key("embeddings", {"model": MODEL, "input": "x" * 5000}) is None


def test_completions_text_ids_and_hash_cap() -> None:
    text = prompt_key("completions", {"prompt": "y" * (3 * CHUNK_CHARS + 10)})
    assert text is not None and len(text.hashes) == 3
    ids = prompt_key("completions", {"prompt": list(range(5 * CHUNK_TOKENS))})
    assert ids is not None and len(ids.hashes) == 5 and ids.tokens == 5 * CHUNK_TOKENS
    huge = prompt_key("completions", {"prompt": "z" * (4 * MAX_PREFIX_CHARS)})
    assert huge is not None and len(huge.hashes) == MAX_PREFIX_CHARS // CHUNK_CHARS
    assert huge.tokens == MAX_PREFIX_CHARS  # the whole prompt counts, only its head is hashed


def test_lru_keeps_the_head_of_a_prompt_longest() -> None:
    state = ReplicaRouting(capacity_tokens=3 * CHUNK_TOKENS)
    state.record((1, 2, 3, 4, 5))
    assert state.matched((1, 2, 3, 4, 5)) == 3  # the tail went first
    state.record((7, 8))
    assert state.matched((1, 2, 3)) == 1 and state.matched((7, 8)) == 2
    state.forget()
    assert state.matched((7, 8)) == 0


def test_load_bound_has_a_slack_and_a_ratio() -> None:
    assert load_bound([0, 0]) == LOAD_SLACK
    assert load_bound([100, 100]) == 100 + LOAD_RATIO * 100


def test_first_token_teaches_the_prefill_rate() -> None:
    state = ReplicaRouting()
    now = [10.0]
    sent = Sent(state, 3000, 1000, lambda: now[0], now[0])
    state.pending_tokens = 4000
    now[0] += 0.5
    sent.first_token()
    assert state.pending_tokens == 1000 and state.prefill_rate == pytest.approx(8000)
    sent.settle()  # only once
    assert state.pending_tokens == 1000


# --- routing through the gateway -------------------------------------------------------------

def test_one_tenant_stays_on_the_replica_holding_its_prefix(tmp_path: Path) -> None:
    with _replicas(tmp_path, 3) as (gw, _):
        served = {_post(gw, _chat(SYSTEM_A, f"question {i}?")) for i in range(6)}
        assert len(served) == 1
        home = served.pop()
        replica = next(r for r in gw.gateway.upstreams.replicas() if r.name == home)
        assert replica.routing.prefix_routed == 5 and replica.routing.load_routed == 1
        info = next(d for d in httpx.get(f"{gw.url}/health").json()["replicas"]
                    if d["name"] == home)
        assert info["routing"]["prefix_routed"] == 5 and info["routing"]["prefix_chunks"] > 0


def test_two_tenants_each_keep_a_replica(tmp_path: Path) -> None:
    with _replicas(tmp_path, 2) as (gw, _):
        a: list[str] = []
        b: list[str] = []
        for i in range(4):  # interleaved: the first of each goes by load, to its own replica
            a.append(_post(gw, _chat(SYSTEM_A, f"a {i}")))
            b.append(_post(gw, _chat(SYSTEM_B, f"b {i}"), key=OTHER))
        assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]


def test_busy_beyond_the_load_bound_moves_the_tenant(tmp_path: Path) -> None:
    with _replicas(tmp_path, 2) as (gw, ups):
        home = _post(gw, _chat(SYSTEM_A, "first"))
        upstream = _by_name(gw, ups)
        upstream[home].mode = "hang_after_first"
        with _holding(gw) as hold:
            # Within the bound (min 0 + LOAD_SLACK) the tenant's requests stay home...
            held = [hold(_chat(SYSTEM_A, f"held {i}", stream=True))
                    for i in range(LOAD_SLACK + 1)]
            assert set(held) == {home}
            # ... one more in flight there and the next goes elsewhere.
            away = _post(gw, _chat(SYSTEM_A, "one more"))
            assert away != home


def test_kv_above_the_limit_moves_the_tenant(tmp_path: Path) -> None:
    with _replicas(tmp_path, 2, tiers={"standard": {"max_wait": "2s"}}) as (gw, ups):
        home = _post(gw, _chat(SYSTEM_A, "first"))
        replica = next(r for r in gw.gateway.upstreams.replicas() if r.name == home)
        _by_name(gw, ups)[home].kv = 0.95
        wait_until(lambda: replica.kv_usage == 0.95, what="the poll to see the full cache")
        assert _post(gw, _chat(SYSTEM_A, "second")) != home


def test_predicted_ttft_over_the_slo_moves_the_tenant(tmp_path: Path) -> None:
    threshold = 1.0
    rate = DEFAULT_PREFILL_TOKENS_PER_S  # nothing streamed yet: nothing learned
    # Prefill waiting at home for 0.8 x the threshold; a question of 0.4 x more tokens.
    long_tail = "w" * int(4 * rate * threshold * 0.8)
    size = int(4 * rate * threshold * 0.4)
    with _replicas(tmp_path, 2, slo_ttft_s=threshold) as (gw, ups):
        home = _post(gw, _chat(SYSTEM_A, "first"))
        assert _post(gw, _chat(SYSTEM_A, "c" * size)) == home  # nothing waiting: it fits
        _by_name(gw, ups)[home].mode = "hang"
        replica = next(r for r in gw.gateway.upstreams.replicas() if r.name == home)
        with _holding(gw) as hold:
            assert hold(_chat(SYSTEM_A, long_tail)) == home
            assert replica.routing.pending_tokens > 0.75 * rate * threshold
            # Cached here, but its prefill would wait past the SLO: it goes elsewhere.
            assert _post(gw, _chat(SYSTEM_A, "q" * size)) != home
        assert replica.routing.pending_tokens == 0


def _placements(tmp_path: Path, routing: str) -> list[str]:
    """Where a fixed mix of prompts that share no prefix lands, with every request held."""
    prompts = [_chat(f"{i} " + (SYSTEM_A if i % 2 else SYSTEM_B), "x") if i % 3
               else _chat("short", f"s{i}") for i in range(10)]
    with _replicas(tmp_path / routing, 3, routing=routing) as (gw, ups):
        for u in ups:
            u.mode = "hang_after_first"
        with _holding(gw) as hold:
            return [hold(p) for p in prompts]


def test_no_shared_prefix_routes_exactly_as_least_outstanding(tmp_path: Path) -> None:
    # Distinct prompts, shorter and longer than a chunk: the same replica for every one.
    lo = _placements(tmp_path, "least_outstanding")
    assert _placements(tmp_path, "prefix_aware") == lo
    assert len(set(lo)) == 3


def test_least_outstanding_ignores_prefixes(tmp_path: Path) -> None:
    with _replicas(tmp_path, 2, routing="least_outstanding") as (gw, _):
        assert gw.gateway.forwarder.prompt_of("chat", _chat(SYSTEM_A, "x")) is None
        served = [_post(gw, _chat(SYSTEM_A, f"question {i}?")) for i in range(4)]
        assert len(set(served)) == 2  # one after the other: the rotation alternates
        info = httpx.get(f"{gw.url}/health").json()["replicas"]
        assert all("routing" not in d for d in info)


def test_replica_back_from_down_has_lost_its_affinity(tmp_path: Path) -> None:
    with _replicas(tmp_path, 2) as (gw, ups):
        home = _post(gw, _chat(SYSTEM_A, "first"))
        replica = next(r for r in gw.gateway.upstreams.replicas() if r.name == home)
        assert replica.routing.chunks > 0
        upstream = _by_name(gw, ups)[home]
        upstream.healthy = False
        wait_until(lambda: not replica.healthy, what="the poll to see it down")
        upstream.healthy = True
        wait_until(lambda: replica.healthy, what="the poll to see it back")
        # It exports no start time: being down is all the gateway knows, so it forgets.
        assert replica.routing.chunks == 0


def test_simulated_replicas_hit_their_prefix_cache_and_forget_it_on_restart(
        tmp_path: Path) -> None:
    """On simulated vLLM replicas: the tenant's prefix is cached where it is routed, the
    KV capacity comes from ``vllm:cache_config_info``, streams teach a prefill rate, and a
    restart (a new ``process_start_time_seconds``) empties the gateway's memory of it."""
    with running_fleet(2) as fleet:
        cfg = gateway_config(tmp_path, fleet.base_urls)
        with running_gateway(cfg) as gw:
            with gw.http() as c:
                served = set()
                for i in range(5):
                    body = _chat(SYSTEM_A * 2, f"question {i}?", stream=True, max_tokens=3)
                    with c.stream("POST", CHAT, json=body) as r:
                        assert r.status_code == 200
                        served.add(r.headers["x-vigil-replica"])
                        r.read()
            assert len(served) == 1
            home = served.pop()
            index = [r.name for r in gw.gateway.upstreams.pools["chat"]].index(home)
            replica = gw.gateway.upstreams.pools["chat"][index]
            profile = fleet.replicas[index].profile
            assert replica.routing.capacity_tokens == profile.num_gpu_blocks * profile.block_size
            assert replica.routing.prefill_rate is not None
            assert replica.routing.pending_tokens == 0
            metrics = sample_values(httpx.get(fleet.metrics_urls[index]).text)
            assert total(metrics, "vllm:prefix_cache_hits_total") > 0
            fleet.restart(index)
            wait_until(lambda: replica.routing.chunks == 0, what="the poll to see the restart")
