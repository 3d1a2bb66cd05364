"""The gateway's HTTP/1.1 client for its replicas: keep-alive connections on asyncio protocols.

Why our own and not httpx (which the gateway uses for its polls) or aiohttp: relaying a stream
costs one network read per SSE event, and on the request path the client's share of that was
most of the gateway's CPU. CPU per streamed request with 20 chunks, read to its end on uvloop
(``bench/gateway_bench.py --compare-clients``, loopback): httpx about 1.9 ms (httpcore's
pure-Python h11 and anyio stream layers on every read; its pool also walks all of its
connections on every request start and end, encode/httpcore#1035), aiohttp 0.4-0.5 ms, this
client 0.25 ms; with one chunk 0.76, 0.15-0.18 and 0.05-0.08 ms. What the gateway needs is
small: POST a body, read the response head, then the body as it arrives, and keep the
connection for the next request when the response was read to its end. Parsing is a library's:
httptools (llhttp, in C, uvicorn's own parser) when installed, else h11 (pure Python, a
dependency of uvicorn and httpx, so always there). No redirects, cookies, proxies, compression
or HTTP/2: a replica is a vLLM server named in the config.

Each connection is an ``asyncio.Protocol`` and the target of the parser's callbacks, which
append body bytes to the response and wake its reader, one future per wait. An upstream silent
for ``read_timeout`` seconds (no byte while someone waits for one) fails with ``ReadTimeout``;
the timer is re-armed lazily, not once per read. A reader slower than the replica pauses the
socket past ``BUFFER_LIMIT`` bytes, so memory stays bounded and TCP pushes back on the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import h11

from vigil.errors import ConfigError

try:  # the C parser, from uvicorn[standard]; h11 below without it
    import httptools
except ImportError:  # pragma: no cover - depends on what is installed
    httptools = None

__all__ = [
    "BUFFER_LIMIT",
    "BrokenResponse",
    "ConnectFailed",
    "ReadTimeout",
    "ReplicaConnections",
    "Response",
    "UpstreamError",
    "parser_name",
]

#: Body bytes buffered for a reader before the socket is paused.
BUFFER_LIMIT = 256 * 1024


class UpstreamError(Exception):
    """A request to a replica failed; the message says how."""


class ConnectFailed(UpstreamError):
    """The connection could not be made: nothing was sent."""


class ReadTimeout(UpstreamError, TimeoutError):
    """The replica sent nothing for ``read_timeout`` seconds."""


class BrokenResponse(UpstreamError):
    """The connection was reset or closed before the answer ended, or the answer is not HTTP."""


def parser_name() -> str:
    """Which HTTP parser the client uses: ``httptools`` or ``h11``."""
    return "h11" if httptools is None else "httptools"


# --- h11, when httptools is not installed ------------------------------------------------------

class _H11Parser:
    """h11's client state machine (pure Python) behind httptools' interface: ``feed_data``,
    and the same calls on the connection (``head``, ``on_body``, ``end``)."""

    __slots__ = ("_conn", "_h11")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._h11 = h11.Connection(h11.CLIENT)

    def request(self, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Move h11 through the request we sent (its bytes are ours, already written)."""
        h = self._h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
        h.send(h11.Request(method=b"POST", target=target, headers=[
            *headers, (b"content-length", str(len(body)).encode())]))
        h.send(h11.Data(data=body))
        h.send(h11.EndOfMessage())

    def feed_data(self, data: bytes) -> None:
        self._h11.receive_data(data)
        self._drain()

    def eof(self) -> None:
        with contextlib.suppress(h11.RemoteProtocolError):  # cut short: the caller knows
            self._h11.receive_data(b"")
            self._drain()

    def _drain(self) -> None:
        h, conn = self._h11, self._conn
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                conn.head(event.status_code, list(event.headers), True)
            elif isinstance(event, h11.Data):
                conn.on_body(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                conn.end(h.their_state is h11.DONE and h.our_state is h11.DONE)
                return
            elif isinstance(event, h11.ConnectionClosed):
                return


# --- a response and its connection --------------------------------------------------------------

class Response:
    """A replica's answer: ``status`` and headers once ``ReplicaConnections.post`` returns, the
    body read with ``read()``. ``close()`` it when done (always; it is idempotent)."""

    __slots__ = ("_closed", "_conn", "_error", "_has_head", "_timer", "buffered", "chunks",
                 "complete", "detached", "headers", "keep_alive", "last_read", "status",
                 "until_close", "waiter")

    def __init__(self, conn: _Connection, now: float) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        #: The body ends when the connection does (neither a length nor chunks).
        self.until_close = False
        self.complete = False
        #: Body bytes received and not yet read.
        self.buffered = 0
        #: Loop time of the last byte from the replica (or of sending the request).
        self.last_read = now
        #: Body bytes received and not yet read (the connection appends to it).
        self.chunks: list[bytes] = []
        self._error: UpstreamError | None = None
        self._has_head = False
        self._closed = False
        #: Nobody reads any more (``detach``): the rest of the body is dropped.
        self.detached = False
        #: The reader's future while it waits for the replica.
        self.waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def header(self, name: bytes) -> str | None:
        """The value of response header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def at_eof(self) -> bool:
        """The whole body arrived and was read."""
        return self.complete and not self.chunks

    async def wait_head(self) -> None:
        """Wait for the status line and headers."""
        while not self._has_head:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read, waiting for some; ``b""`` once the
        body is complete. Raises ``UpstreamError`` when it cannot be completed."""
        chunks = self.chunks
        while not chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self._conn.paused:
            self._conn.resume()
        return data

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body; ``BrokenResponse`` past ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while data := await self.read():
            size += len(data)
            if size > limit:
                raise BrokenResponse(f"the answer is larger than {limit} bytes")
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Done with it: the connection goes back to the pool when the answer ended cleanly,
        else it is closed (and the replica drops the request, as vLLM does on a disconnect)."""
        if self._closed:
            return
        self._closed = True
        self._stop_timer()
        conn = self._conn
        conn.response = None
        if self.complete and self.keep_alive and self._error is None:
            conn.release()
        else:
            conn.close()

    def detach(self, grace: float) -> None:
        """Done reading, the answer being whole (an SSE stream's ``[DONE]`` came): the rest of
        the body (a chunked body's last, empty chunk, which vLLM sends in a write of its own)
        is dropped as it arrives, and the connection goes back to the pool when the body ends,
        or is closed if that takes more than ``grace`` seconds. Nobody waits for it."""
        if self._closed:
            return
        if self.complete or self._error is not None:
            self.close()
            return
        self.detached = True
        self.chunks.clear()
        self.buffered = 0
        self._conn.resume()
        self._stop_timer()
        self._timer = self._conn.loop.call_later(grace, self.close)

    # --- what the connection tells -------------------------------------------------------------

    def on_head(self, status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        framed = False  # a length or chunks say where the body ends (one pass: per request)
        for k, v in headers:
            if k == b"content-length" or (k == b"transfer-encoding" and b"chunked" in v.lower()):
                framed = True
                break
        self.until_close = not framed and status not in (204, 304)
        self._has_head = True
        self._wake()

    def on_end(self) -> None:
        self.complete = True
        self._stop_timer()
        if self.detached:
            self.close()
            return
        self._wake()

    def fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._stop_timer()
        if self.detached:
            self.close()
            return
        self._wake()

    # --- waiting, with the read timeout ----------------------------------------------------------

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        conn = self._conn
        waiter = self.waiter = conn.loop.create_future()
        if self._timer is None:
            self._timer = conn.loop.call_at(self.last_read + conn.pool.read_timeout,
                                            self._check_timeout)
        try:
            await waiter
        finally:
            self.waiter = None

    def _check_timeout(self) -> None:
        self._timer = None
        if self.complete or self._error is not None or self._closed:
            return
        conn = self._conn
        timeout = conn.pool.read_timeout
        now = conn.loop.time()
        if conn.paused or self.waiter is None:
            # Paused for a slow reader, or nobody waiting: not the replica's silence.
            self.last_read = now
        elif now - self.last_read >= timeout:
            self.fail(ReadTimeout(f"no answer for {timeout:g} s"))
            conn.close()
            return
        self._timer = conn.loop.call_at(self.last_read + timeout, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica, at most one response at a time; also the target
    of httptools' callbacks (``on_header`` ... ``on_message_complete``), so a body read costs
    one Python call between the parser and the waiting reader."""

    def __init__(self, pool: ReplicaConnections) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.h11: _H11Parser | None = None
        self.parser: Any
        if httptools is not None:
            self.parser = httptools.HttpResponseParser(self)
        else:
            self.parser = self.h11 = _H11Parser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._headers: list[tuple[bytes, bytes]] = []

    def send(self, head: bytes, body: bytes, target: bytes,
             headers: list[tuple[bytes, bytes]]) -> Response:
        """Write a request; its response, to be read."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise BrokenResponse("the connection closed before the request was sent")
        if self.h11 is not None:
            self.h11.request(target, headers, body)
        response = self.response = Response(self, self.loop.time())
        transport.write(head + body)
        return response

    def release(self) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        self.idle_since = self.loop.time()
        self.pool.put_back(self)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: the connection is not usable
            self.close()
            return
        response.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # the parser's error: not HTTP, or not the HTTP we expect
            response.fail(BrokenResponse(f"the answer is not valid HTTP ({exc})"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        response = self.response
        if response is None or response.complete:
            return
        if response.status and response.until_close:
            if self.h11 is not None:
                self.h11.eof()
            response.keep_alive = False
            response.on_end()
            return
        what = "in the middle of the answer" if response.status else "before answering"
        reason = f": {type(exc).__name__}: {exc}".rstrip(": ") if exc else ""
        response.fail(BrokenResponse(f"the replica closed the connection {what}{reason}"))

    # --- the parser's calls (httptools' names; h11's adapter calls the same) ---------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        headers, self._headers = self._headers, []
        self.head(self.parser.get_status_code(), headers, self.parser.should_keep_alive())

    def head(self, status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool) -> None:
        if self.response is not None:
            self.response.on_head(status, headers, keep_alive)

    def on_body(self, data: bytes) -> None:
        response = self.response
        if response is None or response.detached:
            return
        # Response.on_body, inlined: this runs once per SSE event.
        response.chunks.append(data)
        response.buffered += len(data)
        waiter = response.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if response.buffered > BUFFER_LIMIT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.end(None)

    def end(self, keep_alive: bool | None) -> None:
        response = self.response
        if response is None:
            return
        if keep_alive is not None:
            response.keep_alive = keep_alive
        response.on_end()


class ReplicaConnections:
    """Keep-alive connections to one replica (``base_url``: ``http[s]://host:port[/prefix]``).

    ``connect_timeout`` and ``read_timeout`` in seconds; an idle connection is reused for
    ``keepalive`` seconds at most. Make it inside the running event loop.
    """

    def __init__(self, base_url: str, *, connect_timeout: float, read_timeout: float,
                 keepalive: float, headers: dict[str, str]) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"a replica's API base must be an http:// or https:// URL, got "
                              f"{base_url!r}", key="targets.api_url")
        self.loop = asyncio.get_running_loop()
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (ssl.create_default_context()
                                            if url.scheme == "https" else None)
        self._prefix = url.path.rstrip("/").encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self._headers = [(b"host", url.netloc.encode()),
                         *((k.lower().encode(), v.encode()) for k, v in headers.items())]
        fixed = b"".join(b"%s: %s\r\n" % kv for kv in self._headers)
        self._fixed_head = fixed
        self._heads: dict[str, tuple[bytes, bytes]] = {}
        #: Idle connections, most recently used last (reused first).
        self._idle: dict[_Connection, None] = {}
        self._all: set[_Connection] = set()

    def _head(self, path: str) -> tuple[bytes, bytes]:
        found = self._heads.get(path)
        if found is None:
            target = self._prefix + path.encode()
            found = self._heads[path] = (target, b"POST " + target + b" HTTP/1.1\r\n"
                                         + self._fixed_head)
        return found

    async def post(self, path: str, body: bytes, *, extra: bytes = b"") -> Response:
        """POST ``body`` to ``path``; the response once its head arrived (read its body, then
        ``close()`` it). Cancelled before that, the connection is closed. ``extra``: header
        lines of this request alone (``name: value\r\n`` each, e.g. ``traceparent``)."""
        conn = self._take() or await self._connect()
        target, head = self._head(path)
        length = str(len(body)).encode()
        response = conn.send(head + extra + b"content-length: " + length + b"\r\n\r\n", body,
                             target, self._headers)
        try:
            await response.wait_head()
        except BaseException:
            response.close()
            raise
        return response

    def _take(self) -> _Connection | None:
        now = self.loop.time()
        while self._idle:
            conn, _ = self._idle.popitem()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.keepalive:
                conn.close()  # the replica may be closing it right now
                continue
            return conn
        return None

    async def _connect(self) -> _Connection:
        factory: Callable[[], _Connection] = lambda: _Connection(self)  # noqa: E731
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(
                    factory, self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None)
        except TimeoutError:
            raise ConnectFailed(f"connecting timed out after {self.connect_timeout:g} s"
                                ) from None
        except OSError as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        self._all.add(conn)
        return conn

    def put_back(self, conn: _Connection) -> None:
        self._idle[conn] = None

    def forget(self, conn: _Connection) -> None:
        self._idle.pop(conn, None)
        self._all.discard(conn)

    def connections(self) -> int:
        """Open connections (in use or idle)."""
        return len(self._all)

    async def aclose(self) -> None:
        """Close every connection."""
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        self._all.clear()
        await asyncio.sleep(0)  # let the transports finish closing
