"""vLLM's OpenAI-compatible protocol: request schemas, validation errors and response shapes.

Shapes follow vLLM 0.33 (``vllm/entrypoints/openai/*/protocol.py``), which differ slightly from
OpenAI's: errors carry the HTTP status as an int in ``code`` and a type name such as
``BadRequestError``; responses carry extra null keys (``stop_reason``, ``token_ids``,
``prompt_logprobs``, ``kv_transfer_params``); streamed chunks have no ``"usage": null``, and the
final chunk carries ``stop_reason``. Unknown request fields are accepted (vLLM only logs them).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "SSE_DONE",
    "ApiError",
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "Kind",
    "StreamOptions",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "now_s",
    "parse_request",
    "random_id",
    "sse",
    "usage",
]

SSE_DONE = "data: [DONE]\n\n"

_M = TypeVar("_M", bound=BaseModel)


class ApiError(Exception):
    """An error answered as vLLM's ``{"error": {...}}`` body with HTTP ``status``."""

    def __init__(self, message: str, *, status: int = 400, type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param

    @classmethod
    def validation(cls, message: str, *, parameter: str, value: object) -> ApiError:
        """vLLM's ``VLLMValidationError``: the message ends with ``(parameter=..., value=...)``."""
        return cls(f"{message} (parameter={parameter}, value={value})", param=parameter)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.status, param=self.param)


def error_body(message: str, *, type: str, code: int, param: str | None = None
               ) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Base):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _SamplingFields(_Base):
    """The request fields the simulator acts on (others are accepted and ignored)."""

    model: str | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    def requested_max_tokens(self) -> int | None:
        """vLLM: ``max_completion_tokens or max_tokens`` (None: up to max_model_len)."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    #: OpenAI's and vLLM's default for the legacy completions API is 16 tokens.
    max_tokens: int | None = 16
    echo: bool | None = False

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class EmbeddingRequest(_Base):
    """``POST /v1/embeddings``: ``input`` is checked by ``serving.sim.embeddings``."""

    model: str | None = None
    input: Any = None
    encoding_format: str | None = None
    dimensions: int | None = None


def parse_request(raw: bytes, model: type[_M]) -> _M:
    """Parse a JSON body into ``model``; malformed JSON or schema errors become a 400."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        raise ApiError(f"Invalid request: {errors}",
                       param=str(first[0]) if first else None) from None


def random_id(prefix: str) -> str:
    """vLLM-style ids: ``chatcmpl-<32 hex>``, ``cmpl-<32 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event, compact JSON as vLLM's ``model_dump_json``."""
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def now_s() -> int:
    return int(time.time())


# --- non-streaming responses ----------------------------------------------------------------


def chat_response(*, rid: str, created: int, model: str, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    message = {"role": "assistant", "content": text, "refusal": None, "annotations": None,
               "audio": None, "function_call": None, "tool_calls": [],
               "reasoning_content": None}
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason, "stop_reason": None, "token_ids": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {**usage(prompt_tokens, completion_tokens), "prompt_tokens_details": None},
        "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None,
    }


def completion_response(*, rid: str, created: int, model: str, text: str, finish_reason: str,
                        prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                     "prompt_token_ids": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {**usage(prompt_tokens, completion_tokens), "prompt_tokens_details": None},
        "kv_transfer_params": None,
    }


# --- streaming chunks -------------------------------------------------------------------------


def chat_chunk(*, rid: str, created: int, model: str, delta: dict[str, Any] | None,
               finish_reason: str | None = None, usage_: dict[str, int] | None = None
               ) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``delta=None`` makes the final usage chunk (no choices)."""
    chunk: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created,
                             "model": model}
    if delta is None:
        chunk["choices"] = []
    else:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        if "role" not in delta:
            if finish_reason is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
        chunk["choices"] = [choice]
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def completion_chunk(*, rid: str, created: int, model: str, text: str | None,
                     finish_reason: str | None = None, usage_: dict[str, int] | None = None
                     ) -> dict[str, Any]:
    """A streamed ``text_completion``; ``text=None`` makes the final usage chunk."""
    chunk: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created,
                             "model": model}
    if text is None:
        chunk["choices"] = []
    else:
        chunk["choices"] = [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": finish_reason, "stop_reason": None,
                             "token_ids": None}]
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


Kind = Literal["chat", "completion"]
