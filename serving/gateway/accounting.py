"""Each request's share of its replica's GPU cost.

A replica costs ``gpus_per_replica x [prices][gpu] / 3600`` USD per second whether it is busy or
not. While ``n`` requests are in flight on it, each is charged ``1/n`` of that rate, so a request
that lived from ``t0`` to ``t1`` costs ``rate x integral(t0..t1) dt / n(t)``: its end-to-end time
divided by the (harmonic) mean number of requests in flight beside it. The shares of all
requests add up exactly to the cost of the time the replica was busy; idle time is charged to
nobody (it is the pool's cost, which the SLO engine's cost per 1000 requests covers).

Approximation: ``n(t)`` counts the requests *this gateway* has in flight on the replica (another
gateway or a direct client on the same replica is invisible), and a request waiting in vLLM's
queue counts as in flight although it holds no batch slot yet. Both make a busy replica's
requests look a little cheaper than they are, never more expensive.

The integral is kept incrementally (``_area`` is ``integral dt / n`` since the ledger started,
advanced whenever ``n`` changes), so entering and leaving are O(1) whatever the concurrency.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vigil.config import Config

__all__ = ["ShareLedger", "gpu_cost_per_second"]


def gpu_cost_per_second(cfg: Config, pool: str) -> float:
    """USD per second one replica of ``pool`` costs: GPUs per replica x hourly price / 3600."""
    p = cfg.pool(pool)
    return p.gpus_per_replica * cfg.prices[p.gpu] / 3600.0


class ShareLedger:
    """In-flight requests on one replica and the running integral of ``1/n`` over time.

    ``enter()`` returns a mark; ``leave(mark)`` returns the request's share in seconds of whole
    replica time (multiply by ``gpu_cost_per_second`` for USD). ``monotonic`` is injectable.
    """

    __slots__ = ("_area", "_last", "_monotonic", "in_flight")

    def __init__(self, *, monotonic: Callable[[], float] = time.perf_counter) -> None:
        self._monotonic = monotonic
        self.in_flight = 0
        self._area = 0.0
        self._last = monotonic()

    def _advance(self) -> float:
        now = self._monotonic()
        if self.in_flight:
            self._area += (now - self._last) / self.in_flight
        self._last = now
        return self._area

    def enter(self) -> float:
        """A request starts on the replica; returns its mark."""
        mark = self._advance()
        self.in_flight += 1
        return mark

    def leave(self, mark: float) -> float:
        """The request that entered at ``mark`` ends; returns its share (seconds, >= 0)."""
        area = self._advance()
        self.in_flight = max(0, self.in_flight - 1)
        return max(0.0, area - mark)
