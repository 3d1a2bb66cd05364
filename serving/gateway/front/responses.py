"""Answering the proxy endpoints over raw ASGI.

Why not Starlette's ``Response`` classes here: the three proxy endpoints are the gateway's hot
path, and a ``StreamingResponse`` costs a task group and two more tasks per stream under ASGI
spec 2.3, which uvicorn speaks (one listens for the disconnect, one streams), and a wrapper
around every chunk it sends; the gateway watches for the disconnect itself
(``client.DisconnectWatch``) and relays in the request's own task. These helpers send the
same ASGI messages directly; a JSON body is rendered the way ``JSONResponse`` renders it.
Everything else (``/metrics``, ``/health``, the batch API, 404/405) stays FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.types import Send

__all__ = [
    "CONTENT_JSON",
    "CONTENT_SSE",
    "RawHeaders",
    "json_bytes",
    "raw_headers",
    "send_body",
    "send_end",
    "send_json",
    "send_start",
]

#: ASGI header lists: (lower-case name, value) as bytes.
RawHeaders = list[tuple[bytes, bytes]]

CONTENT_JSON = b"application/json"
#: What vLLM (and Starlette for ``text/event-stream``) sends.
CONTENT_SSE = b"text/event-stream; charset=utf-8"
_SSE_TYPE = (b"content-type", CONTENT_SSE)


#: Made once: ``json.dumps`` with options builds an encoder per call.
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None,
                           separators=(",", ":")).encode


def json_bytes(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON, as ``JSONResponse`` renders it (NaN refused)."""
    return _ENCODE(obj).encode("utf-8")


def raw_headers(headers: Mapping[str, str]) -> RawHeaders:
    """``{"Name": "value"}`` as an ASGI header list (latin-1, names in lower case)."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_body(send: Send, status: int, body: bytes, content_type: bytes | None,
                    headers: RawHeaders) -> None:
    """A complete response: ``status``, ``headers`` and ``body`` (with its length; no
    ``content-type`` when ``content_type`` is None)."""
    length = (b"content-length", b"%d" % len(body))
    head = [length, *headers] if content_type is None else \
        [(b"content-type", content_type), length, *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, obj: Any, headers: RawHeaders) -> None:
    """A JSON response."""
    await send_body(send, status, json_bytes(obj), CONTENT_JSON, headers)


async def send_start(send: Send, headers: RawHeaders) -> None:
    """Start a 200 event stream (chunked: its length is unknown)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [_SSE_TYPE, *headers]})


async def send_end(send: Send, data: bytes = b"") -> None:
    """The last piece of a started stream (``data`` may be empty)."""
    await send({"type": "http.response.body", "body": data, "more_body": False})
