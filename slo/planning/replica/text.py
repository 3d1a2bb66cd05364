"""The simulator's deterministic tokenizer, chat template, output text and output lengths.

Tokenizer: **one token per 4 characters** (Unicode code points) of the rendered prompt, rounded
up, at least 1 token. That is the usual rule of thumb for English with Llama-3's tokenizer; it is
deterministic and costs nothing. Token ids given directly (``prompt: [1, 2, 3]``) count one each.

Prefix caching needs token content, not only counts: a prompt is cut into KV blocks of
``block_size`` tokens (``4 * block_size`` characters) and each full block gets a chained hash
(its own content plus the hash of the block before it), as vLLM does. Two prompts that share
their first N characters - the same system prompt, the same few-shot examples - share their
first ``N // (4 * block_size)`` blocks.

Generated text is a deterministic stream of words (one word = one token) chosen from the
request's digest, so the same request always produces the same answer, like greedy decoding.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CHARS_PER_TOKEN",
    "Prompt",
    "count_tokens",
    "encode_ids",
    "encode_text",
    "generated_text",
    "natural_output_len",
    "render_chat",
]

#: Characters per token of the simulated tokenizer.
CHARS_PER_TOKEN = 4

# Words the simulated model "writes"; each is one token. Cycling through them by a hash of the
# request keeps the output deterministic and cheap.
_WORDS = (
    " The", " model", " serves", " tokens", " from", " a", " cache", " of", " keys", " and",
    " values", ",", " so", " each", " step", " reads", " the", " weights", " once", " and",
    " attends", " over", " earlier", " context", ".", " Latency", " grows", " with", " batch",
    " size", ";", " throughput", " grows", " too", " until", " memory", " runs", " out", ".",
    " Requests", " wait", " in", " a", " queue", " when", " the", " GPU", " is", " busy", ".",
)


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt, as far as the engine needs it.

    ``num_tokens`` is the length in tokens; ``block_hashes`` the chained hash of every *full*
    KV block (``num_tokens // block_size`` of them); ``digest`` a stable 64-bit hash of the whole
    prompt, used to seed the request's deterministic output.
    """

    num_tokens: int
    block_hashes: tuple[int, ...]
    digest: int


def count_tokens(text: str) -> int:
    """Tokens in ``text``: one per 4 characters, rounded up, at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def encode_text(text: str, block_size: int = 16) -> Prompt:
    """Tokenize ``text`` and hash its full KV blocks."""
    n = count_tokens(text)
    step = CHARS_PER_TOKEN * block_size
    hashes: list[int] = []
    prev = b""
    for i in range(n // block_size):
        h = hashlib.blake2b(prev + text[i * step:(i + 1) * step].encode(), digest_size=8)
        prev = h.digest()
        hashes.append(int.from_bytes(prev, "big"))
    return Prompt(num_tokens=n, block_hashes=tuple(hashes), digest=_h64(text.encode()))


def encode_ids(ids: Sequence[int], block_size: int = 16) -> Prompt:
    """A prompt given as token ids (one token each)."""
    hashes: list[int] = []
    prev = b""
    for i in range(len(ids) // block_size):
        chunk = ",".join(str(t) for t in ids[i * block_size:(i + 1) * block_size])
        h = hashlib.blake2b(prev + chunk.encode(), digest_size=8)
        prev = h.digest()
        hashes.append(int.from_bytes(prev, "big"))
    digest = _h64(("ids:" + ",".join(str(t) for t in ids)).encode())
    return Prompt(num_tokens=len(ids), block_hashes=tuple(hashes), digest=digest)


def _content_text(content: object) -> str:
    """A message's content: a string, or OpenAI content parts (text parts are kept)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """Apply a Llama-3-style chat template with the generation prompt appended.

    The system prompt comes first and verbatim, so requests sharing it share a KV prefix.
    """
    out = ["<|begin_of_text|>"]
    for m in messages:
        role = str(m.get("role", "user"))
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n"
                   f"{_content_text(m.get('content'))}<|eot_id|>")
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def generated_text(digest: int, start: int, stop: int) -> str:
    """Text of generated tokens ``start`` (inclusive) to ``stop`` (exclusive) of a request."""
    n = len(_WORDS)
    base = digest % n
    return "".join(_WORDS[(base + i) % n] for i in range(start, stop))


def natural_output_len(digest: int, seed: int | None, *, mean: float = 200.0,
                       sigma: float = 0.8) -> int:
    """Where the model would emit end-of-sequence: lognormal with the given ``mean`` (tokens).

    Deterministic per prompt and ``seed`` (no seed: per prompt only, as with greedy decoding).
    """
    mix = digest if seed is None else _h64(f"{digest}:{seed}".encode())
    rng = random.Random(mix)
    mu = math.log(mean) - sigma * sigma / 2  # so that E[X] = mean
    return max(1, round(rng.lognormvariate(mu, sigma)))
