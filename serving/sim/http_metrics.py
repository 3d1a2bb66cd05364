"""The ``http_*`` families of vLLM's API server, as prometheus-fastapi-instrumentator makes them.

vLLM instruments its FastAPI app with ``Instrumentator(excluded_handlers=["/metrics", "/health",
"/load", "/ping", "/version", "/server_info"])`` and the default metrics. This module reproduces
those semantics as a small ASGI middleware:

- ``handler`` is the matched route's path template; an unmatched path is grouped as ``none``;
  excluded handlers are regular expressions *searched* in the handler (so ``/dcgm/metrics`` is
  excluded by ``/metrics`` too; it is listed anyway);
- ``status`` is grouped (``2xx``, ``4xx``, ``5xx``); an exception before the response started is
  a ``5xx``; an error after a stream started keeps the status already sent (not a 5xx);
- sizes come from the ``Content-Length`` headers only, so streamed responses count 0;
- a request is recorded when the app returns, so a streaming request counts when its stream ends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["EXCLUDED_HANDLERS", "HIGHR_BUCKETS", "HttpMetrics", "HttpMetricsMiddleware"]

#: vLLM's excluded handlers (``vllm/entrypoints/openai/api_server.py``).
EXCLUDED_HANDLERS = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")

HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5,
                 5, 7.5, 10, 30, 60)
LOWR_BUCKETS = (0.1, 0.5, 1)

_SIZE_NOTE = "Only value of header is respected. Otherwise ignored. No percentile calculated. "


class HttpMetrics:
    """The instrumentator's default metrics on a replica's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("http_requests_total",
                                "Total number of requests by method, status and handler.",
                                ["method", "status", "handler"], registry=registry)
        self.request_size = Summary(
            "http_request_size_bytes", "Content length of incoming requests by handler. "
            + _SIZE_NOTE, ["handler"], registry=registry)
        self.response_size = Summary(
            "http_response_size_bytes", "Content length of outgoing responses by handler. "
            + _SIZE_NOTE, ["handler"], registry=registry)
        self.latency_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ", buckets=HIGHR_BUCKETS, registry=registry)
        self.latency_lowr = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ", ["method", "handler"], buckets=LOWR_BUCKETS,
            registry=registry)

    def observe(self, *, method: str, handler: str, status: str, duration: float,
                request_size: int, response_size: int) -> None:
        """Record one finished request. ``duration`` seconds, sizes bytes."""
        self.requests.labels(method=method, status=status, handler=handler).inc()
        self.request_size.labels(handler=handler).observe(request_size)
        self.response_size.labels(handler=handler).observe(response_size)
        self.latency_highr.observe(duration)
        self.latency_lowr.labels(method=method, handler=handler).observe(duration)


def _content_length(headers: Sequence[tuple[bytes, bytes]]) -> int:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class HttpMetricsMiddleware:
    """ASGI middleware recording ``http_*`` metrics for every non-excluded HTTP request.

    ``metrics`` returns the replica's current ``HttpMetrics`` (it changes when the replica
    restarts); ``routes`` returns the app's routes, to find the handler template.
    """

    def __init__(self, app: ASGIApp, *, metrics: Callable[[], HttpMetrics],
                 routes: Callable[[], Sequence[BaseRoute]],
                 excluded_handlers: Sequence[str] = EXCLUDED_HANDLERS) -> None:
        self.app = app
        self._metrics = metrics
        self._routes = routes
        self._excluded = [re.compile(p) for p in excluded_handlers]

    def _handler(self, scope: Scope) -> tuple[str, bool]:
        for route in self._routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", scope["path"])), True
        return str(scope["path"]), False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler, templated = self._handler(scope)
        if any(p.search(handler) for p in self._excluded):
            await self.app(scope, receive, send)
            return
        if not templated:
            handler = "none"
        start = time.perf_counter()
        status = 500  # stays 500 if the app raises before starting a response
        response_headers: Sequence[tuple[bytes, bytes]] = ()

        async def send_wrapper(message: Message) -> None:
            nonlocal status, response_headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                response_headers = list(message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self._metrics().observe(
                method=str(scope.get("method", "GET")), handler=handler,
                status=f"{str(status)[0]}xx",
                duration=max(time.perf_counter() - start, 0.0),
                request_size=_content_length(scope.get("headers", ())),
                response_size=_content_length(response_headers))
