"""Sending one request to a replica of its pool and reading what comes back.

``Forwarder.unary`` POSTs and reads the whole answer (with a size bound); ``Forwarder.open``
POSTs and returns as soon as the upstream's headers arrive, leaving the body (an SSE stream) to
be relayed (``serving.gateway.front.relay``). Both go through the replica's connections
(``http_client``, which says why the gateway has its own client on this path), pick the
replica (``Upstreams.pick``), retry once on another replica when the connection could not even
be made (nothing was sent, so nothing can run twice), and turn every transport failure into the
gateway's error: a read timeout into ``UpstreamTimeout`` (504), a reset or protocol error into
``UpstreamFailure`` (502), a 200 whose body is not JSON into 502.

The replica's cost ledger (``accounting.ShareLedger``) is entered before sending and left when
the exchange ends however it ends (a cancelled task included), so every request is charged for
the replica time it held. Upstream requests carry ``Accept-Encoding: identity``: the body is
relayed byte for byte, never decompressed and re-compressed. A response is either read to its
end and its connection kept for the next request, or closed with its connection: closing an
unfinished response is how the gateway tells vLLM to abort.

With prefix-aware routing (``routing``) a request's prompt (``prompt_key.PromptKey``, from
``Forwarder.prompt_of``) goes with it: ``pick`` routes by it, the replica is told what it was
sent (``Upstreams.sent``), and its prefill counts as waiting there until its first token, for
a stream the first body bytes from the replica (vLLM sends its first event once the prompt is
prefilled; that TTFT teaches the replica's prefill rate, unless the event is an error), for a
non-streaming request until its estimated prefill time has passed (``Sent.settle_after``) or
its answer came, if sooner. A request that never ran there (no connection, a transport error
or cancellation before the answer's head, an error status) takes back the chunks it added to
the replica's memory (``Sent.fail``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.gateway.errors import UpstreamFailure, UpstreamTimeout
from serving.gateway.upstream.http_client import ConnectFailed, ReadTimeout, Response, UpstreamError
from serving.gateway.upstream.prompt_key import PromptKey
from serving.gateway.upstream.replicas import Replica, Upstreams
from serving.gateway.upstream.routing import Sent

__all__ = [
    "MAX_UPSTREAM_BYTES",
    "Charge",
    "Forwarder",
    "OpenStream",
    "UpstreamReply",
    "describe",
    "error_message",
    "failure",
]

#: An upstream answer larger than this is refused (bytes): a completion is kilobytes.
MAX_UPSTREAM_BYTES = 64 * 1024 * 1024
#: Seconds a finished stream's connection waits for the end of the replica's body before it is
#: closed instead of kept.
_TAIL_GRACE_S = 5.0
#: A stream's first event that is an error (vLLM's ``{"error": ...}``, or the older
#: ``{"object": "error", ...}``): its timing says nothing of prefill.
_ERROR_EVENT = re.compile(rb'^\s*data:\s*\{\s*("error"|"object"\s*:\s*"error")')


@dataclass(slots=True)
class Charge:
    """Where a request ran and the replica time it is charged for (seconds of the whole
    replica, ``accounting.ShareLedger``); filled in by the ``Forwarder`` as the exchange goes,
    so it is right however the exchange ends (failure or cancellation included)."""

    replica: Replica | None = None
    share_s: float = 0.0
    #: Its prefill, waiting on the replica for the first token (prefix-aware routing only).
    sent: Sent | None = None

    def settle(self) -> None:
        """The exchange is over: its prefill waits no more (if it still did)."""
        if self.sent is not None:
            self.sent.settle()

    def fail(self) -> None:
        """The request never ran on its replica (``Sent.fail``)."""
        if self.sent is not None:
            self.sent.fail()


@dataclass(slots=True)
class UpstreamReply:
    """A complete upstream answer: status, raw JSON bytes, and the parsed object."""

    replica: Replica
    status: int
    content: bytes
    #: The parsed body; for an error status, always a dict with an ``error`` object.
    data: dict[str, Any]
    content_type: str = "application/json"


@dataclass(slots=True)
class OpenStream:
    """An upstream 200 whose body is still to be read; ``close()`` when done with it."""

    replica: Replica
    response: Response
    mark: float
    charge: Charge

    def close(self, *, whole: bool) -> None:
        """The stream is over: charge the replica time it held, and let go of the response.
        ``whole``: the client has the complete stream, so the connection is kept for the next
        request once the replica ends the body (``Response.detach``); else the connection is
        closed at once (the replica aborts the request). Synchronous, so it runs even in a
        task being cancelled."""
        response = self.response
        if isinstance(response, _FirstRead):
            response = response.response
        if whole:
            response.detach(_TAIL_GRACE_S)
        else:
            response.close()
        self.charge.share_s += self.replica.ledger.leave(self.mark)
        self.charge.settle()


class _FirstRead:
    """A stream's response that tells its ``Sent`` once its first body bytes are read (its
    first token, or, for an error event, only its end), then gets out of the way: after the
    first ``read`` the instance's own ``read`` is the response's, so the relay's later reads
    cost nothing extra."""

    def __init__(self, response: Response, sent: Sent) -> None:
        self.response = response
        self._sent = sent

    async def read(self) -> bytes:
        data = await self.response.read()
        self.read = self.response.read  # type: ignore[method-assign]
        if data:
            if _ERROR_EVENT.match(data):
                self._sent.settle()
            else:
                self._sent.first_token()
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.response, name)


def error_message(data: dict[str, Any]) -> str:
    """The message of an OpenAI/vLLM error body (``{"error": {"message": ...}}``)."""
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message", ""))
    return str(err)


def describe(exc: BaseException) -> str:
    """``"ClassName: message"`` of a transport error (the class alone without a message)."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


class Forwarder:
    """Requests to the replicas of ``upstreams`` with failover on connection failure.

    ``retry_after``: the ``Retry-After`` (seconds) of a 503 when no replica can take a request.
    """

    def __init__(self, upstreams: Upstreams, *, read_timeout: float, retry_after: int) -> None:
        self._up = upstreams
        self._read_timeout = read_timeout
        self._retry_after = retry_after

    def prompt_of(self, endpoint: str, body: Mapping[str, Any]) -> PromptKey | None:
        """What to route a request of ``endpoint`` with ``body`` by (``Upstreams.prompt_of``;
        None with least-outstanding routing)."""
        return self._up.prompt_of(endpoint, body)

    def _failure(self, replica: Replica, exc: BaseException) -> UpstreamFailure | UpstreamTimeout:
        return failure(replica.name, exc, self._read_timeout)

    async def _send(self, pool: str, path: str, payload: bytes, *, premium: bool,
                    charge: Charge, prompt: PromptKey | None, stream: bool, trace: bytes = b""
                    ) -> tuple[Replica, Response, float]:
        """Send on the routed replica, or on another one if it cannot be reached; the replica,
        the response with its body unread, and the ledger mark (left by the caller).
        ``stream``: the first token will be seen (else its prefill settles on a timer)."""
        exclude: Replica | None = None
        for attempt in (1, 2):
            replica = self._up.pick(pool, beyond_kv_limit=premium, exclude=exclude,
                                    prompt=prompt)
            if replica is None:
                raise self._up.no_replica(pool, retry_after=self._retry_after)
            connections = replica.connections
            if connections is None:
                raise RuntimeError("the gateway's upstreams are not started")
            charge.replica = replica
            if prompt is not None:
                charge.sent = self._up.sent(replica, prompt)
                if not stream:
                    charge.sent.settle_after(asyncio.get_running_loop().call_later)
            mark = replica.ledger.enter()
            try:
                # Cancelled before the answer's head, the connection is closed (post's own).
                response = await connections.post(path, payload, extra=trace)
                return replica, response, mark
            except ConnectFailed as exc:
                charge.fail()
                replica.ledger.leave(mark)  # nothing ran there: nothing to charge
                replica.mark_down(f"connect failed: {describe(exc)}")
                if attempt == 2:
                    raise UpstreamFailure(replica.name, describe(exc)) from None
                exclude = replica
            except UpstreamError as exc:
                charge.fail()
                charge.share_s += replica.ledger.leave(mark)
                raise self._failure(replica, exc) from None
            except BaseException:
                charge.fail()
                charge.share_s += replica.ledger.leave(mark)  # cancelled: charged all the same
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _complete(self, replica: Replica, response: Response, mark: float,
                        charge: Charge) -> UpstreamReply:
        """Read the rest of ``response``, close it (an unfinished one closes its connection,
        cancelled included), leave the ledger, classify."""
        if response.status != 200:
            charge.fail()  # refused: nothing of it is cached there
        try:
            content = await response.read_all(MAX_UPSTREAM_BYTES)
        except UpstreamError as exc:
            raise self._failure(replica, exc) from None
        finally:
            response.close()
            charge.share_s += replica.ledger.leave(mark)
            charge.settle()
        return _reply(replica, response.status, content)

    async def unary(self, pool: str, path: str, payload: bytes, *, premium: bool = False,
                    charge: Charge, prompt: PromptKey | None = None, trace: bytes = b""
                    ) -> UpstreamReply:
        """POST ``payload`` to ``path`` on a replica of ``pool``; the complete answer.
        ``prompt``: what prefix-aware routing routes by (``prompt_of``); ``trace``: header
        lines sent with it (``traceparent``)."""
        replica, response, mark = await self._send(pool, path, payload, premium=premium,
                                                   charge=charge, prompt=prompt, stream=False,
                                                   trace=trace)
        return await self._complete(replica, response, mark, charge)

    async def open(self, pool: str, path: str, payload: bytes, *, premium: bool = False,
                   charge: Charge, prompt: PromptKey | None = None, trace: bytes = b""
                   ) -> OpenStream | UpstreamReply:
        """POST a streaming request: the open stream on a 200 event stream, else the complete
        answer (an error, or garbage raised as ``UpstreamFailure``). ``prompt`` as for
        ``unary``."""
        replica, response, mark = await self._send(pool, path, payload, premium=premium,
                                                   charge=charge, prompt=prompt, stream=True,
                                                   trace=trace)
        if response.status == 200 and (response.header(b"content-type") or "").startswith(
                "text/event-stream"):
            sent = charge.sent
            if sent is not None and sent.waiting:
                first = _FirstRead(response, sent)
                return OpenStream(replica, first, mark, charge)  # type: ignore[arg-type]
            return OpenStream(replica, response, mark, charge)
        return await self._complete(replica, response, mark, charge)


def failure(replica: str, exc: BaseException, read_timeout: float
            ) -> UpstreamFailure | UpstreamTimeout:
    """The gateway's error for a transport error on ``replica``: a timeout (the replica was
    silent for ``read_timeout`` seconds) is ``UpstreamTimeout`` (504), anything else
    ``UpstreamFailure`` (502)."""
    if isinstance(exc, ReadTimeout):
        return UpstreamTimeout(replica, read_timeout)
    return UpstreamFailure(replica, describe(exc))


def _reply(replica: Replica, status: int, content: bytes) -> UpstreamReply:
    """Classify a complete answer; garbage becomes ``UpstreamFailure`` (502)."""
    try:
        data = json.loads(content) if content else None
    except ValueError:
        data = None
    if status == 200:
        if not isinstance(data, dict):
            raise UpstreamFailure(replica.name, f"answered 200 with a body that is not a JSON "
                                  f"object: {content[:80]!r}")
        return UpstreamReply(replica, status, content, data)
    if isinstance(data, dict) and "error" in data:
        return UpstreamReply(replica, status, content, data)
    if status >= 500 or status < 400:
        raise UpstreamFailure(replica.name, f"answered {status} with {content[:80]!r}")
    # A 4xx without an OpenAI error body: keep the status, give it one.
    text = content[:200].decode("utf-8", errors="replace")
    body = {"error": {"message": f"The replica answered {status}: {text}",
                      "type": "invalid_request_error", "param": None, "code": None}}
    return UpstreamReply(replica, status, json.dumps(body).encode(), body)
