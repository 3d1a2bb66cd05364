"""``POST /v1/embeddings`` of the simulator: vLLM's response shape, deterministic vectors.

A real vLLM server answers embeddings only when it runs a pooling model; the simulator answers
them on every replica so that a gateway's passthrough (and a cache pointed at a remote
``/v1/embeddings``) can be tested without a GPU. The vectors carry no meaning: each input's
vector is drawn from a generator seeded by a hash of its text (or token ids) and normalised to
length 1, so the same input always gets the same vector and different inputs almost orthogonal
ones. ``encoding_format: "base64"`` (what the ``openai`` client asks for by default) is the
little-endian float32 bytes, as vLLM sends them.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

from serving.sim.protocol import ApiError, random_id, usage
from slo.planning.replica.text import count_tokens

__all__ = ["EMBEDDING_DIMENSIONS", "embedding_response"]

#: Length of a simulated embedding (all-MiniLM-L6-v2's, a common small embedding model).
EMBEDDING_DIMENSIONS = 384


def _vector(key: bytes, dims: int) -> list[float]:
    rng = random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))
    v = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(math.fsum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def _inputs(given: Any) -> list[tuple[bytes, int]]:
    """(hash key, token count) of each input; ``ApiError`` (400) for a malformed ``input``."""
    if isinstance(given, str):
        return [(given.encode(), count_tokens(given))]
    if isinstance(given, list) and given:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in given):
            return [(repr(given).encode(), len(given))]
        out: list[tuple[bytes, int]] = []
        for item in given:
            if isinstance(item, str):
                out.append((item.encode(), count_tokens(item)))
            elif isinstance(item, list) and item and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in item):
                out.append((repr(item).encode(), len(item)))
            else:
                raise ApiError("input must be a string, a list of strings, a list of token ids "
                               "or a list of lists of token ids.", param="input")
        return out
    raise ApiError("input must be a non-empty string or list.", param="input")


def embedding_response(body: dict[str, Any], *, model: str, created: int) -> dict[str, Any]:
    """vLLM's ``EmbeddingResponse`` for a request ``body``."""
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(f"encoding_format must be 'float' or 'base64', got {encoding!r}.",
                       param="encoding_format")
    dims = body.get("dimensions")
    if dims is None:
        dims = EMBEDDING_DIMENSIONS
    elif isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 4096:
        raise ApiError("dimensions must be an integer from 1 to 4096.", param="dimensions")
    data = []
    prompt_tokens = 0
    for i, (key, tokens) in enumerate(_inputs(body.get("input"))):
        vector = _vector(key, dims)
        prompt_tokens += tokens
        embedding: list[float] | str = vector
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data.append({"index": i, "object": "embedding", "embedding": embedding})
    return {"id": random_id("embd"), "object": "list", "created": created, "model": model,
            "data": data, "usage": {**usage(prompt_tokens, 0), "prompt_tokens_details": None}}
