"""The traffic a plan is sized for: requests per second over one day.

``forecast_from_history`` reads a pool's request rate per ``[capacity] plan_step`` over the
store's last ``days`` days (the increase of ``vllm:request_success_total``, every finished
reason, through the pool's selector) and folds it into a time-of-day profile: for each step of
the day (UTC), the mean rate over the days held. The days are the 24-hour periods ending at
``at_s``, so each holds every step of the day once. A least-squares line through the daily
de-seasonalised rates (each held step's rate over the profile's at that step, against the
day's index) projects the next day's, and the profile is scaled to it::

    profile(s)   = mean over days d of rate(d, s)            (s: step of the day)
    daily(d)     = mean over held s of rate(d, s) / profile(s)
    daily(d)     ≈ a + b·d                                   (least squares, full days only)
    forecast(s)  = profile(s) × (a + b·n) / mean(daily)      (n = days asked: the next day)

Only days holding at least 90 % of their steps enter the trend, and a day's value is
de-seasonalised: a day held only in part (the store started mid-day, a gap at the peak) would
otherwise fake a trend from which hours it happens to hold. Steps whose profile is 0 say
nothing about a day's scale and are left out of its value.

The trend scales the shape rather than shifting it (growth brings more users at the peak than
at night), and a projection below zero is clamped to 0. With one day held there is no trend
(``trend_per_day`` 0); nor with fewer than two full days.

The rate counts what reached vLLM: semantic-cache hits never do, so a forecast from history is
already net of the cache (``net_of_cache``), and batch requests sit where the batch queue
released them.

``constant_traffic(rps)`` is a rate given rather than inferred; it does not weaken the basis
of a plan made from it (basis ``measured``, the strongest).

Units: requests per second, seconds (times are Unix seconds, offsets seconds of the UTC day).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from slo.objectives.sli import vllm_matchers
from slo.sources.on_grid import on_grid
from slo.sources.protocol import Source
from vigil.capacity import Basis
from vigil.config import Config, PoolConfig
from vigil.conventions import VLLM_REQUEST_SUCCESS

__all__ = [
    "SECONDS_PER_DAY",
    "TrafficForecast",
    "constant_traffic",
    "forecast_from_history",
    "rate_history",
]

SECONDS_PER_DAY = 86400.0
#: The share of its steps a day must hold to enter the trend.
_FULL_DAY_SHARE = 0.9


@dataclass(frozen=True)
class TrafficForecast:
    """Requests per second at each step of one UTC day.

    ``profile``: the rate (requests/s) over ``[i × step_s, (i + 1) × step_s)`` seconds of the
    day, for every step ``i``; ``basis``: how it is known; ``days``: how many days of history
    it was built from (0 for a given rate); ``trend_per_day``: the least-squares slope of the
    daily mean rate (requests/s per day); ``net_of_cache``: the rate already excludes
    semantic-cache hits (it counts what reached vLLM).
    """

    profile: tuple[float, ...]
    step_s: float
    basis: Basis
    days: int = 0
    trend_per_day: float = 0.0
    net_of_cache: bool = False
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.profile:
            raise ValueError("a traffic forecast needs at least one step")
        if not self.step_s > 0 or abs(len(self.profile) * self.step_s - SECONDS_PER_DAY) > 1e-6:
            raise ValueError(f"{len(self.profile)} steps of {self.step_s:g}s do not make a day")
        if any(not (math.isfinite(v) and v >= 0) for v in self.profile):
            raise ValueError("every rate of a traffic forecast must be a finite number >= 0")

    def rate_at(self, t_s: float) -> float:
        """The forecast rate (requests/s) at ``t_s`` (Unix seconds, or seconds of the day)."""
        i = int((t_s % SECONDS_PER_DAY) // self.step_s)
        return self.profile[min(i, len(self.profile) - 1)]

    def day_curve(self, step_s: float) -> list[tuple[float, float]]:
        """``(seconds of the day, rps)`` for every ``step_s`` of the day: the mean rate over
        ``[t, t + step_s)``, so that the curve's requests add up to the forecast's."""
        if not step_s > 0:
            raise ValueError("step_s must be more than 0 seconds")
        out = []
        t = 0.0
        while t < SECONDS_PER_DAY - 1e-9:
            end = min(t + step_s, SECONDS_PER_DAY)
            out.append((t, self._mean(t, end)))
            t = end
        return out

    def requests_per_day(self) -> float:
        """Requests in one day of the forecast."""
        return math.fsum(self.profile) * self.step_s

    def peak_rps(self) -> float:
        """The highest rate of the day (requests/s)."""
        return max(self.profile)

    def _mean(self, start: float, end: float) -> float:
        """The mean rate over ``[start, end)`` seconds of the day (the steps it overlaps,
        weighted by their overlap)."""
        total = 0.0
        i = int(start // self.step_s)
        while i < len(self.profile) and i * self.step_s < end:
            lo, hi = max(start, i * self.step_s), min(end, (i + 1) * self.step_s)
            total += self.profile[i] * max(0.0, hi - lo)
            i += 1
        return total / (end - start)


def constant_traffic(rps: float, *, step_s: float = 900.0) -> TrafficForecast:
    """The same ``rps`` (requests/s) all day: a rate given, not inferred (basis
    ``measured``: it does not weaken the plan's basis)."""
    if not (math.isfinite(rps) and rps >= 0):
        raise ValueError(f"a request rate must be a finite number >= 0, not {rps!r}")
    steps = round(SECONDS_PER_DAY / step_s)
    return TrafficForecast(profile=(float(rps),) * steps, step_s=SECONDS_PER_DAY / steps,
                           basis="measured", notes=(f"a given rate of {rps:g} requests/s",))


def rate_history(source: Source, pool: PoolConfig, at_s: float, span_s: float,
                 step_s: float) -> pd.Series:
    """The pool's request rate (requests/s) per ``step_s`` over ``(at_s - span_s, at_s]``,
    indexed by each step's end (Unix seconds); NaN where the store has no samples."""
    n = int(span_s // step_s)
    ends = [at_s - (n - 1 - k) * step_s for k in range(n)]
    # One range read of the counter for every step (a week is ~700 steps), each step's value
    # the instant query's.
    source = on_grid(source, ends)
    m = vllm_matchers(pool, source)
    rates = []
    for end in ends:
        inc = source.increase(VLLM_REQUEST_SUCCESS, m, end, step_s).get(())
        rates.append(math.nan if inc is None else max(0.0, inc) / step_s)
    return pd.Series(rates, index=pd.Index(ends, name="t_s"), dtype=float)


def forecast_from_history(source: Source, config: Config, pool: PoolConfig, at_s: float,
                          days: int) -> TrafficForecast:
    """The next day's traffic of ``pool`` from the last ``days`` days before ``at_s`` (Unix
    seconds; see the module docstring), basis ``observed``. ``ValueError`` when the store
    holds no request of the pool in that span."""
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days!r}")
    step = config.capacity.plan_step
    steps_per_day = round(SECONDS_PER_DAY / step)
    step = SECONDS_PER_DAY / steps_per_day
    rates = rate_history(source, pool, at_s, days * SECONDS_PER_DAY, step)
    if rates.notna().sum() == 0:
        raise ValueError(f"no requests of pool {pool.name!r} in the {days} day(s) before "
                         f"{at_s:.0f}: the store holds no vllm:request_success_total for it")
    start = at_s - days * SECONDS_PER_DAY
    # The step's start, not its end, says which step of the day it is.
    t0 = rates.index.to_numpy() - step
    frame = pd.DataFrame({
        "rate": rates.to_numpy(),
        "slot": ((t0 % SECONDS_PER_DAY) // step).astype(int) % steps_per_day,
        "day": ((t0 - start) // SECONDS_PER_DAY).astype(int),
    })
    held = frame.dropna(subset=["rate"])
    profile = held.groupby("slot")["rate"].mean().reindex(range(steps_per_day))
    notes = []
    missing = int(profile.isna().sum())
    if missing:
        # A step of the day never seen: the mean of its neighbours is the least surprising.
        profile = profile.interpolate(limit_direction="both")
        notes.append(f"{missing} of {steps_per_day} steps of the day had no samples "
                     "(interpolated from their neighbours)")
    n_days = int(held["day"].nunique())
    coverage = held.groupby("day")["rate"].size() / steps_per_day
    full = coverage[coverage >= _FULL_DAY_SHARE].index
    seen = held.assign(norm=held["slot"].map(profile))
    seen = seen[seen["day"].isin(full) & (seen["norm"] > 0)]
    daily = (seen["rate"] / seen["norm"]).groupby(seen["day"]).mean()
    left_out = n_days - len(full)
    if left_out:
        notes.append(f"{left_out} day(s) holding under {_FULL_DAY_SHARE:.0%} of their steps "
                     "left out of the trend")
    slope = 0.0
    scale = 1.0
    level = float(profile.mean())
    if len(daily) >= 2:
        ratio_slope, intercept = np.polyfit(daily.index.to_numpy(dtype=float),
                                            daily.to_numpy(dtype=float), 1)
        mean = float(daily.mean())
        projected = max(0.0, float(intercept + ratio_slope * days))
        scale = projected / mean if mean > 0 else 1.0
        # In requests/s per day: the de-seasonalised slope times the profile's mean rate.
        slope = float(ratio_slope) / mean * level if mean > 0 else 0.0
        notes.append(f"trend {slope:+.3g} requests/s per day over {len(daily)} full days: "
                     f"the next day's mean is {level * scale:.3g} requests/s "
                     f"({(scale - 1) * 100:+.1f}%)")
    elif n_days == 1:
        notes.append("one day of history: no trend")
    else:
        notes.append(f"{len(daily)} full day(s) of history: no trend")
    values = tuple(max(0.0, float(v) * scale) for v in profile.to_numpy())
    notes.insert(0, f"observed over {n_days} day(s) of the store's history (asked for {days})")
    return TrafficForecast(profile=values, step_s=step, basis="observed", days=n_days,
                           trend_per_day=float(slope), net_of_cache=True, notes=tuple(notes))
