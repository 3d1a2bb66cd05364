"""`vigil serve`'s HTTP server: ``/metrics`` (the exporter's ``vigil_*``), ``/healthz`` and
``/budgets``, on a thread of its own so that a scrape never waits for the loop."""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import choose_encoder

from alerts.exporter import Exporter
from vigil.conventions import (
    SERVE_BUDGETS_PATH,
)
from vigil.http_server import threading_http_server

__all__ = ["http_server"]


def http_server(host: str, port: int, exporter: Exporter,
                 healthy: Callable[[], tuple[bool, str]],
                 budgets: Callable[[], bytes]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, ctype, encoder(exporter.registry))
            elif path == "/healthz":
                ok, text = healthy()
                self._reply(200 if ok else 503, "text/plain; charset=utf-8",
                            (text + "\n").encode())
            elif path == SERVE_BUDGETS_PATH:
                self._reply(200, "application/json", budgets())
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

        def _reply(self, status: int, ctype: str, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper left; nothing to tell it

        def log_message(self, *args: object) -> None:
            pass  # a scrape every few seconds is not worth a log line

    return threading_http_server(host, port, Handler)


# --- one evaluation -----------------------------------------------------------------------
