"""The client side of a request: its body read with a bound, and noticing that it left.

``read_body`` never holds more than ``limit`` bytes: past the limit it keeps reading only to
discard (up to ``DRAIN_LIMIT``), so a client that sends a 10 MB body gets its 413 instead of a
connection reset in the middle of its upload, and a client that sends more than that is cut off.

``until_done_or_gone`` races an upstream exchange against the client's ``http.disconnect``:
Starlette notices a disconnect only while it streams a response, and the gateway must cancel
the upstream request as soon as the client goes, before any response exists (vLLM's own
``with_cancellation`` does the same).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request

from serving.gateway.errors import BodyTooLarge

__all__ = ["DRAIN_LIMIT", "ClientGone", "read_body", "until_done_or_gone"]

#: Past the body limit, at most this many bytes are read (and discarded) before giving up.
DRAIN_LIMIT = 64 * 1024 * 1024

_T = TypeVar("_T")


class ClientGone(Exception):
    """The client disconnected before the gateway answered."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; ``BodyTooLarge`` (413) past ``limit`` bytes, ``ClientGone`` if the
    client disconnects while sending it."""
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if too_large or size > limit:
                too_large = True
                chunks.clear()  # never hold more than the limit
                if size > DRAIN_LIMIT:
                    break
            else:
                chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    if too_large:
        raise BodyTooLarge(limit)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_done_or_gone(work: Awaitable[_T], request: Request | None) -> _T:
    """The result of ``work``, or ``ClientGone`` as soon as the client disconnects (``work`` is
    then cancelled where it stands, so whatever it held upstream is closed on return).

    ``work`` runs in the caller's task; one watcher task listens for the disconnect and cancels
    the caller (one task per request instead of two and an ``asyncio.wait``: this is the hot
    path)."""
    if request is None:
        return await work
    caller = asyncio.current_task()
    assert caller is not None  # always called from a task
    gone = asyncio.ensure_future(_disconnected(request))
    waiting = True  # a callback already scheduled must not cancel the caller after the work

    def cancel_caller(task: asyncio.Future[None]) -> None:
        if waiting and not task.cancelled() and task.exception() is None:
            caller.cancel()

    gone.add_done_callback(cancel_caller)
    try:
        return await work
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            caller.uncancel()  # our own cancellation: the client left
            raise ClientGone() from None
        raise
    finally:
        waiting = False
        gone.cancel()
