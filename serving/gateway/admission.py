"""Tiers at the gateway: who goes upstream now, who waits, who gets a 429.

* ``premium`` (vLLM priority 0) never waits here. When no healthy replica has KV-cache room it
  still goes to the healthy replica with the least KV usage: vLLM's priority scheduler preempts
  lower-priority work for it. Only a pool with no healthy replica at all answers 503.
* ``standard`` (priority 1) is admitted while the pool's queue (``PoolLoad.queue_length``, the
  summed ``vllm:num_requests_waiting`` of the last poll) is below the tier's ``queue_limit`` and a
  replica has KV room; otherwise it waits, re-checking after every poll, at most the tier's
  ``max_wait``, then gets 429 (or 503 if no replica was healthy) with ``Retry-After``.
* ``batch`` keys on the synchronous endpoints (priority 2) are admitted only with headroom
  (``[gateway.batch]``: mean KV usage below ``headroom_kv_usage`` and queue below
  ``headroom_queue_length``, or inside an ``off_peak`` window), else wait and 429 the same way,
  with ``[gateway.tiers.batch] max_wait``.

Unknown load figures (a server that does not export them) count as room for ``standard`` (the
gateway does not refuse paid work on metrics it cannot see) and as no headroom for ``batch``.
``Retry-After`` is the poll interval rounded up: the soonest the gateway can see a different
load.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from serving.gateway.errors import QueueFull
from serving.gateway.tiers import PoolLoad
from serving.gateway.upstream.replicas import Upstreams
from vigil.clock import Clock, system_clock
from vigil.config import BatchConfig, GatewayConfig
from vigil.conventions import TIER_BATCH, TIER_PREMIUM

__all__ = ["Admission", "has_headroom", "in_off_peak"]


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def in_off_peak(now_s: float, windows: Sequence[str]) -> bool:
    """True when Unix time ``now_s`` falls in one of the ``"HH:MM-HH:MM"`` UTC windows (a
    window whose end is before its start wraps midnight; start inclusive, end exclusive)."""
    if not windows:
        return False
    t = datetime.fromtimestamp(now_s, UTC)
    minute = t.hour * 60 + t.minute
    for w in windows:
        start_text, end_text = w.split("-")
        start, end = _minutes(start_text), _minutes(end_text)
        if start <= end:
            if start <= minute < end:
                return True
        elif minute >= start or minute < end:
            return True
    return False


def has_headroom(load: PoolLoad, cfg: BatchConfig, now_s: float) -> bool:
    """The batch tier may go upstream: off-peak, or KV usage and queue below the thresholds.

    Unknown figures are no headroom, as for the batch queue (``serving.gateway.batch.queue``): the
    cheapest tier waits when the gateway cannot see the load.
    """
    if in_off_peak(now_s, cfg.off_peak):
        return True
    return (load.kv_cache_usage is not None and load.queue_length is not None
            and load.kv_cache_usage < cfg.headroom_kv_usage
            and load.queue_length < cfg.headroom_queue_length)


class Admission:
    """Admits requests by tier; counts who waits (the queue-depth gauge)."""

    def __init__(self, cfg: GatewayConfig, upstreams: Upstreams, *,
                 clock: Clock = system_clock) -> None:
        self._cfg = cfg
        self._upstreams = upstreams
        self._clock = clock
        self.retry_after = max(1, math.ceil(cfg.health_interval))
        #: (pool, tier) -> requests waiting at the gateway now.
        self.waiting: Counter[tuple[str, str]] = Counter()

    def _load_ok(self, pool: str, tier: str) -> bool:
        load = self._upstreams.load(pool)
        if tier == TIER_BATCH:
            return has_headroom(load, self._cfg.batch, self._clock())
        limit = self._cfg.tier(tier).queue_limit
        return load.queue_length is None or load.queue_length < limit

    async def admit(self, pool: str, tier: str) -> float:
        """Return once a request of ``tier`` may go to ``pool``; the seconds it waited.

        Raises ``QueueFull`` (429) or ``NoReplica`` (503), both with ``retry_after``.
        """
        up = self._upstreams
        if tier == TIER_PREMIUM:
            if up.pick(pool, beyond_kv_limit=True) is None:
                raise up.no_replica(pool, retry_after=self.retry_after)
            return 0.0
        if up.routable(pool) and self._load_ok(pool, tier):
            return 0.0
        started = time.perf_counter()
        deadline = started + self._cfg.tier(tier).max_wait
        key = (pool, tier)
        self.waiting[key] += 1
        try:
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0 or not await up.wait_refresh(remaining):
                    break
                if up.routable(pool) and self._load_ok(pool, tier):
                    return time.perf_counter() - started
        finally:
            self.waiting[key] -= 1
            if not self.waiting[key]:
                del self.waiting[key]
        if not any(r.healthy for r in up.pools.get(pool, ())):
            raise up.no_replica(pool, retry_after=self.retry_after)
        load = up.load(pool)
        raise QueueFull(
            f"Pool {pool!r} is too busy for the {tier} tier (queue {load.queue_length}, "
            f"KV-cache usage {_pct(load.kv_cache_usage)}); waited "
            f"{self._cfg.tier(tier).max_wait:g} s. Retry later.",
            retry_after=self.retry_after)


def _pct(ratio: float | None) -> str:
    return "unknown" if ratio is None else f"{ratio:.0%}"
