"""The what-if panel: cost per 1000 requests at another price or replica count, same traffic.

``slo.cost.pool_cost`` prices what happened: ``gpu_hours = Σ up-share × window × GPUs per
replica``, ``cost = gpu_hours × price``, ``per 1000 = cost / requests × 1000``. The question
"what if we ran N replicas at $P per GPU-hour" replaces the observed up-share by N and the
price by P and keeps the observed requests. ``observed_replicas`` inverts the first formula so
that the panel starts from what the engine measured (and then gives back the engine's own
``per_1000_requests``; a test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["observed_replicas", "per_1000_requests"]

_SECONDS_PER_HOUR = 3600.0


def per_1000_requests(*, requests: float | None, window_s: float, replicas: float,
                      gpus_per_replica: int, usd_per_gpu_hour: float) -> float | None:
    """USD per 1000 requests if ``replicas`` replicas (each ``gpus_per_replica`` GPUs at
    ``usd_per_gpu_hour``) had served the observed ``requests`` over ``window_s`` seconds;
    ``None`` without requests (nothing to divide by)."""
    if replicas < 0 or usd_per_gpu_hour < 0 or window_s <= 0:
        raise ValueError("replicas, price and window must not be negative "
                         f"(got {replicas!r}, {usd_per_gpu_hour!r}, {window_s!r})")
    if requests is None or requests <= 0:
        return None
    gpu_hours = replicas * gpus_per_replica * window_s / _SECONDS_PER_HOUR
    return gpu_hours * usd_per_gpu_hour / requests * 1000.0


def observed_replicas(cost: Mapping[str, Any], window_s: float, gpus_per_replica: int
                      ) -> float | None:
    """The mean number of up replicas over the cost window, from the engine's ``gpu_hours``
    (``None`` when it has none)."""
    hours = cost.get("gpu_hours")
    if hours is None or window_s <= 0:
        return None
    return float(hours) / (window_s / _SECONDS_PER_HOUR) / gpus_per_replica
