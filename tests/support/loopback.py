"""Shared test helpers: the one loopback HTTP server of the suite, and canned expositions.

``LoopbackServer`` is a real HTTP server on 127.0.0.1 (a free port) in a thread. Every request,
whatever its method, is recorded (``requests``) before ``respond`` answers it, so a responder
that blocks still leaves a trace. The ``http_server`` fixture (``conftest.py``) yields one that
is shut down at teardown; ``serve_http`` is the same as a context manager.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from serving.sim.testing import free_port_block

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

#: ``serve_forever``'s poll interval (seconds): ``shutdown()`` waits up to this long.
POLL_INTERVAL_S = 0.02


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, for a server that a test starts itself or passes to
    a program on its command line (which cannot report a port it bound to 0). Under pytest it
    comes from this worker's own range (``conftest.py`` sets ``VIGIL_TEST_PORTS``)."""
    return free_port_block(1)


T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 30.0,
             interval_s: float = 0.1, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``check`` every ``interval_s`` seconds until it returns something truthy, and
    return that; exceptions of the types in ``ignore`` count as "not yet". AssertionError
    naming ``what`` after ``timeout_s`` seconds (a bound on the wait, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with suppress(*ignore):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


@dataclass
class Request:
    """One request the server got (header names lower-case), and the status it answered
    (0 while the responder is still deciding)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0

    @property
    def key(self) -> str:
        """The ``Idempotency-Key`` header Vigil's notifier sends ("" when absent)."""
        return self.headers.get("idempotency-key", "")

    @property
    def attempt(self) -> int:
        """The ``X-Vigil-Attempt`` header (0 when absent)."""
        return int(self.headers.get("x-vigil-attempt", "0"))

    def json(self) -> Any:
        return json.loads(self.body)


#: An answer: (status, content type, body).
Answer = tuple[int, str, bytes]
#: Decides the answer to a request; runs on the server's handler thread and may block.
Responder = Callable[[Request], Answer]


def empty(_: Request) -> Answer:
    """200 with an empty body."""
    return 200, "text/plain", b""


class LoopbackServer:
    """A threading HTTP server on ``127.0.0.1:0`` that records every request and answers it
    with ``respond`` (which may be replaced while the server runs).

    ``closing`` is set when the server shuts down, so a responder that waits on it (to model
    a stalled upstream) returns instead of holding a handler thread."""

    def __init__(self, respond: Responder = empty) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        args=(POLL_INTERVAL_S,), daemon=True)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                req = Request(self.command, self.path,
                              {k.lower(): v for k, v in self.headers.items()},
                              self.rfile.read(length) if length else b"")
                with server.lock:
                    server.requests.append(req)
                status, ctype, body = server.respond(req)
                req.status = status
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (a timeout under test)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

            def log_message(self, *args: object) -> None:
                """Quiet: the test reads ``requests``, not stderr."""

        return Handler

    def recorded(self) -> list[Request]:
        """A copy of the requests so far, in arrival order."""
        with self.lock:
            return list(self.requests)

    def clear(self) -> None:
        """Forget the requests so far."""
        with self.lock:
            self.requests.clear()

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Wake blocked responders, stop serving and release the port."""
        self.closing.set()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def serve_http(respond: Responder = empty) -> Iterator[LoopbackServer]:
    """A started ``LoopbackServer`` answering with ``respond``; closed when the block ends."""
    with LoopbackServer(respond) as server:
        yield server


#: A route returns (status, content type, body) or sleeps first; it is called per request.
Route = Callable[[], Answer]


def by_path(routes: Mapping[str, Route]) -> Responder:
    """A responder that answers each path with its route, and 404 for any other path."""

    def respond(req: Request) -> Answer:
        route = routes.get(req.path)
        return route() if route is not None else (404, "text/plain", b"not found")

    return respond


@contextmanager
def exposition_server(routes: dict[str, Route]) -> Iterator[str]:
    """Serve ``routes`` (path -> callable) on a loopback port; yields the base URL."""
    with serve_http(by_path(routes)) as server:
        yield server.url


def text(body: str | bytes, status: int = 200,
         ctype: str = "text/plain; version=0.0.4; charset=utf-8") -> Route:
    """A route answering ``body`` with ``status`` and the text exposition's content type."""
    data = body.encode() if isinstance(body, str) else body
    return lambda: (status, ctype, data)


def slow(seconds: float, route: Route) -> Route:
    """``route``, answered after ``seconds`` of sleep."""

    def inner() -> Answer:
        time.sleep(seconds)
        return route()

    return inner
