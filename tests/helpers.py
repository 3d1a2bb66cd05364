"""Shared test helpers: a real HTTP server on 127.0.0.1 serving canned expositions."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: A route returns (status, content type, body) or sleeps first; it is called per request.
Route = Callable[[], tuple[int, str, bytes]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def exposition_server(routes: dict[str, Route]) -> Iterator[str]:
    """Serve ``routes`` (path -> callable) on a loopback port; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            status, ctype, body = route()
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def text(body: str | bytes, status: int = 200,
         ctype: str = "text/plain; version=0.0.4; charset=utf-8") -> Route:
    data = body.encode() if isinstance(body, str) else body
    return lambda: (status, ctype, data)


def slow(seconds: float, route: Route) -> Route:
    def inner() -> tuple[int, str, bytes]:
        time.sleep(seconds)
        return route()

    return inner
