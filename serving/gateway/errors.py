"""The gateway's errors (leaves of ``vigil.errors.GatewayError``) and their OpenAI-style bodies.

Errors the gateway makes itself follow OpenAI's shape (``tests/fixtures/
openai_error_example.json``): ``{"error": {"message", "type", "param", "code"}}`` with a string
``type`` such as ``invalid_request_error`` and a string (or null) ``code``. Errors an upstream
vLLM server returns are passed through as they are (vLLM puts the HTTP status in ``code``).
"""

from __future__ import annotations

import re
from typing import Any

from vigil.conventions import (
    ERROR_BAD_REQUEST,
    ERROR_CODE_BUDGET,
    ERROR_OOM,
    ERROR_OVER_CAP,
    ERROR_REJECTED,
    ERROR_TIMEOUT,
    ERROR_UNAUTHORIZED,
    ERROR_UPSTREAM_5XX,
)
from vigil.errors import GatewayError

__all__ = [
    "BadRequest",
    "BodyTooLarge",
    "BudgetSpent",
    "ModelNotFound",
    "NoReplica",
    "NotFound",
    "OverCap",
    "QueueFull",
    "Unauthorized",
    "UpstreamFailure",
    "UpstreamTimeout",
    "error_body",
    "looks_like_oom",
    "upstream_5xx_class",
]


class BadRequest(GatewayError):
    """400: the body is not JSON, not an object, or a field has the wrong type or value."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message, status=400, param=param, code=code,
                         error_class=ERROR_BAD_REQUEST)


class Unauthorized(GatewayError):
    """401: no ``Authorization: Bearer`` key, or a key the config does not know."""

    def __init__(self, message: str):
        super().__init__(message, status=401, code="invalid_api_key",
                         error_class=ERROR_UNAUTHORIZED)


class NotFound(GatewayError):
    """404 for a path the gateway does not serve (or 405 for a wrong method)."""

    def __init__(self, message: str, *, status: int = 404):
        super().__init__(message, status=status, code="not_found", error_class=ERROR_BAD_REQUEST)


class ModelNotFound(GatewayError):
    """404 ``model_not_found``: no pool serves the requested model (OpenAI's answer)."""

    def __init__(self, model: str):
        shown = model if len(model) <= 200 else model[:200] + "..."
        super().__init__(f"The model `{shown}` does not exist or you do not have access to it.",
                         status=404, param="model", code="model_not_found",
                         error_class=ERROR_BAD_REQUEST)


class BodyTooLarge(GatewayError):
    """413: the request body is larger than ``[gateway] max_body_bytes``."""

    def __init__(self, limit: int):
        super().__init__(f"The request body is larger than the gateway's limit of {limit} "
                         f"bytes.", status=413, code="request_too_large",
                         error_class=ERROR_BAD_REQUEST)


class OverCap(GatewayError):
    """400: max_tokens above the tier's cap with ``over_cap = "reject"``."""

    def __init__(self, param: str, value: int, cap: int, tier: str):
        super().__init__(f"{param} is {value}, more than the {tier} tier allows ({cap}). "
                         f"Ask for at most {cap} tokens.", status=400, param=param,
                         code="max_tokens_over_cap", error_class=ERROR_OVER_CAP)
        self.value = value


class QueueFull(GatewayError):
    """429 with ``Retry-After``: the pool stayed too busy for the tier for ``max_wait``."""

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message, status=429, type="rate_limit_error",
                         code="pool_busy", error_class=ERROR_REJECTED, retry_after=retry_after)


class BudgetSpent(GatewayError):
    """429 ``insufficient_quota`` / ``budget_exceeded``: the caller's tenant spent a budget whose
    ``enforce`` is "refuse" (``serving.gateway.budgets``). Recorded as ``rejected``: refused
    before any replica, so it costs nothing in the chargeback. No ``Retry-After``: the budget
    opens again when its month ends, not within seconds. ``name``, ``monthly`` and ``spent``
    (in ``currency``) and ``month`` (``YYYY-MM``) are the budget's."""

    def __init__(self, name: str, *, month: str, monthly: float, spent: float, currency: str):
        super().__init__(f"budget \"{name}\" of {monthly:.2f} {currency} for {month} is spent "
                         f"({spent:.2f} {currency}): new requests are refused until the month "
                         f"ends", status=429, type="insufficient_quota", code=ERROR_CODE_BUDGET,
                         error_class=ERROR_REJECTED)
        self.budget = name


class NoReplica(GatewayError):
    """503 with ``Retry-After``: no healthy replica can take the request. ``empty``: the pool
    has no replica at all right now (none configured, and discovery lists none), said so."""

    def __init__(self, pool: str, *, retry_after: int, empty: bool = False):
        message = (f"Pool {pool!r} has no replicas right now (none configured or discovered)."
                   if empty else
                   f"No replica of pool {pool!r} is healthy with KV-cache room right now.")
        super().__init__(message, status=503, type="server_error", code="no_replica",
                         error_class=ERROR_REJECTED, retry_after=retry_after)


class UpstreamTimeout(GatewayError):
    """504: the upstream replica sent nothing for ``read_timeout`` seconds."""

    def __init__(self, replica: str, seconds: float):
        super().__init__(f"Replica {replica!r} sent nothing for {seconds:g} s.", status=504,
                         type="server_error", code="upstream_timeout",
                         error_class=ERROR_TIMEOUT)
        self.replica = replica


class UpstreamFailure(GatewayError):
    """502: the upstream reset the connection, broke the protocol or answered garbage."""

    def __init__(self, replica: str, what: str):
        super().__init__(f"Replica {replica!r} failed: {what}", status=502, type="server_error",
                         code="upstream_error", error_class=ERROR_UPSTREAM_5XX)
        self.replica = replica


def error_body(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's ``{"error": {...}}`` for ``exc``."""
    return {"error": {"message": exc.reason, "type": exc.type, "param": exc.param,
                      "code": exc.code}}


# CUDA's and vLLM's phrasings of running out of GPU memory ("CUDA out of memory",
# "torch.OutOfMemoryError", "OOM"); a word boundary keeps "room" and "zoom" out.
_OOM = re.compile(r"out of memory|outofmemory|\boom\b", re.IGNORECASE)


def looks_like_oom(message: str) -> bool:
    """True when an upstream error message says the GPU ran out of memory."""
    return _OOM.search(message) is not None


def upstream_5xx_class(message: str) -> str:
    """``oom`` when ``message`` names an out-of-memory failure, else ``upstream_5xx``."""
    return ERROR_OOM if looks_like_oom(message) else ERROR_UPSTREAM_5XX
