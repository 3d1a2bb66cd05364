"""Relaying an upstream SSE stream to the client, event by event, and closing it at once.

``relay`` forwards each event as soon as it is complete (``sse.SseFramer``), tallies it
(``sse.StreamTally``), and turns an upstream that stalls, resets, sends garbage or ends early
into one OpenAI-style error event followed by ``data: [DONE]`` — the HTTP status (200) is
already sent, so that is how vLLM reports errors mid-stream too.

``RelayResponse`` is a ``StreamingResponse`` that always runs ``on_close`` when the response
ends, however it ends. When the client disconnects, Starlette cancels the streaming task; the
generator's own ``finally`` may not await anything then (anyio's cancellation would cancel the
await too), so the upstream response is closed in ``on_close``, after the cancel scope is gone:
closing an unfinished httpx response closes its connection, and vLLM aborts the request when its
client connection drops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from serving.gateway.errors import UpstreamFailure, UpstreamTimeout, error_body
from serving.gateway.sse import SSE_DONE, MalformedStream, SseFramer, StreamTally, sse_event
from vigil.errors import GatewayError

__all__ = ["RelayResponse", "StreamOutcome", "relay"]


@dataclass(slots=True)
class StreamOutcome:
    """How the relay ended, for the record: a gateway-detected failure, or None."""

    failure: GatewayError | None = None


async def relay(response: httpx.Response, tally: StreamTally, outcome: StreamOutcome, *,
                replica: str, read_timeout: float) -> AsyncIterator[bytes]:
    """The client's byte stream for the upstream ``response``."""
    framer = SseFramer()
    try:
        async for data in response.aiter_raw():
            now = time.perf_counter()
            events = framer.feed(data)
            if not events:
                continue
            # Whatever one read completed goes out in one write: as soon as it arrived, and
            # without a send (a system call) per event.
            out = [kept for e in events if (kept := tally.inspect(e, now)) is not None]
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
        if tally.done:
            return
        if tally.finish_reason is None and tally.error is None:
            raise MalformedStream("the stream ended before its last token and [DONE]")
        yield SSE_DONE  # finished but never said [DONE]: finish it for the client
        tally.done = True
        return
    except httpx.TimeoutException:
        outcome.failure = UpstreamTimeout(replica, read_timeout)
    except httpx.HTTPError as exc:
        outcome.failure = UpstreamFailure(replica, f"{type(exc).__name__}: {exc}".rstrip(": "))
    except MalformedStream as exc:
        outcome.failure = UpstreamFailure(replica, str(exc))
    yield sse_event(error_body(outcome.failure))
    yield SSE_DONE


class RelayResponse(StreamingResponse):
    """A streaming response that awaits ``on_close`` when it ends (client gone included)."""

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], Awaitable[None]],
                 headers: Mapping[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(RuntimeError):
                    await aclose()
            await self._on_close()
