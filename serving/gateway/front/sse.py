"""Server-sent events passing through the gateway: framing, and what each event tells.

Why our own framer: httpx hands over network reads, which may hold half an event or several;
the gateway must forward whole events as they complete (never wait for more) and look inside
some of them. ``httpx-sse`` is not a dependency and decodes to text; this is the ten lines that
split bytes on the blank line that ends an SSE event, without copying what passes through.

``StreamTally`` watches the events of one OpenAI-style stream (chat or completions) and keeps
what the record needs: when the first token came, the usage chunk, the finish reason, content
chunks (the token count when usage never arrives), a mid-stream error, and, when the response
may be cached, every chunk object. It drops the final usage chunk if the client did not ask for
it (the gateway always asks upstream, to account tokens).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SSE_DONE", "MalformedStream", "SseFramer", "StreamTally", "sse_event"]

SSE_DONE = b"data: [DONE]\n\n"
_DONE_PAYLOAD = b"[DONE]"
#: What makes a chunk worth parsing: usage, a finish reason, an error.
_NEEDS_PARSE = re.compile(rb'"usage"\s*:\s*\{|"finish_reason"\s*:\s*"|"error"\s*:')
#: A chunk that carries output: non-empty content, text or reasoning, or a tool call.
_CARRIES_TOKENS = re.compile(
    rb'"(?:content|text|reasoning_content)"\s*:\s*"[^"]|"tool_calls"\s*:\s*\[\s*\{')


class MalformedStream(Exception):
    """The upstream sent an event that is not JSON (nor ``[DONE]``)."""


def sse_event(obj: dict[str, Any]) -> bytes:
    """One ``data:`` event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class SseFramer:
    """Splits a byte stream into complete SSE events (each returned with its ``\\n\\n``)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events completed by ``data`` (possibly none)."""
        if not self._buf and len(data) > 2 and data.find(b"\n\n") == len(data) - 2 \
                and b"\r" not in data:
            return [data]  # the usual read: exactly one whole event, passed on as it is
        if b"\r" in data:
            # SSE allows CRLF and CR line ends; vLLM and OpenAI send LF. Normalise once.
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + data if self._buf else data
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        parts = buf.split(b"\n\n")
        self._buf = parts.pop()
        return [p + b"\n\n" for p in parts if p]

    def rest(self) -> bytes:
        """Bytes of an event the stream never finished."""
        return self._buf


def _payload(event: bytes) -> bytes | None:
    """The data of an event (data lines joined by newlines), None for a comment-only event."""
    if event.startswith(b"data: ") and event.count(b"\n") == 2:
        return event[6:-2]  # the usual one-line event, without splitting
    lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n")
             if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


@dataclass(slots=True)
class StreamTally:
    """What one stream said so far. ``perf`` times are ``time.perf_counter`` seconds."""

    #: The client asked for the final usage chunk (else it is dropped).
    include_usage: bool
    #: Keep every chunk object (the response may be stored in the cache).
    keep_chunks: bool = False
    first_at: float | None = None
    content_chunks: int = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    #: A mid-stream ``{"error": {...}}`` event's error object.
    error: dict[str, Any] | None = None
    done: bool = False
    upstream_id: str = ""
    chunks: list[dict[str, Any]] = field(default_factory=list)

    def inspect(self, event: bytes, now: float) -> bytes | None:
        """Account ``event`` (received at ``now``); the bytes to forward, or None to drop it.

        Raises ``MalformedStream`` for an event whose data is not JSON.
        """
        payload = _payload(event)
        if payload is None:
            return event  # a comment or keep-alive: forward as is
        if payload == _DONE_PAYLOAD:
            self.done = True
            return event
        if (self.first_at is not None and not self.keep_chunks and payload[:1] == b"{"
                and payload[-1:] == b"}" and _NEEDS_PARSE.search(payload) is None):
            # An ordinary token chunk after the first: it is only counted. Parsing every chunk
            # cost more than all the rest of the gateway's own per-chunk work.
            if _CARRIES_TOKENS.search(payload) is not None:
                self.content_chunks += 1
            return event
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise MalformedStream(f"an event that is not JSON: {payload[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise MalformedStream(f"an event that is not a JSON object: {payload[:80]!r}")
        choices = chunk.get("choices")
        if "error" in chunk and choices is None:
            err = chunk["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)}
            return event
        if not self.upstream_id and isinstance(chunk.get("id"), str):
            self.upstream_id = chunk["id"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if self.keep_chunks:
            self.chunks.append(chunk)
        if isinstance(choices, list) and choices:
            if self.first_at is None:
                # vLLM sends its first chunk (the role, for chat) with the first token.
                self.first_at = now
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                if _carries_tokens(choice):
                    self.content_chunks += 1
                reason = choice.get("finish_reason")
                if reason is not None:
                    self.finish_reason = str(reason)
        elif choices == [] and usage is not None and not self.include_usage:
            return None  # the usage chunk the gateway asked for, not the client
        return event

    def completion_tokens(self) -> tuple[int, bool]:
        """Output tokens and whether the count is exact (from usage) or counted chunks."""
        if self.usage is not None:
            n = self.usage.get("completion_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63:
                return n, True
        return self.content_chunks, False

    def prompt_tokens(self) -> int:
        """Prompt tokens from usage (0 when usage never arrived)."""
        if self.usage is not None:
            n = self.usage.get("prompt_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63:
                return n
        return 0


def _carries_tokens(choice: dict[str, Any]) -> bool:
    text = choice.get("text")
    if text:
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content")
                    or delta.get("tool_calls"))
    return False
