"""Shared parts of the semantic-cache tests: the real local embedder (loaded once per process),
bodies and responses in vLLM's shapes, and uvicorn apps on 127.0.0.1."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from serving.cache import LocalEmbedder, SemanticCache
from serving.sim.protocol import chat_response, completion_response
from vigil.clock import ManualClock
from vigil.config import CacheConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
T0 = 1_795_000_000.0


@functools.cache
def local_embedder() -> LocalEmbedder:
    """The real all-MiniLM-L6-v2, loaded once for the whole test process (seconds)."""
    embedder = LocalEmbedder()
    embedder.load()
    return embedder


def config(**overrides: Any) -> CacheConfig:
    """An enabled cache config; ``overrides`` are CacheConfig fields."""
    return CacheConfig(**{"enabled": True, **overrides})


def make_cache(clock: ManualClock | None = None, **overrides: Any) -> SemanticCache:
    """A cache on the real local model and a manual clock at ``T0``."""
    return SemanticCache.from_config(config(**overrides), clock=clock or ManualClock(T0),
                                     embedder=local_embedder())


def chat(text: str, *, system: str | None = None, history: list[dict[str, Any]] | None = None,
         temperature: float | None = 0, **extra: Any) -> dict[str, Any]:
    """A chat request body (greedy by default)."""
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages += history or []
    messages.append({"role": "user", "content": text})
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 512}
    if temperature is not None:
        body["temperature"] = temperature
    return {**body, **extra}


def answer(text: str, *, finish_reason: str = "stop") -> dict[str, Any]:
    """A vLLM chat.completion (the simulator's exact shape)."""
    return chat_response(rid="chatcmpl-upstream0000", created=int(T0), model=MODEL, text=text,
                         finish_reason=finish_reason, prompt_tokens=12,
                         completion_tokens=len(text.split()))


def completion_answer(text: str) -> dict[str, Any]:
    """A vLLM text_completion (the simulator's exact shape)."""
    return completion_response(rid="cmpl-upstream0000", created=int(T0), model=MODEL,
                               text=text, finish_reason="stop", prompt_tokens=5,
                               completion_tokens=len(text.split()))


def decide(cache: SemanticCache, body: dict[str, Any], *, tenant: str = "acme",
           pool: str = "chat", endpoint: str = "chat",
           headers: dict[str, str] | None = None) -> Any:
    """``cache.decide`` with the usual defaults."""
    return cache.decide(pool=pool, tenant=tenant, endpoint=endpoint, body=body,
                        headers=headers or {})


async def remember(cache: SemanticCache, body: dict[str, Any], text: str,
                   **kwargs: Any) -> None:
    """Look ``body`` up (a miss) and store ``text`` as its answer, as the gateway does."""
    key = decide(cache, body, **kwargs).key
    assert key is not None
    assert await cache.lookup(key) is None
    await cache.store(key, answer(text))


async def ask(cache: SemanticCache, body: dict[str, Any], **kwargs: Any) -> Any:
    """The CacheHit for ``body`` (None on a miss)."""
    key = decide(cache, body, **kwargs).key
    assert key is not None, "the request bypassed the cache"
    return await cache.lookup(key)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        else:
            raise RuntimeError("uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
