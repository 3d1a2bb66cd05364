"""The tiers, and the values the gateway's parts share about callers and pools (app, batch
queue, cache).

The tiers' names, their type (``Tier``) and vLLM's ``priority`` for each are
``vigil.conventions``' (``TIERS``, ``Tier``, ``TIER_PRIORITY``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vigil.conventions import Tier

__all__ = ["Caller", "PoolLoad", "Tier"]


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from its API key (the key itself is never kept)."""

    tenant: str
    tier: Tier
    #: First 12 hex digits of the key's SHA-256: names the key in logs and records.
    key_id: str


@dataclass(frozen=True)
class PoolLoad:
    """A pool's load as the gateway last saw it (from its replicas' /metrics)."""

    #: Mean of the healthy replicas' vllm:kv_cache_usage_perc (ratio 0-1); None = unknown.
    kv_cache_usage: float | None
    #: Sum of vllm:num_requests_waiting over the healthy replicas; None = unknown.
    queue_length: int | None
    #: Replicas passing health checks.
    healthy_replicas: int
