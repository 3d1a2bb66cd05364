"""The what-if panel: cost per 1000 requests at another price or replica count, same traffic.

``slo.cost.pool.pool_cost`` prices what happened: each replica is billed for the time it ran
(``slo.cost.pool.up_seconds``: its ``up == 1`` samples × its scrape interval), ``gpu_hours = Σ
replica seconds / 3600 × GPUs per replica``, ``cost = gpu_hours × price``, ``per 1000 = cost /
requests × 1000``. The question "what if we ran N replicas at $P per GPU-hour" bills N replicas
for the whole window at P, through the same ``slo.cost.pool.gpu_hours_of``, and keeps the observed
requests. ``observed_replicas`` is the mean number of replicas that ran (1.5 for a pool that
went from 1 to 2 replicas half way through the window), so that the panel starts from what the
engine measured (and then gives back the engine's own ``per_1000_requests``; a test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slo.cost.pool import gpu_hours_of
from vigil.durations import SECONDS_PER_HOUR

__all__ = ["observed_replicas", "per_1000_requests"]



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
    return gpu_hours_of(replicas * window_s, gpus_per_replica) * usd_per_gpu_hour \
        / requests * 1000.0


def observed_replicas(cost: Mapping[str, Any], window_s: float, gpus_per_replica: int
                      ) -> float | None:
    """The mean number of replicas that ran over the cost window (replica-seconds billed ÷
    window), from the engine's ``gpu_hours``; ``None`` when it has none."""
    hours = cost.get("gpu_hours")
    if hours is None or window_s <= 0:
        return None
    return float(hours) / (window_s / SECONDS_PER_HOUR) / gpus_per_replica
