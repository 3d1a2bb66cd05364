"""Streams and complete responses, both ways.

``replay_stream`` plays a cached ``chat.completion`` / ``text_completion`` to a streaming client
as vLLM's server-sent events: for chat, a role chunk (``{"role": "assistant", "content": ""}``)
then the content in one chunk carrying ``finish_reason``; for completions, one chunk per choice;
then, when the client asked for ``stream_options.include_usage``, the usage chunk
(``"choices": []``); then ``data: [DONE]``. Like vLLM, ordinary chunks carry no ``usage`` key.
The content goes out whole: nothing is gained by pacing an answer that is already here.

``assemble_stream`` does the reverse for a streamed upstream answer, so it can be stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = ["DONE", "assemble_stream", "replay_stream", "sse_event"]

DONE = b"data: [DONE]\n\n"
_CHUNK_OBJECTS = {"chat.completion": "chat.completion.chunk",
                  "text_completion": "text_completion"}
#: Message fields streamed as deltas before the content (vLLM's reasoning parsers use either).
_EXTRA_DELTA_FIELDS = ("reasoning_content", "reasoning", "refusal")


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event, compact JSON as vLLM writes it."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _chat_chunks(response: dict[str, Any], head: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for i, choice in enumerate(response["choices"]):
        index = choice.get("index", i)
        message = choice.get("message") or {}
        yield {**head, "choices": [{"index": index, "delta": {
            "role": message.get("role") or "assistant", "content": ""},
            "logprobs": None, "finish_reason": None}]}
        for field in _EXTRA_DELTA_FIELDS:
            if message.get(field):
                yield {**head, "choices": [{"index": index, "delta": {field: message[field]},
                                            "logprobs": None, "finish_reason": None}]}
        content = message.get("content")
        last: dict[str, Any] = {"index": index,
                                "delta": {"content": content} if content is not None else {},
                                "logprobs": None, "finish_reason": choice.get("finish_reason")}
        if "stop_reason" in choice:
            last["stop_reason"] = choice["stop_reason"]
        yield {**head, "choices": [last]}


def _completion_chunks(response: dict[str, Any], head: dict[str, Any]
                       ) -> Iterator[dict[str, Any]]:
    for i, choice in enumerate(response["choices"]):
        out: dict[str, Any] = {"index": choice.get("index", i), "text": choice.get("text", ""),
                               "logprobs": None, "finish_reason": choice.get("finish_reason")}
        if "stop_reason" in choice:
            out["stop_reason"] = choice["stop_reason"]
        yield {**head, "choices": [out]}


def replay_stream(response: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """``response`` (a complete ``chat.completion`` or ``text_completion``) as SSE events:
    ``data: {json}`` ..., the usage chunk when ``include_usage``, then ``data: [DONE]`` (each
    event ends with a blank line). Raises ``ValueError`` for any other object."""
    obj = response.get("object")
    if obj not in _CHUNK_OBJECTS or not isinstance(response.get("choices"), list):
        raise ValueError(f"cannot stream a {obj!r} response (chat.completion or "
                         "text_completion with choices expected)")
    head = {"id": response.get("id"), "object": _CHUNK_OBJECTS[obj],
            "created": response.get("created"), "model": response.get("model")}
    chunks = _chat_chunks if obj == "chat.completion" else _completion_chunks
    for chunk in chunks(response, head):
        yield sse_event(chunk)
    usage = response.get("usage")
    if include_usage and usage is not None:
        yield sse_event({**head, "choices": [], "usage": usage})
    yield DONE


class _Choice:
    __slots__ = ("finish_reason", "has_stop_reason", "parts", "role", "stop_reason")

    def __init__(self) -> None:
        self.role: str | None = None
        self.parts: dict[str, list[str]] = {}
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.has_stop_reason = False

    def add(self, field: str, text: Any) -> None:
        if isinstance(text, str) and text:
            self.parts.setdefault(field, []).append(text)

    def text(self, field: str) -> str:
        return "".join(self.parts.get(field, ()))


def assemble_stream(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The complete response of a stream's parsed chunk objects: content joined per choice,
    each choice's ``finish_reason``, the last ``usage`` seen. None when the stream is not a
    finished answer: no chunks, an error event, a choice without ``finish_reason`` (cut off),
    or tool-call deltas (those answers are never cached, so they are not rebuilt)."""
    first: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    usage: Any = None
    for chunk in chunks:
        if not isinstance(chunk, dict) or "error" in chunk:
            return None
        if first is None:
            first = chunk
        elif chunk.get("object") != first.get("object"):
            return None
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            if not isinstance(raw, dict):
                return None
            index = raw.get("index", 0)
            state = choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            if first.get("object") == "chat.completion.chunk":
                delta = raw.get("delta") or {}
                if delta.get("tool_calls") or delta.get("function_call"):
                    return None
                state.role = state.role or delta.get("role")
                for field in ("content", *_EXTRA_DELTA_FIELDS):
                    state.add(field, delta.get(field))
            else:
                state.add("text", raw.get("text"))
            if raw.get("finish_reason") is not None:
                state.finish_reason = raw["finish_reason"]
            if "stop_reason" in raw:
                state.stop_reason, state.has_stop_reason = raw["stop_reason"], True
    if first is None or first.get("object") not in ("chat.completion.chunk", "text_completion"):
        return None
    if not choices or any(c.finish_reason is None for c in choices.values()):
        return None
    chat = first["object"] == "chat.completion.chunk"
    out_choices = []
    for index in sorted(choices):
        state = choices[index]
        choice: dict[str, Any] = {"index": index}
        if chat:
            message: dict[str, Any] = {"role": state.role or "assistant",
                                       "content": state.text("content")}
            for field in _EXTRA_DELTA_FIELDS:
                if field in state.parts:
                    message[field] = state.text(field)
            choice["message"] = message
        else:
            choice["text"] = state.text("text")
        choice["logprobs"] = None
        choice["finish_reason"] = state.finish_reason
        if state.has_stop_reason:
            choice["stop_reason"] = state.stop_reason
        out_choices.append(choice)
    return {"id": first.get("id"), "object": "chat.completion" if chat else "text_completion",
            "created": first.get("created"), "model": first.get("model"),
            "choices": out_choices, "usage": usage}
