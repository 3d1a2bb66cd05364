"""Cache keys: the partition, the exact L1 hash and the text the semantic L2 embeds.

* **Partition** (``CacheKey.partition``): tenant, pool, endpoint, model, the system prompt
  (every system/developer message, whitespace-normalised, case kept) and every request field
  that can change the answer. The fields are taken by *exclusion*: all of the body except the
  conversation and the fields listed in ``NEUTRAL_FIELDS`` (streaming, priority, metadata, ...).
  An unknown vLLM sampling extra (``min_p``, ``guided_json``, ``chat_template_kwargs``) thus
  splits the partition instead of being silently ignored. Two requests in different partitions
  never hit each other, in L1 or L2.
* **L1** (``CacheKey.l1``): the partition plus the whole conversation, each message's role,
  name and text whitespace- and case-normalised (NFKC, casefold).
* **L2** (``CacheKey.l2_partition``, ``CacheKey.query``): the embedding compares only the
  conversation's *last user message*; every earlier turn must match exactly (normalised), so
  its hash is part of the L2 partition. "Yes, do it" after two different assistant answers must
  not hit. A chat whose last message is not the user's (assistant prefill) gets no L2.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vigil.conventions import (
    CACHE_BYPASS_CONTENT,
    CACHE_BYPASS_MALFORMED,
    ENDPOINT_CHAT,
)

__all__ = [
    "NEUTRAL_FIELDS",
    "CacheKey",
    "Uncacheable",
    "build_key",
    "normalise_text",
]

#: Request fields that never change the answer's content (not part of the partition).
#: ``user``/``safety_identifier`` never get here (personal requests bypass the cache).
NEUTRAL_FIELDS = frozenset({
    "messages", "prompt", "model",                       # the partition has them explicitly
    "max_tokens", "max_completion_tokens",               # folded into one value (see below)
    "stream", "stream_options",                          # delivery, not content
    "priority", "request_id", "service_tier",            # scheduling
    "metadata", "store", "prompt_cache_key", "cache_salt", "kv_transfer_params",
    "user", "safety_identifier",
})
#: Sampling fields compared as floats: 0 and 0.0 are the same temperature.
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "length_penalty")


class Uncacheable(Exception):  # a control-flow signal inside the cache, never raised out
    """The request cannot be keyed; ``reason`` is the bypass reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason


@dataclass(eq=False)
class CacheKey:
    """Where a request's answer lives in the cache (from ``SemanticCache.decide``)."""

    tenant: str
    pool: str
    endpoint: str
    model: str
    #: Hex SHA-256 of the partition (tenant, pool, endpoint, model, system prompt, parameters).
    partition: str
    #: Hex SHA-256 of the partition and the whole normalised conversation.
    l1: str
    #: Hex SHA-256 of the partition and the conversation before the last user message.
    l2_partition: str
    #: The last user message (whitespace-normalised, case kept) that L2 embeds; None = L1 only.
    query: str | None
    #: The query's embedding once ``lookup`` computed it; ``store`` reuses it (unit norm).
    embedding: np.ndarray | None = field(default=None, repr=False)
    #: ``lookup`` tried to embed (a failure is not retried by ``store``).
    embed_attempted: bool = field(default=False, repr=False)


def normalise_text(text: str) -> str:
    """``text`` with Unicode compatibility forms folded, case folded and whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _squash(text: str) -> str:
    """Whitespace collapsed, case kept (system prompts, the embedded query)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _digest(*parts: Any) -> str:
    # default=str: a body the gateway built in code may hold a non-JSON value; never crash.
    raw = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                     default=str)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _content_text(content: Any, where: str) -> str:
    """The text of a message's ``content``: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise Uncacheable(CACHE_BYPASS_MALFORMED, f"{where}: a content part is not an "
                                  "object")
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                # Images, audio, files: their bytes are not in the request we could hash.
                raise Uncacheable(CACHE_BYPASS_CONTENT, f"{where}: non-text content part "
                                  f"{part.get('type')!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise Uncacheable(CACHE_BYPASS_MALFORMED, f"{where}: content is "
                      f"{type(content).__name__}, not text")


def _parameters(body: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The answer-changing fields of ``body``, canonicalised."""
    params = {k: v for k, v in body.items() if k not in NEUTRAL_FIELDS}
    for name in _FLOAT_FIELDS:
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            params[name] = float(value)
    stop = params.get("stop")
    if isinstance(stop, str):
        params["stop"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        params["stop"] = sorted(set(stop))  # a set of stop strings: order is irrelevant
    # vLLM uses ``max_completion_tokens or max_tokens`` for chat, ``max_tokens`` for completions.
    max_tokens = body.get("max_tokens")
    if endpoint == ENDPOINT_CHAT and body.get("max_completion_tokens"):
        max_tokens = body["max_completion_tokens"]
    params["max_tokens"] = max_tokens
    return params


def build_key(*, pool: str, tenant: str, endpoint: str, body: dict[str, Any]) -> CacheKey:
    """The key of a request the policy admitted; raises ``Uncacheable`` for content that
    cannot be keyed (non-text parts, token-id or multiple prompts, malformed messages)."""
    model = body.get("model")
    if not isinstance(model, str):
        raise Uncacheable(CACHE_BYPASS_MALFORMED, "model is not a string")
    system: list[tuple[str, int, str]] = []
    turns: list[tuple[str, str, str]] = []
    query: str | None
    if endpoint == ENDPOINT_CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Uncacheable(CACHE_BYPASS_MALFORMED, "messages is not a non-empty list")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise Uncacheable(CACHE_BYPASS_MALFORMED, f"messages[{i}] has no role")
            role = msg["role"]
            text = _content_text(msg.get("content"), f"messages[{i}]")
            name = msg.get("name") if isinstance(msg.get("name"), str) else ""
            if role in ("system", "developer"):
                # Case kept: "Answer in CAPITALS" is another instruction than in lower case.
                system.append((role, i, _squash(text)))
            else:
                turns.append((role, name, text))
        last_role, _, last_text = turns[-1] if turns else ("", "", "")
        query = _squash(last_text) if last_role == "user" and last_text.strip() else None
        earlier = turns[:-1] if query is not None else turns
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            # Token ids or several prompts (several choices): not one text we can key.
            raise Uncacheable(CACHE_BYPASS_CONTENT, "prompt is not a single string")
        turns.append(("prompt", "", prompt))
        query = _squash(prompt) if prompt.strip() else None
        earlier = []
    partition = _digest("partition", tenant, pool, endpoint, model, system,
                        _parameters(body, endpoint))
    l1 = _digest("l1", partition, [(r, n, normalise_text(t)) for r, n, t in turns])
    l2_partition = _digest("l2", partition, [(r, n, normalise_text(t)) for r, n, t in earlier])
    return CacheKey(tenant=tenant, pool=pool, endpoint=endpoint, model=model,
                    partition=partition, l1=l1, l2_partition=l2_partition, query=query)
