"""The gateway's semantic cache: exact L1, embedding-similarity L2, negation guard, TTL + LRU.

See docs/semantic-cache.md. The public surface is ``__all__``; the modules behind it are
policy.py (bypass rules), keys.py (partition and hashes), embedder.py, index.py, negation.py,
store.py, shared.py (the entries shared by gateway instances through their database),
responses.py and stream.py.
"""

from __future__ import annotations

from serving.cache.cache import CacheDecision, CacheHit, CacheStats, SemanticCache
from serving.cache.embedder import Embedder, LocalEmbedder, RemoteEmbedder
from serving.cache.keys import CacheKey
from serving.cache.shared import SharedEntries
from serving.cache.stream import assemble_stream, replay_stream

__all__ = [
    "CacheDecision",
    "CacheHit",
    "CacheKey",
    "CacheStats",
    "Embedder",
    "LocalEmbedder",
    "RemoteEmbedder",
    "SemanticCache",
    "SharedEntries",
    "assemble_stream",
    "replay_stream",
]
