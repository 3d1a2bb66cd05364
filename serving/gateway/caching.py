"""The gateway's side of the semantic cache (``serving.cache``): decide, look up, store later.

The cache itself (L1 exact, L2 embeddings, partitions, negation guard, TTL, LRU) lives in
``serving.cache``; this module only wires it into a request's life:

* ``decide`` runs on the body after the max_tokens policy (so a stored answer was produced under
  the same max_tokens); its outcome becomes the ``X-Vigil-Cache`` header (``miss``/``bypass``, or
  ``hit-l1``/``hit-l2``); no header at all when the cache is off.
* ``store_later`` stores a completed response in a background task, after the client has its
  answer, and remembers what the response cost, so a later hit can report ``saved_usd``. A hit
  comes back with a fresh ``id`` and ``created``, so the costs are keyed by a digest of what a
  hit returns unchanged (its choices and usage), in an LRU as large as the cache
  (``max_entries``).

With the gateway database (``database``), the cache's entries are shared with the other gateway
instances on it (serving/cache/shared.py); ``warm_up`` joins them, ``aclose`` leaves.

The import is guarded: without ``serving.cache`` (or its ``semantic`` extra) the gateway runs
with the cache off, and refuses to start only if the config turns it on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from vigil.config import CacheConfig
from vigil.conventions import CACHE_BYPASS, CACHE_HIT_L1, CACHE_HIT_L2, CACHE_MISS
from vigil.errors import ConfigError

try:  # the cache is optional: see the module docstring
    from serving.cache import SemanticCache, assemble_stream, replay_stream
except ImportError as _exc:  # pragma: no cover - depends on what is installed
    SemanticCache = None  # type: ignore[assignment,misc]
    assemble_stream = None  # type: ignore[assignment]
    replay_stream = None  # type: ignore[assignment]
    _IMPORT_ERROR: str = str(_exc)
else:
    _IMPORT_ERROR = ""

__all__ = ["CacheBridge", "CacheDecision"]

log = logging.getLogger("vigil.gateway.cache")

#: ``CacheHit.layer`` -> response header value.
_HIT_HEADERS = {"l1": CACHE_HIT_L1, "l2": CACHE_HIT_L2}


def _fingerprint(response: Mapping[str, Any]) -> str:
    """A digest of the parts of a response a cache hit returns unchanged."""
    text = json.dumps([response.get("choices"), response.get("usage")], sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class CacheDecision:
    """A request's cache key (None: not cached) and the header value so far."""

    __slots__ = ("header", "key")

    def __init__(self, key: Any, header: str | None) -> None:
        self.key = key
        self.header = header


_OFF = CacheDecision(None, None)


class CacheBridge:
    """The semantic cache as the gateway uses it; inert when ``[gateway.cache]`` is off."""

    def __init__(self, cfg: CacheConfig, *, clock: Callable[[], float] = time.time,
                 cache: Any = None, database: str | Path | None = None) -> None:
        """``database``: the gateway database (SQLite path or PostgreSQL URL) through which
        the entries are shared; unused when the cache is off or ``cache`` is given."""
        self.enabled = cfg.enabled or cache is not None
        self._cache = cache
        if cfg.enabled and cache is None:
            if SemanticCache is None:
                raise ConfigError("the semantic cache is enabled but serving.cache cannot be "
                                  f"imported ({_IMPORT_ERROR}); install the 'semantic' extra "
                                  "or set enabled = false", key="gateway.cache.enabled")
            self._cache = SemanticCache.from_config(cfg, clock=clock, database=database)
        self._costs: OrderedDict[str, float] = OrderedDict()
        self._max_costs = cfg.max_entries
        self._tasks: set[asyncio.Task[None]] = set()

    def decide(self, *, pool: str, tenant: str, endpoint: str, body: dict[str, Any],
               headers: Mapping[str, str]) -> CacheDecision:
        """The cache key of a request (None: bypass or cache off) and its header value."""
        if self._cache is None:
            return _OFF
        decision = self._cache.decide(pool=pool, tenant=tenant, endpoint=endpoint, body=body,
                                      headers=headers)
        if decision.key is None:
            return CacheDecision(None, CACHE_BYPASS)
        return CacheDecision(decision.key, CACHE_MISS)

    async def lookup(self, key: Any) -> Any:
        """The ``CacheHit`` for ``key``, or None."""
        if self._cache is None or key is None:
            return None
        return await self._cache.lookup(key)

    def stats(self) -> Any:
        """The cache's ``CacheStats`` (``serving.cache``), or None when the cache is off or
        keeps no counters (a cache given by a test may not)."""
        stats = getattr(self._cache, "stats", None)
        return stats() if callable(stats) else None

    @staticmethod
    def hit_header(hit: Any) -> str:
        """``hit-l1`` or ``hit-l2``."""
        return _HIT_HEADERS.get(str(hit.layer), CACHE_HIT_L2)

    def saved_usd(self, response: Mapping[str, Any]) -> float | None:
        """What the request that produced ``response`` cost (USD), if still remembered."""
        return self._costs.get(_fingerprint(response))

    def store_later(self, key: Any, response: dict[str, Any], cost_usd: float | None) -> None:
        """Store a completed ``response`` under ``key`` in the background."""
        if self._cache is None or key is None:
            return
        if cost_usd is not None:
            fp = _fingerprint(response)
            self._costs[fp] = cost_usd
            self._costs.move_to_end(fp)
            while len(self._costs) > self._max_costs:
                self._costs.popitem(last=False)
        task = asyncio.create_task(self._store(key, response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, key: Any, response: dict[str, Any]) -> None:
        try:
            await self._cache.store(key, response)
        except Exception:  # a cache failure must never fail a request
            log.exception("semantic cache store failed")

    @staticmethod
    def assemble(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The complete response of a finished stream's chunks (None if incomplete)."""
        if assemble_stream is None:  # pragma: no cover - cache not installed
            return None
        return assemble_stream(chunks)

    @staticmethod
    def replay(response: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
        """A cached response as SSE bytes, ``data: [DONE]`` included."""
        if replay_stream is None:  # pragma: no cover - cache not installed
            raise RuntimeError("serving.cache is not installed")
        return replay_stream(response, include_usage=include_usage)

    async def warm_up(self) -> None:
        """Join the shared entries (the ones in the database are loaded), then load the
        embedding model (until it is loaded, semantic lookups miss); a model that cannot load
        is logged and the cache runs on its exact layer."""
        start = getattr(self._cache, "start", None)
        if start is not None:
            try:
                await start()
            except Exception as exc:  # the cache works unshared
                log.warning("semantic cache: the shared entries cannot be used (%s)", exc)
        warm = getattr(self._cache, "warm_up", None)
        if warm is None:
            return
        try:
            await warm()
        except Exception as exc:
            log.warning("semantic cache: the embedding model did not load (%s); only exact "
                        "matches will hit", exc)

    async def drain(self) -> None:
        """Wait for the stores under way."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Finish pending stores, then close the cache."""
        await self.drain()
        if self._cache is not None:
            with contextlib.suppress(Exception):
                await self._cache.aclose()
