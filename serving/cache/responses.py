"""Which responses may be stored, and the fresh copy a hit returns.

Only a *completed* answer is stored: an OpenAI/vLLM ``chat.completion`` or ``text_completion``
of the request's endpoint, with at least one choice, every choice finished by ``stop`` or
``length`` (``length`` is complete for the max_tokens in the partition) and text content.
Error bodies, aborted or cut streams (``finish_reason`` null or ``abort``), tool calls and
content-filtered answers are refused.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from vigil.conventions import (
    CACHE_REFUSED_ERROR,
    CACHE_REFUSED_NOT_COMPLETE,
    CACHE_REFUSED_TOOL_CALLS,
    ENDPOINT_CHAT,
)

__all__ = ["COMPLETE_FINISH_REASONS", "encode", "fresh_response", "refusal_reason"]

COMPLETE_FINISH_REASONS = ("stop", "length")
_OBJECTS = {ENDPOINT_CHAT: "chat.completion"}
_ID_PREFIXES = {"chat.completion": "chatcmpl", "text_completion": "cmpl"}


def _choice_problem(choice: Any, endpoint: str) -> str | None:
    if not isinstance(choice, dict):
        return CACHE_REFUSED_NOT_COMPLETE
    finish = choice.get("finish_reason")
    if endpoint == ENDPOINT_CHAT:
        message = choice.get("message")
        if not isinstance(message, dict):
            return CACHE_REFUSED_NOT_COMPLETE
        if message.get("tool_calls") or message.get("function_call"):
            return CACHE_REFUSED_TOOL_CALLS
        if not isinstance(message.get("content"), str):
            return CACHE_REFUSED_NOT_COMPLETE
    elif not isinstance(choice.get("text"), str):
        return CACHE_REFUSED_NOT_COMPLETE
    if finish in ("tool_calls", "function_call"):
        return CACHE_REFUSED_TOOL_CALLS
    if finish not in COMPLETE_FINISH_REASONS:
        return CACHE_REFUSED_NOT_COMPLETE
    return None


def refusal_reason(response: Any, endpoint: str) -> str | None:
    """Why ``response`` must not be stored (a ``CACHE_REFUSED_*`` value), or None."""
    if not isinstance(response, dict):
        return CACHE_REFUSED_NOT_COMPLETE
    if response.get("error"):
        return CACHE_REFUSED_ERROR
    if response.get("object") != _OBJECTS.get(endpoint, "text_completion"):
        return CACHE_REFUSED_NOT_COMPLETE
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return CACHE_REFUSED_NOT_COMPLETE
    for choice in choices:
        problem = _choice_problem(choice, endpoint)
        if problem:
            return problem
    return None


def encode(response: dict[str, Any]) -> bytes:
    """The stored form: compact JSON (a private, immutable copy)."""
    return json.dumps(response, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fresh_response(body: bytes, *, created: int) -> dict[str, Any]:
    """A new copy of a stored response with its own ``id`` and ``created`` (Unix seconds):
    another request's id is never handed out twice."""
    response: dict[str, Any] = json.loads(body)
    prefix = _ID_PREFIXES.get(response.get("object", ""), "cmpl")
    response["id"] = f"{prefix}-{uuid.uuid4().hex}"
    response["created"] = created
    return response
