"""The FastAPI app of one simulated replica: vLLM's OpenAI API, ``/metrics`` and DCGM.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or
SSE), ``POST /v1/embeddings`` (deterministic vectors, see ``embeddings``), ``GET /health``,
``GET /ping``, ``GET /load``, ``GET /version``, ``GET /metrics`` and ``GET``
``vigil.conventions.SIM_DCGM_PATH``.

A client that disconnects aborts its request at once, streaming or not, the way vLLM does
(``with_cancellation`` / the streaming generator's cancellation): the request leaves the batch
and its KV blocks are freed before the handler returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import make_asgi_app
from starlette.types import Receive, Scope, Send

from serving.sim.dcgm import render_dcgm
from serving.sim.embeddings import embedding_response
from serving.sim.http_metrics import EXCLUDED_HANDLERS, HttpMetricsMiddleware
from serving.sim.protocol import (
    SSE_DONE,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    Kind,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    now_s,
    parse_request,
    random_id,
    sse,
    usage,
)
from serving.sim.runner import EngineRunner, EngineStopped, RequestHandle
from slo.planning.replica.text import Prompt, encode_ids, encode_text, generated_text, render_chat
from vigil.conventions import SIM_DCGM_PATH

if TYPE_CHECKING:
    from serving.sim.replica import SimReplica

__all__ = ["VLLM_VERSION", "create_app"]

#: The vLLM version the simulator imitates (``GET /version``).
VLLM_VERSION = "0.33.0"


class _MetricsEndpoint:
    """``/metrics`` via prometheus_client's ``make_asgi_app`` (as vLLM mounts it), rendering the
    replica's *current* registry: plain text 0.0.4 by default, OpenMetrics when asked."""

    def __init__(self, replica: SimReplica) -> None:
        self._replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await make_asgi_app(self._replica.registry)(scope, receive, send)


class _EngineStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends (client gone)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(RuntimeError):
                    await aclose()


async def _disconnected(request: Request) -> None:
    """Return when the client goes away (vLLM's ``listen_for_disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(replica: SimReplica) -> FastAPI:
    """The app of ``replica``; it always talks to the replica's current engine and registry."""
    app = FastAPI(title="vLLM API server (Vigil simulator)", version=VLLM_VERSION)
    app.add_middleware(HttpMetricsMiddleware, metrics=lambda: replica.http_metrics,
                       routes=lambda: app.routes,
                       excluded_handlers=(*EXCLUDED_HANDLERS, SIM_DCGM_PATH))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/ping")
    async def ping() -> Response:
        return Response(status_code=200)

    @app.get("/load")
    async def load() -> JSONResponse:
        return JSONResponse({"server_load": replica.runner.num_unfinished})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": VLLM_VERSION})

    @app.get(SIM_DCGM_PATH)
    async def dcgm() -> PlainTextResponse:
        return PlainTextResponse(render_dcgm(replica.gpu),
                                 media_type="text/plain; version=0.0.4")

    app.add_route("/metrics", _MetricsEndpoint(replica), methods=["GET"])

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": replica.model_cards()})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(replica, request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(replica, request, "completion")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = parse_request(await request.body(), EmbeddingRequest)
        replica.resolve_model(body.model)
        return JSONResponse(embedding_response(body.model_dump(), model=body.model or
                                               replica.served_model, created=now_s()))

    return app


def _prompt_of(replica: SimReplica, req: ChatCompletionRequest | CompletionRequest) -> Prompt:
    block_size = replica.profile.block_size
    if isinstance(req, ChatCompletionRequest):
        return encode_text(render_chat(req.messages), block_size)
    prompt = req.prompt
    if prompt is None or prompt == "" or prompt == []:
        raise ApiError("Either prompt or prompt_embeds must be provided and non-empty.",
                       param="prompt")
    if isinstance(prompt, str):
        return encode_text(prompt, block_size)
    if all(isinstance(p, int) for p in prompt):
        return encode_ids([int(p) for p in prompt], block_size)  # type: ignore[arg-type]
    if len(prompt) != 1:
        raise ApiError("Batched prompts are not supported by the simulator; send one prompt "
                       "per request.", param="prompt")
    only = prompt[0]
    return encode_text(only, block_size) if isinstance(only, str) else encode_ids(only, block_size)


def _max_tokens(replica: SimReplica, requested: int | None, prompt_len: int) -> int:
    """vLLM's checks and default: absent means up to ``max_model_len``."""
    max_len = replica.profile.max_model_len
    if prompt_len >= max_len:
        raise ApiError.validation(
            f"This model's maximum context length is {max_len} tokens. However, your request "
            f"has {prompt_len} input tokens. Please reduce the length of the input messages.",
            parameter="input_tokens", value=prompt_len)
    if requested is None:
        return max_len - prompt_len
    if prompt_len + requested > max_len:
        raise ApiError.validation(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {max_len} tokens and your request has {prompt_len} "
            f"input tokens ({requested} > {max_len} - {prompt_len}).",
            parameter="max_tokens", value=requested)
    if requested < 1:
        raise ApiError.validation(f"max_tokens must be at least 1, got {requested}.",
                                  parameter="max_tokens", value=requested)
    return requested


async def _generate(replica: SimReplica, request: Request, kind: Kind) -> Response:
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    body = parse_request(await request.body(), schema)
    lora_name = replica.resolve_model(body.model)
    if body.n != 1:
        if body.n < 1:
            raise ApiError.validation(f"n must be at least 1, got {body.n}.", parameter="n",
                                      value=body.n)
        raise ApiError(f"The simulator supports n=1 only (got n={body.n}).", param="n")
    prompt = _prompt_of(replica, body)
    max_tokens = _max_tokens(replica, body.requested_max_tokens(), prompt.num_tokens)
    if body.min_tokens < 0:
        raise ApiError.validation(f"min_tokens must be greater than or equal to 0, got "
                                  f"{body.min_tokens}.", parameter="min_tokens",
                                  value=body.min_tokens)
    if body.min_tokens > max_tokens:
        raise ApiError.validation(f"min_tokens must be less than or equal to max_tokens="
                                  f"{max_tokens}, got {body.min_tokens}.",
                                  parameter="min_tokens", value=body.min_tokens)
    replica.check_admission(prompt.num_tokens)

    rid = random_id("chatcmpl" if kind == "chat" else "cmpl")
    runner = replica.runner  # the engine this request runs on, even if the replica restarts
    handle = runner.add(rid, prompt, stream=bool(body.stream), max_tokens=max_tokens,
                        min_tokens=body.min_tokens, ignore_eos=body.ignore_eos, seed=body.seed,
                        priority=body.priority, lora_name=lora_name)
    model = body.model or replica.served_model
    text_seed = prompt.digest + (body.seed or 0)
    created = now_s()
    if body.stream:
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = bool(opts and opts.include_usage and opts.continuous_usage_stats)
        events = _stream(kind, handle, rid=rid, created=created, model=model,
                         text_seed=text_seed, include_usage=include_usage,
                         continuous=continuous)
        return _EngineStream(events, on_close=lambda: runner.abort(rid))
    return await _complete(runner, request, kind, handle, rid=rid, created=created,
                           model=model, text_seed=text_seed)


async def _complete(runner: EngineRunner, request: Request, kind: Kind, handle: RequestHandle,
                    *, rid: str, created: int, model: str, text_seed: int) -> Response:
    """Wait for a non-streaming request, aborting it if the client disconnects first."""
    result = asyncio.ensure_future(handle.wait())
    gone = asyncio.ensure_future(_disconnected(request))
    finished = False
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        finished = result.done()
    finally:
        gone.cancel()
        if not finished:  # client gone (or this handler cancelled): abort now
            result.cancel()
            runner.abort(rid)
    if not finished:
        # vLLM's with_cancellation returns None here: FastAPI answers 200 "null" to nobody.
        return JSONResponse(None)
    try:
        req = result.result()
    except EngineStopped as exc:
        return JSONResponse(error_body(str(exc), type="InternalServerError", code=500),
                            status_code=500)
    if req.finish_reason == "error":
        # vLLM's _raise_if_error: GenerationError, answered with a 500.
        return JSONResponse(error_body("Internal server error", type="InternalServerError",
                                       code=500), status_code=500)
    text = generated_text(text_seed, 0, req.num_generated)
    build = chat_response if kind == "chat" else completion_response
    return JSONResponse(build(rid=rid, created=created, model=model, text=text,
                              finish_reason=req.finish_reason or "stop",
                              prompt_tokens=req.prompt_len,
                              completion_tokens=req.num_generated))


async def _stream(kind: Kind, handle: RequestHandle, *, rid: str, created: int, model: str,
                  text_seed: int, include_usage: bool, continuous: bool
                  ) -> AsyncIterator[str]:
    """SSE events in vLLM's chunk shapes, one per engine step."""
    prompt_tokens = handle.req.prompt_len
    first = True
    try:
        async for delta in handle.deltas():
            if delta.finish_reason == "error":
                # The 200 is sent: vLLM reports the GenerationError inside the stream.
                yield sse(error_body("Internal server error", type="InternalServerError",
                                     code=500))
                yield SSE_DONE
                return
            text = generated_text(text_seed, delta.start, delta.stop)
            use = usage(prompt_tokens, delta.stop) if continuous else None
            if kind == "chat":
                if first:
                    yield sse(chat_chunk(rid=rid, created=created, model=model,
                                         delta={"role": "assistant", "content": ""},
                                         usage_=usage(prompt_tokens, 0) if continuous else None))
                    first = False
                yield sse(chat_chunk(rid=rid, created=created, model=model,
                                     delta={"content": text}, finish_reason=delta.finish_reason,
                                     usage_=use))
            else:
                yield sse(completion_chunk(rid=rid, created=created, model=model, text=text,
                                           finish_reason=delta.finish_reason, usage_=use))
        if include_usage:
            final: dict[str, Any]
            use = usage(prompt_tokens, handle.req.num_generated)
            if kind == "chat":
                final = chat_chunk(rid=rid, created=created, model=model, delta=None, usage_=use)
            else:
                final = completion_chunk(rid=rid, created=created, model=model, text=None,
                                         usage_=use)
            yield sse(final)
    except EngineStopped as exc:
        # After the 200 has been sent, vLLM reports errors inside the stream.
        yield sse(error_body(str(exc), type="InternalServerError", code=500))
    yield SSE_DONE
