"""What a pool costs over a window, and per 1000 requests and per million output tokens.

GPU time is what is paid for, busy or idle: an up replica costs its GPUs' hourly price whether
it serves requests or not. So, over the window ``w`` (``[engine] cost_window``, 1 h)::

    gpu_hours  = sum(avg_over_time(up{pool, kind="vllm"}[w])) × w / 3600 × gpus_per_replica
    cost_usd   = gpu_hours × prices[pool.gpu]
    requests   = sum(increase(vllm:request_success_total{pool, kind="vllm"}[w]))   (all reasons)
    output_tokens = sum(increase(vllm:generation_tokens_total{pool, kind="vllm"}[w]))
    per_1000_requests         = cost_usd / requests × 1000
    per_million_output_tokens = cost_usd / output_tokens × 1e6
    idle_share = share of the pool's vllm:num_requests_running samples in w that are 0
    idle_cost_usd = cost_usd × idle_share

``avg_over_time(up)`` only sees the time a target was scraped: a target the collector scrapes
all along (every configured target) counts its down time as ``up = 0``, but a target that
first appears mid-window (service discovery) counts as if it had been there all window.

Anything without data is ``None``, never 0 (e.g. ``per_1000_requests`` with no requests).
Cost by priority tier and semantic-cache savings need the gateway's request log (a later
issue): their keys are present and ``None`` until then. Units: USD, GPU-hours, seconds.
"""

from __future__ import annotations

import math
from typing import Any

from slo.aggregate import sum_by
from slo.quantiles import finite_or_none
from slo.sli import vllm_matchers
from slo.source import Source
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    LABEL_MODEL_NAME,
    SERIES_UP,
    VLLM_GENERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
)
from vigil.durations import format_duration

__all__ = ["gpu_hours", "idle_share", "pool_cost"]

_SECONDS_PER_HOUR = 3600.0


def gpu_hours(source: Source, pool: PoolConfig, at_s: float, window_s: float) -> float | None:
    """GPU-hours the pool's vLLM targets were up in the window (idle time included);
    ``None`` when no target of the pool was scraped in it."""
    per_target = source.avg_over_time(SERIES_UP, vllm_matchers(pool.name), at_s, window_s)
    if not per_target:
        return None
    up_share = sum_by(per_target, (), source.semantics)[()]  # sum(avg_over_time(up[w]))
    return up_share * window_s / _SECONDS_PER_HOUR * pool.gpus_per_replica


def idle_share(source: Source, pool: PoolConfig, at_s: float, window_s: float) -> float | None:
    """Share (0-1) of the pool's ``vllm:num_requests_running`` samples in the window that are 0;
    ``None`` without samples. Counted over samples, so every scrape of every engine weighs
    the same."""
    samples = source.samples(VLLM_REQUESTS_RUNNING, vllm_matchers(pool.name), at_s, window_s)
    values = [p.value for pts in samples.values() for p in pts
              if p.value is not None and not math.isnan(p.value)]
    if not values:
        return None
    return sum(1 for v in values if v == 0) / len(values)


def _per(cost: float | None, amount: float | None, unit: float) -> float | None:
    """``cost / amount × unit``, ``None`` when either is unknown or nothing was served."""
    if cost is None or amount is None or amount <= 0:
        return None
    return finite_or_none(cost / amount * unit)


def pool_cost(
    source: Source,
    config: Config,
    pool: PoolConfig,
    at_s: float,
    window_s: float | None = None,
) -> dict[str, Any]:
    """The ``"cost"`` block of one pool in the status JSON, over ``window_s`` (default
    ``[engine] cost_window``). USD, GPU-hours, requests, tokens; ``None`` = no data."""
    w = config.engine.cost_window if window_s is None else window_s
    price = config.prices[pool.gpu]  # parse_config guarantees a price for every pool's GPU
    hours = gpu_hours(source, pool, at_s, w)
    cost = None if hours is None else hours * price
    m = vllm_matchers(pool.name)
    requests = source.increase(VLLM_REQUEST_SUCCESS, m, at_s, w).get(())
    tokens = source.increase(VLLM_GENERATION_TOKENS, m, at_s, w).get(())
    idle = idle_share(source, pool, at_s, w)
    by = (LABEL_MODEL_NAME,)
    models: dict[str, dict[str, float | None]] = {}
    for name, key in ((VLLM_REQUEST_SUCCESS, "requests"), (VLLM_GENERATION_TOKENS,
                                                         "output_tokens")):
        for labels, value in source.increase(name, m, at_s, w, by).items():
            model = dict(labels).get(LABEL_MODEL_NAME)
            if model:
                models.setdefault(model, {"requests": None, "output_tokens": None})[key] = value
    return {
        "window": format_duration(w),
        "model": pool.model,
        "gpu": pool.gpu,
        "usd_per_gpu_hour": price,
        "gpu_hours": hours,
        "cost_usd": cost,
        "requests": requests,
        "output_tokens": tokens,
        "per_1000_requests": _per(cost, requests, 1000.0),
        "per_million_output_tokens": _per(cost, tokens, 1_000_000.0),
        "idle_share": idle,
        "idle_cost_usd": None if cost is None or idle is None else cost * idle,
        "models": dict(sorted(models.items())),
        # From the gateway's request log (a later issue): GPU cost split by priority tier
        # (premium / standard / batch) and what semantic-cache hits saved. Null until then.
        "by_tier": None,
        "cache_savings_usd": None,
    }
