"""Shared parts of the batch queue tests (no tests here).

A ``LoopThread`` runs one event loop in a background thread and serves FastAPI apps on it with
uvicorn on 127.0.0.1: the batch test app (the queue's router, auth from a dict of keys, the
queue's ``run()`` in the app's lifespan) and scripted upstreams. ``ControlledLoad`` and
``FakeClock`` are what the tests turn to move the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from serving.gateway.batch.queue import BatchQueue, BatchRequest
from serving.gateway.tiers import Caller, PoolLoad
from slo.planning.replica.profiles import DEFAULT_MODEL
from vigil.config import BatchConfig
from vigil.conventions import TIER_PRIORITY

T = TypeVar("T")

MODEL = DEFAULT_MODEL
POOL = "chat"
#: API key -> caller; two tenants, so isolation can be tested.
KEYS = {
    "key-alpha": Caller(tenant="alpha", tier="standard", key_id="a1a1a1a1a1a1"),
    "key-alpha-2": Caller(tenant="alpha", tier="premium", key_id="a2a2a2a2a2a2"),
    "key-beta": Caller(tenant="beta", tier="batch", key_id="b1b1b1b1b1b1"),
}
#: 2026-11-10 12:00:00 UTC: noon, outside a 01:00-06:00 window.
NOON = 1_794_312_000.0


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy (a safety deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


@dataclass
class FakeClock:
    """An injectable clock (Unix seconds) the test moves by hand; counts its readings (the
    release loop reads it once or more per poll)."""

    now: float = NOON
    calls: int = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now

    def readings_after(self, n: int) -> Callable[[], bool]:
        """A predicate: true once the clock has been read ``n`` more times from now."""
        target = self.calls + n
        return lambda: self.calls >= target


@dataclass
class ControlledLoad:
    """``load(pool)`` for the queue: the test sets the figures and counts the polls."""

    kv_cache_usage: float | None = 0.95
    queue_length: int | None = 0
    healthy_replicas: int = 1
    calls: int = 0

    def __call__(self, pool: str) -> PoolLoad:
        self.calls += 1
        return PoolLoad(self.kv_cache_usage, self.queue_length, self.healthy_replicas)

    def idle(self) -> None:
        self.kv_cache_usage, self.queue_length = 0.1, 0

    def polls_after(self, n: int) -> Callable[[], bool]:
        """A predicate: true once the queue has polled ``n`` more times from now."""
        target = self.calls + n
        return lambda: self.calls >= target


async def auth(request: Request) -> Caller:
    """Bearer key -> caller, 401 otherwise (the gateway's auth does the same job)."""
    header = request.headers.get("authorization", "")
    caller = KEYS.get(header.removeprefix("Bearer ").strip())
    if caller is None:
        raise HTTPException(401, "missing or unknown API key")
    return caller


def pool_of_model(model: str) -> str | None:
    return POOL if model == MODEL else None


class LoopThread:
    """One event loop in a daemon thread; serves apps with uvicorn on loopback ports."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="batch-test-loop")
        self._thread.start()
        self._servers: list[tuple[uvicorn.Server, asyncio.Future[None]]] = []

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(self, app: FastAPI) -> tuple[str, uvicorn.Server]:
        """Start ``app`` (lifespan on) on a free port; its base URL and server."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                               access_log=False, timeout_graceful_shutdown=2))

        async def start() -> asyncio.Future[None]:
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started:
                if task.done():
                    await task
                await asyncio.sleep(0.01)
            return task

        task = self.call(start())
        self._servers.append((server, task))
        return f"http://127.0.0.1:{port}", server

    def stop_server(self, server: uvicorn.Server) -> None:
        for s, task in list(self._servers):
            if s is server:
                s.should_exit = True
                self.call(asyncio.wait_for(asyncio.shield(task), 15))
                self._servers.remove((s, task))

    def close(self) -> None:
        for server, _ in list(self._servers):
            self.stop_server(server)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def batch_app(queue: BatchQueue) -> FastAPI:
    """The test gateway: the queue's router, and its release loop while the app runs."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(queue.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(lifespan=lifespan)
    app.include_router(queue.router())
    return app


class HttpSender:
    """``send`` for the queue: POSTs the request to an upstream at vLLM priority 2."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.sent: list[str] = []  # custom_ids, in send order (repeats included)
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, req: BatchRequest) -> tuple[int, dict[str, Any]]:
        if self._client is None:  # created in the loop that uses it
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=30.0)
        self.sent.append(req.custom_id)
        path = "/v1/chat/completions" if req.endpoint == "chat" else "/v1/completions"
        body = {**req.body, "priority": TIER_PRIORITY[req.caller.tier]}
        resp = await self._client.post(path, json=body)
        return resp.status_code, resp.json()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


@dataclass
class ScriptedUpstream:
    """An OpenAI-like upstream whose answers the test scripts.

    ``hold``: park requests until ``release`` is set; then ``fail_first``: answer
    ``fail_status`` to the first N tries of each custom_id (sent in the body as ``user``).
    """

    fail_first: int = 0
    fail_status: int = 503
    tries: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    max_waiting: int = 0
    hold: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            key = str(body.get("user"))
            self.tries[key] = self.tries.get(key, 0) + 1
            if self.hold:
                self.waiting += 1
                self.max_waiting = max(self.max_waiting, self.waiting)
                try:
                    await self.release.wait()
                finally:
                    self.waiting -= 1
            if self.tries[key] <= self.fail_first:
                return JSONResponse({"error": {"message": "scripted failure", "type": "x",
                                               "param": None, "code": self.fail_status}},
                                    status_code=self.fail_status)
            return JSONResponse({"id": f"chatcmpl-{key}", "object": "chat.completion",
                                 "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": "ok"}}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                           "total_tokens": 4}})

        return app


def chat_line(custom_id: str, *, model: str = MODEL, content: str = "Say hi.",
              max_tokens: int = 4, url: str = "/v1/chat/completions") -> dict[str, Any]:
    """One input line; ``user`` carries the custom_id so scripted upstreams can key on it."""
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": content}],
                     "max_tokens": max_tokens, "user": custom_id}}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def headers(key: str = "key-alpha") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def openai_client(client: httpx.Client, key: str = "key-alpha") -> openai.OpenAI:
    """The official client, pointed at the test gateway."""
    return openai.OpenAI(base_url=f"{str(client.base_url).rstrip('/')}/v1", api_key=key,
                         max_retries=0)


def upload(client: httpx.Client, content: bytes, *, key: str = "key-alpha",
           purpose: str = "batch") -> httpx.Response:
    return client.post("/v1/files", headers=headers(key),
                       files={"file": ("input.jsonl", content, "application/jsonl")},
                       data={"purpose": purpose})


def submit(client: httpx.Client, lines: list[Any], *, key: str = "key-alpha",
           window: str = "24h") -> dict[str, Any]:
    """Upload ``lines`` and create a batch of them; the batch object."""
    r = upload(client, jsonl(lines), key=key)
    assert r.status_code == 200, r.text
    r = client.post("/v1/batches", headers=headers(key),
                    json={"input_file_id": r.json()["id"], "endpoint": "/v1/chat/completions",
                          "completion_window": window})
    assert r.status_code == 200, r.text
    return r.json()


def get_batch(client: httpx.Client, batch_id: str, key: str = "key-alpha") -> dict[str, Any]:
    r = client.get(f"/v1/batches/{batch_id}", headers=headers(key))
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(client: httpx.Client, batch_id: str, *statuses: str,
                key: str = "key-alpha") -> dict[str, Any]:
    return wait_until(lambda: (b := get_batch(client, batch_id, key))["status"] in statuses
                      and b, what=f"batch {batch_id} to reach {statuses}")


def file_lines(client: httpx.Client, file_id: str, key: str = "key-alpha"
               ) -> list[dict[str, Any]]:
    r = client.get(f"/v1/files/{file_id}/content", headers=headers(key))
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines()]


def batch_config(**overrides: Any) -> BatchConfig:
    """Fast polling for tests (the default is 1 s)."""
    return BatchConfig(**{"poll_interval": 0.02, **overrides})


@contextlib.contextmanager
def running_queue(loop: LoopThread, path: Path, cfg: BatchConfig, *, send: Any,
                  load: ControlledLoad, clock: Callable[[], float] = time.time,
                  pools: list[str] | None = None, **kw: Any
                  ) -> Iterator[tuple[httpx.Client, BatchQueue]]:
    """A queue on ``path`` served by the test gateway app; an HTTP client for it."""
    queue = BatchQueue(path, cfg, pools=pools or [POOL], load=load, send=send, auth=auth,
                       clock=clock, pool_of_model=pool_of_model, **kw)
    base, server = loop.serve(batch_app(queue))
    try:
        with httpx.Client(base_url=base, timeout=30.0) as client:
            yield client, queue
    finally:
        loop.stop_server(server)
        queue.close()


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    """A ``LoopThread`` for one test, closed after it (import it into the test module)."""
    lt = LoopThread()
    yield lt
    lt.close()
