"""Capacity at the SLO: judging a load level and searching for the highest one that passes.

A *probe* keeps ``concurrency`` requests in flight and looks at each request's outcome. A
request is *good* for one SLO when it succeeded and its indicator (TTFT or e2e) is within that
SLO's threshold; the level *passes* when, for every SLO, the share of good requests meets the
objective. Shares are estimated from a finite sample, so each is an interval (Wilson score, at
the search's confidence level): a level passes when every SLO's interval lies at or above its
objective, fails when one SLO's interval lies wholly below, and is *unresolved* otherwise (the
probe runner then sends more requests; see ``serving.loadgen.probe``).

The search doubles the concurrency from 1 until a probe fails, then bisects between the last
pass and the first failure until they are within ``precision`` of each other (relative), the
way GuideLLM's sweep and ``vllm bench serve --goodput`` runs are used by hand. Everything here
is pure: the probe is a function given to the search, so the search runs on a live replica,
on virtual-time simulator runs, or on a synthetic function in a test alike.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, NamedTuple

import numpy as np

from vigil.capacity import Basis, CapacityProfile, Probe, ProfileIdentity, SloTarget

__all__ = [
    "Judgement",
    "RequestOutcome",
    "SearchResult",
    "Verdict",
    "judge",
    "probe_from_outcomes",
    "profile_from_search",
    "search",
    "search_sync",
    "unresolved",
    "wilson_interval",
]

Verdict = Literal["pass", "fail", "unresolved"]

_PCTS = (50.0, 95.0, 99.0)


def wilson_interval(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` (ratios 0-1) of a binomial proportion
    ``successes / n`` at ``confidence`` (0-1, two-sided); ``(0.0, 1.0)`` for ``n == 0``.

    Wilson rather than the normal approximation: it stays inside 0-1 and keeps its coverage
    at 0 or ``n`` successes, which is exactly where a capacity probe lives (almost every
    request good, or almost none)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), not {confidence!r}")
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n)) / (1.0 + z2n)
    # At 0 or n successes the formula touches 0 or 1 exactly; rounding must not hide that.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


class RequestOutcome(NamedTuple):
    """One request of a probe as the client saw it: ``ok`` (answered in full), its TTFT, e2e
    latency and mean inter-token gap (seconds; None when not measured) and output tokens."""

    ok: bool
    ttft_s: float | None
    e2e_s: float | None
    itl_s: float | None
    output_tokens: int


@dataclass(frozen=True)
class Judgement:
    """How a sample of requests meets the SLOs.

    ``attainment``: ratio 0-1 of requests within every SLO's threshold, ``[low, high]`` its
    Wilson interval; ``by_slo``: per SLO name, the ratio 0-1 within that SLO's threshold;
    ``verdict``: pass, fail or unresolved (see the module's docstring).
    """

    attainment: float
    low: float
    high: float
    by_slo: dict[str, float]
    verdict: Verdict


def _within(o: RequestOutcome, slo: SloTarget) -> bool:
    """Whether one request is good for one SLO. A request without the indicator measured
    (TTFT of an answer that was not streamed) is judged on its success alone, as
    ``serving.loadgen.report`` judges goodput."""
    if not o.ok:
        return False
    value = o.ttft_s if slo.indicator == "ttft" else o.e2e_s
    return value is None or value <= slo.threshold_seconds


def _verdict(counts: Sequence[int], n: int, slos: Sequence[SloTarget],
             confidence: float) -> Verdict:
    verdict: Verdict = "pass"
    for good, slo in zip(counts, slos, strict=True):
        low, high = wilson_interval(good, n, confidence)
        if high < slo.objective:
            return "fail"
        if low < slo.objective:
            verdict = "unresolved"
    return verdict


def judge(outcomes: Iterable[RequestOutcome], slos: Sequence[SloTarget],
          confidence: float) -> Judgement:
    """Judge ``outcomes`` against ``slos`` at ``confidence`` (0-1).

    Pass when every SLO's interval low is at or above its objective, fail when any SLO's
    interval high is below its objective, unresolved otherwise (and always with no requests).
    Without SLOs every successful request is good and the verdict is pass."""
    outcomes = list(outcomes)
    n = len(outcomes)
    counts = [sum(1 for o in outcomes if _within(o, s)) for s in slos]
    good = sum(1 for o in outcomes if o.ok and all(_within(o, s) for s in slos))
    low, high = wilson_interval(good, n, confidence)
    verdict: Verdict = "unresolved" if n == 0 else _verdict(counts, n, slos, confidence)
    return Judgement(
        attainment=good / n if n else 0.0,
        low=low,
        high=high,
        by_slo={s.name: (c / n if n else 0.0) for s, c in zip(slos, counts, strict=True)},
        verdict=verdict,
    )


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (seconds) with linear interpolation, as ``vllm bench serve``."""
    if not values:
        return {f"p{p:g}": None for p in _PCTS}
    got = np.percentile(np.asarray(values, dtype=float), _PCTS)
    return {f"p{p:g}": float(v) for p, v in zip(_PCTS, got, strict=True)}


def probe_from_outcomes(concurrency: int, outcomes: Sequence[RequestOutcome],
                        duration_s: float, slos: Sequence[SloTarget],
                        confidence: float) -> Probe:
    """The ``Probe`` of one load level: ``outcomes`` measured over ``duration_s`` seconds.

    ``passed`` follows the judgement; an unresolved one (the runner ran out of requests) is
    decided on the point estimates: every SLO's share at or above its objective. The interval
    recorded in the probe then straddles the objective, which ``unresolved`` reads back."""
    j = judge(outcomes, slos, confidence)
    if j.verdict == "unresolved":
        passed = bool(outcomes) and all(j.by_slo[s.name] >= s.objective for s in slos)
    else:
        passed = j.verdict == "pass"
    ok = [o for o in outcomes if o.ok]
    good = round(j.attainment * len(outcomes))
    seconds = duration_s if duration_s > 0 else math.inf
    return Probe(
        concurrency=concurrency,
        requests=len(outcomes),
        errors=len(outcomes) - len(ok),
        duration_s=duration_s,
        attainment=j.attainment,
        attainment_low=j.low,
        attainment_high=j.high,
        passed=passed,
        goodput_rps=good / seconds,
        throughput_rps=len(ok) / seconds,
        output_tokens_per_s=sum(o.output_tokens for o in ok) / seconds,
        ttft_s=_percentiles([o.ttft_s for o in ok if o.ttft_s is not None]),
        itl_s=_percentiles([o.itl_s for o in ok if o.itl_s is not None]),
        e2e_s=_percentiles([o.e2e_s for o in ok if o.e2e_s is not None]),
        attainment_by_slo=j.by_slo,
    )


def unresolved(probe: Probe, slos: Sequence[SloTarget], confidence: float) -> bool:
    """Whether ``probe``'s verdict was decided on the point estimate: some SLO's interval,
    recomputed from the probe's per-SLO shares and request count, straddles its objective
    while none lies wholly below."""
    counts = [round(probe.attainment_by_slo.get(s.name, 0.0) * probe.requests) for s in slos]
    return probe.requests == 0 or _verdict(counts, probe.requests, slos,
                                           confidence) == "unresolved"


@dataclass(frozen=True)
class SearchResult:
    """The outcome of a search: ``best`` the highest passing probe (None: even concurrency 1
    failed), ``failed`` the lowest failing one above it (None: ``max_concurrency`` passed),
    ``probes`` every probe in the order run."""

    best: Probe | None
    failed: Probe | None
    probes: tuple[Probe, ...]


def _steps(max_concurrency: int,
           precision: float) -> Generator[int, Probe, SearchResult]:
    """The search as a generator: it yields the next concurrency to probe and is sent that
    probe, so the async and the sync drivers share one algorithm."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency!r}")
    if not precision > 0:
        raise ValueError(f"precision must be more than 0, not {precision!r}")
    probes: list[Probe] = []
    best: Probe | None = None
    failed: Probe | None = None
    c = 1
    while True:
        p = yield c
        probes.append(p)
        if not p.passed:
            failed = p
            break
        best = p
        if c >= max_concurrency:
            break
        c = min(2 * c, max_concurrency)
    # Bisect between the highest pass and the lowest fail; concurrencies are integers, so
    # adjacent ones end it whatever the precision.
    while (best is not None and failed is not None
           and failed.concurrency - best.concurrency > 1
           and (failed.concurrency - best.concurrency) / best.concurrency > precision):
        p = yield (best.concurrency + failed.concurrency) // 2
        probes.append(p)
        if p.passed:
            best = p
        else:
            failed = p
    return SearchResult(best=best, failed=failed, probes=tuple(probes))


async def search(probe: Callable[[int], Awaitable[Probe]], *, max_concurrency: int,
                 precision: float) -> SearchResult:
    """The highest concurrency (requests in flight) whose probe passes: 1, 2, 4, ... up to
    ``max_concurrency`` until one fails, then bisection until ``(fail - pass) / pass <=
    precision`` (ratio, e.g. 0.10) or the two are adjacent."""
    steps = _steps(max_concurrency, precision)
    try:
        c = next(steps)
        while True:
            c = steps.send(await probe(c))
    except StopIteration as done:
        result: SearchResult = done.value
        return result


def search_sync(probe: Callable[[int], Probe], *, max_concurrency: int,
                precision: float) -> SearchResult:
    """``search`` with a synchronous probe function (virtual-time simulator runs, tests)."""
    steps = _steps(max_concurrency, precision)
    try:
        c = next(steps)
        while True:
            c = steps.send(probe(c))
    except StopIteration as done:
        result: SearchResult = done.value
        return result


def profile_from_search(identity: ProfileIdentity, basis: Basis, result: SearchResult,
                        slos: Sequence[SloTarget], *, source: str, pool: str,
                        created_at: float, confidence: float,
                        precision: float) -> CapacityProfile:
    """The ``CapacityProfile`` a search found: the best probe's concurrency, goodput (req/s)
    and output tokens/s (all 0 when even concurrency 1 failed), every probe, and notes on
    what limits the figures."""
    notes: list[str] = []
    best = result.best
    if best is None:
        notes.append("even concurrency 1 does not meet the SLOs: no load level passes")
    elif result.failed is None:
        notes.append(f"concurrency {best.concurrency} (the search's maximum) still passes: "
                     "the capacity may be higher")
    decided = [p.concurrency for p in result.probes if unresolved(p, slos, confidence)]
    if decided:
        notes.append("decided on the point estimate (interval still straddled the objective "
                     "at the request limit): concurrency " + ", ".join(map(str, decided)))
    errors = sum(p.errors for p in result.probes)
    if errors:
        notes.append(f"{errors} request(s) failed during the search")
    return CapacityProfile(
        identity=identity,
        basis=basis,
        max_concurrency=best.concurrency if best else 0,
        max_goodput_rps=best.goodput_rps if best else 0.0,
        max_output_tokens_per_s=best.output_tokens_per_s if best else 0.0,
        slos=tuple(slos),
        source=source,
        pool=pool,
        created_at=created_at,
        confidence=confidence,
        precision=precision,
        probes=tuple(result.probes),
        notes=tuple(notes),
    )

