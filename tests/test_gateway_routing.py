"""Prefix-aware routing: a prompt goes where its prefix was sent, within the load bound, the
KV limit and the pool's TTFT SLO (else where its first token comes soonest); traffic sharing no
prefix is routed by least outstanding, ties placed by rendezvous; a replica that restarts (or
comes back from down) has no affinity left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.gateway import (
    BATCH,
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

from collector.exposition import normalise_vllm_names, parse
from serving.gateway.batch.queue import BatchRequest
from serving.gateway.front.api_keys import key_sha256
from serving.gateway.tiers import Caller
from serving.gateway.upstream.forwarder import _FirstRead
from serving.gateway.upstream.prompt_key import (
    CHARS_PER_TOKEN,
    CHUNK_CHARS,
    CHUNK_TOKENS,
    MAX_PREFIX_CHARS,
    PromptKey,
    prompt_key,
)
from serving.gateway.upstream.replicas import Replica, Upstreams
from serving.gateway.upstream.routing import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    LOAD_RATIO,
    LOAD_SLACK,
    MIN_MATCH_TOKENS,
    RATE_STEP,
    UNARY_PREFILL_FACTOR,
    UNARY_PREFILL_MAX_S,
    ReplicaRouting,
    Sent,
    load_bound,
    rendezvous,
    uncached_tokens,
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


def test_chunks_are_characters_so_a_full_match_leaves_the_tail_uncached() -> None:
    # 3,000 Chinese characters are 9,000 UTF-8 bytes: chunks of bytes would claim 35 chunks
    # (2,240 tokens) of a prompt estimated at 750 tokens, leaving nothing to prefill.
    key = prompt_key("completions", {"prompt": "你好世界" * 750})
    assert key is not None and len(key.hashes) == 3000 // CHUNK_CHARS
    assert key.tokens == 3000 // CHARS_PER_TOKEN
    assert uncached_tokens(key, len(key.hashes)) == key.tokens - 11 * CHUNK_TOKENS > 0
    # Past the hash cap the unhashed tail stays to prefill even when every hash matches.
    huge = prompt_key("completions", {"prompt": "z" * (4 * MAX_PREFIX_CHARS)})
    assert huge is not None
    assert uncached_tokens(huge, len(huge.hashes)) == 3 * MAX_PREFIX_CHARS // CHARS_PER_TOKEN


def test_models_and_tools_never_share_chunks() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"id": {"type": "string"}}}}}
    same_tool = json.loads(json.dumps(tool, sort_keys=True))  # other key order, same tool
    base = prompt_key("chat", _chat(SYSTEM_A, "q"))
    lora = prompt_key("chat", {**_chat(SYSTEM_A, "q"), "model": "acme-lora"})
    tools = prompt_key("chat", _chat(SYSTEM_A, "q", tools=[tool]))
    tools_again = prompt_key("chat", _chat(SYSTEM_A, "q2", tools=[same_tool]))
    ids = prompt_key("completions", {"model": MODEL, "prompt": list(range(2 * CHUNK_TOKENS))})
    ids_lora = prompt_key("completions", {"model": "acme-lora",
                                          "prompt": list(range(2 * CHUNK_TOKENS))})
    assert base and lora and tools and tools_again and ids and ids_lora
    for a, b in [(base, lora), (base, tools), (lora, tools), (ids, ids_lora)]:
        assert not set(a.hashes) & set(b.hashes) and a.anchor != b.anchor
    assert tools.hashes[:10] == tools_again.hashes[:10] and tools.anchor == tools_again.anchor


def test_the_anchor_is_the_same_in_every_process() -> None:
    body = _chat(SYSTEM_A, "q")
    script = ("import json, sys; from serving.gateway.upstream.prompt_key import prompt_key; "
              "print(prompt_key('chat', json.loads(sys.argv[1])).anchor)")
    seen = {subprocess.run([sys.executable, "-c", script, json.dumps(body)], check=True,
                           capture_output=True, text=True, env={**os.environ,
                           "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
    key = prompt_key("chat", body)
    assert key is not None and seen == {str(key.anchor)}


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


def test_one_early_first_byte_moves_the_rate_one_step_only() -> None:
    state = ReplicaRouting()
    state.learn(640, 0.01)  # 64,000 tokens/s from one sample
    assert state.prefill_rate == pytest.approx(DEFAULT_PREFILL_TOKENS_PER_S * RATE_STEP)
    state.prefill_rate = 5000.0
    state.learn(640, 0.01)
    assert state.prefill_rate == pytest.approx(5000 + 0.2 * (20_000 - 5000))
    state.prefill_rate = 5000.0
    state.learn(10_000, 100.0)  # 100 tokens/s: a stalled replica, clamped as well
    assert state.prefill_rate == pytest.approx(5000 + 0.2 * (1250 - 5000))


class _Body:
    """A response whose body reads are ``chunks``."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)

    async def read(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


@pytest.mark.parametrize("event", [
    b'data: {"error": {"message": "prompt too long", "code": 400}}\n\n',
    b'data: {"object":"error","message":"boom","type":"BadRequestError"}\n\n'])
def test_an_error_event_first_teaches_nothing(event: bytes) -> None:
    state = ReplicaRouting()
    now = [0.0]
    sent = Sent(state, 1000, 0, lambda: now[0], 0.0)
    state.pending_tokens = 1000
    now[0] = 0.01
    assert asyncio.run(_FirstRead(_Body(event), sent).read()) == event  # type: ignore[arg-type]
    assert state.prefill_rate is None and state.pending_tokens == 0 and not sent.waiting
    token = b'data: {"id":"x","choices":[{"delta":{"content":"\\"error\\": no"}}]}\n\n'
    sent = Sent(state, 1000, 0, lambda: now[0], 0.0)
    asyncio.run(_FirstRead(_Body(token), sent).read())  # type: ignore[arg-type]
    assert state.prefill_rate is not None


def test_unary_prefill_settles_after_its_estimated_time() -> None:
    state = ReplicaRouting()
    state.pending_tokens = 3000
    sent = Sent(state, 2000, 1000, lambda: 0.0, 0.0)
    timers: list[tuple[float, Any]] = []

    class Handle:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    handle = Handle()

    def call_later(delay: float, fn: Any) -> Handle:
        timers.append((delay, fn))
        return handle

    sent.settle_after(call_later)
    [(delay, fn)] = timers
    assert delay == pytest.approx(UNARY_PREFILL_FACTOR * 3000 / DEFAULT_PREFILL_TOKENS_PER_S)
    fn()
    assert state.pending_tokens == 1000 and not sent.waiting
    sent.settle()  # the answer's end: nothing twice
    assert state.pending_tokens == 1000
    long = Sent(state, 10**9, 0, lambda: 0.0, 0.0)
    assert long.prefill_estimate_s() == UNARY_PREFILL_MAX_S
    early = Sent(state, 10, 0, lambda: 0.0, 0.0)
    early.settle_after(call_later)
    early.settle()  # answered before the timer: the timer goes
    assert handle.cancelled


def test_a_failed_request_takes_back_only_the_chunks_it_added() -> None:
    state = ReplicaRouting()
    state.record((1, 2))
    added = state.record((1, 2, 3, 4))
    assert set(added) == {3, 4}
    sent = Sent(state, 128, 0, lambda: 0.0, 0.0, added)
    state.pending_tokens = 128
    sent.fail()
    assert state.matched((1, 2, 3, 4)) == 2 and state.pending_tokens == 0


# --- choosing among replicas (Upstreams.pick, no traffic) ------------------------------------

@contextlib.contextmanager
def _pool(tmp_path: Path, n: int, slo_ttft_s: float | None = None
          ) -> Iterator[tuple[Upstreams, list[Replica]]]:
    """``n`` healthy replicas that are never polled (nothing listens on their addresses)."""
    cfg = gateway_config(tmp_path, [f"http://127.0.0.1:{9 + i}" for i in range(n)])
    if slo_ttft_s is not None:
        cfg = _with_ttft_slo(cfg, slo_ttft_s)
    up = Upstreams(cfg)
    replicas = up.pools["chat"]
    for r in replicas:
        r.healthy = True
    try:
        yield up, replicas
    finally:
        asyncio.run(up.aclose())


def _key(text: str) -> PromptKey:
    key = prompt_key("completions", {"model": MODEL, "prompt": text})
    assert key is not None
    return key


def test_slo_miss_goes_where_the_first_token_comes_soonest(tmp_path: Path) -> None:
    rate = DEFAULT_PREFILL_TOKENS_PER_S
    prompt = _key("p" * (CHUNK_CHARS * 40))  # 2,560 tokens, all of them cached on home
    with _pool(tmp_path, 3, slo_ttft_s=1.0) as (up, (home, idle, busy)):
        home.routing.record(prompt.hashes)
        home.routing.pending_tokens = int(1.2 * rate)  # 1.2 s waiting: past the SLO
        # The replica with fewest in flight has prefill queued too: without the prefix it
        # would be slower still, so the tenant stays home.
        idle.routing.pending_tokens = int(0.8 * rate)  # 1.31 s with the whole prompt
        busy.ledger.in_flight = home.ledger.in_flight = 1
        busy.routing.pending_tokens = int(0.9 * rate)
        assert up.pick("chat", prompt=prompt) is home
        # Nothing waiting on the busier one: 2,560 tokens there (0.5 s) is soonest, not the
        # least loaded replica's 1.31 s.
        busy.routing.pending_tokens = 0
        assert up.pick("chat", prompt=prompt) is busy
        assert busy.routing.load_routed == 1 and home.routing.prefix_routed == 1


def test_a_short_shared_preamble_does_not_pull_the_prompt(tmp_path: Path) -> None:
    preamble = "Acme Corp. confidential. " * 50  # 1,250 characters: 4 chunks, 256 tokens
    with _pool(tmp_path, 2) as (up, (holder, other)):
        holder.routing.record(_key(preamble + "x" * 1000).hashes)
        holder.ledger.in_flight = 1
        long_prompt = _key(preamble + "y" * 12_000)  # 3,313 tokens: 256 is under 30 %
        assert holder.routing.matched(long_prompt.hashes) * CHUNK_TOKENS >= MIN_MATCH_TOKENS
        assert up.pick("chat", prompt=long_prompt) is other
        short_prompt = _key(preamble + "y" * 1000)  # 563 tokens: the preamble is 45 %
        assert up.pick("chat", prompt=short_prompt) is holder


def test_new_prompts_are_placed_by_rendezvous_among_the_least_loaded(tmp_path: Path) -> None:
    prompts = [_key(f"tenant {i} " + SYSTEM_B) for i in range(24)]
    with _pool(tmp_path, 3) as (up, replicas), _pool(tmp_path / "b", 3) as (up2, _):
        names = [r.name for r in replicas]
        chosen = [up.pick("chat", prompt=p) for p in prompts]
        again = [up2.pick("chat", prompt=p) for p in prompts]  # another gateway instance
        expected = [max(names, key=lambda n, p=p: rendezvous(p.anchor, n)) for p in prompts]
        assert [r.name for r in chosen if r] == expected == [r.name for r in again if r]
        assert len(set(expected)) == 3
        # Fewest in flight comes first: the rendezvous choice busy, the next best one.
        first = next(r for r in replicas if r.name == expected[0])
        first.ledger.in_flight = 1
        second = max((n for n in names if n != first.name),
                     key=lambda n: rendezvous(prompts[0].anchor, n))
        picked = up.pick("chat", prompt=prompts[0])
        assert picked is not None and picked.name == second
        # Equal in flight, prefill waiting on the next best one too: the third.
        first.ledger.in_flight = 0
        for r in replicas:
            r.routing.pending_tokens = 0 if r.name not in (first.name, second) else 3000
        picked = up.pick("chat", prompt=prompts[0])
        assert picked is not None and picked.name not in (first.name, second)


def test_a_missing_restart_sign_keeps_the_last_one(tmp_path: Path) -> None:
    def families(queries: float | None) -> Any:
        text = "# TYPE vllm:prefix_cache_queries counter\n"
        if queries is not None:
            text += f'vllm:prefix_cache_queries_total{{engine="0"}} {queries}\n'
        return normalise_vllm_names(parse(text.encode(), content_type="text/plain",
                                          source="r"))

    with _pool(tmp_path, 1) as (up, (r,)):
        up._cache_facts(r, families(100.0))
        r.routing.record((1, 2))
        up._cache_facts(r, families(None))  # one poll without the counter
        assert r.routing.counter == 100.0 and r.routing.chunks == 2
        up._cache_facts(r, families(5.0))  # it went back: a restart
        assert r.routing.chunks == 0


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


def test_unary_prefill_stops_counting_before_its_answer(tmp_path: Path) -> None:
    with _replicas(tmp_path, 1) as (gw, ups):
        ups[0].mode = "hang"
        replica = gw.gateway.upstreams.replicas()[0]
        with _holding(gw) as hold:
            hold(_chat(SYSTEM_A, "a non-streaming question"))  # ~1,000 tokens: 0.3 s
            assert replica.routing.pending_tokens > 900
            wait_until(lambda: replica.routing.pending_tokens == 0, timeout=3.0,
                       what="the estimated prefill time to pass")
            assert replica.outstanding == 1


def test_refused_request_leaves_no_chunks_behind(tmp_path: Path) -> None:
    with _replicas(tmp_path, 1) as (gw, ups):
        ups[0].mode = "error_500"
        replica = gw.gateway.upstreams.replicas()[0]
        with gw.http() as c:
            assert c.post(CHAT, json=_chat(SYSTEM_A, "q")).status_code >= 500
        assert replica.routing.chunks == 0 and replica.routing.pending_tokens == 0
        ups[0].mode = "ok"
        _post(gw, _chat(SYSTEM_A, "q"))
        assert replica.routing.chunks > 0


def test_batch_requests_route_by_prefix(tmp_path: Path) -> None:
    with _replicas(tmp_path, 3) as (gw, _):
        home = _post(gw, _chat(SYSTEM_A, "first"))
        caller = Caller(tenant="nightly", tier="batch", key_id=key_sha256(BATCH)[:12])
        for i in range(3):
            item = BatchRequest(batch_id="batch_x", custom_id=f"c{i}", pool="chat",
                                endpoint="chat", caller=caller, body=_chat(SYSTEM_A, f"b{i}"))
            status, _ = gw.call(lambda item=item: gw.gateway.send_batch(item))
            assert status == 200
        replica = next(r for r in gw.gateway.upstreams.replicas() if r.name == home)
        assert replica.routing.prefix_routed == 3


def test_no_shared_prefix_routes_by_least_outstanding(tmp_path: Path) -> None:
    # Distinct prompts, shorter and longer than a chunk, every one held: each goes to a
    # replica with the fewest in flight, so they spread evenly.
    prompts = [_chat(f"{i} " + (SYSTEM_A if i % 2 else SYSTEM_B), "x") if i % 3
               else _chat("short", f"s{i}") for i in range(10)]
    with _replicas(tmp_path, 3) as (gw, ups):
        for u in ups:
            u.mode = "hang_after_first"
        with _holding(gw) as hold:
            for p in prompts:
                before = _outstanding(gw)
                assert before[hold(p)] == min(before.values())
            counts = sorted(_outstanding(gw).values())
        assert counts == [3, 3, 4]


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
