"""Remote embeddings: a real uvicorn server on 127.0.0.1 speaking OpenAI's /v1/embeddings
(backed by the real local model), and its failures, which must be misses, never errors."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from support.cache import T0, answer, ask, chat, decide, local_embedder, remember, serve

from serving.cache import RemoteEmbedder, SemanticCache
from serving.cache.embedder import REMOTE_MAX_CHARS
from vigil.clock import ManualClock
from vigil.config import CacheConfig

PASSWORD = "How do I reset my password?"


def embeddings_app(calls: list[dict[str, Any]], mode: dict[str, str]) -> FastAPI:
    """``/v1/embeddings`` answering with all-MiniLM-L6-v2, or failing as ``mode["kind"]``."""
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        calls.append(body)
        kind = mode.get("kind", "ok")
        if kind == "500":
            return JSONResponse({"error": {"message": "boom", "type": "InternalServerError",
                                           "code": 500}}, status_code=500)
        if kind == "garbage":
            return PlainTextResponse("<html>bad gateway</html>")
        if kind == "empty":
            return JSONResponse({"object": "list", "data": []})
        if kind == "zero":
            return JSONResponse({"object": "list", "data": [{"index": 0, "embedding": [0.0] * 4}]})
        if kind == "strings":
            return JSONResponse({"object": "list", "data": [{"index": 0, "embedding": "AAAA"}]})
        if kind == "hang":
            await asyncio.sleep(1.0)
        data = []
        for i, text in enumerate(body["input"]):
            vector = await local_embedder().embed(text)
            assert vector is not None
            # Unnormalised on purpose: the client must normalise what it gets.
            data.append({"object": "embedding", "index": i, "embedding": (vector * 3).tolist()})
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    return app


def remote_cache(url: str, **overrides: Any) -> SemanticCache:
    cfg = CacheConfig(enabled=True, embeddings=url, embedding_model="minilm-test", **overrides)
    return SemanticCache.from_config(cfg, clock=ManualClock(T0))


def test_remote_embeddings_hit_paraphrases_and_guard_negations() -> None:
    calls: list[dict[str, Any]] = []
    local_embedder()  # load the model the server uses before it serves

    async def go(url: str) -> None:
        cache = remote_cache(url)
        await remember(cache, chat(PASSWORD), "Settings > Security.")
        hit = await ask(cache, chat("What is the way to reset my password?"))
        assert hit is not None and hit.layer == "l2" and hit.similarity > 0.95
        await remember(cache, chat("Is it safe to drink?"), "Yes.")
        assert await ask(cache, chat("Is it not safe to drink?")) is None
        assert cache.stats().embedding_failures == 0
        await cache.aclose()

    with serve(embeddings_app(calls, {})) as url:
        asyncio.run(go(url))
    assert calls[0] == {"model": "minilm-test", "input": [PASSWORD]}
    # One embedding per request: the store reused the lookup's.
    assert len(calls) == 4


def test_an_openai_style_base_url_with_v1_works() -> None:
    calls: list[dict[str, Any]] = []
    local_embedder()

    async def go(url: str) -> None:
        cache = remote_cache(f"{url}/v1")
        await remember(cache, chat(PASSWORD), "Settings > Security.")
        assert await ask(cache, chat("What is the way to reset my password?")) is not None
        await cache.aclose()

    with serve(embeddings_app(calls, {})) as url:
        asyncio.run(go(url))
    assert len(calls) == 2


@pytest.mark.parametrize("kind", ["500", "garbage", "empty", "zero", "strings", "hang"])
def test_a_failing_endpoint_is_a_miss_never_an_error(kind: str) -> None:
    calls: list[dict[str, Any]] = []

    async def go(url: str) -> None:
        cfg = CacheConfig(enabled=True, embeddings=url)
        embedder = RemoteEmbedder(url, "m", timeout=0.2)
        cache = SemanticCache.from_config(cfg, clock=ManualClock(T0), embedder=embedder)
        key = decide(cache, chat(PASSWORD)).key
        assert await cache.lookup(key) is None
        await cache.store(key, answer("Settings > Security."))
        stats = cache.stats()
        assert (stats.embedding_failures, stats.stores, stats.partitions) == (1, 1, 0)
        # The answer is still served to exact repeats (L1 needs no embedding).
        hit = await ask(cache, chat(PASSWORD))
        assert hit is not None and hit.layer == "l1"
        await embedder.aclose()

    with serve(embeddings_app(calls, {"kind": kind})) as url:
        asyncio.run(go(url))
    assert len(calls) == 1


def test_an_unreachable_endpoint_is_a_miss() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def go() -> None:
        cache = remote_cache(url)
        for text in (PASSWORD, "other"):
            key = decide(cache, chat(text)).key
            assert await cache.lookup(key) is None
            await cache.store(key, answer("an answer"))
        assert cache.stats().embedding_failures == 2
        assert await ask(cache, chat(PASSWORD)) is not None  # L1 serves it
        await cache.aclose()
    asyncio.run(go())


def test_long_texts_are_not_sent() -> None:
    calls: list[dict[str, Any]] = []

    async def go(url: str) -> None:
        cache = remote_cache(url)
        await remember(cache, chat("x" * (REMOTE_MAX_CHARS + 1)), "ok")
        assert cache.stats().embedding_failures == 0 and cache.stats().partitions == 0
        await cache.aclose()

    with serve(embeddings_app(calls, {})) as url:
        asyncio.run(go(url))
    assert calls == []
