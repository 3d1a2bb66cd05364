"""A pool's GPU prices over time, and what each of its replicas costs per second at a moment.

Prices come from ``[[cost.prices]]`` (``vigil.config.cost.PriceConfig``), per pool, each from
its ``since`` until the pool's next entry of the same capacity:

* **on demand**: the hourly rate of a running replica's GPUs; before the pool's first entry,
  its GPU's ``[prices]`` rate;
* **reserved**: ``replicas`` replicas' GPUs committed at their rate, paid whether they run or
  not. While ``n`` non-spot replicas run, ``min(n, R)`` of them are on the reservation and
  the rest on demand; each runs at the blend ``(min(n, R) × reserved + max(0, n − R) ×
  on_demand) / n`` (which replica is "the reserved one" is arbitrary, so none is), and the
  ``max(0, R − n)`` unused reserved replicas cost their rate as the pool's idle time;
* **spot**: the replicas whose name matches ``replica_match`` run at the spot rate.

So a rate change mid-month bills each part of the month at its rate, and a pool's cost over
a window is exactly the integral of these rates over its replicas' billed time.

Units: Unix seconds, the ``[cost] currency`` per GPU-hour (``per_gpu_hour``) or per second
of one replica (``*_per_s``).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from vigil.config import Config, PoolConfig
from vigil.config.cost import parse_since
from vigil.durations import SECONDS_PER_HOUR

__all__ = ["PoolPrices", "ReplicaRates", "pool_prices"]

_E = TypeVar("_E", bound=tuple[Any, ...])



@dataclass(frozen=True)
class ReplicaRates:
    """What the pool pays per second over a stretch of time: per running replica (currency
    and GPU-hours) and for its unused reserved replicas."""

    per_replica: dict[str, float]
    gpu_hours_per_replica_s: float
    unused_reserved_per_s: float
    unused_reserved_gpu_hours_per_s: float


@dataclass(frozen=True)
class PoolPrices:
    """One pool's price entries, each list sorted by its start (Unix seconds)."""

    gpus: int
    #: (since, per GPU-hour); the first starts at -inf with the GPU's ``[prices]`` rate.
    on_demand: tuple[tuple[float, float], ...]
    #: (since, replicas, per GPU-hour).
    reserved: tuple[tuple[float, int, float], ...]
    #: (since, compiled ``replica_match``, per GPU-hour).
    spot: tuple[tuple[float, re.Pattern[str], float], ...]

    def changes(self, start_s: float, end_s: float) -> list[float]:
        """The moments in ``(start_s, end_s)`` when a price changes, in order."""
        times = {e[0] for group in (self.on_demand, self.reserved, self.spot) for e in group}
        return sorted(t for t in times if start_s < t < end_s)

    def rates(self, at_s: float, running: list[str]) -> ReplicaRates:
        """The rates in force at ``at_s`` while the replicas ``running`` run (the price in
        force from a change on, see the module docstring)."""
        od = _current(self.on_demand, at_s)
        assert od is not None  # the first on-demand entry starts at -inf
        reserved = _current(self.reserved, at_s)
        spot = _current(self.spot, at_s)
        per_gpu_s = self.gpus / SECONDS_PER_HOUR
        rates: dict[str, float] = {}
        regular = []
        for name in running:
            if spot is not None and spot[1].fullmatch(name):
                rates[name] = spot[2] * per_gpu_s
            else:
                regular.append(name)
        r_count, r_rate = (reserved[1], reserved[2]) if reserved is not None else (0, 0.0)
        n = len(regular)
        if n:
            on_res = min(n, r_count)
            blend = (on_res * r_rate + (n - on_res) * od[1]) / n
            for name in regular:
                rates[name] = blend * per_gpu_s
        unused = max(0, r_count - n)
        return ReplicaRates(rates, per_gpu_s, unused * r_rate * per_gpu_s, unused * per_gpu_s)


def _current(entries: tuple[_E, ...], at_s: float) -> _E | None:
    """The entry in force at ``at_s`` (the last one starting at or before it)."""
    i = bisect.bisect_right([e[0] for e in entries], at_s)
    return entries[i - 1] if i else None


def pool_prices(config: Config, pool: PoolConfig) -> PoolPrices:
    """``pool``'s prices from ``[prices]`` and ``[[cost.prices]]``."""
    tz = config.cost.timezone
    od: list[tuple[float, float]] = [(float("-inf"), config.prices[pool.gpu])]
    reserved: list[tuple[float, int, float]] = []
    spot: list[tuple[float, re.Pattern[str], float]] = []
    for p in config.cost.prices:
        if p.pool != pool.name:
            continue
        since = parse_since(p.since, tz)
        if p.capacity == "on_demand":
            od.append((since, p.per_gpu_hour))
        elif p.capacity == "reserved":
            reserved.append((since, p.replicas, p.per_gpu_hour))
        else:
            spot.append((since, re.compile(p.replica_match), p.per_gpu_hour))
    return PoolPrices(pool.gpus_per_replica, tuple(sorted(od, key=lambda e: e[0])),
                      tuple(sorted(reserved, key=lambda e: e[0])),
                      tuple(sorted(spot, key=lambda e: e[0])))
