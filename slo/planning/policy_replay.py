"""Replay a day of traffic through simulated replicas while a scaling policy adds and removes
them: what each policy would have cost, in GPU-hours, and what latency it would have given.

Two policies, on the same traffic and the same simulated GPU:

* ``threshold``: today's policy, ``slo.scaling.policy.decide`` on the simulated signals (KV-cache
  usage, queue length, TTFT p95), every tick (``[collector] scrape_interval``), with its
  cooldown, scale-in hold and projection over the spin-up time;
* ``capacity``: capacity-sized: every tick, ``ceil(projected λ / μ)`` replicas, ``λ`` the
  arrival rate (requests per second), projected by its least-squares trend
  (``slo.scaling.policy.trend`` over the fit window) ``[scaling] spinup`` ahead when rising, ``μ``
  the capacity of one replica at the SLO; more replicas are ordered at once, fewer only when
  the target stayed lower for the whole ``[scaling] scale_in_hold`` (down to the highest
  target of that span).

A replica ordered at ``t`` serves from ``t + spinup`` and is billed from ``t`` (its GPUs are
held while it loads); a removed one stops at once. Both policies start from
``ceil(λ(start) / μ)`` warm replicas (within the pool's bounds).

**Aggregation (what makes a day take seconds).** A day of vLLM steps is millions of engine
iterations; instead, traffic is split evenly over the serving replicas (the gateway's
least-loaded routing), and each tick looks up the *level* of its per-replica rate: one
``slo.planning.replica.virtual.run_virtual`` run of the calibrated engine under Poisson arrivals at
that rate (``warmup_s`` discarded, then ``level_s`` measured), cached by rate rounded to a
``resolution`` (4 %) geometric grid. A level gives the signals (time-weighted KV-cache usage
and queue length, TTFT p95) and the share of requests within each latency SLO. So a tick is
the steady state of its load: queues do not carry over from one tick to the next (an
overloaded tick is as bad as ``level_s`` of that overload), and the TTFT signal is the
tick's, not a 5-minute window's.

Who uses it: no command; the benchmark ``bench/plan_bench.py`` replays a day through both
policies with it. It stays in the package rather than beside that benchmark because the test
suite checks it as well (``tests/test_policy_replay.py``: spin-up, billing, level capacity,
the lower bound), and what it replays is the package's own (``slo.scaling.policy.decide``,
``slo.planning.replica``), so it changes with them.

Units: seconds, requests per second, GPU-hours; ratios 0-1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from slo.cost.pool import gpu_hours_of
from slo.cost.waste import lower_bound_replicas
from slo.objectives.spec import effective_slos
from slo.planning.replica.engine import Engine, EngineConfig
from slo.planning.replica.profiles import Profile, get_profile
from slo.planning.replica.text import Prompt
from slo.planning.replica.virtual import Arrival, poisson_arrivals, run_virtual
from slo.scaling.policy import Timeline, decide, fit_window_for, trend
from slo.scaling.signals import ttft_threshold_for
from vigil.capacity import SloTarget
from vigil.config import Config, PoolConfig

__all__ = [
    "POLICIES",
    "Level",
    "LevelBook",
    "PolicyName",
    "PolicyRun",
    "Traffic",
    "level_capacity",
    "lower_bound_gpu_hours",
    "pool_slo_targets",
    "rate_function",
    "replay_policies",
]

PolicyName = Literal["threshold", "capacity"]
POLICIES: tuple[PolicyName, ...] = ("threshold", "capacity")

#: A rate curve ``rate(t) -> requests/s``, ``(t_s, rps)`` points (each rate holds until the
#: next point), or arrival times (seconds).
Traffic = Callable[[float], float] | Sequence[tuple[float, float]] | Sequence[float]

_IDLE_RPS = 1e-6


@dataclass(frozen=True)
class Level:
    """One replica's steady state at ``rps`` requests per second: ``kv_usage`` (ratio 0-1)
    and ``queue_length`` (requests) time-weighted, ``ttft_p95_s`` (None without requests),
    ``within`` the share 0-1 of requests within each SLO's threshold, by SLO name."""

    rps: float
    kv_usage: float
    queue_length: float
    ttft_p95_s: float | None
    within: dict[str, float]
    requests: int


class LevelBook:
    """Levels of one calibration and request shape, computed on first use (see the module
    docstring). ``resolution``: relative width 0-1 of a rate bucket."""

    def __init__(self, profile: Profile, slos: Sequence[SloTarget], *, prompt_tokens: int = 512,
                 output_tokens: int = 128, level_s: float = 40.0, warmup_s: float = 10.0,
                 resolution: float = 0.04, seed: int = 0) -> None:
        if not 0 < resolution < 1:
            raise ValueError(f"resolution must be in (0, 1), not {resolution!r}")
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        self.profile = profile
        self.slos = tuple(slos)
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.level_s = level_s
        self.warmup_s = warmup_s
        self.resolution = resolution
        self.seed = seed
        self._levels: dict[int, Level] = {}

    def __len__(self) -> int:
        """Levels simulated so far."""
        return len(self._levels)

    def bucket_rate(self, rps: float) -> float:
        """The rate (requests/s) whose level stands for ``rps``: the nearest grid point."""
        k = round(math.log(rps) / math.log1p(self.resolution))
        return math.exp(k * math.log1p(self.resolution))

    def level(self, rps: float) -> Level:
        """The level at ``rps`` requests per second per replica."""
        if rps <= _IDLE_RPS:
            return Level(0.0, 0.0, 0.0, None, {s.name: 1.0 for s in self.slos}, 0)
        k = round(math.log(rps) / math.log1p(self.resolution))
        found = self._levels.get(k)
        if found is None:
            found = self._levels[k] = self._simulate(self.bucket_rate(rps), k)
        return found

    def _simulate(self, rps: float, k: int) -> Level:
        rng = random.Random(self.seed * 1_000_003 + k)
        blocks = self.prompt_tokens // self.profile.block_size

        def make(t: float, i: int) -> Arrival:
            # Random block hashes: no two requests share a cached prefix.
            prompt = Prompt(self.prompt_tokens, tuple(rng.getrandbits(64) for _ in range(blocks)),
                            rng.getrandbits(64))
            return Arrival(t, prompt, self.output_tokens, ignore_eos=True)

        start, stop = self.warmup_s, self.warmup_s + self.level_s
        arrivals = poisson_arrivals(rps, 0.0, stop, rng, make)
        run = run_virtual(Engine(EngineConfig(self.profile, seed=self.seed)), arrivals)
        measured = [r for r in run.finished if start <= r.arrival_time < stop]
        within: dict[str, float] = {}
        for s in self.slos:
            good = sum(1 for r in measured if _latency(r, s.indicator) <= s.threshold_seconds)
            within[s.name] = good / len(measured) if measured else 1.0
        ttfts = sorted(_latency(r, "ttft") for r in measured)
        p95 = ttfts[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)) - 1)] if ttfts else None
        kv = queue = 0.0
        samples = [s for s in run.samples if s.time < stop]
        for a, b in zip(samples, [*samples[1:], None], strict=True):
            lo, hi = max(a.time, start), min(b.time if b is not None else stop, stop)
            if hi > lo:
                kv += a.kv_usage * (hi - lo)
                queue += a.waiting * (hi - lo)
        return Level(rps, kv / self.level_s, queue / self.level_s, p95, within, len(measured))


def level_capacity(book: LevelBook, *, max_rps: float = 1000.0) -> float:
    """The highest per-replica rate (requests/s, on the book's grid) whose level meets every
    SLO's objective, found by bisection over the grid (attainment falls with the rate); 0.0
    when even the lowest grid rate fails."""
    step = math.log1p(book.resolution)
    lo, hi = round(math.log(0.01) / step), round(math.log(max_rps) / step)

    def ok(k: int) -> bool:
        level = book.level(math.exp(k * step))
        return all(level.within.get(s.name, 0.0) >= s.objective for s in book.slos)

    if not ok(lo):
        return 0.0
    if ok(hi):
        return math.exp(hi * step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return math.exp(lo * step)


def _latency(req: object, indicator: str) -> float:
    first = getattr(req, "first_token_time", None)
    last = getattr(req, "last_token_time", None)
    end = first if indicator == "ttft" else last
    return math.inf if end is None else end - req.arrival_time  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PolicyRun:
    """One policy through the traffic: ``gpu_hours`` billed (replicas × time ×
    gpus_per_replica, spin-up included), ``attainment_by_slo`` the share 0-1 of requests
    within each latency SLO's threshold, ``meets_slo`` every share >= its objective,
    ``replicas`` the billed replicas ``(t_s, count)`` at each tick, ``requests`` the
    arrivals served, ``scale_outs``/``scale_ins`` the changes made."""

    policy: PolicyName
    gpu_hours: float
    attainment_by_slo: dict[str, float]
    meets_slo: bool
    replicas: list[tuple[float, int]]
    requests: float
    scale_outs: int
    scale_ins: int
    notes: tuple[str, ...] = field(default=())


def pool_slo_targets(config: Config, pool: PoolConfig) -> list[SloTarget]:
    """The pool's latency SLOs (``ttft``/``e2e``, defaults filled in) as ``SloTarget``s."""
    return [SloTarget(s.name, s.indicator, float(s.threshold_seconds), s.objective)  # type: ignore[arg-type]
            for s in effective_slos(config)
            if s.pool == pool.name and s.indicator in ("ttft", "e2e")
            and s.threshold_seconds is not None]


def rate_function(traffic: Traffic, tick_s: float) -> Callable[[float], float]:
    """``traffic`` as ``rate(t) -> requests/s``: a callable as is; ``(t, rps)`` points as a
    step function (0 before the first); arrival times counted per ``tick_s`` bucket."""
    if callable(traffic):
        return traffic
    items = list(traffic)
    if items and isinstance(items[0], tuple):
        # Traffic is a union mypy cannot narrow by the first item: these are (t, rps) pairs.
        pairs: Sequence[tuple[float, float]] = items  # type: ignore[assignment]
        points = sorted((float(t), float(r)) for t, r in pairs)

        def step(t: float) -> float:
            value = 0.0
            for pt, rate in points:
                if pt > t:
                    break
                value = rate
            return value

        return step
    counts: dict[int, int] = {}
    for a in items:
        counts[math.floor(float(a) / tick_s)] = counts.get(math.floor(float(a) / tick_s), 0) + 1  # type: ignore[arg-type]
    return lambda t: counts.get(math.floor(t / tick_s), 0) / tick_s


def lower_bound_gpu_hours(rate: Callable[[float], float], start_s: float, end_s: float,
                          step_s: float, capacity_rps_per_replica: float, gpus_per_replica: int,
                          *, samples_per_step: int = 60) -> float:
    """``slo.cost.waste``'s lower bound for a rate curve: per ``step_s`` step, ``ceil(mean λ / μ)``
    replicas for the step (GPU-hours), ``mean λ`` sampled ``samples_per_step`` times."""
    total = 0.0
    t = start_s
    while t + step_s <= end_s + 1e-9:
        mean = math.fsum(rate(t + (i + 0.5) * step_s / samples_per_step)
                         for i in range(samples_per_step)) / samples_per_step
        total += lower_bound_replicas(max(0.0, mean), capacity_rps_per_replica) * step_s
        t += step_s
    return gpu_hours_of(total, gpus_per_replica)


@dataclass
class _Fleet:
    """Replicas serving and starting (each starting one with its ready time)."""

    serving: int
    starting: list[float] = field(default_factory=list)
    last_up_at: float | None = None
    last_scale_in_at: float | None = None
    outs: int = 0
    ins: int = 0

    @property
    def billed(self) -> int:
        return self.serving + len(self.starting)

    def advance(self, now: float) -> None:
        ready = [t for t in self.starting if t <= now]
        if ready:
            self.serving += len(ready)
            self.starting = [t for t in self.starting if t > now]
            self.last_up_at = max(ready)

    def resize(self, target: int, now: float, spinup: float) -> None:
        if target > self.billed:
            self.starting += [now + spinup] * (target - self.billed)
            self.outs += 1
        elif target < self.billed:
            drop = self.billed - target
            keep = max(0, len(self.starting) - drop)  # cancel the newest orders first
            drop -= len(self.starting) - keep
            self.starting = self.starting[:keep]
            self.serving -= drop
            self.last_scale_in_at = now
            self.ins += 1


def replay_policies(
    traffic: Traffic,
    calibration: str | Profile,
    config: Config,
    pool: PoolConfig,
    capacity_rps_per_replica: float,
    *,
    start_s: float = 0.0,
    end_s: float | None = None,
    slos: Sequence[SloTarget] | None = None,
    policies: Sequence[PolicyName] = POLICIES,
    book: LevelBook | None = None,
    tick_s: float | None = None,
) -> dict[str, PolicyRun]:
    """Each policy of ``policies`` through ``traffic`` over ``[start_s, end_s]`` (seconds; the
    end defaults to the last point or arrival), on replicas of ``calibration`` (a simulator
    profile or its name), sized with ``capacity_rps_per_replica`` (μ, requests/s).
    ``slos``: default the pool's latency SLOs; ``book``: reuse levels across calls (its
    calibration wins); ``tick_s``: default ``[collector] scrape_interval``."""
    tick = float(tick_s if tick_s is not None else config.collector.scrape_interval)
    if end_s is None:
        if callable(traffic):
            raise ValueError("a rate function needs end_s")
        items = list(traffic)
        end_s = max((float(x[0]) if isinstance(x, tuple) else float(x)) for x in items)  # type: ignore[arg-type]
    targets = list(slos) if slos is not None else pool_slo_targets(config, pool)
    if book is None:
        profile = get_profile(calibration) if isinstance(calibration, str) else calibration
        book = LevelBook(profile, targets)
    rate = rate_function(traffic, tick)
    ticks = [start_s + k * tick for k in range(math.floor((end_s - start_s) / tick + 1e-9))]
    out: dict[str, PolicyRun] = {}
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})")
        out[name] = _run(name, ticks, tick, rate, book, targets, config, pool,
                         capacity_rps_per_replica)
    return out


def _clamp(n: int, pool: PoolConfig) -> int:
    return min(max(n, pool.min_replicas), pool.max_replicas)


def _run(name: PolicyName, ticks: Sequence[float], tick: float, rate: Callable[[float], float],
         book: LevelBook, slos: Sequence[SloTarget], config: Config, pool: PoolConfig,
         mu: float) -> PolicyRun:
    scaling = config.scaling
    spinup = float(scaling.spinup)
    fit = fit_window_for(scaling)
    hold = float(scaling.scale_in_hold)
    keep_s = max(hold, fit) + 2 * tick
    ttft_threshold = ttft_threshold_for(config, pool)
    first = rate(ticks[0] + tick / 2) if ticks else 0.0
    fleet = _Fleet(_clamp(lower_bound_replicas(max(0.0, first), mu), pool))
    kv: Timeline = []
    queue: Timeline = []
    ttft: Timeline = []
    lam: Timeline = []
    wants: Timeline = []
    good: dict[str, float] = {s.name: 0.0 for s in slos}
    requests = billed_s = 0.0
    timeline: list[tuple[float, int]] = []
    for t in ticks:
        fleet.advance(t)
        timeline.append((t, fleet.billed))
        billed_s += fleet.billed * tick
        arrival = max(0.0, rate(t + tick / 2))
        served = arrival * tick
        requests += served
        if fleet.serving > 0:
            level = book.level(arrival / fleet.serving)
            within = level.within
        else:
            level = book.level(0.0)
            within = {s.name: (1.0 if served == 0 else 0.0) for s in slos}
        for s in slos:
            good[s.name] += served * within.get(s.name, 0.0)
        now = t + tick
        for series in (kv, queue, ttft, lam, wants):
            while series and series[0][0] < now - keep_s:
                series.pop(0)
        if name == "threshold":
            kv.append((now, level.kv_usage))
            queue.append((now, level.queue_length * fleet.serving))
            if level.ttft_p95_s is not None:
                ttft.append((now, level.ttft_p95_s))
            rec = decide(kv, queue, ttft, now=now, current=fleet.serving, pool=pool,
                         scaling=scaling, ttft_threshold_s=ttft_threshold,
                         last_scale_out_at=fleet.last_up_at,
                         last_scale_in_at=fleet.last_scale_in_at, fit_window_s=fit,
                         max_age_s=config.engine.lookback)
            if rec.action == "scale_out":
                # The orchestrator's target is the recommendation; replicas still loading
                # already count toward it (a repeated scale-out does not order them again).
                fleet.resize(max(rec.desired, fleet.billed), now, spinup)
            elif rec.action == "scale_in":
                fleet.resize(rec.desired, now, spinup)
        else:
            lam.append((now, arrival))
            projected = arrival
            fitted = trend(lam, now, fit)
            if fitted is not None and fitted.slope_per_s > 0:
                projected = max(arrival, fitted.at_now + fitted.slope_per_s * spinup)
            want = _clamp(lower_bound_replicas(projected, mu), pool)
            wants.append((now, float(want)))
            if want > fleet.billed:
                fleet.resize(want, now, spinup)
            elif want < fleet.billed:
                since = now - hold
                span = [w for ts, w in wants if ts >= since - 1e-9]
                covered = wants[0][0] <= since + 1e-9
                last_change = max(fleet.last_scale_in_at or -math.inf,
                                  max(fleet.starting, default=-math.inf) - spinup)
                if covered and last_change <= since and max(span) < fleet.billed:
                    fleet.resize(int(max(span)), now, spinup)
    attainment = {s.name: (good[s.name] / requests if requests > 0 else 1.0) for s in slos}
    meets = all(attainment[s.name] >= s.objective for s in slos)
    return PolicyRun(name, gpu_hours_of(billed_s, pool.gpus_per_replica), attainment,
                     meets, timeline, requests, fleet.outs, fleet.ins,
                     notes=(f"{len(book)} simulated load levels",))
