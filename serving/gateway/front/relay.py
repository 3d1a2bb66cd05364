"""Relaying an upstream SSE stream to the client, event by event.

``relay`` forwards each event as soon as it is complete (``sse.SseFramer``), tallies it
(``sse.StreamTally``), and turns an upstream that stalls, resets, sends garbage or ends early
into one OpenAI-style error event followed by ``data: [DONE]`` — the HTTP status (200) is
already sent, so that is how vLLM reports errors mid-stream too.

It runs in the request's own task and writes with the ASGI ``send`` directly (``responses``):
per event that is one read from the upstream connection, a few byte comparisons, and one write.
When the client leaves, the request's ``DisconnectWatch`` cancels the task wherever it waits;
the caller then closes the upstream response (``OpenStream.close``, synchronous), which closes
its connection, and vLLM aborts a request whose connection drops. The client's response ends
with the upstream's ``[DONE]``, not with the end of the upstream's body, which vLLM sends in a
separate write.
"""

from __future__ import annotations

import time

from starlette.types import Send

from serving.gateway.errors import UpstreamFailure, error_body
from serving.gateway.front.responses import send_end
from serving.gateway.front.sse import SSE_DONE, MalformedStream, SseFramer, StreamTally, sse_event
from serving.gateway.upstream.forwarder import OpenStream, failure
from serving.gateway.upstream.http_client import UpstreamError
from vigil.errors import GatewayError

__all__ = ["relay"]


async def relay(opened: OpenStream, tally: StreamTally, send: Send, *,
                read_timeout: float) -> GatewayError | None:
    """Relay the open upstream stream to the client (whose response is started) and end the
    client's response; the failure the gateway detected (also sent as an error event), or
    None."""
    response = opened.response
    framer = SseFramer()
    inspect = tally.inspect
    problem: GatewayError | None = None
    try:
        while True:
            data = await response.read()
            if not data:  # the end of the upstream's body
                break
            now = time.perf_counter()
            events = framer.feed(data)
            if len(events) == 1:  # the usual read: one event
                kept = inspect(events[0], now)
                out = b"" if kept is None else kept
            elif events:
                # Whatever one read completed goes out in one write: as soon as it arrived,
                # and without a send (a system call) per event.
                out = b"".join([kept for e in events if (kept := inspect(e, now)) is not None])
            else:
                continue
            if tally.done:
                # [DONE]: the client's stream is whole. Its last events and the end of the
                # response go in one write, without waiting for the end of the replica's body
                # (the caller keeps the connection for when it comes).
                await send_end(send, out)
                return None
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
        if tally.finish_reason is None and tally.error is None:
            raise MalformedStream("the stream ended before its last token and [DONE]")
        tally.done = True  # finished but never said [DONE]: finish it for the client
        await send_end(send, SSE_DONE)
        return None
    except UpstreamError as exc:
        problem = failure(opened.replica.name, exc, read_timeout)
    except MalformedStream as exc:
        problem = UpstreamFailure(opened.replica.name, str(exc))
    await send_end(send, sse_event(error_body(problem)) + SSE_DONE)
    return problem
