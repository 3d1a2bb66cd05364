"""What the batch queue and the gateway call of each other, typed on both sides.

The queue (``queue.BatchQueue``, and its API ``api.BatchApi``) is built with callbacks into the
gateway, and the gateway reads the queue's depth back. Each callback's type is a ``Protocol``
here, so that mypy checks the side that implements it and the side that calls it against one
signature:

* ``SendBatch``: the queue's ``send(request)``, one released request upstream
  (``serving.gateway.gateway.Gateway.send_batch``);
* ``PoolLoadOf``: the queue's ``load(pool)``, asked before it releases work
  (``serving.gateway.upstream.replicas.Upstreams.load``);
* ``AuthenticateCaller``: the API's ``auth(request)``, the caller of an API call, raising the
  401 itself (the app's ``auth``, over ``Gateway.keys``);
* ``PoolOfModel``: the API's ``pool_of_model(model)``, checking input lines
  (``Gateway.pool_of_model``);
* ``QueueDepth``: the gateway's ``batch_depth(pool)``, for its queue-depth gauge
  (``BatchQueue.depth``).

``BatchRequest`` is what the queue hands to ``send``; ``BatchReply`` what comes back.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from serving.gateway.tiers import Caller, PoolLoad

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "AuthenticateCaller",
    "BatchReply",
    "BatchRequest",
    "PoolLoadOf",
    "PoolOfModel",
    "QueueDepth",
    "SendBatch",
]

#: What ``send`` answers: (HTTP status, JSON body); an error's body is OpenAI's error object.
BatchReply = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class BatchRequest:
    """One request of a batch, released to the gateway's ``send``.

    ``caller.tier`` is always ``"batch"`` (``vigil.conventions.TIER_BATCH``): whatever the
    submitting key's tier, queued work runs at vLLM ``priority`` ``TIER_PRIORITY["batch"]``
    (2). ``body`` is the input line's body as the caller wrote it (the gateway applies its
    max_tokens policy).
    """

    batch_id: str
    custom_id: str
    pool: str
    endpoint: Literal["chat", "completions"]
    body: dict[str, Any]
    caller: Caller


class SendBatch(Protocol):
    """Performs one released request upstream; returns ``(HTTP status, JSON body)``."""

    def __call__(self, request: BatchRequest, /) -> Awaitable[BatchReply]: ...


class PoolLoadOf(Protocol):
    """The load of ``pool`` as last seen."""

    def __call__(self, pool: str, /) -> PoolLoad: ...


class AuthenticateCaller(Protocol):
    """The caller of an API call, from its API key; raises the 401 itself."""

    def __call__(self, request: Request, /) -> Awaitable[Caller]: ...


class PoolOfModel(Protocol):
    """The pool serving ``model``; None when no pool serves it."""

    def __call__(self, model: str, /) -> str | None: ...


class QueueDepth(Protocol):
    """Batch requests of ``pool`` waiting or in flight."""

    def __call__(self, pool: str, /) -> int: ...
