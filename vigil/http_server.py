"""The small HTTP servers of the processes (`vigil serve`'s /metrics and /healthz, the OTLP
receiver): the standard library's threading server on an IPv4 or IPv6 address.

The standard library's server, not an ASGI one: a scrape or an export every few seconds needs
no event loop, and these servers run beside work that owns its own (serve's scheduler)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vigil.errors import ConfigError

__all__ = ["parse_listen", "threading_http_server"]


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


def parse_listen(value: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """``"host:port"`` (IPv6 in brackets) -> ``(host, port)``; ``ConfigError`` if malformed.

    Port 0 (the kernel picks one) only with ``allow_port_zero``.
    """
    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    low = 0 if allow_port_zero else 1
    if not sep or not host or not port_text.isdigit() or not low <= int(port_text) < 65536:
        raise ConfigError(f"--listen must be HOST:PORT with a port {low}-65535, got {value!r}")
    return host, int(port_text)
