"""What the traffic we had would have cost: the lower bound of GPU time, and the waste above it.

Over ``[start_s, end_s]`` in steps of ``step_s`` (``[capacity] plan_step``, 15 min), each step
being the interval ``(t - step_s, t]``:

* **used** GPU-hours: what the pool was billed for in the step, ``slo.cost.pool.up_seconds`` over
  the step (each ``up == 1`` sample stands for one scrape interval), summed over replicas,
  ``/ 3600 × gpus_per_replica``;
* **λ(t)**: the requests the pool finished in the step, ``increase(vllm:request_success_total
  {<pool's selector>}[step])`` (every finish reason, as ``slo.cost.pool`` counts requests), divided
  by ``step_s``: requests per second;
* the **lower bound** ``ceil(λ(t) / μ)`` replicas, ``μ`` being the measured capacity of one
  replica at the SLO (requests per second; a ``CapacityProfile``'s ``max_goodput_rps``), and
  its GPU-hours ``replicas × step_s / 3600 × gpus_per_replica``;
* **waste** = used − lower bound, in GPU-hours and in USD at ``[prices]`` for the pool's GPU.

A step without traffic has a lower bound of 0 replicas, not ``min_replicas``: the bound is
what the traffic itself needed, and a configured floor above it is reported as waste (it is a
choice, and its price is worth seeing). A step where the pool's replicas were billed but no
request counter was read (``λ`` unknown) gets no lower bound (``None``): its GPU-hours are in
``unmeasured_gpu_hours`` and out of the waste, which is never claimed without evidence.

The bound is a floor for any autoscaler that keeps every replica at or under its capacity; a
real one pays for spin-up and for the headroom of a noisy load, so 1.0× is out of reach.

Units: seconds (times are Unix seconds), requests per second, GPU-hours, USD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slo.cost.pool import gpu_hours_of, up_seconds
from slo.objectives.sli import vllm_matchers
from slo.sources.on_grid import on_grid
from slo.sources.protocol import Source
from vigil.capacity import replicas_needed
from vigil.config import Config, PoolConfig
from vigil.conventions import VLLM_REQUEST_SUCCESS

__all__ = ["WasteResult", "WasteStep", "lower_bound_replicas", "step_times", "waste"]



@dataclass(frozen=True)
class WasteStep:
    """One step ``(t_s - step, t_s]``: ``rps`` the finished requests per second (None when no
    counter was read), ``used_gpu_hours`` what the pool was billed for, and the lower bound
    (None with ``rps``)."""

    t_s: float
    rps: float | None
    used_gpu_hours: float
    lower_bound_replicas: int | None
    lower_bound_gpu_hours: float | None


@dataclass(frozen=True)
class WasteResult:
    """The steps and their totals (GPU-hours, USD). ``waste_gpu_hours`` = used − lower bound
    over the steps with a known bound; ``unmeasured_gpu_hours`` the used GPU-hours of the
    others; ``usd_per_gpu_hour`` the price the USD figure uses."""

    steps: list[WasteStep]
    used_gpu_hours: float
    lower_bound_gpu_hours: float
    waste_gpu_hours: float
    waste_usd: float
    unmeasured_gpu_hours: float = 0.0
    usd_per_gpu_hour: float = 0.0

    @property
    def ratio(self) -> float | None:
        """Used over lower-bound GPU-hours of the measured steps (1.0 = no waste); None
        without a bound above 0."""
        measured = self.used_gpu_hours - self.unmeasured_gpu_hours
        return measured / self.lower_bound_gpu_hours if self.lower_bound_gpu_hours > 0 else None


def step_times(start_s: float, end_s: float, step_s: float) -> list[float]:
    """The ends ``start_s + k × step_s`` (k >= 1) of the whole steps within ``[start_s,
    end_s]``, oldest first."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be > 0 seconds, not {step_s!r}")
    if not (math.isfinite(start_s) and math.isfinite(end_s)):
        raise ValueError(f"start_s and end_s must be finite Unix seconds, not "
                         f"{start_s!r}, {end_s!r}")
    # The epsilon keeps 86400 / 900 at 96 steps despite float rounding.
    n = math.floor((end_s - start_s) / step_s + 1e-9)
    return [start_s + k * step_s for k in range(1, n + 1)]


def lower_bound_replicas(rps: float, capacity_rps_per_replica: float) -> int:
    """``ceil(rps / capacity)``: the fewest replicas that serve ``rps`` requests per second,
    each at most at its capacity (requests per second; ``vigil.capacity.replicas_needed``)."""
    return replicas_needed(rps, capacity_rps_per_replica)


def waste(
    source: Source,
    config: Config,
    pool: PoolConfig,
    capacity_rps_per_replica: float,
    start_s: float,
    end_s: float,
    step_s: float,
) -> WasteResult:
    """Used GPU-hours, the lower bound ``ceil(λ/μ)`` and the waste of ``pool`` over
    ``[start_s, end_s]`` (Unix seconds) in steps of ``step_s`` seconds (see the module
    docstring). ``capacity_rps_per_replica``: μ, requests per second one replica serves at
    the SLO. A step should hold several scrapes (``increase`` needs two samples)."""
    price = config.prices[pool.gpu]
    times = step_times(start_s, end_s, step_s)
    # A week is ~700 steps: on a grid the counter is one range read for all of them, each
    # step's value the instant query's.
    source = on_grid(source, times)
    m = vllm_matchers(pool, source)
    steps: list[WasteStep] = []
    for t in times:
        billed = up_seconds(source, config, pool, t, step_s)
        used = gpu_hours_of(math.fsum(billed.values()), pool.gpus_per_replica)
        finished = source.increase(VLLM_REQUEST_SUCCESS, m, t, step_s).get(())
        if finished is None or not math.isfinite(finished):
            # Nothing up and nothing counted: no traffic needed nothing. Up but uncounted:
            # unknown.
            rps = None if used > 0 else 0.0
        else:
            rps = max(0.0, finished) / step_s
        if rps is None:
            steps.append(WasteStep(t, None, used, None, None))
            continue
        n = lower_bound_replicas(rps, capacity_rps_per_replica)
        steps.append(WasteStep(t, rps, used, n, gpu_hours_of(n * step_s, pool.gpus_per_replica)))
    used_total = math.fsum(s.used_gpu_hours for s in steps)
    lower = math.fsum(s.lower_bound_gpu_hours for s in steps
                      if s.lower_bound_gpu_hours is not None)
    unmeasured = math.fsum(s.used_gpu_hours for s in steps if s.lower_bound_gpu_hours is None)
    wasted = used_total - unmeasured - lower
    return WasteResult(steps, used_total, lower, wasted, wasted * price, unmeasured, price)
