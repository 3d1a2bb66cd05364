"""Capacity observed in production: the per-replica load a pool carried while meeting its SLOs.

No benchmark is run. The history a ``Source`` holds (Vigil's store or a Prometheus; a pool's
series chosen by ``slo.objectives.sli.pool_series``, as the SLIs are) is cut into steps of
``[capacity] plan_step`` (15 min). Per step ``(t - step, t]``, in PromQL terms over the pool's vLLM
series:

* ``replicas``: the mean number of replicas up over the step, ``sum(up_seconds) / step``
  (``slo.cost.pool.up_seconds``: each ``up == 1`` sample stands for one scrape interval), so a
  replica that joined half way counts one half;
* ``rps_per_replica``: ``sum(increase(vllm:request_success_total[step])) / step / replicas``
  (every finished reason: the load the replicas carried);
* ``ttft_p95_s`` / ``e2e_p95_s``: ``histogram_quantile(0.95, sum by (le) (increase(
  <x>_bucket[step])))``;
* per latency SLO of the pool (``slo.objectives.spec.effective_slos``, endpoint ``all``: vLLM's
  histograms have no endpoint), its attainment: ``histogram_fraction(-Inf, threshold, ...)`` of its
  model's buckets (``slo.promql.quantile.bucket_fraction_below``; interpolated when the threshold is
  not a bucket bound);
* ``running_per_replica``: ``sum(avg_over_time(vllm:num_requests_running[step])) / replicas``;
  ``output_tokens_per_s_per_replica``: ``increase(vllm:generation_tokens_total[step]) / step /
  replicas``.

**Which steps tell.** A step is judged only with at least ``[capacity] min_probe_requests``
finished requests (the same floor as one benchmark probe); a lighter one is ``"light"``: at
night a replica serves a handful of requests and their latency says nothing about its limit.
A judged step is then decided as a probe is (``slo.planning.capacity_search.judge``): per SLO, the
Wilson interval (``[capacity] confidence``) of the share within its threshold, over the
histogram's count of requests; ``"pass"`` when every SLO's lower bound reaches its objective,
``"fail"`` when one SLO's upper bound is below it, else ``"unresolved"`` (not counted either
way).

**The capacity** is the highest passing per-replica rate *below the lowest failing one*. A step
that passed at a higher rate than some failing step (cheap requests, a lucky quarter hour) does
not raise it; a step that failed at a low rate lowers it. Both err on the side of more replicas.

It is ``None`` with a reason (``assess_observed`` gives it) when no step failed — the history
never reached the limit, so the highest passing rate is only a lower bound (given as
``lower_bound_rps``, and not returned as a capacity, since it would pretend to be the limit) —
when no step passed, or when every passing step is above the lowest failing one (latency is then
not limited by load). Histograms do not say which requests missed which threshold, so with two
latency SLOs a step's joint attainment is the lower bound ``1 - sum(1 - attainment_i)``.

Units: seconds, requests per second per replica, output tokens per second per replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, NamedTuple

from slo.cost.pool import up_seconds
from slo.objectives.quantiles import finite_or_none
from slo.objectives.sli import inf_bucket_count, vllm_matchers
from slo.objectives.spec import SloSpec, effective_slos
from slo.planning.capacity_search import wilson_interval
from slo.promql.quantile import Bucket, bucket_fraction_below, histogram_quantile
from slo.scaling.signals import sample_times
from slo.sources.on_grid import on_grid
from slo.sources.protocol import Source, is_external
from vigil.capacity import CapacityProfile, Probe, ProfileIdentity, SloTarget
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ENDPOINT_ALL,
    FINISHED_REASON_ERROR,
    LABEL_FINISHED_REASON,
    LABEL_MODEL_NAME,
    SUFFIX_COUNT,
    SUFFIX_SUM,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_GENERATION_TOKENS_HIST,
    VLLM_PROMPT_TOKENS_HIST,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_TTFT,
)
from vigil.durations import format_duration
from vigil.model import Labels

__all__ = [
    "P95",
    "REASON_NEVER_FAILED",
    "REASON_NEVER_PASSED",
    "REASON_NOT_LOAD_BOUND",
    "REASON_NO_HISTORY",
    "REASON_NO_LATENCY_SLO",
    "CurvePoint",
    "ObservedCapacity",
    "Verdict",
    "assess_observed",
    "latency_targets",
    "observed_capacity",
    "rate_latency_curve",
]

#: The quantile of the curve's latency figures.
P95 = 0.95
REASON_NO_LATENCY_SLO = ("the pool has no ttft or e2e SLO over every endpoint: there is "
                         "nothing to judge a step against")
REASON_NO_HISTORY = "no step of the history has requests on up replicas"
REASON_NEVER_FAILED = ("no step missed an SLO: the history never reached the limit, so its "
                       "highest passing rate is a lower bound, not the capacity")
REASON_NEVER_PASSED = "no step with enough load met every latency SLO"
REASON_NOT_LOAD_BOUND = ("every passing step carried more load than the lightest failing one: "
                         "latency does not follow load in this history")

#: ``"light"``: too few requests to tell; the others as ``slo.planning.capacity_search.judge``.
Verdict = Literal["pass", "fail", "unresolved", "light"]

_METRICS = {"ttft": VLLM_TTFT, "e2e": VLLM_E2E}


class CurvePoint(NamedTuple):
    """One step of the observed rate-latency curve, ending at ``t_s`` (Unix seconds).

    ``replicas``: mean replicas up over the step; ``rps_per_replica``: finished requests per
    second per replica; ``ttft_p95_s`` / ``e2e_p95_s``: the pool's p95 (seconds, ``None``
    without observations); ``attainment_by_slo``: per latency SLO name, the ratio 0-1 of the
    step's requests within its threshold (absent without observations); ``met``: the step was
    judged and passed (``verdict == "pass"``); ``requests`` / ``errors``: finished requests of
    the pool in the step (all reasons / ``error``); ``running_per_replica``: mean requests in
    flight per replica; ``output_tokens_per_s_per_replica``: tokens per second per replica;
    ``verdict``: see the module docs.
    """

    t_s: float
    replicas: float
    rps_per_replica: float
    ttft_p95_s: float | None
    e2e_p95_s: float | None
    attainment_by_slo: dict[str, float]
    met: bool
    requests: float = 0.0
    errors: float = 0.0
    running_per_replica: float | None = None
    output_tokens_per_s_per_replica: float | None = None
    verdict: Verdict = "light"
    #: Per SLO name, the Wilson interval ``(low, high)`` of ``attainment_by_slo``.
    interval_by_slo: Mapping[str, tuple[float, float]] = MappingProxyType({})


@dataclass(frozen=True)
class ObservedCapacity:
    """What the history says about a pool's capacity.

    ``profile``: the observed capacity (``None`` when the history cannot tell, see
    ``reason``); ``lower_bound_rps``: when no step failed, the highest passing per-replica rate
    (the capacity is at least this); ``curve``: every step with requests, oldest first.
    """

    profile: CapacityProfile | None
    reason: str = ""
    lower_bound_rps: float | None = None
    curve: tuple[CurvePoint, ...] = field(default=())


def latency_targets(config: Config, pool: PoolConfig) -> list[tuple[SloSpec, SloTarget]]:
    """The pool's latency SLOs (``ttft``/``e2e`` over every endpoint, defaults filled in) and
    each one as the ``SloTarget`` a capacity is judged against."""
    out: list[tuple[SloSpec, SloTarget]] = []
    for spec in effective_slos(config):
        if (spec.pool != pool.name or not spec.is_latency or spec.endpoint != ENDPOINT_ALL
                or spec.threshold_seconds is None):
            continue
        indicator: Literal["ttft", "e2e"] = "ttft" if spec.indicator == "ttft" else "e2e"
        out.append((spec, SloTarget(spec.name, indicator, float(spec.threshold_seconds),
                                    spec.objective)))
    return out


def _merged(groups: Mapping[Labels, list[Bucket]]) -> list[Bucket] | None:
    """The buckets of every group summed by bound: ``sum by (le)`` over the groups."""
    if not groups:
        return None
    total: dict[float, float] = {}
    for buckets in groups.values():
        for le, count in buckets:
            total[le] = total.get(le, 0.0) + count
    return sorted(total.items())


def _p95(groups: Mapping[Labels, list[Bucket]], source: Source) -> float | None:
    merged = _merged(groups)
    return None if merged is None else finite_or_none(
        histogram_quantile(P95, merged, source.semantics))


def _attainment(spec: SloSpec, groups: Mapping[Labels, list[Bucket]]
                ) -> tuple[float, float] | None:
    """``(share within the threshold, observations)`` of the SLO's model; None without any."""
    buckets = groups.get(((LABEL_MODEL_NAME, spec.model),))
    if not buckets:
        return None
    total = inf_bucket_count(buckets)
    good, _ = bucket_fraction_below(float(spec.threshold_seconds or 0.0), buckets)
    if total is None or total <= 0 or math.isnan(good):
        return None
    return good, total


def _verdict(requests: float, shares: Mapping[str, tuple[float, float]],
             targets: Sequence[tuple[SloSpec, SloTarget]], min_requests: int,
             confidence: float) -> tuple[Verdict, dict[str, tuple[float, float]]]:
    intervals: dict[str, tuple[float, float]] = {}
    for _, target in targets:
        if target.name in shares:
            good, n = shares[target.name]
            total = round(n)
            # Non-monotonic buckets (a reset mid-window) can put more below the threshold
            # than the +Inf bucket holds.
            k = min(total, max(0, round(good * total)))
            intervals[target.name] = wilson_interval(k, total, confidence)
    if requests < min_requests:
        return "light", intervals
    if any(iv[1] < t.objective for _, t in targets if (iv := intervals.get(t.name))):
        return "fail", intervals
    if len(intervals) == len(targets) and all(intervals[t.name][0] >= t.objective
                                              for _, t in targets):
        return "pass", intervals
    return "unresolved", intervals


def rate_latency_curve(source: Source, config: Config, pool: PoolConfig, at_s: float,
                       span_s: float, step_s: float) -> list[CurvePoint]:
    """The pool's per-step load and latency over ``(at_s - span_s, at_s]`` (Unix seconds),
    steps of ``step_s`` seconds ending at ``at_s``, oldest first (module docs). Steps without
    an up replica or without a finished request are left out: they say nothing about load."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be > 0 seconds, not {step_s!r}")
    if not (math.isfinite(span_s) and span_s >= step_s):
        raise ValueError(f"span_s must be at least one step ({step_s:g} s), not {span_s!r}")
    targets = latency_targets(config, pool)
    cap = config.capacity
    points: list[CurvePoint] = []
    # sample_times includes at_s - span_s, whose window lies before the span: skip it.
    steps = sample_times(at_s, span_s, step_s)[1:]
    # A week is ~700 steps of six queries each: asked step by step, every window is its own
    # read (15 minutes hold no whole hour of the store's rollup). On a grid each increase,
    # bucket increase and average is one range read for every step, each step's answer the
    # instant query's, bit for bit.
    source = on_grid(source, steps)
    m = vllm_matchers(pool, source)
    for t in steps:
        replicas = math.fsum(up_seconds(source, config, pool, t, step_s).values()) / step_s
        if replicas <= 0:
            continue
        by_reason = source.increase(VLLM_REQUEST_SUCCESS, m, t, step_s,
                                    by=(LABEL_FINISHED_REASON,))
        requests = math.fsum(by_reason.values())
        if requests <= 0:
            continue
        errors = by_reason.get(((LABEL_FINISHED_REASON, FINISHED_REASON_ERROR),), 0.0)
        tokens = source.increase(VLLM_GENERATION_TOKENS, m, t, step_s).get(())
        running = source.avg_over_time(VLLM_REQUESTS_RUNNING, m, t, step_s)
        by_metric = {ind: source.bucket_increase(metric, m, t, step_s, by=(LABEL_MODEL_NAME,))
                     for ind, metric in _METRICS.items()}
        shares: dict[str, tuple[float, float]] = {}
        for spec, target in targets:
            share = _attainment(spec, by_metric[target.indicator])
            if share is not None:
                shares[target.name] = share
        verdict, intervals = _verdict(requests, shares, targets, cap.min_probe_requests,
                                      cap.confidence)
        points.append(CurvePoint(
            t_s=t,
            replicas=replicas,
            rps_per_replica=requests / step_s / replicas,
            ttft_p95_s=_p95(by_metric["ttft"], source),
            e2e_p95_s=_p95(by_metric["e2e"], source),
            attainment_by_slo={name: good for name, (good, _) in shares.items()},
            met=verdict == "pass",
            requests=requests,
            errors=errors,
            running_per_replica=(math.fsum(running.values()) / replicas) if running else None,
            output_tokens_per_s_per_replica=None if tokens is None
            else tokens / step_s / replicas,
            verdict=verdict,
            interval_by_slo=intervals,
        ))
    return points


def _joint(values: Sequence[float]) -> float:
    """A lower bound of the share meeting every SLO from each SLO's share (Bonferroni)."""
    return max(0.0, 1.0 - math.fsum(1.0 - v for v in values))


def _probe(point: CurvePoint, step_s: float) -> Probe:
    """One step as a probe of one replica (counts and rates per replica)."""
    shares = list(point.attainment_by_slo.values())
    lows = [lo for lo, _ in point.interval_by_slo.values()]
    highs = [hi for _, hi in point.interval_by_slo.values()]
    attainment = _joint(shares)
    return Probe(
        concurrency=round(point.running_per_replica or 0.0),
        requests=round(point.requests / point.replicas),
        errors=round(point.errors / point.replicas),
        duration_s=step_s,
        attainment=attainment,
        attainment_low=_joint(lows),
        attainment_high=min(highs) if highs else 1.0,
        passed=point.met,
        goodput_rps=point.rps_per_replica * attainment,
        throughput_rps=point.rps_per_replica,
        output_tokens_per_s=point.output_tokens_per_s_per_replica or 0.0,
        ttft_s={"p95": point.ttft_p95_s},
        e2e_s={"p95": point.e2e_p95_s},
        attainment_by_slo=dict(point.attainment_by_slo),
    )


def _mean_tokens(source: Source, pool: PoolConfig, histogram: str, at_s: float,
                 span_s: float) -> int:
    """Mean tokens per request over the span (``increase(_sum) / increase(_count)``), 0
    without data."""
    m = vllm_matchers(pool, source, model=pool.model)
    total = source.increase(histogram + SUFFIX_SUM, m, at_s, span_s).get(())
    count = source.increase(histogram + SUFFIX_COUNT, m, at_s, span_s).get(())
    if total is None or not count:
        return 0
    return round(total / count)


def _identity(source: Source, pool: PoolConfig, at_s: float, span_s: float) -> ProfileIdentity:
    spec = pool.vllm.speculative_method
    return ProfileIdentity(
        model=pool.model, gpu=pool.gpu, gpus_per_replica=pool.gpus_per_replica,
        quantization=pool.vllm.quantization, speculative=spec,
        num_speculative_tokens=pool.vllm.num_speculative_tokens if spec else 0,
        prompt_tokens=_mean_tokens(source, pool, VLLM_PROMPT_TOKENS_HIST, at_s, span_s),
        output_tokens=_mean_tokens(source, pool, VLLM_GENERATION_TOKENS_HIST, at_s, span_s),
    )


def _source_name(source: Source) -> str:
    if is_external(source):
        return str(getattr(source, "url", "prometheus"))
    return "store"


def assess_observed(source: Source, config: Config, pool: PoolConfig, at_s: float,
                    span_s: float) -> ObservedCapacity:
    """The pool's observed capacity over ``(at_s - span_s, at_s]`` (Unix seconds), with the
    reason when there is none and the curve it was read from (module docs)."""
    step = float(config.capacity.plan_step)
    targets = latency_targets(config, pool)
    if not targets:
        return ObservedCapacity(None, REASON_NO_LATENCY_SLO)
    curve = tuple(rate_latency_curve(source, config, pool, at_s, span_s, step))
    if not curve:
        return ObservedCapacity(None, REASON_NO_HISTORY)
    passing = [p for p in curve if p.verdict == "pass"]
    failing = [p for p in curve if p.verdict == "fail"]
    if not failing:
        lower = max((p.rps_per_replica for p in passing), default=None)
        reason = REASON_NEVER_FAILED if lower is not None else REASON_NEVER_PASSED
        if lower is not None:
            reason += f" (at least {lower:.3g} requests/s per replica)"
        return ObservedCapacity(None, reason, lower, curve)
    if not passing:
        return ObservedCapacity(None, REASON_NEVER_PASSED, None, curve)
    lowest_fail = min(failing, key=lambda p: p.rps_per_replica)
    below = [p for p in passing if p.rps_per_replica < lowest_fail.rps_per_replica]
    if not below:
        return ObservedCapacity(None, REASON_NOT_LOAD_BOUND, None, curve)
    best = max(below, key=lambda p: p.rps_per_replica)
    best_probe = _probe(best, step)
    counts = {v: sum(1 for p in curve if p.verdict == v)
              for v in ("pass", "fail", "unresolved", "light")}
    higher = sum(1 for p in passing if p.rps_per_replica > lowest_fail.rps_per_replica)
    notes = [
        f"observed over {format_duration(span_s)} of history in {len(curve)} steps of "
        f"{format_duration(step)}: {counts['pass']} met every latency SLO, {counts['fail']} "
        f"missed one, {counts['unresolved']} undecided, {counts['light']} under "
        f"{config.capacity.min_probe_requests} requests (not judged)",
        f"capacity: the highest passing rate per replica below the lightest failing step "
        f"({lowest_fail.rps_per_replica:.3g} requests/s per replica)",
    ]
    if higher:
        notes.append(f"{higher} passing step(s) above the lightest failing one left out")
    if len(targets) > 1:
        notes.append("attainment over several SLOs is a lower bound: the histograms do not "
                     "say which requests missed both thresholds")
    profile = CapacityProfile(
        identity=_identity(source, pool, at_s, span_s),
        basis="observed",
        max_concurrency=best_probe.concurrency,
        max_goodput_rps=best_probe.goodput_rps,
        max_output_tokens_per_s=best_probe.output_tokens_per_s,
        slos=tuple(t for _, t in targets),
        source=_source_name(source),
        pool=pool.name,
        created_at=at_s,
        confidence=config.capacity.confidence,
        precision=(lowest_fail.rps_per_replica - best.rps_per_replica) / best.rps_per_replica,
        probes=(best_probe, _probe(lowest_fail, step)),
        notes=tuple(notes),
    )
    return ObservedCapacity(profile, "", None, curve)


def observed_capacity(source: Source, config: Config, pool: PoolConfig, at_s: float,
                      span_s: float) -> CapacityProfile | None:
    """The pool's capacity per replica as its history over ``(at_s - span_s, at_s]`` (Unix
    seconds) shows it, basis ``"observed"``; ``None`` when the history cannot tell
    (``assess_observed`` says why)."""
    return assess_observed(source, config, pool, at_s, span_s).profile
