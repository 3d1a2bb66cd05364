"""The gateway's own HTTP/1.1 client (``serving.gateway.upstream.http_client``) against real
loopback servers: keep-alive reuse, bodies as they arrive, timeouts, broken answers, closing an
unfinished answer, back-pressure. Every test runs with httptools and with the h11 fallback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from support.gateway import MODEL, ScriptedUpstream, scripted_upstream
from support.loopback import free_port

from serving.gateway.upstream import http_client as upstream_http
from serving.gateway.upstream.http_client import (
    BUFFER_LIMIT,
    BrokenResponse,
    ConnectFailed,
    ReadTimeout,
    ReplicaConnections,
)

CHAT = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "h11":
        monkeypatch.setattr(upstream_http, "httptools", None)
    else:
        pytest.importorskip("httptools")
    assert upstream_http.parser_name() == request.param
    return str(request.param)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with scripted_upstream() as up:
        yield up


@pytest.fixture(autouse=True)
def _ok(upstream: ScriptedUpstream) -> Iterator[None]:
    upstream.mode = "ok"
    yield
    upstream.mode = "ok"


def run(base: str, body: Callable[[ReplicaConnections], Awaitable[Any]], *,
        read_timeout: float = 5.0) -> Any:
    """``body(connections)`` in a fresh event loop; the connections are closed after it."""
    async def main() -> Any:
        pool = ReplicaConnections(base, connect_timeout=2.0, read_timeout=read_timeout,
                                  keepalive=4.0, headers=HEADERS)
        try:
            return await body(pool)
        finally:
            await pool.aclose()
    return asyncio.run(main())


def _body(stream: bool) -> bytes:
    return json.dumps({"model": MODEL, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_the_connection_is_kept_for_the_next_request(parser: str,
                                                     upstream: ScriptedUpstream) -> None:
    async def body(pool: ReplicaConnections) -> list[tuple[int, str]]:
        out = []
        for _ in range(3):
            r = await pool.post(CHAT, _body(False))
            text = (await r.read_all(1 << 20)).decode()
            r.close()
            out.append((r.status, json.loads(text)["choices"][0]["message"]["content"]))
            assert pool.connections() == 1
        return out

    assert run(upstream.url, body) == [(200, "Hello there.")] * 3
    assert upstream.bodies[-1]["stream"] is False


def test_a_stream_is_read_as_it_arrives(parser: str, upstream: ScriptedUpstream) -> None:
    upstream.tokens = 4

    async def body(pool: ReplicaConnections) -> tuple[str | None, bytes, bool]:
        r = await pool.post(CHAT, _body(True))
        data = b""
        while piece := await r.read():
            data += piece
        r.close()
        return r.header(b"content-type"), data, r.at_eof

    ctype, data, at_eof = run(upstream.url, body)
    assert ctype == "text/event-stream" and at_eof
    events = [e for e in data.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and len(events) == 4 + 2  # tokens, usage, [DONE]


def test_a_silent_replica_times_out(parser: str, upstream: ScriptedUpstream) -> None:
    upstream.mode = "hang"

    async def body(pool: ReplicaConnections) -> None:
        await pool.post(CHAT, _body(False))

    with pytest.raises(ReadTimeout, match=r"no answer for 0\.3 s"):
        run(upstream.url, body, read_timeout=0.3)


def test_a_stream_that_stalls_times_out_mid_way(parser: str, upstream: ScriptedUpstream) -> None:
    upstream.mode = "hang_after_first"

    async def body(pool: ReplicaConnections) -> bytes:
        r = await pool.post(CHAT, _body(True))
        try:
            first = await r.read()
            with pytest.raises(ReadTimeout):
                await r.read()
            return first
        finally:
            r.close()

    assert b"Hello" in run(upstream.url, body, read_timeout=0.3)


@pytest.mark.parametrize(("mode", "message"), [
    ("reset", "closed the connection before answering"),
    ("close", "closed the connection before answering"),
    ("garbage", "not valid HTTP"),
])
def test_broken_answers(parser: str, upstream: ScriptedUpstream, mode: str,
                        message: str) -> None:
    upstream.mode = mode

    async def body(pool: ReplicaConnections) -> None:
        await pool.post(CHAT, _body(False))

    with pytest.raises(BrokenResponse, match=message):
        run(upstream.url, body)


def test_a_stream_cut_short_is_broken(parser: str, upstream: ScriptedUpstream) -> None:
    upstream.mode = "stream_cut"

    async def body(pool: ReplicaConnections) -> None:
        r = await pool.post(CHAT, _body(True))
        try:
            while await r.read():
                pass
        finally:
            r.close()

    with pytest.raises(BrokenResponse, match="in the middle of the answer"):
        run(upstream.url, body)


def test_connection_refused(parser: str) -> None:
    async def body(pool: ReplicaConnections) -> None:
        await pool.post(CHAT, _body(False))

    with pytest.raises(ConnectFailed):
        run(f"http://127.0.0.1:{free_port()}", body)


async def _watching_server(answer: bytes) -> tuple[asyncio.Server, asyncio.Event]:
    """A loopback server that writes ``answer`` to a request, then sets the event when the
    client closes the connection."""
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        closed.set()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), closed


@pytest.mark.parametrize("answer", [
    b"",  # cancelled before the head
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
    b"\r\n\r\n6\r\ndata: \r\n",  # closed after the first piece
], ids=["before-head", "mid-stream"])
def test_leaving_an_unfinished_answer_closes_its_connection(parser: str, answer: bytes) -> None:
    async def main() -> int:
        server, closed = await _watching_server(answer)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = ReplicaConnections(base, connect_timeout=2, read_timeout=30, keepalive=4,
                                  headers=HEADERS)
        if answer:
            r = await pool.post(CHAT, b"{}")
            assert await r.read() == b"data: "
            r.close()  # the client left: the replica must see its connection go
        else:
            task = asyncio.ensure_future(pool.post(CHAT, b"{}"))
            await asyncio.sleep(0.1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.wait_for(closed.wait(), 5)  # a safety deadline, not a timing assertion
        n = pool.connections()
        await pool.aclose()
        server.close()
        return n

    assert asyncio.run(main()) == 0


def test_detached_stream_keeps_its_connection_once_the_body_ends(
        parser: str, upstream: ScriptedUpstream) -> None:
    async def body(pool: ReplicaConnections) -> int:
        for _ in range(2):
            r = await pool.post(CHAT, _body(True))
            data = b""
            while b"[DONE]" not in data:
                data += await r.read()
            r.detach(grace=5.0)  # the end of the chunked body may still be on its way
            await asyncio.sleep(0.05)
        return pool.connections()

    assert run(upstream.url, body) == 1


@contextlib.asynccontextmanager
async def raw_server(answer: bytes, *, close: bool) -> AsyncIterator[str]:
    """A loopback server answering every request with ``answer`` (then closing, if asked).
    On exit it waits for its connections to end: a handler cancelled at the loop's shutdown
    makes Python 3.11's ``asyncio.streams`` log an error."""
    open_handlers = 0
    idle = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_handlers
        open_handlers += 1
        idle.clear()
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:"))
                    await reader.readexactly(length)
                    writer.write(answer)
                    await writer.drain()
                    if close:
                        break
            writer.close()
        finally:
            open_handlers -= 1
            if not open_handlers:
                idle.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        if open_handlers:
            await asyncio.wait_for(idle.wait(), 5)  # the client closed its connections


def test_a_body_read_until_the_close(parser: str) -> None:
    async def main() -> tuple[bytes, int]:
        answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"ok\": true}"
        async with raw_server(answer, close=True) as base:
            pool = ReplicaConnections(base, connect_timeout=2, read_timeout=5, keepalive=4,
                                      headers=HEADERS)
            r = await pool.post(CHAT, b"{}")
            data = await r.read_all(1000)
            r.close()
            await asyncio.sleep(0)
            n = pool.connections()
            await pool.aclose()
            return data, n

    assert asyncio.run(main()) == (b'{"ok": true}', 0)


def test_a_slow_reader_pauses_the_socket_and_gets_everything(parser: str) -> None:
    size = 8 * BUFFER_LIMIT
    payload = bytes(range(256)) * (size // 256)

    async def main() -> tuple[bool, bytes]:
        answer = (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                  b"content-length: " + str(size).encode() + b"\r\n\r\n" + payload)
        async with raw_server(answer, close=False) as base:
            pool = ReplicaConnections(base, connect_timeout=2, read_timeout=5, keepalive=4,
                                      headers=HEADERS)
            r = await pool.post(CHAT, b"{}")
            deadline = time.monotonic() + 5
            conn = r._conn
            while not conn.paused and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # nobody reads: the buffer fills, then pauses
            paused, buffered = conn.paused, r.buffered
            assert buffered <= BUFFER_LIMIT + 256 * 1024  # bounded near the limit
            data = await r.read_all(2 * size)
            r.close()
            await pool.aclose()
            return paused, data

    paused, data = asyncio.run(main())
    assert paused and data == payload
