"""The small HTTP servers of the processes (`vigil serve`'s /metrics and /healthz, the OTLP
receiver): the standard library's threading server on an IPv4 or IPv6 address.

The standard library's server, not an ASGI one: a scrape or an export every few seconds needs
no event loop, and these servers run beside work that owns its own (serve's scheduler)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["threading_http_server"]


def threading_http_server(host: str, port: int,
                          handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A bound (not yet serving) threading server for ``handler`` on ``host:port`` (port 0:
    any free one); an address with a colon is IPv6. Its threads are daemons, so a stuck
    client never holds the process at exit."""
    family = socket.AF_INET6 if ":" in host else ThreadingHTTPServer.address_family

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    return Server((host, port), handler)
