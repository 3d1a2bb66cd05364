"""The client side of a request, over raw ASGI: its body read with a bound, and noticing that
it left.

``read_body`` never holds more than ``limit`` bytes: past the limit it keeps reading only to
discard (up to ``DRAIN_LIMIT``), so a client that sends a 10 MB body gets its 413 instead of a
connection reset in the middle of its upload, and a client that sends more than that is cut off.

``DisconnectWatch`` cancels the request's task as soon as the client's ``http.disconnect``
arrives: the gateway must cancel the upstream request the moment the client goes, whether it is
waiting for admission, for the upstream's headers, or in the middle of relaying a stream (vLLM's
own ``with_cancellation`` does the same). One watcher task per request covers all three; the
request's own task does all the work (no task group, no task per response).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any

from starlette.types import Receive

from serving.gateway.errors import BodyTooLarge

__all__ = ["DRAIN_LIMIT", "ClientGone", "DisconnectWatch", "header", "read_body"]

#: Past the body limit, at most this many bytes are read (and discarded) before giving up.
DRAIN_LIMIT = 64 * 1024 * 1024


class ClientGone(Exception):
    """The client disconnected before the gateway answered."""


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case, as ASGI gives names) in an ASGI
    ``scope["headers"]`` list, decoded as latin-1 (HTTP's bytes, unchanged); None if absent."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    """The request body; ``BodyTooLarge`` (413) past ``limit`` bytes, ``ClientGone`` if the
    client disconnects while sending it. ``content_length`` is the header's value, if any."""
    too_large = content_length is not None and content_length.isdigit() and \
        int(content_length) > limit
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body: bytes = message.get("body", b"")
        size += len(body)
        if too_large or size > limit:
            too_large = True
            chunks.clear()  # never hold more than the limit
            if size > DRAIN_LIMIT:
                break
        elif body:
            chunks.append(body)
        if not message.get("more_body", False):
            break
    if too_large:
        raise BodyTooLarge(limit)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class DisconnectWatch:
    """Cancels the task that creates it when the client disconnects, until ``stop()``.

    Made after the body is read (the watcher then owns ``receive``). The watched task wraps its
    work in ``try: ... except asyncio.CancelledError: if not watch.claim(): raise`` and
    ``finally: watch.stop()``: ``claim()`` tells the client's leaving (the cancellation is then
    withdrawn) from any other cancellation (a server shutdown), which must go on.

    Why no task of its own: a task per request (made, then cancelled, and its cancellation run
    through the loop) cost about 10 us of CPU, a thirtieth of a whole proxied request. The
    watcher coroutine is stepped here instead, as a task would step it: each future it waits on
    (uvicorn's ``receive`` waits on one ``asyncio.Event``) gets a done callback that resumes it;
    ``stop()`` throws ``CancelledError`` into it where it waits. A ``receive`` that waits on
    anything but an asyncio future gets a task after all.
    """

    __slots__ = ("_active", "_caller", "_coro", "_fired", "_receive", "_task", "_waiting")

    def __init__(self, receive: Receive) -> None:
        caller = asyncio.current_task()
        if caller is None:
            raise RuntimeError("DisconnectWatch must be made inside a task")
        self._caller = caller
        self._active = True
        self._fired = False
        self._task: asyncio.Task[None] | None = None
        self._waiting: asyncio.Future[Any] | None = None
        self._receive = receive
        self._coro: Coroutine[Any, Any, None] | None = _until_disconnect(receive)
        self._step(None)

    def _step(self, _done: asyncio.Future[Any] | None) -> None:
        """Resume the watcher coroutine until it waits on a future again, or ends."""
        coro = self._coro
        self._waiting = None
        if coro is None or not self._active:
            return
        try:
            waited = coro.send(None)
        except StopIteration:  # the client disconnected
            self._coro = None
            self._on_done()
            return
        except BaseException:  # receive() failed: nothing more to watch (as a task would end)
            self._coro = None
            return
        if getattr(waited, "_asyncio_future_blocking", None):
            # What ``Task`` does with an awaited future: resume when it is done.
            waited._asyncio_future_blocking = False
            self._waiting = waited
            waited.add_done_callback(self._step)
            return
        # Not an asyncio future (a bare yield, another framework's awaitable): a task steps a
        # fresh watcher (the unfinished ``receive()`` consumed no message).
        coro.close()
        self._coro = None
        self._task = asyncio.ensure_future(_until_disconnect(self._receive))
        self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._on_done()

    def _on_done(self) -> None:
        # ``_active`` matters: the watcher may finish in the same loop turn as the work (uvicorn
        # answers ``receive()`` with a disconnect once the response is complete).
        if self._active:
            self._fired = True
            self._caller.cancel()

    def claim(self) -> bool:
        """Call on ``CancelledError``: True when it is this watch's (the client left); the
        task's cancellation is then withdrawn, so it can record the cancel and return."""
        if not self._fired:
            return False
        self._fired = False
        self._caller.uncancel()
        return True

    def stop(self) -> None:
        """Stop watching (the response is complete, or the work is over)."""
        self._active = False
        if self._task is not None:
            self._task.cancel()
        coro, self._coro = self._coro, None
        if coro is None:
            return
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.remove_done_callback(self._step)
        # As a task's cancellation would: CancelledError where the coroutine waits, so its
        # ``finally`` blocks run (uvicorn's ``Event.wait`` removes its waiter there).
        try:
            coro.throw(asyncio.CancelledError())
        except BaseException:  # CancelledError, StopIteration: it ended
            return
        coro.close()  # it waited again while being cancelled: no more steps
