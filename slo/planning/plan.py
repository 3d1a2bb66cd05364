"""The cheapest configuration that meets the SLOs for a day of traffic (``vigil plan``).

Each candidate is a capacity profile: ``μ = max_goodput_rps``, the requests per second one
replica serves within its SLO targets. Over the traffic's day curve (one point per
``[capacity] plan_step``, ``λ(t)`` requests/s)::

    n(t)              = max(ceil(λ(t) / μ), pool.min_replicas)
    gpu_hours_per_day = Σ n(t) × step / 3600 × gpus_per_replica
    cost_per_day      = gpu_hours_per_day × prices[gpu]                       (USD)
    cost_per_month    = cost_per_day × hours_per_month / 24                   (USD; 730 h:
                                                                               30.42 days)
    cost_per_1000     = cost_per_day / requests per day × 1000   (the traffic's requests,
                                                                  cache hits included)
    headroom          = min over t with n(t) > 0 of 1 − λ(t) / (n(t) μ)

Planning is unbounded by default: the pool's ``max_replicas`` caps today's autoscaler, not what
the traffic needs, so a plan above it says so in its notes (``respect_max_replicas=True``
clamps to it instead, and a step the cap cannot serve fails the plan).

A plan meets the SLOs when ``λ(t) <= n(t) μ`` at every step and the profile was judged against
targets at least as strict as the pool's latency SLOs now (``slo.objectives.spec.effective_slos``):
for every configured ``ttft``/``e2e`` SLO, a target of the same indicator with a threshold no
larger and an objective no lower. A profile measured against a looser SLO says nothing about
the stricter one, and does not count (its notes say which SLO). A plan's ``basis`` is the
weakest of its profile's and the traffic's (measured > observed > estimated).

Levers change the traffic or μ before sizing, each with its measured input and its effect
shown (``LeverEffect``):

* ``batch_share``: the batch tier's share of requests (the gateway's records) is taken out of
  every step and poured back into the day's troughs (water-filling: the lowest steps are raised
  to one level until the moved requests are placed), as the batch queue's off-peak release does.
  Not applied to a forecast from history (``days`` > 0): its batch requests already sit where
  the queue released them, so taking a share out of every step would cut the peak twice.
* ``cache_hit_rate``: the semantic cache's measured hit rate; hits never reach a GPU:
  ``λ × (1 − hit rate)``. Not applied to traffic already net of the cache (a forecast from
  vLLM's counters, which never see a hit).
* ``mean_output_tokens``: the traffic's mean output tokens per request (the max_tokens policy
  shapes it). A profile's μ holds for its ``output_tokens``; it is scaled by
  ``profile output tokens / traffic mean output tokens``. An approximation: it takes a
  request's GPU time as proportional to its output tokens (decode-bound), ignoring prefill.

``measure_levers`` measures the three from the gateway's records (and vLLM's token counter for
the output length when no record says it).

Units: requests per second, seconds, GPU-hours, USD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from slo.cost.pool import gpu_hours_of
from slo.objectives.sli import vllm_matchers
from slo.objectives.spec import effective_slos
from slo.planning.forecast import SECONDS_PER_DAY, TrafficForecast
from slo.sources.protocol import Source
from vigil.capacity import (
    BASES,
    Basis,
    CapacityProfile,
    ProfileIdentity,
    SloTarget,
    replicas_needed,
)
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ERROR_REFUSED_CLASSES,
    LATENCY_INDICATORS,
    VLLM_GENERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
)
from vigil.model import RequestRecord

__all__ = [
    "LEVER_NAMES",
    "CandidatePlan",
    "LeverEffect",
    "Levers",
    "PlanResult",
    "current_identity",
    "measure_levers",
    "plan",
    "required_slos",
    "same_model",
    "slo_gaps",
    "weakest_basis",
]

_HOURS_PER_DAY = 24.0
#: The levers ``measure_levers`` can measure, by the name a user asks for them.
LEVER_NAMES = ("batch", "cache", "output-tokens")


@dataclass(frozen=True)
class Levers:
    """Measured inputs of the levers a plan may pull (``None``: not pulled).

    ``batch_share``: ratio 0-1 of requests from the batch tier; ``cache_hit_rate``: ratio 0-1
    of requests answered by the semantic cache; ``mean_output_tokens``: the traffic's mean
    output tokens per request. ``sources`` says where each was measured (per field name).
    """

    batch_share: float | None = None
    cache_hit_rate: float | None = None
    mean_output_tokens: float | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("batch_share", "cache_hit_rate"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a ratio 0-1, not {v!r}")
        v = self.mean_output_tokens
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"mean_output_tokens must be more than 0, not {v!r}")


@dataclass(frozen=True)
class LeverEffect:
    """One lever as applied: its name, measured input, where it was measured, and effect."""

    name: str
    value: float
    source: str
    effect: str
    applied: bool = True


@dataclass(frozen=True)
class CandidatePlan:
    """One profile sized for the day. ``replicas_curve``: ``(seconds of the day, replicas)``
    per plan step; costs USD; ``headroom``: the least spare share 0-1 of the capacity over the
    day (negative when the traffic exceeds it); ``rps_per_replica``: μ as used (after the
    output-tokens lever); ``requests_per_day``: the traffic's."""

    profile: CapacityProfile
    replicas_curve: list[tuple[float, int]]
    gpu_hours_per_day: float
    cost_per_day_usd: float
    cost_per_month_usd: float
    cost_per_1000_requests: float | None
    headroom: float
    meets_slo: bool
    basis: Basis
    notes: tuple[str, ...] = ()
    rps_per_replica: float = 0.0
    peak_replicas: int = 0
    requests_per_day: float = 0.0
    usd_per_gpu_hour: float = 0.0


@dataclass(frozen=True)
class PlanResult:
    """Every candidate, those meeting the SLOs cheapest first, then the others (cheapest
    first); ``today``: the pool's current configuration sized the same way (``None`` without
    a profile of it); ``levers``: what each lever did; ``notes``: candidates left out."""

    candidates: list[CandidatePlan]
    today: CandidatePlan | None
    levers: tuple[LeverEffect, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> CandidatePlan | None:
        """The cheapest candidate meeting the SLOs, ``None`` when none does."""
        return self.candidates[0] if self.candidates and self.candidates[0].meets_slo else None


def weakest_basis(*bases: Basis) -> Basis:
    """The least trustworthy of ``bases`` (measured > observed > estimated)."""
    return max(bases, key=BASES.index)


def current_identity(pool: PoolConfig) -> ProfileIdentity:
    """The pool's configuration now, from the config (model, GPU, quantization, speculative
    decoding); the request shape is left 0 (any)."""
    spec = pool.vllm.speculative_method
    return ProfileIdentity(
        model=pool.model, gpu=pool.gpu, gpus_per_replica=pool.gpus_per_replica,
        quantization=pool.vllm.quantization, speculative=spec,
        num_speculative_tokens=pool.vllm.num_speculative_tokens if spec else 0,
    )


def _same_configuration(a: ProfileIdentity, b: ProfileIdentity) -> bool:
    return (a.model, a.gpu, a.gpus_per_replica, a.quantization, a.speculative) == \
        (b.model, b.gpu, b.gpus_per_replica, b.quantization, b.speculative)


def required_slos(config: Config, pool: PoolConfig) -> list[SloTarget]:
    """The pool's latency SLOs now (``ttft``/``e2e``, defaults filled in) as targets."""
    # ignore: the filter below keeps only ttft and e2e indicators, which SloTarget's Literal
    # type cannot learn from a comprehension's condition.
    return [SloTarget(name=s.name, indicator=s.indicator,  # type: ignore[arg-type]
                      threshold_seconds=float(s.threshold_seconds), objective=s.objective)
            for s in effective_slos(config)
            if s.pool == pool.name and s.indicator in LATENCY_INDICATORS
            and s.threshold_seconds is not None]


def same_model(a: str, b: str) -> bool:
    """Whether two model names are one model, case aside (a calibration may name it without
    its organisation: ``Llama-3.1-8B-Instruct``)."""
    a, b = a.lower(), b.lower()
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def slo_gaps(profile: CapacityProfile, required: Sequence[SloTarget]) -> list[str]:
    """Why the profile's targets do not cover ``required`` (empty when they do)."""
    gaps = []
    for need in required:
        covering = [t for t in profile.slos if t.indicator == need.indicator
                    and t.threshold_seconds <= need.threshold_seconds
                    and t.objective >= need.objective]
        if covering:
            continue
        same = [t for t in profile.slos if t.indicator == need.indicator]
        had = ", ".join(f"{t.threshold_seconds:g}s for {t.objective:.4g}" for t in same) \
            or "none"
        gaps.append(f"SLO {need.name!r} asks {need.indicator} <= {need.threshold_seconds:g}s "
                    f"for {need.objective:.4g} of requests; the profile was judged against "
                    f"{had}: a looser target does not count")
    return gaps


def _water_fill(rates: list[float], moved: float, step_s: float) -> list[float]:
    """``rates`` (requests/s per step) with ``moved`` requests poured into the lowest steps,
    all raised to one level."""
    if moved <= 0:
        return list(rates)
    order = sorted(rates)
    # The k lowest steps raised to one level place every moved request; the first k whose
    # level stays below the next step's rate is the one (k = all steps always fits).
    level = 0.0
    below = 0.0
    for k, r in enumerate(order, start=1):
        below += r
        level = (moved / step_s + below) / k
        if k == len(order) or level <= order[k]:
            break
    return [max(r, level) for r in rates]


def _apply_traffic_levers(traffic: TrafficForecast, curve: list[tuple[float, float]],
                          step_s: float, levers: Levers | None
                          ) -> tuple[list[tuple[float, float]], list[LeverEffect]]:
    if levers is None:
        return curve, []
    effects = []
    rates = [r for _, r in curve]
    if levers.batch_share is not None and traffic.days > 0:
        effects.append(LeverEffect(
            "batch_share", levers.batch_share, levers.sources.get("batch_share", ""),
            "not applied: the traffic comes from the store's history, where batch requests "
            "already sit where the batch queue released them (the troughs)", applied=False))
    elif levers.batch_share is not None:
        share = levers.batch_share
        before = max(rates)
        kept = [r * (1.0 - share) for r in rates]
        moved = math.fsum(r * share for r in rates) * step_s
        rates = _water_fill(kept, moved, step_s)
        effects.append(LeverEffect(
            "batch_share", share, levers.sources.get("batch_share", ""),
            f"{share:.1%} of requests moved into the troughs: peak {before:.3g} -> "
            f"{max(rates):.3g} requests/s"))
    if levers.cache_hit_rate is not None:
        hit = levers.cache_hit_rate
        source = levers.sources.get("cache_hit_rate", "")
        if traffic.net_of_cache:
            effects.append(LeverEffect(
                "cache_hit_rate", hit, source,
                "not applied: the traffic counts what reached vLLM, already net of the "
                "cache's hits", applied=False))
        else:
            before = max(rates)
            rates = [r * (1.0 - hit) for r in rates]
            effects.append(LeverEffect(
                "cache_hit_rate", hit, source,
                f"{hit:.1%} of requests answered by the cache, never a GPU: peak "
                f"{before:.3g} -> {max(rates):.3g} requests/s"))
    return [(t, r) for (t, _), r in zip(curve, rates, strict=True)], effects


def _size(config: Config, pool: PoolConfig, profile: CapacityProfile, traffic: TrafficForecast,
          curve: list[tuple[float, float]], step_s: float, requests_per_day: float,
          required: Sequence[SloTarget], levers: Levers | None, respect_max_replicas: bool,
          ) -> CandidatePlan:
    notes: list[str] = []
    mu = profile.max_goodput_rps
    out_tokens = profile.identity.output_tokens
    if levers is not None and levers.mean_output_tokens is not None:
        if out_tokens > 0:
            mu = mu * out_tokens / levers.mean_output_tokens
            notes.append(f"μ scaled by output tokens {out_tokens} / {levers.mean_output_tokens:.4g}"
                         f": {profile.max_goodput_rps:.3g} -> {mu:.3g} requests/s per replica")
        else:
            notes.append("μ not scaled for output length: the profile does not say its "
                         "output tokens")
    cap = pool.max_replicas if respect_max_replicas else None
    replicas: list[tuple[float, int]] = []
    served = True
    headroom = 1.0
    for t, lam in curve:
        need = replicas_needed(max(0.0, lam), mu) if mu > 0 else (0 if lam <= 0 else math.inf)
        n_f = max(float(need), float(pool.min_replicas))
        if cap is not None:
            n_f = min(n_f, float(cap))
        if math.isinf(n_f):
            served = False
            headroom = -math.inf
            replicas.append((t, 0))
            continue
        n = int(n_f)
        replicas.append((t, n))
        if lam > n * mu + 1e-9:
            served = False
        if n > 0 and mu > 0:
            headroom = min(headroom, 1.0 - lam / (n * mu))
    if mu <= 0:
        notes.append("the profile serves no request within its SLOs (μ = 0)")
    elif not served:
        notes.append(f"the pool's max_replicas {pool.max_replicas} cannot serve the peak")
    peak = max((n for _, n in replicas), default=0)
    if cap is None and peak > pool.max_replicas:
        notes.append(f"needs {peak} replicas at the peak, more than the pool's max_replicas "
                     f"{pool.max_replicas}: raise it to follow this plan")
    gaps = slo_gaps(profile, required)
    notes.extend(gaps)
    if not required:
        notes.append(f"pool {pool.name!r} has no latency SLO: any profile counts")
    gpu_hours = gpu_hours_of(math.fsum(n for _, n in replicas) * step_s,
                             profile.identity.gpus_per_replica)
    price = config.prices[profile.identity.gpu]
    per_day = gpu_hours * price
    per_month = per_day * config.capacity.hours_per_month / _HOURS_PER_DAY
    per_1000 = per_day / requests_per_day * 1000.0 if requests_per_day > 0 else None
    return CandidatePlan(
        profile=profile, replicas_curve=replicas, gpu_hours_per_day=gpu_hours,
        cost_per_day_usd=per_day, cost_per_month_usd=per_month,
        cost_per_1000_requests=per_1000,
        headroom=headroom if math.isfinite(headroom) else -1.0,
        meets_slo=served and mu > 0 and not gaps,
        basis=weakest_basis(profile.basis, traffic.basis), notes=tuple(notes),
        rps_per_replica=mu, peak_replicas=peak, requests_per_day=requests_per_day,
        usd_per_gpu_hour=price,
    )


def _today_profile(pool: PoolConfig, candidates: Sequence[CapacityProfile]
                   ) -> CapacityProfile | None:
    """The best profile of the pool's configuration now: one saved for the pool first, then
    any of the same configuration; best basis, then newest."""
    ident = current_identity(pool)
    same = [p for p in candidates if _same_configuration(p.identity, ident)]
    if not same:
        return None
    return min(same, key=lambda p: (p.pool != pool.name, BASES.index(p.basis), -p.created_at))


def plan(config: Config, pool: PoolConfig, traffic: TrafficForecast,
         candidates: Sequence[CapacityProfile], *, levers: Levers | None = None,
         respect_max_replicas: bool = False,
         required: Sequence[SloTarget] | None = None) -> PlanResult:
    """Size every candidate profile for ``traffic`` and rank them (see the module docstring).

    Candidates of another model than the pool's, or of a GPU without a price in ``[prices]``,
    are left out (named in ``notes``). ``required``: the latency SLOs a plan must meet
    (default: the pool's now, ``required_slos``), for asking what another SLO would cost."""
    step = config.capacity.plan_step
    curve = traffic.day_curve(step)
    requests_per_day = traffic.requests_per_day()
    # The last step may be shorter when plan_step does not divide a day.
    step_s = SECONDS_PER_DAY / len(curve)
    curve, effects = _apply_traffic_levers(traffic, curve, step_s, levers)
    if levers is not None and levers.mean_output_tokens is not None:
        effects.append(LeverEffect(
            "mean_output_tokens", levers.mean_output_tokens,
            levers.sources.get("mean_output_tokens", ""),
            "each profile's μ scaled by its output tokens / this mean (GPU time taken as "
            "proportional to output tokens)"))
    if required is None:
        required = required_slos(config, pool)
    notes: list[str] = []
    plans = []
    for profile in candidates:
        ident = profile.identity
        if not same_model(ident.model, pool.model):
            notes.append(f"{ident.label()}: another model than the pool's ({pool.model})")
            continue
        if ident.gpu not in config.prices:
            notes.append(f"{ident.label()}: no price for GPU {ident.gpu!r} in [prices]")
            continue
        plans.append(_size(config, pool, profile, traffic, curve, step_s, requests_per_day,
                           required, levers, respect_max_replicas))
    plans.sort(key=lambda c: (not c.meets_slo, c.cost_per_day_usd, BASES.index(c.basis)))
    kept = [c.profile for c in plans]
    today_profile = _today_profile(pool, kept)
    today = next((c for c in plans if c.profile is today_profile), None)
    return PlanResult(candidates=plans, today=today, levers=tuple(effects), notes=tuple(notes))


def measure_levers(names: Sequence[str], *, pool: PoolConfig,
                   records: Sequence[RequestRecord] = (), source: Source | None = None,
                   at_s: float = 0.0, span_s: float = 0.0) -> tuple[Levers, list[str]]:
    """The levers ``names`` (of ``LEVER_NAMES``) measured for ``pool``: from the gateway's
    ``records`` over the span (requests refused before a replica or the cache left out), the
    mean output tokens from vLLM's counters over ``(at_s - span_s, at_s]`` when no record says
    it. Returns the levers and a note per lever that could not be measured."""
    unknown = sorted(set(names) - set(LEVER_NAMES))
    if unknown:
        raise ValueError(f"unknown lever(s) {', '.join(unknown)} (known: "
                         f"{', '.join(LEVER_NAMES)})")
    served = [r for r in records if r.pool == pool.name
              and r.error_class not in ERROR_REFUSED_CLASSES]
    values: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    where = f"{len(served)} gateway records of pool {pool.name!r}"
    if "batch" in names:
        if served:
            values["batch_share"] = sum(1 for r in served if r.tier == "batch") / len(served)
            sources["batch_share"] = where
        else:
            notes.append("batch: no gateway records to measure the batch tier's share")
    if "cache" in names:
        if served:
            values["cache_hit_rate"] = sum(1 for r in served if r.cache_hit) / len(served)
            sources["cache_hit_rate"] = where
        else:
            notes.append("cache: no gateway records to measure the cache's hit rate")
    if "output-tokens" in names:
        generated = [r.generated_tokens for r in served if not r.cache_hit]
        if generated and sum(generated) > 0:
            values["mean_output_tokens"] = math.fsum(generated) / len(generated)
            sources["mean_output_tokens"] = where.replace("records", "records (cache misses)")
        elif source is not None and span_s > 0:
            m = vllm_matchers(pool, source)
            tokens = source.increase(VLLM_GENERATION_TOKENS, m, at_s, span_s).get(())
            requests = source.increase(VLLM_REQUEST_SUCCESS, m, at_s, span_s).get(())
            if tokens and requests:
                values["mean_output_tokens"] = tokens / requests
                sources["mean_output_tokens"] = (f"{VLLM_GENERATION_TOKENS} / "
                                                 f"{VLLM_REQUEST_SUCCESS}")
            else:
                notes.append("output-tokens: no requests in the store's history")
        else:
            notes.append("output-tokens: no gateway records and no store history")
    return Levers(**values, sources=sources), notes
