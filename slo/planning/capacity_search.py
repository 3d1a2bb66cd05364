"""Capacity at the SLO: judging a load level and searching for the highest one that passes.

A *probe* keeps ``concurrency`` requests in flight and looks at each request's outcome. A
request is *good* for one SLO when it succeeded and its indicator (TTFT or e2e) is within that
SLO's threshold; the level *passes* when, for every SLO, the share of good requests meets the
objective. Shares are estimated from a finite sample, so each is an interval (Wilson score, at
the search's confidence level): a level passes when every SLO's interval lies at or above its
objective, fails when one SLO's interval lies wholly below, and is *unresolved* otherwise (the
probe runner then sends more requests; see ``serving.loadgen.probe``).

The interval needs many requests to pass a high objective even when every request is good (73
for 0.95 at 95 % confidence, 381 for 0.99), and no distribution-free rule needs fewer: n
requests all good bound the q-quantile of the indicator only for ``q <= (1 - confidence) **
(1 / n)``, 59 requests for the 0.95-quantile. A level far from the knee does not need that
sample to be decided, so a second rule, the *latency margin* (``Margin``), passes it early:
at least ``Margin.requests`` requests, none failed, and every one's indicator within
``Margin.ratio`` of each SLO's threshold. What that sample shows without assumption is that,
at the search's confidence, the ``(1 - confidence) ** (1 / n)``-quantile of each indicator is
within ``ratio x threshold`` (the 0.86-quantile for 20 requests at 95 %): the objective's
quantile is then within the threshold unless the latency distribution's tail grows by more than
``1 / ratio`` (2x) between those two quantiles. That is the rule's one assumption
(``docs/capacity.md``, "The latency margin"). Once broken the rule stays broken as requests are
added (the worst latency and the failures only grow), so checking it after every request is in
effect one test, not many, and does not inflate its error the way repeated looks at an interval
do; the interval is looked at only at checkpoints (``ProbeWindow``).

The search doubles the concurrency from 1 until a probe fails, then bisects between the last
pass and the first failure until they are within ``precision`` of each other (relative), the
way GuideLLM's sweep and ``vllm bench serve --goodput`` runs are used by hand. Everything here
is pure: the probe is a function given to the search, so the search runs on a live replica,
on virtual-time simulator runs, or on a synthetic function in a test alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, NamedTuple

import numpy as np

from vigil.capacity import Basis, CapacityProfile, Probe, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig

__all__ = [
    "RANGE_RATIO",
    "Judgement",
    "Margin",
    "ProbeWindow",
    "RequestOutcome",
    "SearchResult",
    "Verdict",
    "judge",
    "probe_from_outcomes",
    "probe_length",
    "profile_from_search",
    "search",
    "search_sync",
    "tail_quantile",
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


#: A probe's request lengths (prompt and output tokens) are uniform within this ratio either
#: side of the asked means, as ``vllm bench serve --random-range-ratio 0.5`` draws them: with
#: every request alike, a closed loop stays in lock step (its requests prefill in one step and
#: finish in one step, wave after wave) and measures a synchronised burst, not a steady load.
RANGE_RATIO = 0.5


def probe_length(mean: int, rng: random.Random) -> int:
    """A request length (tokens) for a probe: uniform within ``RANGE_RATIO`` of ``mean``,
    at least 1."""
    return rng.randint(max(1, math.floor(mean * (1 - RANGE_RATIO))),
                       max(1, math.ceil(mean * (1 + RANGE_RATIO))))


class RequestOutcome(NamedTuple):
    """One request of a probe as the client saw it: ``ok`` (answered in full), its TTFT, e2e
    latency and mean inter-token gap (seconds; None when not measured) and output tokens."""

    ok: bool
    ttft_s: float | None
    e2e_s: float | None
    itl_s: float | None
    output_tokens: int


class Margin(NamedTuple):
    """The latency-margin rule (module docs): a sample of at least ``requests`` requests, none
    failed, each one's indicator within ``ratio`` (0-1) of every SLO's threshold, passes."""

    ratio: float
    requests: int

    @classmethod
    def of(cls, capacity: CapacityConfig) -> Margin | None:
        """The rule ``[capacity]`` sets (``clear_margin``, ``clear_probe_requests``); None when
        ``clear_margin`` is 0, which turns it off."""
        if capacity.clear_margin <= 0:
            return None
        return cls(capacity.clear_margin, capacity.clear_probe_requests)


def tail_quantile(n: int, confidence: float) -> float:
    """The highest quantile (0-1) that the largest of ``n`` values bounds from above at
    ``confidence`` (0-1), whatever their distribution: ``(1 - confidence) ** (1 / n)``.

    The largest value lies below the q-quantile only when all ``n`` do, which happens with
    probability ``q ** n``; so it is at or above the q-quantile with probability ``1 - q ** n``,
    at least ``confidence`` for every q up to this one. 0.0 for ``n == 0``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), not {confidence!r}")
    if n < 0:
        raise ValueError(f"n must be at least 0, not {n!r}")
    return (1.0 - confidence) ** (1.0 / n) if n else 0.0


@dataclass(frozen=True)
class Judgement:
    """How a sample of requests meets the SLOs.

    ``attainment``: ratio 0-1 of requests within every SLO's threshold, ``[low, high]`` its
    Wilson interval; ``by_slo``: per SLO name, the ratio 0-1 within that SLO's threshold;
    ``verdict``: pass, fail or unresolved (see the module's docstring); ``on_margin``: the
    latency-margin rule holds (the verdict is then pass, whatever the interval says).
    """

    attainment: float
    low: float
    high: float
    by_slo: dict[str, float]
    verdict: Verdict
    on_margin: bool = False


def _indicator(o: RequestOutcome, slo: SloTarget) -> float | None:
    """The request's value (seconds) of the SLO's indicator, None when not measured."""
    return o.ttft_s if slo.indicator == "ttft" else o.e2e_s


def _within(o: RequestOutcome, slo: SloTarget) -> bool:
    """Whether one request is good for one SLO. A request without the indicator measured
    (TTFT of an answer that was not streamed) is judged on its success alone, as
    ``serving.loadgen.report`` judges goodput."""
    if not o.ok:
        return False
    value = _indicator(o, slo)
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


class _Tally:
    """Running counts of a sample against SLOs, one request at a time (O(SLOs) a request), so
    that a runner can re-judge its sample after every request without going over it again."""

    def __init__(self, slos: Sequence[SloTarget]) -> None:
        self.slos = tuple(slos)
        self.n = 0
        self.errors = 0
        self.good = 0  # requests good for every SLO
        self.good_by = [0] * len(self.slos)
        # Per SLO the highest indicator seen (seconds); a failed request, or one without the
        # indicator measured, gives no evidence of a margin and counts as infinitely slow.
        self.worst = [0.0] * len(self.slos)

    def add(self, o: RequestOutcome) -> None:
        self.n += 1
        self.errors += not o.ok
        within = [_within(o, s) for s in self.slos]
        self.good += o.ok and all(within)
        for i, (w, s) in enumerate(zip(within, self.slos, strict=True)):
            self.good_by[i] += w
            value = _indicator(o, s) if o.ok else None
            self.worst[i] = max(self.worst[i], math.inf if value is None else value)

    def on_margin(self, margin: Margin | None) -> bool:
        return (margin is not None and self.n >= margin.requests and self.errors == 0
                and all(w <= margin.ratio * s.threshold_seconds
                        for w, s in zip(self.worst, self.slos, strict=True)))

    def interval_verdict(self, confidence: float) -> Verdict:
        if self.n == 0:
            return "unresolved"
        return _verdict(self.good_by, self.n, self.slos, confidence)


def judge(outcomes: Iterable[RequestOutcome], slos: Sequence[SloTarget],
          confidence: float, margin: Margin | None = None) -> Judgement:
    """Judge ``outcomes`` against ``slos`` at ``confidence`` (0-1).

    Pass when the latency-margin rule ``margin`` holds (module docs; None: not applied) or
    every SLO's interval low is at or above its objective, fail when any SLO's interval high is
    below its objective, unresolved otherwise (and always with no requests). Without SLOs every
    successful request is good and the verdict is pass."""
    tally = _Tally(slos)
    for o in outcomes:
        tally.add(o)
    n = tally.n
    low, high = wilson_interval(tally.good, n, confidence)
    on_margin = tally.on_margin(margin)
    return Judgement(
        attainment=tally.good / n if n else 0.0,
        low=low,
        high=high,
        by_slo={s.name: (c / n if n else 0.0)
                for s, c in zip(slos, tally.good_by, strict=True)},
        # The margin implies every request good, so the interval cannot say fail beside it.
        verdict="pass" if on_margin else tally.interval_verdict(confidence),
        on_margin=on_margin,
    )


class ProbeWindow:
    """Which requests of one closed-loop probe are counted, and when the probe is over.

    The runner calls ``admit`` as it sends each request and ``finish`` as each counted one
    ends; ``done`` then says the probe is over and ``outcomes`` holds its sample. The first
    ``concurrency`` requests are a warm-up and are not counted (they start together on an idle
    server, which steady load never does). The window closes (``admit`` counts no more):

    * as soon as the latency-margin rule holds (``[capacity] clear_margin``,
      ``clear_probe_requests``) on the counted requests in the order they were *sent*, as far
      as every one has finished (the first to finish are the fast ones, and a margin seen on
      them alone would lean towards a pass): a level far from the knee is decided on a few
      requests, whatever the time. Should one of the requests still in flight then break the
      margin, the window opens again and the level is judged as any other;
    * otherwise on its interval, checked as requests are sent once ``min_probe_requests``
      have been counted and ``probe_duration`` seconds have passed since the first was sent,
      on the requests finished by then (at least ``min_probe_requests``), and after that every
      ``max(concurrency, min_probe_requests / 2)`` more requests while it stays unresolved.
      Near the objective the sample must be large and spread over time: requests of a closed
      loop are not independent (a slow stretch slows several waves in a row), and checking an
      interval after every request would stop on a chance excursion more often than its
      confidence says;
    * or at ``max_probe_requests`` counted requests, unresolved (decided on the point
      estimate, ``probe_from_outcomes``).

    The probe is over once the window is closed and every counted request has finished."""

    def __init__(self, slos: Sequence[SloTarget], capacity: CapacityConfig,
                 concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
        self._capacity = capacity
        self._margin = Margin.of(capacity)
        self._concurrency = concurrency
        self._finished = _Tally(slos)  # every counted request finished so far, in any order
        self._prefix = _Tally(slos)  # the counted requests, in send order, up to the first out
        self._target = capacity.min_probe_requests
        self._chunk = max(concurrency, math.ceil(capacity.min_probe_requests / 2))
        self._sent = 0
        self._sent_at: list[float] = []  # send time (seconds) of each counted request
        self._outcomes: list[RequestOutcome | None] = []  # None while in flight
        self._busy_s = 0.0
        self._by_margin = False  # the margin rule closed the window
        self.closed = False
        self.done = False

    def admit(self, now: float) -> int | None:
        """A request is sent at ``now`` (seconds): its index among the counted requests, or
        None when it is not counted (the warm-up, or the window is closed)."""
        self._sent += 1
        if self._sent <= self._concurrency or self.closed:
            return None
        cap = self._capacity
        n = len(self._outcomes)
        if n >= self._target and now - self._sent_at[0] >= cap.probe_duration:
            if (self._finished.n >= cap.min_probe_requests
                    and self._finished.interval_verdict(cap.confidence) != "unresolved"):
                self._close()
                return None
            self._target = n + self._chunk
        if n >= cap.max_probe_requests:
            self._close()
            return None
        self._sent_at.append(now)
        self._outcomes.append(None)
        return n

    def finish(self, index: int, outcome: RequestOutcome, now: float) -> None:
        """The counted request ``index`` ended at ``now`` (seconds) with ``outcome``."""
        if self._outcomes[index] is not None:
            raise ValueError(f"counted request {index} already finished")
        self._outcomes[index] = outcome
        self._busy_s += now - self._sent_at[index]
        self._finished.add(outcome)
        while self._prefix.n < len(self._outcomes):
            o = self._outcomes[self._prefix.n]
            if o is None:
                break
            self._prefix.add(o)
        on_margin = self._prefix.on_margin(self._margin)
        if self._by_margin and not on_margin:
            # A request in flight at the close broke the margin (the rule never holds again
            # once broken): measure on, as any level near the knee.
            self._by_margin = self.closed = False
        elif on_margin and not self.closed:
            self._by_margin = self.closed = True
        self._settle()

    def _close(self) -> None:
        self.closed = True
        self._settle()

    def _settle(self) -> None:
        self.done = self.closed and self._prefix.n == len(self._outcomes)

    @property
    def outcomes(self) -> list[RequestOutcome]:
        """The counted requests finished so far, in the order they were sent (once ``done``:
        the probe's sample)."""
        return [o for o in self._outcomes if o is not None]

    @property
    def duration_s(self) -> float:
        """Seconds of the run the counted requests took, by Little's law: the slot time they
        took over ``concurrency`` (exact for a closed loop without think time)."""
        return self._busy_s / self._concurrency


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (seconds) with linear interpolation, as ``vllm bench serve``."""
    if not values:
        return {f"p{p:g}": None for p in _PCTS}
    got = np.percentile(np.asarray(values, dtype=float), _PCTS)
    return {f"p{p:g}": float(v) for p, v in zip(_PCTS, got, strict=True)}


def probe_from_outcomes(concurrency: int, outcomes: Sequence[RequestOutcome],
                        duration_s: float, slos: Sequence[SloTarget],
                        confidence: float, margin: Margin | None = None) -> Probe:
    """The ``Probe`` of one load level: ``outcomes`` measured over ``duration_s`` seconds.

    ``passed`` follows the judgement (``margin``: the latency-margin rule, None for the
    interval alone); an unresolved one (the runner ran out of requests) is decided on the
    point estimates: every SLO's share at or above its objective. The interval recorded in the
    probe then straddles the objective, which ``unresolved`` reads back."""
    j = judge(outcomes, slos, confidence, margin)
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
    while none lies wholly below, and not every request was good.

    A probe whose every request succeeded within every threshold has a point estimate of 1,
    nowhere near an objective: it passed on the latency margin (``Margin``), which a
    ``Probe`` does not record but which only such a sample can meet, or, with a request cap
    below what the interval needs, on a sample without a single bad request."""
    if probe.requests == 0:
        return True
    counts = [round(probe.attainment_by_slo.get(s.name, 0.0) * probe.requests) for s in slos]
    if probe.errors == 0 and all(c == probe.requests for c in counts):
        return False
    return _verdict(counts, probe.requests, slos, confidence) == "unresolved"


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

