"""Cached answers: an LRU bound, a TTL on the injected clock, the L1 map and the L2 indexes.

Every entry is reachable by its exact L1 hash and, when it has an embedding, through the vector
index of its L2 partition. The store is bounded by ``max_entries`` (least recently *used*
evicted first: a hit refreshes an entry's place) and entries expire ``ttl`` seconds after they
were stored (a hit does not extend the TTL: the answer gets no fresher by being read). An
entry another gateway instance stored (serving/cache/shared.py) keeps the expiry it was given
there. Expired entries are dropped when met by a lookup and swept, soonest expiry first, on
every insert.

All methods run on the event loop's thread; only ``VectorIndex.search`` may run elsewhere.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from serving.cache.index import VectorIndex
from vigil.clock import Clock

__all__ = ["Entry", "EntryStore"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One cached answer."""

    id: int
    l1: str
    #: The L2 partition whose index holds this entry's embedding; None = L1 only.
    l2_partition: str | None
    #: The response as compact JSON (immutable; every hit decodes a fresh copy).
    body: bytes
    #: The embedded query (for the negation guard, computed for candidates only); None = L1 only.
    query: str | None
    #: Unix seconds (injected clock) at which the entry expires.
    expires_at: float


class EntryStore:
    """Entries bounded by count (LRU) and age (TTL on ``clock``)."""

    def __init__(self, *, max_entries: int, ttl: float, clock: Clock):
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # LRU order, oldest first
        self._by_l1: dict[str, int] = {}
        self._indexes: dict[str, VectorIndex] = {}
        #: (expires_at, id), a heap: entries of other instances arrive with their own expiry.
        self._expiry: list[tuple[float, int]] = []
        self._next_id = 1
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def partitions(self) -> int:
        """L2 partitions that hold at least one embedding."""
        return len(self._indexes)

    @property
    def index_bytes(self) -> int:
        """Memory of the vector indexes (bytes)."""
        return sum(ix.nbytes for ix in self._indexes.values())

    def index(self, l2_partition: str) -> VectorIndex | None:
        """The vector index of a partition (None when it holds nothing)."""
        return self._indexes.get(l2_partition)

    def _live(self, entry_id: int) -> Entry | None:
        entry = self._entries.get(entry_id)
        if entry is None:
            return None
        if self._clock() >= entry.expires_at:
            self._remove(entry)
            self.expirations += 1
            return None
        return entry

    def get(self, entry_id: int) -> Entry | None:
        """The live entry ``entry_id`` (an expired one is dropped); does not count as a use."""
        return self._live(entry_id)

    def get_l1(self, l1: str) -> Entry | None:
        """The live entry stored under the exact hash ``l1``."""
        entry_id = self._by_l1.get(l1)
        return None if entry_id is None else self._live(entry_id)

    def touch(self, entry: Entry) -> None:
        """Mark ``entry`` as just used (LRU)."""
        if entry.id in self._entries:
            self._entries.move_to_end(entry.id)

    def put(self, *, l1: str, body: bytes, l2_partition: str | None = None,
            vector: np.ndarray | None = None, query: str | None = None,
            expires_at: float | None = None) -> Entry:
        """Store an answer; replaces the entry with the same ``l1``; evicts beyond the bound.
        ``expires_at`` (Unix seconds on the clock) defaults to now + ``ttl``."""
        now = self._clock()
        self.sweep(now)
        old = self._by_l1.get(l1)
        if old is not None and old in self._entries:
            self._remove(self._entries[old])
        index = None
        if l2_partition is not None and vector is not None:
            index = self._indexes.get(l2_partition)
            if index is not None and index.dim != vector.shape[0]:
                # The embedding model changed under a running cache: keep the entry L1-only.
                index = None
            elif index is None:
                index = self._indexes[l2_partition] = VectorIndex(vector.shape[0])
        entry = Entry(id=self._next_id, l1=l1, body=body,
                      expires_at=now + self.ttl if expires_at is None else expires_at,
                      l2_partition=l2_partition if index is not None else None,
                      query=query if index is not None else None)
        self._next_id += 1
        if index is not None and vector is not None:
            index.add(entry.id, vector)
        self._entries[entry.id] = entry
        self._by_l1[l1] = entry.id
        heapq.heappush(self._expiry, (entry.expires_at, entry.id))
        while len(self._entries) > self.max_entries:
            self._remove(next(iter(self._entries.values())))  # least recently used
            self.evictions += 1
        if len(self._expiry) > 2 * self.max_entries + 16:
            # Evicted and replaced entries leave stale ids behind until their expiry time; at
            # a high store rate that is many per TTL. Rebuild from the live entries.
            self._expiry = sorted((e.expires_at, e.id) for e in self._entries.values())
        return entry

    def sweep(self, now: float | None = None) -> int:
        """Drop expired entries, soonest expiry first; returns how many."""
        now = self._clock() if now is None else now
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, entry_id = heapq.heappop(self._expiry)
            entry = self._entries.get(entry_id)
            if entry is not None:
                self._remove(entry)
                dropped += 1
        self.expirations += dropped
        return dropped

    def _remove(self, entry: Entry) -> None:
        self._entries.pop(entry.id, None)
        if self._by_l1.get(entry.l1) == entry.id:
            del self._by_l1[entry.l1]
        if entry.l2_partition is not None:
            index = self._indexes.get(entry.l2_partition)
            if index is not None:
                index.remove(entry.id)
                if not len(index):
                    del self._indexes[entry.l2_partition]
