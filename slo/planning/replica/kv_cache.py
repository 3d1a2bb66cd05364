"""The paged KV cache: a pool of fixed-size blocks with reference counts and prefix caching.

It follows vLLM V1's ``BlockPool``: free blocks wait in an LRU queue; a free block that still
holds a full, hashed block of some prompt stays findable by its hash until it is reused
("cached but evictable"), and counts as free for ``kv_cache_usage_perc``. A request that hits the
cache shares those blocks (reference count + 1) instead of recomputing them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool"]


class BlockPool:
    """``num_blocks`` KV blocks. Block ids are ``0 .. num_blocks - 1``."""

    def __init__(self, num_blocks: int, *, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # LRU order: the front is evicted first. OrderedDict gives O(1) removal from the middle,
        # needed when a cached free block is hit again.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id

    @property
    def num_free(self) -> int:
        """Blocks not referenced by any request (cached-but-evictable ones included)."""
        return len(self._free)

    def usage(self) -> float:
        """Fraction 0-1 of blocks in use, as vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - len(self._free) / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids holding the longest cached prefix of ``hashes`` (at most ``max_blocks``)."""
        if not self.enable_prefix_caching:
            return []
        out: list[int] = []
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def count_free(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are currently free (touching them takes them out of the pool)."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix-cache hit)."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, evicting the least recently freed; the caller checks ``num_free``."""
        if n > len(self._free):
            raise RuntimeError(f"KV cache: {n} blocks requested, {len(self._free)} free")
        out: list[int] = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:  # evict its cached content
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; unreferenced blocks return to the free queue.

        Blocks are released tail first, so a request's last blocks are evicted before its
        prefix (which other requests are more likely to share), as vLLM does.
        """
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def cache(self, block: int, block_hash: int) -> None:
        """Make a full block findable by its content hash."""
        if self.enable_prefix_caching and block_hash not in self._cached:
            self._cached[block_hash] = block
            self._hash[block] = block_hash
