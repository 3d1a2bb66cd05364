"""The scaling recommendation for one pool: Vigil's scaling policy as a pure function.

The policy (every number from ``ScalingConfig``; see ``docs/scaling.md``):

* **Scale out** when ANY signal is over its threshold — KV-cache usage > 0.80, queue length
  > 50, TTFT p95 (``scale_out_ttft_quantile``) > 0.80 × the TTFT SLO threshold — *or* its
  least-squares projection over the GPU spin-up time (3 min) is. The desired count is
  proportional to the worst signal:
  ``clamp(max(current + 1, ceil(current × worst value / threshold)), min, max)``.
* **Scale in** by one replica only when ALL of: KV-cache usage < 0.30 and queue length <= 0 at
  every sample of the last ``scale_in_hold`` (10 min), with the data covering that whole span.
  A projection never causes a scale-in.
* **Cooldown:** no new decision within ``cooldown`` (5 min) of a scale-out.
* **Capacity** (optional, ``CapacitySizing`` from a saved capacity profile): a scale-out is
  sized by the arriving load instead, ``needed = ceil((finished rate + queue growth + queued
  / spinup) / rps_per_replica)`` (a saturated pool finishes only as fast as it already does;
  what it does not finish piles up in the queue), and never below the proportional rule of
  the queue and TTFT triggers: ``clamp(max(current + 1, needed, proportional), min, max)``.
  A scale-in never goes below ``ceil(rate now / rps_per_replica)``. The triggers stay the
  same.

Everything here is pure: the signals come in as timelines, the time as ``now`` and the last
scale-out as a timestamp, so a test (or a replay of history) gets the same answer every time.
``slo.scaling.signals`` turns a ``Source`` into these inputs.

Units: times are Unix seconds, durations seconds, KV-cache usage a ratio 0-1, queue length a
number of requests, TTFT seconds, request rates requests per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from vigil.capacity import CapacityProfile, ceil_replicas, replicas_needed
from vigil.config import PoolConfig, ScalingConfig
from vigil.durations import format_duration

__all__ = [
    "DEFAULT_FIT_WINDOW_S",
    "DEFAULT_MAX_AGE_S",
    "SIGNAL_CAPACITY",
    "SIGNAL_CAPACITY_FLOOR",
    "SIGNAL_COOLDOWN",
    "SIGNAL_KV",
    "SIGNAL_LABELS",
    "SIGNAL_MAX_REPLICAS",
    "SIGNAL_MIN_REPLICAS",
    "SIGNAL_PROPORTIONAL",
    "SIGNAL_QUEUE",
    "SIGNAL_REQUEST_RATE",
    "SIGNAL_SCALE_IN_HOLD",
    "SIGNAL_TTFT",
    "Action",
    "CapacitySizing",
    "Reason",
    "Recommendation",
    "Timeline",
    "Trend",
    "action_of",
    "decide",
    "fit_window_for",
    "latest",
    "trend",
]

#: ``(Unix seconds, value)`` samples of one signal, in any order (sorted on use).
Timeline = list[tuple[float, float]]

Action = Literal["scale_out", "scale_in", "hold"]

# Signal names: the keys of ``Recommendation.signals`` and ``Reason.signal``.
SIGNAL_KV = "kv_cache_usage"
SIGNAL_QUEUE = "queue_length"
#: The TTFT at ``ScalingConfig.scale_out_ttft_quantile``; the key keeps its name (p95 is the
#: default) so that status consumers need not follow the setting.
SIGNAL_TTFT = "ttft_p95_seconds"
#: The pool's request rate (requests/s); a key of ``Recommendation.signals`` only when the
#: recommendation was sized by capacity.
SIGNAL_REQUEST_RATE = "request_rate"
# Pseudo-signals: reasons that are about the decision, not the load.
SIGNAL_COOLDOWN = "cooldown"
SIGNAL_MAX_REPLICAS = "max_replicas"
SIGNAL_MIN_REPLICAS = "min_replicas"
SIGNAL_SCALE_IN_HOLD = "scale_in_hold"
#: A scale-out sized by the request rate and a capacity profile.
SIGNAL_CAPACITY = "capacity"
#: A scale-in stopped at the replicas the current request rate needs.
SIGNAL_CAPACITY_FLOOR = "capacity_floor"
#: A capacity-sized scale-out raised to what the proportional rule of a queue or TTFT
#: trigger asks (the rate of finished requests understates a saturated pool's load).
SIGNAL_PROPORTIONAL = "proportional"

#: Least-squares fit window (seconds) when the spin-up time is shorter: five minutes of
#: 15-second samples (21 points) is enough to tell a trend from scrape-to-scrape noise.
DEFAULT_FIT_WINDOW_S = 300.0

#: A signal whose newest sample is older than this (seconds) is missing, as PromQL's default
#: lookback makes a series absent; also the largest gap tolerated inside a scale-in hold.
DEFAULT_MAX_AGE_S = 300.0

#: The load signals' names as people read them ("KV-cache usage > 0.80").
SIGNAL_LABELS = {
    SIGNAL_KV: "KV-cache usage",
    SIGNAL_QUEUE: "queue length",
    SIGNAL_TTFT: "TTFT",
}

def fit_window_for(scaling: ScalingConfig) -> float:
    """The least-squares fit window (seconds): at least ``DEFAULT_FIT_WINDOW_S`` and at least
    the spin-up time, so that we never extrapolate further ahead than we have looked back."""
    return max(DEFAULT_FIT_WINDOW_S, float(scaling.spinup))


@dataclass(frozen=True)
class CapacitySizing:
    """What one replica serves within the SLOs, from a capacity profile.

    ``rps_per_replica``: requests per second one replica serves while meeting every latency
    SLO (the profile's ``max_goodput_rps``); ``basis``: how that is known (``"measured"``,
    ``"observed"`` or ``"estimated"``); ``source``: which profile (its key, or where it came
    from), for the reasons and the status.
    """

    rps_per_replica: float
    basis: str
    source: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rps_per_replica) and self.rps_per_replica > 0):
            raise ValueError(f"rps_per_replica must be > 0 requests/s, not "
                             f"{self.rps_per_replica!r}")

    @classmethod
    def from_profile(cls, profile: CapacityProfile | None) -> CapacitySizing | None:
        """The sizing of a saved capacity profile (its ``max_goodput_rps``, basis and key);
        None without one, or for one that serves nothing within its SLOs (its search found
        no passing level: it cannot size a pool, the proportional rule does)."""
        if profile is None or not profile.max_goodput_rps > 0:
            return None
        return cls(profile.max_goodput_rps, profile.basis, profile.key)

    def replicas_for(self, rps: float) -> int:
        """``ceil(rps / rps_per_replica)``: replicas that serve ``rps`` requests/s (rounded
        to 9 decimals first, so that float noise does not add a replica)."""
        return replicas_needed(max(0.0, rps), self.rps_per_replica)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"rps_per_replica": self.rps_per_replica, "basis": self.basis,
                "source": self.source}


class Trend(NamedTuple):
    """A least-squares line through a timeline: ``value(t) = at_now + slope_per_s × (t - now)``."""

    slope_per_s: float  #: Signal units per second.
    at_now: float  #: The fitted value at ``now`` (the line's intercept at ``now``).


@dataclass(frozen=True)
class Reason:
    """One reason of a recommendation, with the numbers behind it.

    ``signal`` is a ``SIGNAL_*`` name; ``value`` the observed value (for scale-in: the largest
    value in the hold window; for the cooldown: seconds since the scale-out; for the replica
    bounds: the current replica count; for a capacity reason: the request rate now);
    ``threshold`` what it was compared with (for a capacity reason: requests/s per replica);
    ``comparison`` the operator that held (``">"``, ``"<"``, ``"<="``, ``">="``; ``"/"`` for
    a capacity reason, a division);
    ``projected`` the least-squares projection ``horizon_s`` ahead (None when no projection is
    involved). ``trend_per_s`` is the fitted slope (units per second), ``window_s`` the span a
    held condition covers (seconds). ``quantile`` (ratio 0-1) is the TTFT quantile compared,
    named in ``text`` (``"TTFT p95"``). ``basis`` (capacity reasons only) is the capacity
    profile's basis and ``replicas`` the replica count the rate needs. A scale-out's capacity
    reason adds the arriving load beyond the finished rate: ``queue_growth_per_s`` (the
    queue's rising slope, requests/s) and ``queued`` (waiting requests, to drain within
    ``drain_s`` seconds, the spin-up time). A ``SIGNAL_PROPORTIONAL`` reason has ``value``
    the current replicas, ``threshold`` the worst ratio of a queue/TTFT trigger to its
    threshold, ``of`` that trigger's signal and ``replicas`` the proportional count.
    """

    signal: str
    value: float
    threshold: float
    projected: float | None
    comparison: str
    trend_per_s: float | None = None
    horizon_s: float | None = None
    window_s: float | None = None
    quantile: float | None = None
    basis: str | None = None
    replicas: int | None = None
    queue_growth_per_s: float | None = None
    queued: float | None = None
    drain_s: float | None = None
    of: str | None = None

    @property
    def text(self) -> str:
        """A one-line human explanation, e.g. ``"KV-cache usage 0.86 > 0.80"``."""
        if self.signal == SIGNAL_COOLDOWN:
            left = max(0.0, self.threshold - self.value)
            return (
                f"cooldown: last scale-out {format_duration(self.value)} ago "
                f"< {format_duration(self.threshold)}, next decision in {format_duration(left)}"
            )
        if self.signal in (SIGNAL_MAX_REPLICAS, SIGNAL_MIN_REPLICAS):
            at = "at" if self.comparison in (">=", "<=") else (
                "above" if self.comparison == ">" else "below"
            )
            return (
                f"{at} {self.signal}: {_count(self.value)} replicas {self.comparison} "
                f"{_count(self.threshold)}"
            )
        if self.signal in (SIGNAL_CAPACITY, SIGNAL_CAPACITY_FLOOR):
            when, rate = ("projected", self.projected) if self.projected is not None else (
                "now", self.value)
            load = f"{_rps(rate)} req/s {when}"
            if self.queue_growth_per_s or self.queued:
                load = f"({load} finished"
                if self.queue_growth_per_s:
                    load += f" + {_rps(self.queue_growth_per_s)} req/s queue growth"
                if self.queued:
                    load += (f" + {_count(self.queued)} queued / "
                             f"{format_duration(self.drain_s or 0.0)}")
                load += ")"
            text = (f"sized by capacity: {load} / "
                    f"{_rps(self.threshold)} req/s per replica ({self.basis}) = "
                    f"{self.replicas}")
            if self.signal == SIGNAL_CAPACITY_FLOOR:
                text += ", no scale-in below it"
            return text
        if self.signal == SIGNAL_PROPORTIONAL:
            label = SIGNAL_LABELS.get(self.of or "", self.of or "")
            return (f"sized by {label}: {_count(self.value)} replicas × "
                    f"{self.threshold:.2f} = {self.replicas} (the proportional rule, above "
                    f"the capacity sizing)")
        if self.signal == SIGNAL_SCALE_IN_HOLD:
            return (
                f"scale-in conditions held for {format_duration(self.value)} "
                f"{self.comparison} {format_duration(self.threshold)}"
            )
        label = SIGNAL_LABELS.get(self.signal, self.signal)
        if self.quantile is not None:
            label += f" p{self.quantile * 100:g}"
        value = _fmt(self.signal, self.value)
        threshold = _fmt(self.signal, self.threshold)
        if self.window_s is not None:  # a held scale-in condition: value is the window's max
            return (
                f"{label} max {value} {self.comparison} {threshold} "
                f"over {format_duration(self.window_s)}"
            )
        if self.projected is None:
            return f"{label} {value} {self.comparison} {threshold}"
        horizon = format_duration(self.horizon_s or 0.0)
        slope = _per_min(self.trend_per_s or 0.0)
        projected = _fmt(self.signal, self.projected)
        if _compare(self.value, self.comparison, self.threshold):
            return (f"{label} {value} {self.comparison} {threshold} "
                    f"(projected {projected} in {horizon}, trend {slope}/min)")
        # The projection alone triggered: lead with it, the current value last.
        return (f"{label} projected {projected} {self.comparison} {threshold} in {horizon} "
                f"(trend {slope}/min; now {value})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus ``text`` (``basis`` and ``replicas`` on capacity reasons
        only)."""
        out: dict[str, Any] = {
            "signal": self.signal,
            "value": self.value,
            "threshold": self.threshold,
            "projected": self.projected,
            "comparison": self.comparison,
            "trend_per_s": self.trend_per_s,
            "horizon_s": self.horizon_s,
            "window_s": self.window_s,
        }
        if self.basis is not None:
            out["basis"] = self.basis
            out["replicas"] = self.replicas
            if self.queue_growth_per_s is not None or self.queued is not None:
                out["queue_growth_per_s"] = self.queue_growth_per_s
                out["queued"] = self.queued
                out["drain_s"] = self.drain_s
        if self.of is not None:
            out["of"] = self.of
            out["replicas"] = self.replicas
        out["text"] = self.text
        return out


@dataclass(frozen=True)
class Recommendation:
    """What to do with one pool now.

    ``current``/``desired`` are replica counts; ``action`` is ``"scale_out"`` exactly when
    ``desired > current``, ``"scale_in"`` when ``desired < current``, else ``"hold"``.
    ``next_decision_at`` (Unix seconds) is when a new decision is allowed: ``now`` outside the
    cooldown, the end of the cooldown inside it. ``signals`` holds the current value of each
    signal (None when missing): ``kv_cache_usage`` (ratio 0-1, mean over replicas),
    ``queue_length`` (requests, sum over replicas), ``ttft_p95_seconds`` (the TTFT at
    ``scale_out_ttft_quantile``, seconds), and ``request_rate`` (requests/s) when sized by
    capacity; ``slo.scaling.signals`` adds ``kv_cache_usage_max`` (the busiest replica, for display
    only). ``capacity`` is the sizing used (None without a capacity profile).
    """

    pool: str
    current: int
    desired: int
    action: Action
    reasons: list[Reason]
    next_decision_at: float | None
    signals: dict[str, float | None] = field(default_factory=dict)
    capacity: CapacitySizing | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``reasons`` as text, ``reason_details`` with the numbers; ``capacity``
        only when the recommendation was sized by capacity."""
        out: dict[str, Any] = {
            "pool": self.pool,
            "current": self.current,
            "desired": self.desired,
            "action": self.action,
            "reasons": [r.text for r in self.reasons],
            "reason_details": [r.to_dict() for r in self.reasons],
            "next_decision_at": self.next_decision_at,
            "signals": dict(self.signals),
        }
        if self.capacity is not None:
            out["capacity"] = self.capacity.to_dict()
        return out


# --- small helpers ------------------------------------------------------------------------


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _fmt(signal: str, x: float) -> str:
    """A value in its signal's customary precision."""
    if signal == SIGNAL_KV:
        return f"{x:.2f}"
    if signal == SIGNAL_TTFT:
        return f"{x:.3f} s"
    if signal == SIGNAL_QUEUE:
        # Whole requests; a fraction only for a small projected or averaged value.
        return str(round(x)) if abs(x) >= 10 or abs(x - round(x)) < 0.05 else f"{x:.1f}"
    return f"{x:g}"


def _rps(x: float) -> str:
    """A request rate: one decimal (``14.2``), two significant digits below 1 (``0.35``)."""
    return f"{x:.1f}" if abs(x) >= 1 or x == 0 else f"{x:.2g}"


def _per_min(slope_per_s: float) -> str:
    """A slope per minute with a sign and two significant digits (``+4.1``, ``+0.03``)."""
    x = slope_per_s * 60.0
    if x == 0:
        return "+0"
    if abs(x) >= 10:
        return f"{x:+.0f}"
    if abs(x) >= 1:
        return f"{x:+.1f}"
    digits = max(2, 1 - math.floor(math.log10(abs(x))))
    return f"{x:+.{digits}f}"


def _compare(a: float, op: str, b: float) -> bool:
    return {">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}.get(op, False)


def _clean(timeline: Iterable[tuple[float, float]] | None, now: float) -> Timeline:
    """Finite samples at or before ``now``, sorted by time (future samples are clock skew)."""
    if not timeline:
        return []
    return sorted(
        (float(t), float(v))
        for t, v in timeline
        if math.isfinite(t) and math.isfinite(v) and t <= now
    )


def latest(timeline: Timeline | None, now: float,
           max_age_s: float = DEFAULT_MAX_AGE_S) -> float | None:
    """The newest finite value at or before ``now`` and younger than ``max_age_s``; else None."""
    pts = _clean(timeline, now)
    if not pts or pts[-1][0] <= now - max_age_s:
        return None
    return pts[-1][1]


def trend(timeline: Timeline | None, now: float, fit_window_s: float) -> Trend | None:
    """Ordinary least squares over the finite samples with ``now - fit_window_s <= t <= now``.

    Returns ``Trend(slope per second, fitted value at now)``, or None with fewer than 3
    samples (two points are a line through noise, not a trend) or when all samples share one
    timestamp. Time is centred on ``now`` before fitting: squared Unix seconds (~3e18) would
    lose the sub-second digits in float64.
    """
    if not math.isfinite(now) or not fit_window_s > 0:
        raise ValueError(f"need a finite now and a fit window > 0 s, got {now!r}, "
                         f"{fit_window_s!r}")
    pts = [(t - now, v) for t, v in _clean(timeline, now) if t >= now - fit_window_s]
    n = len(pts)
    if n < 3:
        return None
    mx = math.fsum(x for x, _ in pts) / n
    my = math.fsum(y for _, y in pts) / n
    sxx = math.fsum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    sxy = math.fsum((x - mx) * (y - my) for x, y in pts)
    slope = sxy / sxx
    return Trend(slope, my - slope * mx)


def _held_since(
    pts: Timeline, now: float, ok: Callable[[float], bool], max_gap_s: float
) -> float | None:
    """The start of the unbroken run of ``ok`` samples that ends at the newest sample.

    The run is broken by a sample that is not ``ok`` or by a gap longer than ``max_gap_s``
    (no data is not "low"). None when the newest sample is stale or not ``ok``.
    """
    if not pts or pts[-1][0] <= now - max_gap_s or not ok(pts[-1][1]):
        return None
    start = pts[-1][0]
    for t, v in reversed(pts[:-1]):
        if start - t > max_gap_s or not ok(v):
            break
        start = t
    return start


class _Signal(NamedTuple):
    name: str
    timeline: Timeline
    threshold: float


def _ratio(value: float, threshold: float) -> float | None:
    """``value / threshold`` for proportional sizing; None for a zero threshold (any value is
    "infinitely" over it, so only the minimum step of +1 is justified)."""
    return value / threshold if threshold > 0 else None


def _desired_out(current: int, ratio: float | None, pool: PoolConfig) -> int:
    target = current + 1
    if ratio is not None and math.isfinite(ratio):
        target = max(target, ceil_replicas(current * ratio))
    return min(max(target, pool.min_replicas), pool.max_replicas)


def _capacity_reason(capacity: CapacitySizing, rate_pts: Timeline, rate_now: float,
                     now: float, fit_window_s: float, spinup_s: float,
                     queue_pts: Timeline, queue_now: float | None) -> Reason:
    """The capacity sizing of a scale-out, for the ARRIVING load (requests/s): the finished
    rate (the larger of now and its rising least-squares projection over the spin-up time:
    the new replicas face that one), plus the queue's rising slope (arrivals the pool does
    not finish), plus the waiting requests spread over the spin-up time (the backlog to drain
    by the time the new replicas serve)."""
    fitted = trend(rate_pts, now, fit_window_s)
    projected = slope = None
    rate = rate_now
    if fitted is not None and fitted.slope_per_s > 0:
        p = fitted.at_now + fitted.slope_per_s * spinup_s
        if p > rate_now:
            projected, slope, rate = p, fitted.slope_per_s, p
    growth = queued = drain = None
    if queue_now is not None:
        q_fit = trend(queue_pts, now, fit_window_s)
        if q_fit is not None and q_fit.slope_per_s > 0:
            growth = q_fit.slope_per_s
            rate += growth
        if queue_now > 0 and spinup_s > 0:
            queued, drain = queue_now, spinup_s
            rate += queue_now / spinup_s
    return Reason(
        SIGNAL_CAPACITY, rate_now, capacity.rps_per_replica, projected, "/",
        trend_per_s=slope, horizon_s=None if projected is None else spinup_s,
        basis=capacity.basis, replicas=capacity.replicas_for(rate),
        queue_growth_per_s=growth, queued=queued, drain_s=drain,
    )


def action_of(current: int, desired: int) -> Action:
    """``scale_out`` when ``desired > current``, ``scale_in`` when below, else ``hold``."""
    if desired > current:
        return "scale_out"
    if desired < current:
        return "scale_in"
    return "hold"


class _Triggers(NamedTuple):
    """What the scale-out triggers found: the reasons, the worst ratio over its threshold of
    any signal, and the worst of the queue and TTFT alone (``(ratio, signal)``)."""

    reasons: list[Reason]
    worst: float | None
    pressure: tuple[float, str] | None


def _checked_fit_window(now: float, current: int, ttft_threshold_s: float, max_age_s: float,
                        fit_window_s: float | None, scaling: ScalingConfig) -> float:
    """Step 0: refuse arguments no policy can act on; the trend-fit window (seconds)."""
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite Unix time in seconds, not {now!r}")
    if isinstance(current, bool) or not isinstance(current, int) or current < 0:
        raise ValueError(f"current must be a replica count >= 0, not {current!r}")
    if not (math.isfinite(ttft_threshold_s) and ttft_threshold_s > 0):
        raise ValueError(f"ttft_threshold_s must be > 0 seconds, not {ttft_threshold_s!r}")
    if not max_age_s > 0:
        raise ValueError(f"max_age_s must be > 0 seconds, not {max_age_s!r}")
    fit_window = fit_window_for(scaling) if fit_window_s is None else float(fit_window_s)
    if not (math.isfinite(fit_window) and fit_window > 0):
        raise ValueError(f"fit_window_s must be > 0 seconds, not {fit_window_s!r}")
    return fit_window


def _scale_out_triggers(signals: Sequence[_Signal], values: Mapping[str, float | None],
                        now: float, fit_window_s: float, scaling: ScalingConfig) -> _Triggers:
    """Step 1: the signals over their threshold now, or projected over it at ``now +
    spinup`` by a *rising* trend (a falling line still over the threshold at now + spinup
    says the latest sample dropped below: no reason to buy a GPU)."""
    spinup = float(scaling.spinup)
    reasons: list[Reason] = []
    worst: float | None = None
    # The worst queue/TTFT ratio: those measure load the pool does not finish, which a rate
    # of finished requests cannot see, so a capacity sizing never goes below their rule.
    pressure: tuple[float, str] | None = None
    for s in signals:
        value = values[s.name]
        if value is None:
            continue  # missing: never triggers anything
        fitted = trend(s.timeline, now, fit_window_s)
        projected = slope = None
        if fitted is not None and fitted.slope_per_s > 0:
            p = fitted.at_now + fitted.slope_per_s * spinup
            if s.name == SIGNAL_KV:
                # Usage cannot exceed 1: a steeper line means "full, then queueing", which
                # the queue signal measures; sizing on 1.3 × a full cache would overshoot.
                p = min(p, 1.0)
            if p > s.threshold:
                projected, slope = p, fitted.slope_per_s
        if value <= s.threshold and projected is None:
            continue
        reasons.append(Reason(
            s.name, value, s.threshold, projected, ">", trend_per_s=slope,
            horizon_s=None if projected is None else spinup,
            quantile=float(scaling.scale_out_ttft_quantile) if s.name == SIGNAL_TTFT else None,
        ))
        # Size for the larger of now and the projection: new replicas arrive at now + spinup.
        over = max(v for v in (value, projected) if v is not None and v > s.threshold)
        r = _ratio(over, s.threshold)
        if r is not None:
            worst = r if worst is None else max(worst, r)
            if s.name != SIGNAL_KV and (pressure is None or r > pressure[0]):
                pressure = (r, s.name)
    return _Triggers(reasons, worst, pressure)


def _cooldown(now: float, last_scale_out_at: float | None,
              scaling: ScalingConfig) -> tuple[float, Reason | None]:
    """Step 2: ``(next decision time, the cooldown reason or None)``. The cooldown ends
    ``cooldown`` after the scale-out; exactly at that instant decisions are allowed again
    ("within 5 min" is a strict inequality)."""
    if last_scale_out_at is None or now - last_scale_out_at >= scaling.cooldown:
        return now, None
    # A scale-out stamped in the future (clock skew) counts as "just now".
    elapsed = max(0.0, now - last_scale_out_at)
    return (last_scale_out_at + scaling.cooldown,
            Reason(SIGNAL_COOLDOWN, elapsed, float(scaling.cooldown), None, "<"))


def _size_out(current: int, pool: PoolConfig, triggers: _Triggers,
              sizing: Reason | None) -> tuple[int, list[Reason]]:
    """Step 3: the scale-out target and the reasons that say how it was sized: the
    proportional rule alone, or with a capacity profile ``max(current + 1, needed,
    proportional)`` within the replica bounds."""
    lo, hi = pool.min_replicas, pool.max_replicas
    if sizing is None:
        return _desired_out(current, triggers.worst, pool), []
    needed = sizing.replicas or 0
    extra = [sizing]
    proportional = 0
    pressure = triggers.pressure
    if pressure is not None and math.isfinite(pressure[0]):
        proportional = ceil_replicas(current * pressure[0])
        if proportional > max(needed, current + 1):
            extra.append(Reason(SIGNAL_PROPORTIONAL, float(current), pressure[0], None,
                                "×", replicas=proportional, of=pressure[1]))
    desired = min(max(current + 1, needed, proportional, lo), hi)
    wanted = max(needed, proportional)
    if wanted > hi and desired > current:
        extra.append(Reason(SIGNAL_MAX_REPLICAS, float(wanted), float(hi), None, ">"))
    return desired, extra


def _scale_in(now: float, current: int, pool: PoolConfig, scaling: ScalingConfig,
              kv_pts: Timeline, queue_pts: Timeline, last_scale_in_at: float | None,
              max_age_s: float, capacity: CapacitySizing | None,
              rate_now: float | None) -> tuple[int, list[Reason]]:
    """Step 4: one replica fewer only when ALL scale-in conditions held for the whole hold
    span, on samples (never on a projection), and since the last scale-in; else hold, with
    the reason that kept the replica."""
    lo = pool.min_replicas
    hold = float(scaling.scale_in_hold)
    kv_since = _held_since(kv_pts, now, lambda v: v < scaling.scale_in_kv_usage, max_age_s)
    queue_since = _held_since(queue_pts, now, lambda v: v <= scaling.scale_in_queue_length,
                              max_age_s)
    if kv_since is None or queue_since is None:
        return current, []
    since = max(kv_since, queue_since)
    if last_scale_in_at is not None:
        since = max(since, last_scale_in_at)
    held = max(0.0, now - since)
    if held < hold:
        return current, [Reason(SIGNAL_SCALE_IN_HOLD, held, hold, None, "<")]
    window_start = now - hold
    low = [
        Reason(SIGNAL_KV, max(v for t, v in kv_pts if t >= window_start),
               float(scaling.scale_in_kv_usage), None, "<", window_s=hold),
        Reason(SIGNAL_QUEUE, max(v for t, v in queue_pts if t >= window_start),
               float(scaling.scale_in_queue_length), None, "<=", window_s=hold),
    ]
    if current <= lo:
        return current, [*low, Reason(SIGNAL_MIN_REPLICAS, float(current), float(lo), None,
                                      "<=")]
    if capacity is not None and rate_now is not None:
        floor = capacity.replicas_for(rate_now)
        if current - 1 < floor:
            # Low KV usage and an empty queue can hide a rate the survivors would not serve
            # within the SLOs (short prompts, short answers): the profile says how many do.
            return current, [*low, Reason(
                SIGNAL_CAPACITY_FLOOR, rate_now, capacity.rps_per_replica, None, "/",
                basis=capacity.basis, replicas=floor)]
    # One replica at a time: the hold was measured with `current` replicas; after removing
    # one, the survivors carry its share, and the next step needs a fresh 10-minute hold.
    return current - 1, low


# --- the policy -----------------------------------------------------------------------------


def decide(
    kv: Timeline | None,
    queue: Timeline | None,
    ttft_p95: Timeline | None,
    *,
    now: float,
    current: int,
    pool: PoolConfig,
    scaling: ScalingConfig,
    ttft_threshold_s: float,
    last_scale_out_at: float | None,
    last_scale_in_at: float | None = None,
    fit_window_s: float | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    request_rate: Timeline | None = None,
    capacity: CapacitySizing | None = None,
) -> Recommendation:
    """The scaling policy for one pool at ``now`` (Unix seconds).

    ``kv`` is the pool's KV-cache usage (ratio 0-1, mean over replicas), ``queue`` its queue
    length (waiting requests, sum over replicas), ``ttft_p95`` its TTFT at
    ``scaling.scale_out_ttft_quantile`` (p95 by default; seconds); each a
    timeline of ``(Unix seconds, value)``, None or empty when the signal is missing (it then
    triggers nothing and is reported as None). ``current`` is the number of ready replicas;
    ``ttft_threshold_s`` the TTFT SLO threshold (seconds; scale-out happens above
    ``scaling.scale_out_ttft_ratio`` of it). ``last_scale_out_at`` starts the cooldown;
    ``last_scale_in_at`` (optional) restarts the scale-in hold, so that one quiet stretch
    removes one replica rather than one per evaluation. ``fit_window_s`` defaults to
    ``fit_window_for(scaling)``; a signal whose newest sample is older than ``max_age_s`` is
    missing, and a scale-in hold may not contain a gap longer than that.

    ``capacity`` (optional) sizes by the request rate: ``request_rate`` is the pool's rate of
    successful requests (requests/s, a timeline like the others). A scale-out then asks for
    ``max(current + 1, needed, proportional)`` replicas: ``needed = ceil(arriving /
    capacity.rps_per_replica)``, the arriving load being the finished rate (the larger of
    now and its least-squares projection over the spin-up time) + the queue's rising slope +
    the queue length / spin-up time; ``proportional`` the proportional rule of the queue and
    TTFT triggers (0 when only KV-cache usage triggered). A scale-in never goes below
    ``ceil(rate now / rps_per_replica)``. Without a fresh rate sample the proportional rule
    sizes as before. Without ``capacity`` the result is what it always was.

    The steps, in order of precedence: replica bounds (a count outside ``[min_replicas,
    max_replicas]`` is brought back inside, cooldown or not), then the cooldown
    (``_cooldown``), then scale-out (``_scale_out_triggers``, sized by ``_size_out``), then
    scale-in (``_scale_in``).
    Raises ValueError for a negative ``current``, a non-finite ``now``, or a TTFT threshold,
    ``max_age_s`` or ``fit_window_s`` that is not > 0.
    """
    fit_window = _checked_fit_window(now, current, ttft_threshold_s, max_age_s, fit_window_s,
                                     scaling)
    signals = [
        _Signal(SIGNAL_KV, _clean(kv, now), float(scaling.scale_out_kv_usage)),
        _Signal(SIGNAL_QUEUE, _clean(queue, now), float(scaling.scale_out_queue_length)),
        _Signal(SIGNAL_TTFT, _clean(ttft_p95, now),
                float(scaling.scale_out_ttft_ratio) * ttft_threshold_s),
    ]
    values = {s.name: latest(s.timeline, now, max_age_s) for s in signals}
    rate_pts = _clean(request_rate, now) if capacity is not None else []
    rate_now = latest(rate_pts, now, max_age_s)
    if capacity is not None:
        values[SIGNAL_REQUEST_RATE] = rate_now

    triggers = _scale_out_triggers(signals, values, now, fit_window, scaling)
    next_at, cooldown = _cooldown(now, last_scale_out_at, scaling)
    sizing = (None if capacity is None or rate_now is None
              else _capacity_reason(capacity, rate_pts, rate_now, now, fit_window,
                                    float(scaling.spinup), signals[1].timeline,
                                    values[SIGNAL_QUEUE]))
    lo, hi = pool.min_replicas, pool.max_replicas

    def result(desired: int, reasons: list[Reason]) -> Recommendation:
        return Recommendation(
            pool=pool.name, current=current, desired=desired,
            action=action_of(current, desired), reasons=reasons,
            next_decision_at=next_at, signals=dict(values), capacity=capacity,
        )

    # 1. Bounds: the configured floor and ceiling are not load decisions; they hold always.
    if current < lo:
        desired = lo
        reasons = [Reason(SIGNAL_MIN_REPLICAS, float(current), float(lo), None, "<")]
        if triggers.reasons and cooldown is None:
            out, sized_by = _size_out(current, pool, triggers, sizing)
            desired = max(lo, out)
            reasons += [*triggers.reasons, *sized_by]
        return result(desired, reasons)
    if current > hi:
        return result(hi, [Reason(SIGNAL_MAX_REPLICAS, float(current), float(hi), None, ">")])

    # 2. Cooldown: hold, and show what would have triggered so the pressure stays visible.
    if cooldown is not None:
        return result(current, [cooldown, *triggers.reasons])

    # 3. Scale out on ANY trigger.
    if triggers.reasons:
        desired, sized_by = _size_out(current, pool, triggers, sizing)
        if desired <= current:  # current == max_replicas
            at_max = Reason(SIGNAL_MAX_REPLICAS, float(current), float(hi), None, ">=")
            return result(current, [*triggers.reasons, at_max])
        return result(desired, [*triggers.reasons, *sized_by])

    # 4. Scale in.
    return result(*_scale_in(now, current, pool, scaling, signals[0].timeline,
                             signals[1].timeline, last_scale_in_at, max_age_s, capacity,
                             rate_now))
