"""The gateway's FastAPI app: the OpenAI surface, ``/metrics``, ``/health``, the batch API.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``
(passthrough), ``GET /v1/models``, ``GET /metrics`` (the gateway's own series), ``GET /health``,
and the batch queue's ``/v1/files`` and ``/v1/batches`` when ``serving.gateway.batch.queue``
is present. Every error, including unknown paths and wrong methods, is an OpenAI-style JSON body.

The three proxy endpoints are raw ASGI (``Gateway.handle``): ``GatewayApp`` hands their POSTs
over before FastAPI's middleware and routing, whose per-request work the hot path does not need
(``responses`` says why no Response objects either). Their routes are still registered, so another
method gets FastAPI's 405 like every other path.

The lifespan opens the records database, reads the discovered targets and polls the replicas
once, starts the batch queue's release loop (the discovery and poll loops are the upstreams'
own), and closes all of it on shutdown. ``/health`` lists every replica with its origin
(``static`` or the discovery source that found it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from serving.gateway.errors import BadRequest, NotFound, error_body
from serving.gateway.gateway import Gateway
from serving.gateway.tiers import Caller
from vigil.clock import Clock, system_clock
from vigil.config import Config
from vigil.conventions import (
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ENDPOINT_PATHS,
)
from vigil.errors import GatewayError

if TYPE_CHECKING:
    from serving.gateway.batch.queue import BatchQueue

__all__ = ["GatewayApp", "ProxyEndpoint", "create_app"]

log = logging.getLogger("vigil.gateway")


class ProxyEndpoint:
    """One proxy endpoint (``chat``, ``completions``, ``embeddings``) as an ASGI app."""

    __slots__ = ("endpoint", "gateway")

    def __init__(self, gateway: Gateway, endpoint: str) -> None:
        self.gateway = gateway
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway.handle(scope, receive, send, self.endpoint)


class GatewayApp(FastAPI):
    """FastAPI with a short way in for the proxy endpoints' POSTs (see the module docstring)."""

    def __init__(self, *, proxy: dict[str, ProxyEndpoint], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: path -> endpoint, for POST.
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.proxy.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _batch_queue(gateway: Gateway, cfg: Config, clock: Clock) -> BatchQueue | None:
    """The batch queue wired to this gateway, or None when its module is not there. The
    callbacks each side hands the other are typed by ``serving.gateway.batch.interface``."""
    try:
        from serving.gateway.batch.queue import BatchQueue
    except ImportError:  # pragma: no cover - the batch queue ships with the gateway
        log.warning("serving.gateway.batch.queue is not available: no /v1/batches")
        return None

    async def auth(request: Request) -> Caller:
        return gateway.keys.authenticate(request.headers.get("authorization"))

    return BatchQueue(cfg.gateway_database(), cfg.gateway.batch,
                      pools=[p.name for p in cfg.pools], load=gateway.upstreams.load,
                      send=gateway.send_batch, auth=auth, clock=clock,
                      pool_of_model=gateway.pool_of_model)


def create_app(cfg: Config, *, clock: Clock = system_clock, cache: Any = None,
               batch: bool = True, gateway: Gateway | None = None,
               on_started: Callable[[], None] | None = None) -> GatewayApp:
    """The gateway app for ``cfg``. ``cache`` injects a ``SemanticCache`` (else built from
    ``[gateway.cache]``); ``batch=False`` leaves the batch queue out. ``on_started`` runs once
    the lifespan's start-up is done (records open, replicas polled, the cache's model loaded),
    before the first request: ``vigil gateway`` freezes the heap there
    (``vigil_shell.gateway_cli.freeze_heap``)."""
    gw = gateway or Gateway(cfg, clock=clock, cache=cache)
    queue = _batch_queue(gw, cfg, clock) if batch else None
    if queue is not None:
        gw.batch_depth = queue.depth

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        task = asyncio.create_task(queue.run(), name="gateway-batch") if queue else None
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            if task is not None and queue is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await queue.aclose()
            await gw.aclose()

    proxy = {ENDPOINT_PATHS[e]: ProxyEndpoint(gw, e)
             for e in (ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS)}
    app = GatewayApp(proxy=proxy, title="Vigil gateway", lifespan=lifespan, docs_url=None,
                     redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return JSONResponse(error_body(exc), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err: GatewayError = NotFound(f"Unknown path {request.url.path}; the gateway "
                                         "serves the OpenAI API under /v1.")
        elif exc.status_code == 405:
            err = NotFound(f"Method {request.method} is not allowed on {request.url.path}.",
                           status=405)
        else:
            err = GatewayError(str(exc.detail), status=exc.status_code)
        return JSONResponse(error_body(err), status_code=err.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(BadRequest(f"Invalid request: {exc.errors()}")),
                            status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        err = GatewayError("The gateway failed on this request; it has been logged.",
                           status=500, type="server_error", code="internal_error")
        return JSONResponse(error_body(err), status_code=500)

    # Reached only by other methods (405): GatewayApp takes the POSTs first.
    for path, endpoint in proxy.items():
        app.router.routes.append(Route(path, endpoint, methods=["POST"],
                                       include_in_schema=False))

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        gw.keys.authenticate(request.headers.get("authorization"))
        created = int(clock())
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "vigil",
             "root": model, "parent": None, "pool": pool}
            for model, pool in gw.models()]})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(gw.metrics.registry), media_type=content_type)

    @app.get("/health")
    async def health() -> JSONResponse:
        pools = {}
        for name, replicas in gw.upstreams.pools.items():
            load = gw.upstreams.load(name)
            pools[name] = {"replicas": len(replicas), "healthy_replicas": load.healthy_replicas,
                           "kv_cache_usage": load.kv_cache_usage,
                           "queue_length": load.queue_length}
        return JSONResponse({"status": "ok", "pools": pools,
                             "replicas": gw.upstreams.describe()})

    if queue is not None:
        app.include_router(queue.router())
    return app
