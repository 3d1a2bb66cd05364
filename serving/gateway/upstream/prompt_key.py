"""A request's prompt as the gateway sees it for prefix-aware routing: chained chunk hashes.

vLLM caches a prompt's KV blocks by a chained hash of their tokens, so two requests share
cached blocks exactly as far as they share a prefix of tokens. The gateway does not know the
model's tokenizer, but a shared prefix of text is a shared prefix of tokens: it renders the
prompt as text (chat: each message's role and text content, in order; completions: the prompt
string, or its token ids), cuts it into chunks of ``CHUNK_CHARS`` characters (characters, not
UTF-8 bytes: the prompt's token estimate counts characters too, so a chunk is
``CHUNK_TOKENS`` estimated tokens whatever the script), and hashes each full chunk together
with the hash of the chunk before it, as vLLM chains its blocks' hashes. Chunk ``k`` of two
prompts has the same hash only if their first ``k + 1`` chunks are equal (barring a 64-bit
collision). The chain starts from a hash of the request's model and tools (canonical JSON):
vLLM's blocks differ across models and LoRA adapters (each a model name), and a chat
template renders the tools into the prompt, so requests that differ there share nothing.

The chain's hash is Python's own (SipHash-1-3 over the chunk, combined with the previous
64-bit hash), not blake2b: the chain never leaves the process (each gateway instance keeps its
own view of the replicas), so a per-process key is fine and even keeps clients from crafting
collisions, and it is cheaper. One value must agree across gateway processes: ``anchor``, the
blake2b hash of the model, tools and first chunk, by which a prompt that no replica holds is
placed (``routing.rendezvous``), so every instance sends a new tenant to the same replica.

Only the first ``MAX_PREFIX_CHARS`` characters are hashed, so the work on the request path is
bounded. Measured (best of 25 runs on a shared 2-core VM under load): rendering and hashing a
16,000-character chat prompt (62 chunks) takes about 30 µs, where a blake2b chain of the same
chunks alone takes about 50 µs; a 100,000-character prompt costs what its first 32,768
characters cost, about 40 µs. Hashing 131,072 characters would take about 105 µs (145 µs for
Chinese text) before matching and recording four times as many chunks, so the cap stays.
Matching 62 chunks against one replica's memory takes about 4 µs, recording them about 9 µs;
the tools' canonical JSON about 25 µs for ten tools with long descriptions.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vigil.conventions import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS

__all__ = [
    "CHARS_PER_TOKEN",
    "CHUNK_CHARS",
    "CHUNK_TOKENS",
    "MAX_PREFIX_CHARS",
    "PromptKey",
    "chain_hashes",
    "prompt_key",
    "render_chat",
]

#: Characters per token assumed for text (the usual rule of thumb for English with Llama-3's
#: tokenizer; the simulator uses the same ratio).
CHARS_PER_TOKEN = 4
#: Tokens per hashed chunk: a few vLLM blocks (16 tokens each), so a prompt of a few thousand
#: tokens is tens of hashes, not hundreds.
CHUNK_TOKENS = 64
#: Characters per chunk of a text prompt.
CHUNK_CHARS = CHUNK_TOKENS * CHARS_PER_TOKEN
#: Characters hashed at most (and token ids, for prompts given as ids): the cost bound.
MAX_PREFIX_CHARS = 32 * 1024


@dataclass(frozen=True, slots=True)
class PromptKey:
    """What routing knows of a request's prompt: ``hashes``, the chained hash of each full
    chunk of its first ``MAX_PREFIX_CHARS`` characters (``CHUNK_TOKENS`` tokens each),
    ``tokens``, the estimated length of the whole prompt in tokens, the ``endpoint``
    ("chat" or "completions": which TTFT SLO applies), and ``anchor``, a 64-bit hash of its
    model, tools and first chunk that is the same in every process (blake2b)."""

    hashes: tuple[int, ...]
    tokens: int
    endpoint: str
    anchor: int = 0


def chain_hashes(data: str, chunk: int = CHUNK_CHARS, limit: int = MAX_PREFIX_CHARS,
                 seed: int = 0) -> tuple[int, ...]:
    """The chained 64-bit hash of each full ``chunk``-character piece of ``data``'s first
    ``limit`` characters, the chain starting from ``seed`` (a trailing partial piece has
    none: vLLM caches full blocks only). Stable within one process only."""
    data = data[:limit]
    hashes: list[int] = []
    prev = seed
    for start in range(0, len(data) - chunk + 1, chunk):
        prev = hash((prev, data[start:start + chunk]))
        hashes.append(prev)
    return tuple(hashes)


def _context(body: Mapping[str, Any]) -> str:
    """What besides the prompt decides its KV blocks: the model (a LoRA adapter is one too)
    and the tools, as canonical JSON (the chat template renders them into the prompt)."""
    tools = body.get("tools")
    text = "" if tools is None else json.dumps(tools, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False, default=str)
    return f"{body.get('model', '')}\x1f{text}"


def _anchor(context: str, head: str) -> int:
    """The cross-process hash of a prompt's context and first chunk ``head``."""
    digest = hashlib.blake2b(f"{context}\x1e{head}".encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _content_text(content: object) -> str:
    """A message's text: a string, or the text of OpenAI content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p)
                       for p in content
                       if isinstance(p, str) or (isinstance(p, Mapping)
                                                 and p.get("type") == "text"))
    return "" if content is None else str(content)


def render_chat(messages: Sequence[Any], limit: int = MAX_PREFIX_CHARS) -> tuple[str, int]:
    """The text the gateway hashes for chat ``messages`` (role and text content of each, in
    order; stopped once past ``limit`` characters) and the full rendering's length in
    characters."""
    parts: list[str] = []
    size = total = 0
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        text = f"<{m.get('role', '')}>{_content_text(m.get('content'))}\n"
        total += len(text)
        if size < limit:
            parts.append(text)
            size += len(text)
    return "".join(parts), total


def prompt_key(endpoint: str, body: Mapping[str, Any]) -> PromptKey | None:
    """The prompt of a chat or completions request body, hashed; None for other endpoints or
    a prompt shorter than one chunk (nothing a replica could share)."""
    if endpoint == ENDPOINT_CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        text, chars = render_chat(messages)
    elif endpoint == ENDPOINT_COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return _ids_key(prompt, endpoint, _context(body))
        if isinstance(prompt, list):
            # A batch of prompts: each runs on its own, the first one's prefix is the shared
            # one (the same instructions before different inputs, typically).
            texts = [p for p in prompt if isinstance(p, str)]
            if not texts:
                return None
            text, chars = texts[0], sum(len(t) for t in texts)
        elif isinstance(prompt, str):
            text, chars = prompt, len(prompt)
        else:
            return None
    else:
        return None
    if chars < CHUNK_CHARS:
        return None
    context = _context(body)
    # Beyond MAX_PREFIX_CHARS nothing is hashed: ``tokens`` still counts the whole prompt, so
    # a replica holding every hashed chunk still has the unhashed tail to prefill.
    return PromptKey(chain_hashes(text, seed=hash(context)),
                     math.ceil(chars / CHARS_PER_TOKEN), endpoint,
                     _anchor(context, text[:CHUNK_CHARS]))


def _ids_key(ids: Sequence[Any], endpoint: str, context: str) -> PromptKey | None:
    """A prompt given as token ids: chunks of ``CHUNK_TOKENS`` ids."""
    if len(ids) < CHUNK_TOKENS:
        return None
    hashes: list[int] = []
    prev = hash(context)
    end = min(len(ids), MAX_PREFIX_CHARS)
    for start in range(0, end - CHUNK_TOKENS + 1, CHUNK_TOKENS):
        try:  # a tuple of ints hashes without a string made of it
            prev = hash((prev, tuple(ids[start:start + CHUNK_TOKENS])))
        except TypeError:  # not ids after all (vLLM will say so): route by load
            return None
        hashes.append(prev)
    head = ",".join(str(i) for i in ids[:CHUNK_TOKENS])
    return PromptKey(tuple(hashes), len(ids), endpoint, _anchor(context, head))
