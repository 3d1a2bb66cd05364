"""Routing: least outstanding requests among healthy replicas with KV-cache room; health and
load polled from /health and /metrics; a replica that refuses connections is skipped at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.gateway import (
    MODEL,
    PREMIUM,
    STANDARD,
    GatewayHandle,
    ScriptedUpstream,
    gateway_config,
    running_gateway,
    scripted_upstream,
    wait_until,
)
from support.loopback import free_port

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}


@contextlib.contextmanager
def two_replicas(tmp_path: Path, **gateway: object
                 ) -> Iterator[tuple[GatewayHandle, ScriptedUpstream, ScriptedUpstream]]:
    with scripted_upstream() as a, scripted_upstream() as b:
        cfg = gateway_config(tmp_path, [a.url, b.url], gateway=dict(gateway))
        with running_gateway(cfg) as gw:
            yield gw, a, b


def _replica(gw: GatewayHandle, key: str = STANDARD, **kw: object) -> str:
    with gw.http(key=key) as c:
        r = c.post(CHAT, json={**BODY, **kw})
    assert r.status_code == 200, r.text
    return r.headers["x-vigil-replica"]


def _refresh(gw: GatewayHandle) -> None:
    gw.call(gw.gateway.upstreams.poll_once)


def test_least_outstanding_not_round_robin(tmp_path: Path) -> None:
    with two_replicas(tmp_path) as (gw, a, b):
        a.mode = "hang_after_first"
        b.mode = "hang_after_first"
        with gw.http() as c, c.stream("POST", CHAT, json={**BODY, "stream": True}) as held:
            busy = held.headers["x-vigil-replica"]
            other = {"chat-0": b, "chat-1": a}[busy]
            other.mode = "ok"
            assert [_replica(gw) for _ in range(4)] == [
                {"chat-0": "chat-1", "chat-1": "chat-0"}[busy]] * 4
        a.mode = b.mode = "ok"
        wait_until(lambda: all(r.outstanding == 0 for r in gw.gateway.upstreams.replicas()))
        assert {_replica(gw) for _ in range(4)} == {"chat-0", "chat-1"}


def test_replica_above_kv_limit_gets_nothing(tmp_path: Path) -> None:
    with two_replicas(tmp_path, tiers={"standard": {"max_wait": "0.2s"}}) as (gw, a, b):
        a.kv = 0.95
        _refresh(gw)
        assert {_replica(gw) for _ in range(4)} == {"chat-1"}
        b.kv = 0.97
        _refresh(gw)
        with gw.http(key=STANDARD) as c:
            assert c.post(CHAT, json=BODY).status_code == 429  # no room anywhere: waits, 429
        # Premium still goes: to the replica with the least KV usage (vLLM preempts for it).
        assert _replica(gw, key=PREMIUM) == "chat-0"
        a.kv = b.kv = 0.1
        _refresh(gw)
        assert {_replica(gw) for _ in range(4)} == {"chat-0", "chat-1"}


def test_unhealthy_replica_is_skipped_until_it_recovers(tmp_path: Path) -> None:
    with two_replicas(tmp_path) as (gw, a, _):
        a.healthy = False
        _refresh(gw)
        assert {_replica(gw) for _ in range(4)} == {"chat-1"}
        load = gw.gateway.upstreams.load("chat")
        assert load.healthy_replicas == 1
        up = httpx.get(f"{gw.url}/metrics").text
        assert 'vigil_gateway_replica_up{pool="chat",replica="chat-0"} 0.0' in up
        a.healthy = True
        wait_until(lambda: gw.gateway.upstreams.load("chat").healthy_replicas == 2,
                   what="the poller to see it back")
        assert {_replica(gw) for _ in range(4)} == {"chat-0", "chat-1"}


def test_connection_refused_fails_over_at_once(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with scripted_upstream() as live:
        cfg = gateway_config(tmp_path, [dead, live.url], gateway={"health_interval": "60s"})
        with running_gateway(cfg) as gw:
            # The first poll found the dead one down: it is never tried.
            assert [r.healthy for r in gw.gateway.upstreams.replicas()] == [False, True]
            assert {_replica(gw) for _ in range(3)} == {"chat-1"}
            # A replica that dies between polls: the request is retried on the other.
            gw.gateway.upstreams.pools["chat"][0].healthy = True
            results = {_replica(gw) for _ in range(4)}
            assert results == {"chat-1"}
            assert not gw.gateway.upstreams.pools["chat"][0].healthy


def test_load_is_the_mean_kv_and_summed_queue(tmp_path: Path) -> None:
    with two_replicas(tmp_path) as (gw, a, b):
        a.kv, a.waiting, b.kv, b.waiting = 0.2, 3, 0.4, 4
        _refresh(gw)
        load = gw.gateway.upstreams.load("chat")
        assert load.kv_cache_usage == pytest.approx(0.3)
        assert (load.queue_length, load.healthy_replicas) == (7, 2)
        health = httpx.get(f"{gw.url}/health").json()["pools"]["chat"]
        assert health["queue_length"] == 7
