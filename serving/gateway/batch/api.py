"""The OpenAI-compatible batch API over the batch store: files, batches, input validation.

Routes (all per tenant: another tenant's ids answer 404, as unknown ones do):
``POST /v1/files`` (multipart, ``purpose=batch``), ``GET /v1/files/{id}``,
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches``,
``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

Objects have the fields of ``openai.types.Batch`` and ``openai.types.FileObject`` so the official
client parses them. Errors are OpenAI-style bodies (``{"error": {message, type, param, code}}``)
built here rather than by FastAPI, whose 422 bodies the client would not understand; while the
database cannot be reached every route answers 503 (``database_unavailable``, with
``Retry-After``), which the client retries; the body says nothing of the database (host, user,
name), the log has the detail. Text with a NUL character (which PostgreSQL cannot store) is
refused: a ``custom_id`` or file name with one is a 400, an id with one is not found.

Store calls go through ``call`` (the queue's API threads): a handler never blocks the event
loop on the database.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from serving.gateway.batch.interface import AuthenticateCaller, PoolOfModel
from serving.gateway.batch.store import (
    BatchStore,
    NewRequest,
    RequestCounts,
    StoredBatch,
    StoredFile,
)
from serving.gateway.tiers import Caller
from vigil.conventions import (
    BATCH_ENDPOINTS,
    BATCH_ERROR_INVALID_LINE,
    BATCH_PURPOSE_INPUT,
    BATCH_PURPOSE_OUTPUT,
)
from vigil.durations import parse_duration
from vigil.errors import BatchInputError, StoreUnavailable

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINES",
    "BatchApi",
    "InputLine",
    "batch_object",
    "file_object",
    "openai_error",
    "parse_batch_input",
]

#: OpenAI's own limits on a batch input file: 200 MB and 50,000 requests.
MAX_FILE_BYTES = 200 * 1024 * 1024
MAX_LINES = 50_000
#: Stop listing problems after this many: the first ones are what the caller needs.
_MAX_PROBLEMS = 100
_LINE_KEYS = {"custom_id", "method", "url", "body"}
_CREATE_KEYS = {"input_file_id", "endpoint", "completion_window", "metadata",
                "output_expires_after"}
#: Seconds a client is told to wait when the database is unreachable.
_UNAVAILABLE_RETRY_AFTER = 5
#: PostgreSQL text cannot hold it: names and ids with it are refused before any store call.
_NUL = "\x00"

#: The logger's name is the module's before the gateway's modules moved into rooms: log
#: settings that name it keep working.
log = logging.getLogger("serving.gateway.batch_api")

T = TypeVar("T")
#: How a store call is run: ``await call(store.method, *args, **kwargs)``.
StoreCall = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class InputLine:
    """One request of a batch input file (``line`` is 1-based)."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    pool: str


def _check_line(obj: Any, pool_of_model: PoolOfModel,
                pools: Sequence[str]) -> tuple[str | None, str]:
    """``(problem, pool)`` for one parsed line: the first thing wrong with it, or None."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}", ""
    unknown = sorted(set(obj) - _LINE_KEYS)
    if unknown:
        return (f"unknown key {unknown[0]!r} (a line has custom_id, method, url and body)", "")
    missing = sorted(_LINE_KEYS - set(obj))
    if missing:
        return f"missing {missing[0]!r}", ""
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return f"custom_id must be a non-empty string, got {custom_id!r}", ""
    if _NUL in custom_id:
        return f"custom_id must not hold a NUL character, got {custom_id!r}", ""
    if obj["method"] != "POST":
        return f"method must be 'POST', got {obj['method']!r}", ""
    url = obj["url"]
    if url not in BATCH_ENDPOINTS:
        known = " or ".join(repr(u) for u in BATCH_ENDPOINTS)
        return f"url must be {known}, got {url!r}", ""
    body = obj["body"]
    if not isinstance(body, dict):
        return f"body must be a JSON object, got {type(body).__name__}", ""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return f"body.model must be a non-empty string, got {model!r}", ""
    pool = pool_of_model(model)
    if pool is None:
        return f"model {model!r} is not served by this gateway", ""
    if pool not in pools:
        return f"model {model!r} is served by pool {pool!r}, which takes no batch work", ""
    if body.get("stream"):
        return "body.stream must be false: batch results are not streamed", ""
    if BATCH_ENDPOINTS[url] == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "body.messages must be a non-empty list for /v1/chat/completions", ""
    elif "prompt" not in body:
        return "body.prompt is required for /v1/completions", ""
    return None, pool


def parse_batch_input(content: bytes, *, pool_of_model: PoolOfModel,
                      pools: Sequence[str], max_lines: int = MAX_LINES,
                      source: str = "batch input") -> list[InputLine]:
    """Validate a JSONL batch input file and return its requests.

    Every non-blank line must be ``{"custom_id", "method": "POST", "url", "body"}`` with a
    batchable ``url``, a served ``body.model`` and a ``custom_id`` unique in the file. Raises
    ``BatchInputError`` listing each bad line by number (1-based) when any line is bad.
    """
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchInputError([(0, f"not UTF-8 text (byte {exc.start})")], source=source) \
            from None
    problems: list[tuple[int, str]] = []
    lines: list[InputLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(problems) >= _MAX_PROBLEMS:
            break
        if not raw.strip():
            continue  # blank lines (a trailing newline, say) carry no request
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append((number, f"invalid JSON ({exc.msg} at column {exc.colno})"))
            continue
        problem, pool = _check_line(obj, pool_of_model, pools)
        if problem is None and obj["custom_id"] in seen:
            problem = f"custom_id {obj['custom_id']!r} is already used on line " \
                      f"{seen[obj['custom_id']]}"
        if problem is not None:
            problems.append((number, problem))
            continue
        seen[obj["custom_id"]] = number
        lines.append(InputLine(number, obj["custom_id"], obj["url"], obj["body"], pool))
    if not problems and not lines:
        problems.append((0, "the file holds no requests"))
    if len(lines) > max_lines:
        problems.append((0, f"{len(lines)} requests is more than the {max_lines} allowed "
                            "in one batch"))
    if problems:
        raise BatchInputError(problems, source=source)
    return lines


# --- OpenAI objects ---------------------------------------------------------------------------
def openai_error(status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse({"error": {"message": message, "type": type, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


def _unavailable() -> JSONResponse:
    # Nothing of the error itself: it names the database's host, user and name.
    return openai_error(503, "the batch queue's database is unreachable; retry later",
                        type="server_error", code="database_unavailable",
                        headers={"Retry-After": str(_UNAVAILABLE_RETRY_AFTER)})


def _answers_503_when_unavailable(
        handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """``handler``, answering 503 when the database is unreachable (FastAPI reads the
    parameters through ``functools.wraps``)."""

    @functools.wraps(handler)
    async def guarded(*args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(*args, **kwargs)
        except StoreUnavailable as exc:
            log.warning("batch API: answering 503: %s", exc)
            return _unavailable()

    return guarded


async def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(fn, *args, **kwargs)


def file_object(f: StoredFile, *, retention: float) -> dict[str, Any]:
    """``openai.types.FileObject`` fields. Output files expire ``retention`` seconds after they
    are written; an input file lives at least that long, and as long as a batch uses it."""
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": (int(f.created_at + retention) if f.purpose == BATCH_PURPOSE_OUTPUT
                           else None),
            "status_details": None}


def batch_object(b: StoredBatch, counts: RequestCounts) -> dict[str, Any]:
    """``openai.types.Batch`` fields."""
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id, "created_at": b.created_at,
        "in_progress_at": b.in_progress_at, "expires_at": b.expires_at,
        "finalizing_at": b.finalizing_at, "completed_at": b.completed_at,
        "failed_at": b.failed_at, "expired_at": b.expired_at,
        "cancelling_at": b.cancelling_at, "cancelled_at": b.cancelled_at,
        "request_counts": {"total": counts.total, "completed": counts.completed,
                           "failed": counts.failed},
        "metadata": b.metadata, "model": b.model,
    }


def _not_found(kind: str, object_id: str) -> JSONResponse:
    # The same answer for "never existed" and "another tenant's": ids leak nothing.
    return openai_error(404, f"No such {kind} object: {object_id!r}", code="not_found")


def _storable(object_id: str) -> bool:
    """Whether ``object_id`` can be looked up at all: one with NUL names nothing stored."""
    return _NUL not in object_id


def _check_metadata(value: Any) -> str | None:
    """OpenAI's metadata rules: up to 16 string pairs, keys <= 64 and values <= 512 chars."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return "metadata must be an object of string keys and string values"
    if len(value) > 16:
        return f"metadata holds at most 16 pairs, got {len(value)}"
    for k, v in value.items():
        if len(k) > 64 or len(v) > 512:
            return f"metadata key {k[:64]!r}: keys are at most 64 and values 512 characters"
    return None


class BatchApi:
    """The batch routes over ``store``.

    ``auth(request)`` names the caller (and raises the 401 itself); ``clock`` gives Unix
    seconds; ``pool_of_model`` maps a model name to its pool (None: not served); ``pools``
    are the pools that take batch work; ``on_change`` is called when there is new work for the
    release loop; ``retention`` (seconds) is how long results are kept; ``call`` runs a store
    call off the event loop (the queue's API threads; default ``asyncio.to_thread``).
    """

    def __init__(self, store: BatchStore, *, auth: AuthenticateCaller,
                 clock: Callable[[], float], pool_of_model: PoolOfModel,
                 pools: Sequence[str], on_change: Callable[[], None], retention: float,
                 max_file_bytes: int = MAX_FILE_BYTES, max_lines: int = MAX_LINES,
                 call: StoreCall = _in_thread) -> None:
        self._store = store
        self._call = call
        self._auth = auth
        self._clock = clock
        self._pool_of_model = pool_of_model
        self._pools = list(pools)
        self._on_change = on_change
        self._retention = retention
        self._max_file_bytes = max_file_bytes
        self._max_lines = max_lines

    def _now(self) -> int:
        return int(self._clock())

    async def _parse(self, content: bytes, source: str) -> list[InputLine]:
        # In a worker thread: a 200 MB file takes seconds to parse, and the event loop also
        # serves the gateway's interactive traffic.
        return await asyncio.to_thread(
            parse_batch_input, content, pool_of_model=self._pool_of_model, pools=self._pools,
            max_lines=self._max_lines, source=source)

    async def _batch_json(self, b: StoredBatch) -> dict[str, Any]:
        return batch_object(b, await self._call(self._store.counts, b.id))

    def router(self) -> APIRouter:
        """The routes, to include in the gateway's FastAPI app."""
        r = APIRouter()
        for path, handler, method in (
                ("/v1/files", self.upload_file, "POST"),
                ("/v1/files/{file_id}", self.get_file, "GET"),
                ("/v1/files/{file_id}/content", self.get_file_content, "GET"),
                ("/v1/batches", self.create_batch, "POST"),
                ("/v1/batches", self.list_batches, "GET"),
                ("/v1/batches/{batch_id}", self.get_batch, "GET"),
                ("/v1/batches/{batch_id}/cancel", self.cancel_batch, "POST")):
            r.add_api_route(path, _answers_503_when_unavailable(handler), methods=[method])
        return r

    # --- files ------------------------------------------------------------------------------
    async def upload_file(self, request: Request) -> Response:
        """``POST /v1/files``: a JSONL batch input file, validated line by line."""
        caller = await self._auth(request)
        try:
            form = await request.form(max_files=1, max_fields=4)
        except Exception as exc:  # starlette raises its own MultiPartException / HTTPException
            return openai_error(400, f"expected a multipart/form-data body with 'file' and "
                                     f"'purpose': {exc}", param="file")
        try:
            purpose = form.get("purpose")
            upload = form.get("file")
            if purpose != BATCH_PURPOSE_INPUT:
                return openai_error(400, f"purpose must be {BATCH_PURPOSE_INPUT!r} (the only "
                                         f"files this gateway takes), got {purpose!r}",
                                    param="purpose")
            if not isinstance(upload, UploadFile):
                return openai_error(400, "missing the 'file' part", param="file")
            content = await upload.read(self._max_file_bytes + 1)
            filename = upload.filename or "input.jsonl"
        finally:
            await form.close()
        if _NUL in filename:
            return openai_error(400, f"the file name must not hold a NUL character, got "
                                     f"{filename!r}", param="file")
        if len(content) > self._max_file_bytes:
            return openai_error(413, f"the file is larger than {self._max_file_bytes} bytes",
                                param="file")
        try:
            await self._parse(content, filename)
        except BatchInputError as exc:
            return openai_error(400, f"invalid batch input file {exc}", param="file",
                                code="invalid_batch_file")
        f = await self._call(self._store.add_file, tenant=caller.tenant,
                             purpose=BATCH_PURPOSE_INPUT, filename=filename, content=content,
                             now=self._now())
        return JSONResponse(file_object(f, retention=self._retention))

    async def get_file(self, file_id: str, request: Request) -> Response:
        """``GET /v1/files/{id}``."""
        caller = await self._auth(request)
        f = await self._call(self._store.file, file_id, caller.tenant) \
            if _storable(file_id) else None
        if f is None:
            return _not_found("File", file_id)
        return JSONResponse(file_object(f, retention=self._retention))

    async def get_file_content(self, file_id: str, request: Request) -> Response:
        """``GET /v1/files/{id}/content``: the raw bytes."""
        caller = await self._auth(request)
        content = await self._call(self._store.file_content, file_id, caller.tenant) \
            if _storable(file_id) else None
        if content is None:
            return _not_found("File", file_id)
        return Response(content, media_type="application/octet-stream")

    # --- batches ----------------------------------------------------------------------------
    async def create_batch(self, request: Request) -> Response:
        """``POST /v1/batches``: queue every request of an uploaded input file."""
        caller = await self._auth(request)
        try:
            params = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return openai_error(400, f"the body is not valid JSON: {exc}")
        if not isinstance(params, dict):
            return openai_error(400, "the body must be a JSON object")
        unknown = sorted(set(params) - _CREATE_KEYS)
        if unknown:
            return openai_error(400, f"Unrecognized request argument supplied: {unknown[0]}",
                                param=unknown[0])
        for key in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(params.get(key), str) or not params[key]:
                return openai_error(400, f"{key} is required (a string)", param=key)
        endpoint, window = params["endpoint"], params["completion_window"]
        if endpoint not in BATCH_ENDPOINTS:
            known = ", ".join(BATCH_ENDPOINTS)
            return openai_error(400, f"endpoint {endpoint!r} cannot be batched here (only "
                                     f"{known})", param="endpoint")
        try:
            window_s = parse_duration(window)
        except ValueError as exc:
            return openai_error(400, f"completion_window: {exc}", param="completion_window")
        if not 0 < window_s < math.inf:
            return openai_error(400, "completion_window must be more than 0 seconds",
                                param="completion_window")
        problem = _check_metadata(params.get("metadata"))
        if problem:
            return openai_error(400, problem, param="metadata")
        metadata = params.get("metadata")
        file_id = params["input_file_id"]
        if not _storable(file_id):
            return _not_found("File", file_id)
        f = await self._call(self._store.file, file_id, caller.tenant)
        content = (await self._call(self._store.file_content, file_id, caller.tenant)
                   if f else None)
        if f is None or content is None:
            return _not_found("File", file_id)
        if f.purpose != BATCH_PURPOSE_INPUT:
            return openai_error(400, f"file {file_id!r} has purpose {f.purpose!r}, not "
                                     f"{BATCH_PURPOSE_INPUT!r}", param="input_file_id")
        now = self._now()
        try:
            # Validated at upload, but a model may have left the config since: check again.
            lines = await self._parse(content, f.filename)
            problems = [(x.line, f"url {x.url!r} does not match the batch's endpoint "
                                 f"{endpoint!r}", "url") for x in lines if x.url != endpoint]
        except BatchInputError as exc:
            lines, problems = [], [(n, m, None) for n, m in exc.problems]
        if problems:
            errors = [{"code": BATCH_ERROR_INVALID_LINE, "line": n or None, "message": m,
                       "param": p} for n, m, p in problems]
            batch_id = await self._call(
                self._store.add_failed_batch, tenant=caller.tenant, key_id=caller.key_id,
                input_file_id=file_id,
                endpoint=endpoint, completion_window=window, window_s=window_s,
                metadata=metadata, errors=errors, now=now)
        else:
            models = {x.body["model"] for x in lines}
            batch_id = await self._call(
                self._store.add_batch, tenant=caller.tenant, key_id=caller.key_id,
                input_file_id=file_id,
                endpoint=endpoint, completion_window=window, window_s=window_s,
                metadata=metadata, model=models.pop() if len(models) == 1 else None,
                requests=[NewRequest(x.line, x.custom_id, x.pool, x.url,
                                     json.dumps(x.body, separators=(",", ":")))
                          for x in lines], now=now)
            self._on_change()
        return await self._batch_response(batch_id, caller)

    async def _batch_response(self, batch_id: str, caller: Caller) -> Response:
        b = await self._call(self._store.batch, batch_id, caller.tenant)
        if b is None:  # purged between two statements: only with a zero retention
            return _not_found("Batch", batch_id)
        return JSONResponse(await self._batch_json(b))

    async def get_batch(self, batch_id: str, request: Request) -> Response:
        """``GET /v1/batches/{id}``."""
        caller = await self._auth(request)
        b = await self._call(self._store.batch, batch_id, caller.tenant) \
            if _storable(batch_id) else None
        if b is None:
            return _not_found("Batch", batch_id)
        return JSONResponse(await self._batch_json(b))

    async def list_batches(self, request: Request) -> Response:
        """``GET /v1/batches?after=ID&limit=N``: newest first, OpenAI's cursor page."""
        caller = await self._auth(request)
        after = request.query_params.get("after") or None
        if after is not None and not _storable(after):
            return openai_error(400, f"after must be a batch id, got {after!r}", param="after")
        raw_limit = request.query_params.get("limit", "20")
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return openai_error(400, f"limit must be an integer from 1 to 100, got "
                                     f"{raw_limit!r}", param="limit")
        batches, has_more = await self._call(self._store.list_batches, caller.tenant,
                                             after=after, limit=limit)
        data = [await self._batch_json(b) for b in batches]
        return JSONResponse({"object": "list", "data": data,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None,
                             "has_more": has_more})

    async def cancel_batch(self, batch_id: str, request: Request) -> Response:
        """``POST /v1/batches/{id}/cancel``: queued requests are dropped now; requests in
        flight finish, then the batch is ``cancelled`` with the results it has."""
        caller = await self._auth(request)
        b = await self._call(self._store.batch, batch_id, caller.tenant) \
            if _storable(batch_id) else None
        if b is None:
            return _not_found("Batch", batch_id)
        if b.status in ("completed", "failed", "expired"):
            return openai_error(409, f"batch {batch_id!r} is already {b.status} and cannot be "
                                     "cancelled", code="batch_not_cancellable")
        now = self._now()
        await self._call(self._store.cancel, batch_id, now)
        # Nothing in flight: cancelled at once.
        await self._call(self._store.finalize_ready, now, batch_id=batch_id)
        self._on_change()
        return await self._batch_response(batch_id, caller)
