"""Shared parts of the gateway tests (no tests here).

``running_gateway`` serves the real gateway app with uvicorn on a free loopback port, in a thread
with its own event loop; ``gateway_config`` builds a config whose pool's replicas are a running
simulated fleet (``serving.sim.testing.running_fleet``) or any loopback upstream. Three API keys
are configured, one per tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn

from serving.gateway.front.api_keys import key_sha256
from serving.gateway.front.app import create_app
from serving.gateway.front.uvicorn_protocol import protocol
from serving.gateway.gateway import Gateway
from slo.planning.replica.profiles import DEFAULT_MODEL
from slo.sources.request_log import GatewayRecords
from support.loopback import free_port
from vigil.config import Config, parse_config
from vigil.storage.gateway_records import GatewayRecord
from vigil_shell.gateway_cli import server_choices

MODEL = DEFAULT_MODEL
POOL = "chat"
#: key -> (tenant, tier)
KEYS = {
    "sk-premium": ("acme", "premium"),
    "sk-standard": ("acme", "standard"),
    "sk-batch": ("nightly", "batch"),
    "sk-other": ("globex", "standard"),
}
PREMIUM, STANDARD, BATCH, OTHER = KEYS


def gateway_config(tmp_path: Path, upstream_urls: list[str], *, model: str = MODEL,
                   gateway: dict[str, Any] | None = None, pool: dict[str, Any] | None = None,
                   prices: dict[str, float] | None = None) -> Config:
    """A config with one pool ``chat`` whose vLLM replicas are ``upstream_urls`` (bases)."""
    gw: dict[str, Any] = {
        "records_path": str(tmp_path / "gateway.db"),
        "health_interval": "0.2s",
        "api_keys": [{"sha256": key_sha256(k), "tenant": t, "tier": tier}
                     for k, (t, tier) in KEYS.items()],
    }
    gw.update(gateway or {})
    data: dict[str, Any] = {
        "pools": [{"name": POOL, "model": model, "gpu": "H100", **(pool or {})}],
        "targets": [{"name": f"{POOL}-{i}", "url": f"{u.rstrip('/')}/metrics", "pool": POOL}
                    for i, u in enumerate(upstream_urls)],
        "gateway": gw,
    }
    if prices is not None:
        data["prices"] = prices
    return parse_config(data)


class _Server(uvicorn.Server):
    """uvicorn without signal handlers (it runs in a thread)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class GatewayHandle:
    """A running gateway."""

    url: str
    gateway: Gateway
    cfg: Config
    loop: asyncio.AbstractEventLoop

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def client(self, key: str = STANDARD, **kw: Any) -> openai.OpenAI:
        """The official client, unchanged, pointed at the gateway."""
        return openai.OpenAI(base_url=self.api, api_key=key, max_retries=0, **kw)

    def http(self, key: str | None = STANDARD, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn`` (sync, or returning a coroutine) on the gateway's event loop."""
        async def run() -> Any:
            out = fn()
            if asyncio.iscoroutine(out):
                out = await out
            return out
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def records(self) -> GatewayRecords:
        return GatewayRecords(self.cfg.gateway_records_path())

    def record(self, request_id: str, timeout: float = 10.0) -> GatewayRecord:
        """The record of ``request_id`` once it is written."""
        reader = self.records()
        found = wait_until(lambda: reader.get(request_id), timeout=timeout,
                           what=f"record {request_id}")
        assert isinstance(found, GatewayRecord)
        return found

    def all_records(self) -> list[GatewayRecord]:
        self.gateway.records.flush()
        return self.records().rows(None, time.time() + 3600, 10 * 86400)


def wait_until(predicate: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> Any:
    """Poll ``predicate`` until truthy (a safety deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


@contextlib.contextmanager
def running_gateway(cfg: Config, **kw: Any) -> Iterator[GatewayHandle]:
    """Serve ``create_app(cfg, **kw)`` on a free loopback port until the block ends."""
    port = free_port()
    app = create_app(cfg, **kw)
    # The protocol ``vigil gateway`` serves with (server_http), so the tests cover it too.
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                    access_log=False, lifespan="on",
                                    timeout_graceful_shutdown=2,
                                    http=protocol(server_choices()[1])))
    loops: list[asyncio.AbstractEventLoop] = []
    errors: list[BaseException] = []

    def main() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        try:
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="gateway", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or errors or not thread.is_alive(), timeout=20,
                   what="the gateway to start")
        if errors or not server.started:
            raise RuntimeError(f"the gateway did not start: {errors}")
        yield GatewayHandle(url=f"http://127.0.0.1:{port}", gateway=app.state.gateway,
                            cfg=cfg, loop=loops[0])
    finally:
        server.should_exit = True
        thread.join(20)


# --- a scripted upstream: a raw HTTP/1.1 server that misbehaves on demand ------------------

_CHAT = {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 1, "model": MODEL,
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."},
                      "logprobs": None, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def _chunk(content: str | None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
                            "created": 1, "model": MODEL}
    if content is None:
        body["choices"] = []
    else:
        body["choices"] = [{"index": 0, "delta": {"content": content}, "logprobs": None,
                            "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class ScriptedUpstream:
    """A loopback HTTP/1.1 server standing in for a vLLM replica whose answers the test picks.

    ``GET /health`` answers 200 and ``GET /metrics`` the three vLLM gauges (``kv``,
    ``waiting``); a POST does what ``mode`` says: ``ok`` (a chat completion, or an SSE stream of
    ``tokens`` chunks when the body asks to stream), ``hang``, ``hang_after_first`` (stream: one
    chunk, then silence), ``reset`` (TCP RST), ``close`` (close without answering), ``garbage``
    (not HTTP), ``json_garbage`` (200 whose body is not JSON), ``error_500``, ``oom`` (500 with
    vLLM's OOM message), ``html_502``, ``stream_garbage``, ``stream_cut`` (one chunk, then the
    connection closes without ``[DONE]``). Received bodies are kept in ``bodies``.
    """

    def __init__(self) -> None:
        self.mode = "ok"
        self.kv = 0.1
        self.waiting = 0
        self.tokens = 3
        self.healthy = True
        self.bodies: list[dict[str, Any]] = []
        self.open_connections = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve_conn(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._answer(method, target, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return
        finally:
            self.open_connections -= 1
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    def _head(status: int, ctype: str, length: int | None = None) -> bytes:
        h = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n"
        h += f"Content-Length: {length}\r\n" if length is not None else \
            "Transfer-Encoding: chunked\r\n"
        return (h + "\r\n").encode()

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        writer.write(self._head(status, "application/json", len(data)) + data)
        await writer.drain()

    @staticmethod
    def _piece(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    async def _answer(self, method: str, target: str, body: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False to close the connection."""
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/health":
            writer.write(self._head(200 if self.healthy else 503, "text/plain", 0))
            await writer.drain()
            return True
        if method == "GET" and path == "/metrics":
            text = (f"# TYPE vllm:kv_cache_usage_perc gauge\n"
                    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {self.kv}\n'
                    f"# TYPE vllm:num_requests_waiting gauge\n"
                    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} '
                    f"{self.waiting}\n"
                    f"# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0\n').encode()
            writer.write(self._head(200, "text/plain; version=0.0.4", len(text)) + text)
            await writer.drain()
            return True
        try:
            req = json.loads(body)
        except ValueError:
            req = {}
        self.bodies.append(req)
        mode = self.mode
        stream = bool(req.get("stream"))
        if mode == "ok" and not stream:
            await self._send_json(writer, 200, _CHAT)
            return True
        if mode in ("ok", "hang_after_first", "stream_garbage", "stream_cut"):
            writer.write(self._head(200, "text/event-stream"))
            writer.write(self._piece(_chunk("Hello")))
            await writer.drain()
            if mode == "hang_after_first":
                await asyncio.sleep(3600)
            if mode == "stream_garbage":
                writer.write(self._piece(b"data: this is not json\n\n"))
                await writer.drain()
                await asyncio.sleep(3600)
            if mode == "stream_cut":
                await writer.drain()
                return False
            for i in range(1, self.tokens):
                last = i == self.tokens - 1
                writer.write(self._piece(_chunk(f" w{i}", "stop" if last else None)))
            usage = {"prompt_tokens": 7, "completion_tokens": self.tokens,
                     "total_tokens": 7 + self.tokens}
            writer.write(self._piece(_chunk(None, usage=usage)))
            writer.write(self._piece(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            return True
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if mode == "close":
            return False
        if mode == "garbage":
            writer.write(b"this is not HTTP at all\r\n\r\n")
            await writer.drain()
            return False
        if mode == "json_garbage":
            data = b"<html>oops</html>"
            writer.write(self._head(200, "application/json", len(data)) + data)
            await writer.drain()
            return True
        if mode == "error_500":
            await self._send_json(writer, 500, {"error": {
                "message": "EngineCore encountered an issue.", "type": "InternalServerError",
                "param": None, "code": 500}})
            return True
        if mode == "oom":
            await self._send_json(writer, 500, {"error": {
                "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
                "type": "InternalServerError", "param": None, "code": 500}})
            return True
        if mode == "html_502":
            data = b"<html><body>Bad Gateway</body></html>"
            writer.write(self._head(502, "text/html", len(data)) + data)
            await writer.drain()
            return True
        raise AssertionError(f"unknown mode {mode!r}")


@contextlib.contextmanager
def scripted_upstream() -> Iterator[ScriptedUpstream]:
    """Run a ``ScriptedUpstream`` on a free loopback port in its own thread."""
    up = ScriptedUpstream()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        server = await asyncio.start_server(up._serve_conn, "127.0.0.1", 0)
        up.port = server.sockets[0].getsockname()[1]
        holder["server"] = server
        holder["stop"] = asyncio.Event()
        ready.set()
        await holder["stop"].wait()
        server.close()
        # Connections still open (a hanging answer) end with the server: nothing is left for
        # the garbage collector to finalise later, in the middle of another test.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True,
                              name="scripted-upstream")
    thread.start()
    ready.wait(10)
    try:
        yield up
    finally:
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(5)
        if not thread.is_alive():
            loop.close()
