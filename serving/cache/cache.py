"""``SemanticCache``: decide, look up (exact L1, then semantic L2), store completed answers.

The gateway calls, per request::

    decision = cache.decide(pool=..., tenant=..., endpoint=..., body=..., headers=...)
    if decision.key is not None:
        hit = await cache.lookup(decision.key)      # CacheHit or None
        ...                                         # on a miss, ask the upstream, then
        await cache.store(decision.key, response)   # only completed responses are kept

``decide`` is cheap and synchronous (policy.py, keys.py). ``lookup`` tries the exact hash, then
embeds the last user message (embedder.py, off the event loop) and searches the key's L2
partition (index.py) for the best candidate with cosine similarity > ``similarity_threshold``
whose polarity agrees (negation.py). The embedding computed by ``lookup`` is kept on the key,
so ``store`` does not embed twice; when the partition is empty, ``lookup`` does not embed at
all and ``store`` does (run it off the response path). An embedding failure is logged, counted
and is a miss.

With a gateway database (``from_config(..., database=...)``), the answers stored here are also
written to the table several gateway instances share, and those of the other instances are
put into this cache's store as they arrive (shared.py): ``start`` joins, ``aclose`` leaves.
Rows arriving from the database wait in an inbox, applied on the event loop in chunks (and at
the start of every lookup), so the L1 map and the vector indexes stay in step with the table
without a lookup ever waiting on the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from serving.cache.embedder import Embedder, embedder_from_config
from serving.cache.keys import CacheKey, Uncacheable, build_key
from serving.cache.negation import conflict, polarity
from serving.cache.policy import bypass_reason
from serving.cache.responses import encode, fresh_response, refusal_reason
from serving.cache.shared import SharedEntries
from serving.cache.store import Entry, EntryStore
from vigil.clock import Clock, system_clock
from vigil.config import CacheConfig
from vigil.conventions import CACHE_LAYER_L1, CACHE_LAYER_L2
from vigil.errors import EmbeddingError

__all__ = ["CacheDecision", "CacheHit", "CacheStats", "SemanticCache"]

log = logging.getLogger("vigil.cache")

#: Candidates above the threshold checked by the negation guard, best first: when the nearest
#: is "turn off the light", the next may be "please turn on the light".
CANDIDATES = 8
#: Partitions larger than this are searched in a worker thread (a 100k-row product takes
#: milliseconds); smaller ones on the event loop, where a thread hop would cost more.
INLINE_SEARCH_ROWS = 4096
#: Seconds between two warnings about embedding failures.
_WARNING_INTERVAL = 60.0
#: Shared rows applied per event-loop callback or lookup. Each costs ~20 us (its rotation into
#: a vector index, measured with 384 dimensions on 2 busy cores), so a chunk holds the loop
#: ~1.3 ms: a large batch from the database never stalls requests for long.
APPLY_CHUNK = 64
#: How long ``start`` waits for the shared entries already in the database (seconds).
LOAD_WAIT = 5.0


@dataclass(frozen=True)
class CacheDecision:
    """``key`` to look up and store under, or None with the ``bypass`` reason."""

    key: CacheKey | None
    bypass: str | None

    @property
    def cacheable(self) -> bool:
        """The request may be answered from the cache."""
        return self.key is not None


@dataclass(frozen=True)
class CacheHit:
    """A cached answer, ready to send: ``response`` has a fresh ``id`` and ``created``."""

    response: dict[str, Any]
    layer: Literal["l1", "l2"]
    #: Cosine similarity of the query and the cached query (1.0 for an exact L1 hit).
    similarity: float
    #: Time the lookup took (seconds), embedding and search included.
    lookup_seconds: float


@dataclass(frozen=True)
class CacheStats:
    """Counters since start (for the gateway's /metrics) and the current size."""

    entries: int
    #: L2 partitions holding embeddings, and the memory of their matrices (bytes).
    partitions: int
    index_bytes: int
    hits_l1: int
    hits_l2: int
    misses: int
    stores: int
    evictions: int
    expirations: int
    #: Lookups whose embedding failed (model missing or loading, endpoint down) ...
    embedding_failures: int
    #: ... or was skipped because the local embedder already had MAX_PENDING texts queued.
    embeddings_busy: int
    #: Candidates above the threshold refused by the negation guard.
    guard_rejections: int
    bypasses: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, int] = field(default_factory=dict)
    #: Shared through the gateway database: entries written, entries not written (queue full,
    #: database unreachable, or the row refused), entries of other instances put into this
    #: cache; of the dropped, those the database refused for their content.
    shared_written: int = 0
    shared_dropped: int = 0
    shared_applied: int = 0
    shared_rejected: int = 0


class SemanticCache:
    """The gateway's response cache (see the module docstring)."""

    def __init__(self, cfg: CacheConfig, *, embedder: Embedder | None,
                 clock: Clock = system_clock, owns_embedder: bool = False,
                 shared: SharedEntries | None = None):
        self.cfg = cfg
        self.shared = shared
        self._loop: asyncio.AbstractEventLoop | None = None
        self._apply_scheduled = False
        self._shared_applied = 0
        #: The local embedder's dimension, once known: shared vectors of another dimension
        #: come from another model and are kept L1-only.
        self._dim: int | None = None
        self._embedder = embedder
        self._owns_embedder = owns_embedder
        self._clock = clock
        self._store = EntryStore(max_entries=cfg.max_entries, ttl=cfg.ttl, clock=clock)
        self._hits = Counter[str]()
        self._misses = 0
        self._stores = 0
        self._embedding_failures = 0
        self._guard_rejections = 0
        self._bypasses = Counter[str]()
        self._refused = Counter[str]()
        self._embeddings_busy = 0
        self._last_warning = -_WARNING_INTERVAL

    @classmethod
    def from_config(cls, cfg: CacheConfig, *, clock: Clock = system_clock,
                    embedder: Embedder | None = None, database: str | Path | None = None,
                    origin: str | None = None) -> SemanticCache:
        """A cache for ``[gateway.cache]``. Without ``embedder``, one is built from
        ``cfg.embeddings`` (only when the cache is enabled) and closed by ``aclose``.
        ``database`` (an SQLite path or a PostgreSQL URL) shares the entries with the other
        gateway instances on it (``origin`` names this one; default: host, pid, random);
        nothing is opened when the cache is disabled, nor before ``start``."""
        owns = embedder is None and cfg.enabled
        if owns:
            embedder = embedder_from_config(cfg)
        shared = None
        if cfg.enabled and database is not None:
            shared = SharedEntries(database, clock=clock, max_entries=cfg.max_entries,
                                   sync_interval=cfg.sync_interval, origin=origin)
        return cls(cfg, embedder=embedder, clock=clock, owns_embedder=owns, shared=shared)

    # --- per request ------------------------------------------------------------------------

    def decide(self, *, pool: str, tenant: str, endpoint: str, body: dict[str, Any],
               headers: Mapping[str, str]) -> CacheDecision:
        """Whether the request may use the cache and, if so, its key. Never raises for a bad
        body: what cannot be keyed bypasses (``malformed``) and the upstream judges it."""
        reason = bypass_reason(self.cfg, pool=pool, tenant=tenant, endpoint=endpoint,
                               body=body, headers=headers)
        if reason is None:
            try:
                return CacheDecision(build_key(pool=pool, tenant=tenant, endpoint=endpoint,
                                               body=body), None)
            except Uncacheable as exc:
                reason = exc.reason
        self._bypasses[reason] += 1
        return CacheDecision(None, reason)

    async def lookup(self, key: CacheKey) -> CacheHit | None:
        """The cached answer for ``key``: exact L1 first, then semantic L2; None on a miss."""
        started = time.perf_counter()
        if self.shared is not None and self.shared.pending:
            self._apply_shared(APPLY_CHUNK)
        entry = self._store.get_l1(key.l1)
        if entry is not None:
            return self._hit(entry, CACHE_LAYER_L1, 1.0, started)
        # An empty partition cannot hit: leave the embedding to store(), off the request path.
        vector = await self._embed(key) if self._store.index(key.l2_partition) else None
        if vector is not None:
            found = await self._search(key, vector)
            if found is not None:
                return self._hit(found[0], CACHE_LAYER_L2, found[1], started)
        self._misses += 1
        return None

    async def store(self, key: CacheKey | None, response: dict[str, Any]) -> None:
        """Keep ``response`` under ``key`` if it is a completed answer (responses.py);
        anything else is refused and counted."""
        if key is None:
            return
        reason = refusal_reason(response, key.endpoint)
        if reason is not None:
            self._refused[reason] += 1
            log.debug("semantic cache: not storing a response (%s)", reason)
            return
        body = encode(response)
        vector = await self._embed(key)
        entry = self._store.put(l1=key.l1, body=body,
                                l2_partition=key.l2_partition if vector is not None else None,
                                vector=vector, query=key.query if vector is not None else None)
        self._stores += 1
        if self.shared is not None:
            # What the local entry holds: L1-only when its partition's index has another
            # dimension.
            self.shared.publish(l1=entry.l1, body=body, l2_partition=entry.l2_partition,
                                query=entry.query,
                                vector=vector if entry.l2_partition is not None else None,
                                expires_at=entry.expires_at)

    # --- lifecycle ----------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Load the embedding model now (call at startup: until it is loaded, L2 misses).
        Raises ``EmbeddingError`` when it cannot load."""
        if self._embedder is not None:
            await self._embedder.warm_up()

    async def start(self) -> None:
        """Join the shared entries (no-op without a database): start the writer and reader
        thread and put the live entries already in the database into this cache, waiting
        for them up to ``LOAD_WAIT`` seconds (a database out of reach: the cache starts
        empty and joins when it is back). Call on the event loop that serves lookups."""
        if self.shared is None or self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.shared.start(self._schedule_apply)
        await asyncio.to_thread(self.shared.wait_loaded, LOAD_WAIT)
        self._apply_shared(None)  # before serving: all of it at once

    async def sync_now(self) -> None:
        """Write what this instance stored and read what the others stored, now (shutdown,
        tests); the regular reads happen every ``sync_interval`` seconds."""
        if self.shared is None:
            return
        await asyncio.to_thread(self.shared.flush)
        await asyncio.to_thread(self.shared.sync)
        self._apply_shared(None)

    async def aclose(self) -> None:
        """Write the pending shared entries and leave; release the embedder this cache
        built (a given one belongs to its owner)."""
        if self.shared is not None:
            await asyncio.to_thread(self.shared.close)
        if self._embedder is not None and self._owns_embedder:
            await self._embedder.aclose()

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        return CacheStats(
            entries=len(self._store), partitions=self._store.partitions,
            index_bytes=self._store.index_bytes, hits_l1=self._hits[CACHE_LAYER_L1],
            hits_l2=self._hits[CACHE_LAYER_L2], misses=self._misses, stores=self._stores,
            evictions=self._store.evictions, expirations=self._store.expirations,
            embedding_failures=self._embedding_failures, embeddings_busy=self._embeddings_busy,
            guard_rejections=self._guard_rejections, bypasses=dict(self._bypasses),
            refused=dict(self._refused),
            shared_written=self.shared.written if self.shared is not None else 0,
            shared_dropped=self.shared.dropped if self.shared is not None else 0,
            shared_applied=self._shared_applied,
            shared_rejected=self.shared.rejected if self.shared is not None else 0)

    # --- shared entries (on the event loop) ---------------------------------------------------

    def _schedule_apply(self) -> None:
        """Called by the reader thread after it filled the inbox."""
        loop = self._loop
        if loop is None or self._apply_scheduled:
            return
        self._apply_scheduled = True
        loop.call_soon_threadsafe(self._apply_soon)

    def _apply_soon(self) -> None:
        # Cleared first: rows that arrive while this runs schedule another call.
        self._apply_scheduled = False
        self._apply_shared(APPLY_CHUNK)
        if self.shared is not None and self.shared.pending and self._loop is not None:
            self._apply_scheduled = True
            self._loop.call_soon(self._apply_soon)  # the rest after the requests waiting

    def _apply_shared(self, limit: int | None) -> int:
        """Put up to ``limit`` rows of the inbox (all when None) into the store; returns how
        many were applied (expired ones, and ones older than the local entry, are not)."""
        if self.shared is None:
            return 0
        applied = 0
        now = self._clock()
        for row in self.shared.take(limit):
            if row.expires_at <= now:
                continue
            existing = self._store.get_l1(row.l1)
            if existing is not None and existing.expires_at >= row.expires_at:
                continue  # the same question, answered here no earlier
            vector = row.vector
            if vector is not None and self._dim is not None and vector.shape[0] != self._dim:
                vector = None  # another instance runs another embedding model
            self._store.put(l1=row.l1, body=row.body, expires_at=row.expires_at,
                            l2_partition=row.l2_partition if vector is not None else None,
                            vector=vector, query=row.query if vector is not None else None)
            applied += 1
        self._shared_applied += applied
        return applied

    # --- internals ----------------------------------------------------------------------------

    def _hit(self, entry: Entry, layer: Literal["l1", "l2"], similarity: float,
             started: float) -> CacheHit:
        self._store.touch(entry)
        self._hits[layer] += 1
        return CacheHit(response=fresh_response(entry.body, created=int(self._clock())),
                        layer=layer, similarity=min(similarity, 1.0),
                        lookup_seconds=time.perf_counter() - started)

    async def _embed(self, key: CacheKey) -> np.ndarray | None:
        """The query's embedding, computed once per key; None when L2 does not apply or the
        embedder failed (logged when the failure changes, always counted)."""
        if key.embed_attempted:
            return key.embedding
        key.embed_attempted = True
        if key.query is None or self._embedder is None:
            return None
        try:
            vector = await self._embedder.embed(key.query)
        except EmbeddingError as exc:
            if exc.busy:
                self._embeddings_busy += 1
            else:
                self._embedding_failures += 1
            # Counted every time, logged at most once a minute (a dead endpoint at 1000
            # requests/s must not write 1000 lines/s). Log volume is not cache semantics, so
            # this is the monotonic clock, not the injected one.
            now = time.monotonic()
            if now - self._last_warning >= _WARNING_INTERVAL:
                self._last_warning = now
                log.warning("semantic cache: %s; such lookups miss (%d failures, %d busy so "
                            "far)", exc, self._embedding_failures, self._embeddings_busy)
            return None
        if vector is not None:
            vector = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1)
            self._dim = int(vector.shape[0])
        key.embedding = vector
        return vector

    async def _search(self, key: CacheKey, vector: np.ndarray) -> tuple[Entry, float] | None:
        index = self._store.index(key.l2_partition)
        if index is None or index.dim != vector.shape[0]:
            return None
        threshold = self.cfg.similarity_threshold
        if len(index) > INLINE_SEARCH_ROWS:
            candidates = await asyncio.to_thread(index.search, vector, threshold=threshold,
                                                 limit=CANDIDATES)
            index = self._store.index(key.l2_partition)  # it may have changed meanwhile
            if index is None:
                return None
        else:
            candidates = index.search(vector, threshold=threshold, limit=CANDIDATES)
        # Re-score on the loop: a search in a thread may have read a row being moved.
        scored: list[tuple[float, Entry]] = []
        for entry_id, _ in candidates:
            entry = self._store.get(entry_id)
            similarity = index.score(entry_id, vector) if entry is not None else None
            if entry is not None and similarity is not None and similarity > threshold:
                scored.append((similarity, entry))
        scored.sort(key=lambda pair: -pair[0])
        query_polarity = polarity(key.query or "")
        for similarity, entry in scored:
            if entry.query is None:
                continue
            why = conflict(query_polarity, polarity(entry.query))
            if why is not None:
                self._guard_rejections += 1
                log.debug("semantic cache: candidate at %.3f refused by the guard (%s)",
                          similarity, why)
                continue
            return entry, similarity
        return None
