"""http_sd discovery against a real HTTP server on 127.0.0.1 (Prometheus's endpoint rules)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.loopback import free_port

from collector.discovery import TargetSet
from vigil.config import parse_config

GROUPS = [{"targets": ["10.0.0.1:8000", "10.0.0.2:8000"],
           "labels": {"pool": "chat", "namespace": "llm", "__meta_k8s": "x"}}]


def config(url: str):
    return parse_config({
        "pools": [{"name": "chat", "model": "m"}],
        "discovery": [{"name": "chat-k8s", "url": url, "refresh_interval": "10s"}],
    })


def answer(status: int = 200, ctype: str = "application/json", body: object = GROUPS):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda req: (status, ctype, data)


def refresh(ts: TargetSet):
    return asyncio.run(ts.refresh(force=True))


def test_targets_labels_and_request_headers(http_server):
    http_server.respond = answer(ctype="application/json; charset=utf-8")
    url = f"{http_server.url}/sd"
    ts = TargetSet(config(url))
    changes = refresh(ts)
    assert [t.name for t in changes.added] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    t = ts.current()["10.0.0.1:8000"]
    assert t.origin == f"http_sd chat-k8s ({url})"
    assert t.target.labels == {"namespace": "llm"}
    (req,) = http_server.recorded()
    assert req.method == "GET" and req.path == "/sd"
    assert req.headers["x-prometheus-refresh-interval-seconds"] == "10"
    assert ts.errors() == {"chat-k8s": ""}


@pytest.mark.parametrize("bad,reason", [
    (answer(status=503), "HTTP status 503"),
    (answer(ctype="text/plain"), "not application/json"),
    (answer(body=b'[{"targets": ["10.0.0.9:8000"'), "invalid JSON"),
    (answer(body={"targets": []}), "expected a list of target groups"),
    (answer(body=b"\xff\xfe"), "not UTF-8"),
])
def test_a_bad_answer_keeps_the_previous_targets(http_server, bad, reason):
    http_server.respond = answer()
    ts = TargetSet(config(http_server.url))
    refresh(ts)
    before = ts.current()
    http_server.respond = bad
    assert not refresh(ts)
    assert ts.current() == before
    err = ts.errors()["chat-k8s"]
    assert reason in err and "previous 2 target(s) are kept" in err and http_server.url in err
    http_server.respond = answer(body=[])  # an empty list is valid: no targets
    assert len(refresh(ts).removed) == 2
    assert ts.current() == {} and ts.errors() == {"chat-k8s": ""}


def test_an_unreachable_endpoint_is_reported():
    dead = TargetSet(config(f"http://127.0.0.1:{free_port()}/sd"))
    assert not refresh(dead)
    assert "connection refused" in dead.errors()["chat-k8s"]


def test_an_injected_client_is_used_and_left_open(http_server):
    http_server.respond = answer()

    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            ts = TargetSet(config(http_server.url), http_client=client)
            await ts.refresh(force=True)
            await ts.refresh(force=True)
            assert not client.is_closed
            return ts

    assert len(asyncio.run(go()).current()) == 2
    assert len(http_server.recorded()) == 2
