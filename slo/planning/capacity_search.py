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

A level that clearly fails need not run its full probe either: at a few fixed looks
(``early_looks``, the first after one full turnover of the loop) its finished requests fail
it when some SLO's upper bound lies below its objective at a confidence corrected for the
number of looks (``early_fail_confidence``, Bonferroni). Only failures stop early.

The search (``_steps``) has three parts. An opening ramp (``Ramp``; run live by
``serving.loadgen.probe.LoadRunner``) adds one closed-loop client per finished request, so
the load doubles about once per request latency, until the last requests miss an SLO too
often; each request is tagged with the mean load over its life, and ``estimate_knee`` fits
the misses against the load to say where the knee is. From that estimate the search
gallops: up by ``1 + precision``, ``1 + 2 precision``, ... while the probes pass, down
likewise while they fail, until a pass and a failure bracket the knee. Without an estimate
(``start=None``: ``[capacity] ramp = false``, the simulator's estimate) it doubles from 1
until a probe fails instead, the way GuideLLM's sweep and ``vllm bench serve --goodput``
runs are used by hand. Then it bisects between the highest pass and the lowest failure until
they are within ``precision`` of each other (relative). Everything here is pure: the probe
is a function given to the search, so the search runs on a live replica, on virtual-time
simulator runs, or on a synthetic function in a test alike.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, NamedTuple

import numpy as np

from vigil.capacity import Basis, CapacityProfile, Probe, ProfileIdentity, SloTarget
from vigil.config import CapacityConfig

__all__ = [
    "RAMP_LOW",
    "RANGE_RATIO",
    "Judgement",
    "Margin",
    "ProbeWindow",
    "Ramp",
    "RampRecord",
    "RampSummary",
    "RequestOutcome",
    "SearchResult",
    "Verdict",
    "early_fail_confidence",
    "early_looks",
    "estimate_knee",
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

    def fails_at(self, confidence: float) -> bool:
        """Some SLO's Wilson upper bound at ``confidence`` lies below its objective."""
        return self.n > 0 and any(
            wilson_interval(g, self.n, confidence)[1] < s.objective
            for g, s in zip(self.good_by, self.slos, strict=True))

    def indifferent(self, confidence: float, ratio: float) -> bool:
        """Every SLO whose interval at ``confidence`` still reaches below its objective has
        an interval no wider than ``ratio x (1 - objective)`` either side of its centre
        (``[capacity] indifference``): the sample pins the share close enough to the
        objective that more requests would only split hairs."""
        if self.n == 0 or ratio <= 0:
            return False
        for g, s in zip(self.good_by, self.slos, strict=True):
            low, high = wilson_interval(g, self.n, confidence)
            if low < s.objective and (high - low) / 2.0 > ratio * (1.0 - s.objective):
                return False
        return True

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


def early_looks(concurrency: int, capacity: CapacityConfig) -> tuple[int, ...]:
    """The finished-request counts at which a level may stop early on a clear failure
    (``ProbeWindow``; empty when ``[capacity] early_fail`` is off).

    The first look waits for one full turnover of the loop and for ``clear_probe_requests``
    (``max(concurrency, clear_probe_requests)``): a level is not judged on its first instants,
    nor on a handful of requests whose interval says little. The next looks double the count
    while it stays below ``min_probe_requests``, where the level's own checkpoints take over;
    a fixed, short schedule, so that the looks' error can be bounded in advance
    (``early_fail_confidence``)."""
    if not capacity.early_fail:
        return ()
    looks = [max(concurrency, capacity.clear_probe_requests)]
    while looks[-1] * 2 < capacity.min_probe_requests:
        looks.append(looks[-1] * 2)
    return tuple(looks)


def early_fail_confidence(confidence: float, looks: int) -> float:
    """The confidence (0-1) of each of ``looks`` early looks at a failing level: the error
    ``1 - confidence`` split evenly among them (Bonferroni), so that the chance that any of
    them fails a level that meets its objectives stays within ``1 - confidence``."""
    return 1.0 - (1.0 - confidence) / max(1, looks)


class ProbeWindow:
    """Which requests of one closed-loop probe are counted, and when the probe is over.

    The runner calls ``admit`` as it sends each request and ``finish`` as each counted one
    ends; ``done`` then says the probe is over and ``outcomes`` holds its sample. The first
    ``warm_up`` requests are not counted: by default ``concurrency`` (a cold start: they start
    together on an idle server, which steady load never does); a runner that keeps its loop
    running from the level before (``serving.loadgen.probe.LoadRunner``) passes the number of
    streams it adds (their first requests start together, a burst), or 0 when it goes down
    (retired streams are cancelled, and the rest were already running at more load). The
    window closes (``admit`` counts no more):

    * as soon as the latency-margin rule holds (``[capacity] clear_margin``,
      ``clear_probe_requests``) on the counted requests in the order they were *sent*, as far
      as every one has finished (the first to finish are the fast ones, and a margin seen on
      them alone would lean towards a pass): a level far from the knee is decided on a few
      requests, whatever the time. Should one of the requests still in flight then break the
      margin, the window opens again and the level is judged as any other;
    * as soon as the requests finished so far show a clear failure (``[capacity]
      early_fail``): at the looks of ``early_looks`` (the first after a full turnover of the
      loop), some SLO's Wilson upper bound, at the confidence ``early_fail_confidence``
      corrected for the number of looks, lies below its objective. Only a failure stops a
      level early: a pass still needs the margin or the interval at the checkpoints below.
      Such a level is over at once: its sample is the requests finished by then (the fast
      ones, so waiting for the others could only confirm the failure);
    * otherwise on its interval, checked as requests are sent once ``min_probe_requests``
      have been counted and finished and ``probe_duration`` seconds have passed since the
      first was sent, on the requests finished by then, and after that every
      ``max(concurrency, min_probe_requests / 2)`` more requests while it stays unresolved.
      Near the objective the sample must be large and spread over time: requests of a closed
      loop are not independent (a slow stretch slows several waves in a row), and checking an
      interval after every request would stop on a chance excursion more often than its
      confidence says;
    * or, unresolved (decided on the point estimate, ``probe_from_outcomes``), at one of
      those checkpoints once every SLO interval that straddles its objective is at most
      ``[capacity] indifference x (1 - objective)`` either side of its centre (by default,
      for an objective of 0.95, ±2.5 points, about 300 requests: the estimated miss share is
      then between half and one and a half times what the objective allows, the level is at
      the knee, and more requests would only split hairs; a level whose share sits at its
      objective would otherwise never resolve), or at ``max_probe_requests`` counted
      requests.

    The probe is over once the window is closed and every counted request has finished (or
    at once on an early fail)."""

    def __init__(self, slos: Sequence[SloTarget], capacity: CapacityConfig,
                 concurrency: int, warm_up: int | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency!r}")
        if warm_up is not None and warm_up < 0:
            raise ValueError(f"warm_up must be at least 0, not {warm_up!r}")
        self._capacity = capacity
        self._margin = Margin.of(capacity)
        self._concurrency = concurrency
        self._warm_up = concurrency if warm_up is None else warm_up
        self._finished = _Tally(slos)  # every counted request finished so far, in any order
        self._prefix = _Tally(slos)  # the counted requests, in send order, up to the first out
        self._target = capacity.min_probe_requests
        self._chunk = max(concurrency, math.ceil(capacity.min_probe_requests / 2))
        looks = early_looks(concurrency, capacity)
        self._looks = deque(looks)
        self._early_confidence = early_fail_confidence(capacity.confidence, len(looks))
        self._sent = 0
        self._sent_at: list[float] = []  # send time (seconds) of each counted request
        self._outcomes: list[RequestOutcome | None] = []  # None while in flight
        self._busy_s = 0.0
        self._by_margin = False  # the margin rule closed the window
        self.early_failed = False  # a clear failure closed the window before the checkpoints
        self.closed = False
        self.done = False

    def admit(self, now: float) -> int | None:
        """A request is sent at ``now`` (seconds): its index among the counted requests, or
        None when it is not counted (the warm-up, or the window is closed)."""
        self._sent += 1
        if self._sent <= self._warm_up or self.closed:
            return None
        cap = self._capacity
        n = len(self._outcomes)
        if (n >= self._target and now - self._sent_at[0] >= cap.probe_duration
                and self._finished.n >= cap.min_probe_requests):
            # A look at the interval: only one on min_probe_requests finished counts as one
            # (before that the level waits for them, request by request, not a whole chunk).
            if (self._finished.interval_verdict(cap.confidence) != "unresolved"
                    or self._finished.indifferent(cap.confidence, cap.indifference)):
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
        if self.early_failed:
            return  # the sample was settled at the early fail (``_settle``)
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
        if self._looks and self._finished.n >= self._looks[0] and not self.closed:
            # One look of the fixed schedule (a look the margin's close skipped is taken
            # later, so there are never more than the schedule's): the count of looks is what
            # the corrected confidence was split over.
            self._looks.popleft()
            if self._finished.fails_at(self._early_confidence):
                self.early_failed = self.closed = True
        self._settle()

    def _close(self) -> None:
        self.closed = True
        self._settle()

    def _settle(self) -> None:
        # An early fail does not wait for its counted requests in flight: the finished ones
        # are the fast ones (finish order), so a sample that fails without the slow ones
        # would fail with them; waiting would only cost up to one request latency. Those in
        # flight leave the sample (they go on as uncounted load).
        self.done = self.closed and (self.early_failed
                                     or self._prefix.n == len(self._outcomes))

    @property
    def outcomes(self) -> list[RequestOutcome]:
        """The counted requests finished so far, in the order they were sent (once ``done``:
        the probe's sample)."""
        return [o for o in self._outcomes if o is not None]

    @property
    def duration_s(self) -> float:
        """Seconds of the run the counted requests took, by Little's law: the slot time they
        took over ``concurrency`` (exact for a closed loop without think time; for an early
        fail, of the requests in its sample only, which leaves its rates a little high: they
        describe a failing level and no answer is read from them)."""
        return self._busy_s / self._concurrency


class RampRecord(NamedTuple):
    """One request of the opening ramp: ``load``, the mean number of requests in flight over
    its life (itself included), and its ``outcome``."""

    load: float
    outcome: RequestOutcome


@dataclass(frozen=True)
class RampSummary:
    """What the opening ramp found: ``start``, the concurrency the search probes first;
    ``knee``, the estimate it came from (requests in flight, ``estimate_knee``); ``streams``,
    the most streams the ramp ran; ``requests`` finished and ``seconds`` taken; ``stopped``,
    why it ended: ``"misses"`` (the last requests missed an SLO too often) or
    ``"max_concurrency"``."""

    start: int
    knee: float
    streams: int
    requests: int
    seconds: float
    stopped: Literal["misses", "max_concurrency"]

    def to_dict(self) -> dict[str, object]:
        return {"start": self.start, "knee": round(self.knee, 2), "streams": self.streams,
                "requests": self.requests, "seconds": round(self.seconds, 3),
                "stopped": self.stopped}


def _isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing least-squares fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted: list[float] = []
    for total, count in blocks:
        fitted += [total / count] * int(count)
    return fitted


def estimate_knee(records: Sequence[RampRecord], slos: Sequence[SloTarget]) -> float:
    """The highest load (requests in flight) at which the ramp's requests still met every
    SLO's objective: per SLO, each request's miss (0/1) is fitted by a non-decreasing function
    of its load (isotonic regression: the only assumption is that more load never lowers the
    chance of a miss), and the knee is the highest load whose fitted miss rate is within
    ``1 - objective``, the lowest over the SLOs. 0.0 when even the lightest requests miss too
    often (or there are none).

    A ramp puts about one request at each load, so the estimate is coarse (a single miss
    pulls it down to just below that miss's load); it only tells the search where to start
    (``search``'s ``start``), and the levels near it are then probed in full."""
    if not records:
        return 0.0
    ordered = sorted(records, key=lambda r: r.load)
    knee = math.inf
    for slo in slos:
        fitted = _isotonic([0.0 if _within(r.outcome, slo) else 1.0 for r in ordered])
        within = [r.load for r, f in zip(ordered, fitted, strict=True)
                  if f <= 1.0 - slo.objective + 1e-12]
        knee = min(knee, max(within, default=0.0))
    if not slos:  # no objective: every successful request is good
        ok = [r.load for r in ordered if r.outcome.ok]
        knee = max(ok, default=0.0)
    return knee


#: Loads (requests in flight) below this at which the ramp already misses too often: the
#: search then probes concurrency 1 first, so that a replica that cannot meet the SLOs even
#: one request at a time is reported as such.
RAMP_LOW = 3


class Ramp:
    """The opening ramp of a search: how fast the load grows, what each request saw and when
    it stops (pure; ``serving.loadgen.probe.LoadRunner.ramp`` runs it on a live replica).

    It starts with one stream (a closed-loop client) and adds one more each time a request
    finishes, so the streams double about once per request latency: the load of 32 streams is
    reached in five latencies, where probing 1, 2, 4, 8, 16 one by one takes five probes of
    20 requests or 20 seconds each. Each request is tagged with the mean number of requests in
    flight over its life (``RampRecord``): its latency is that of that load, not of the load
    when it was sent or ended. The ramp stops when, among the last ``max(window, streams)``
    finished requests, more missed some SLO's threshold than its objective allows (the load
    is past the knee), or once ``max(window, streams)`` requests have finished at
    ``max_concurrency`` streams. Its requests judge no level: the ramp only estimates where
    the knee is (``estimate_knee``, ``summary``)."""

    def __init__(self, slos: Sequence[SloTarget], max_concurrency: int,
                 window: int = 20) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency!r}")
        self._slos = tuple(slos)
        self._max = max_concurrency
        self._window = max(1, window)
        self.streams = 1
        self.in_flight = 0
        self._area = 0.0  # integral of the requests in flight over time (request-seconds)
        self._last: float | None = None
        self._started: float | None = None
        self._ended = 0.0
        self._open: dict[int, tuple[float, float]] = {}  # index -> (sent at, area then)
        self._next = 0
        self._at_max = 0  # requests finished since the streams reached max_concurrency
        self.records: list[RampRecord] = []
        self.stopped: Literal["misses", "max_concurrency"] | None = None

    @property
    def done(self) -> bool:
        return self.stopped is not None

    def _advance(self, now: float) -> None:
        if self._last is not None:
            self._area += self.in_flight * max(0.0, now - self._last)
        self._last = now
        if self._started is None:
            self._started = now
        self._ended = now

    def admit(self, now: float) -> int:
        """A request is sent at ``now`` (seconds): its index."""
        self._advance(now)
        index = self._next
        self._next += 1
        self.in_flight += 1
        self._open[index] = (now, self._area)
        return index

    def finish(self, index: int, outcome: RequestOutcome, now: float) -> int:
        """Request ``index`` ended at ``now`` with ``outcome``: the number of streams to add
        (1 while the ramp goes on, else 0)."""
        if index not in self._open:
            raise ValueError(f"ramp request {index} is not in flight")
        self._advance(now)
        sent, area = self._open.pop(index)
        life = now - sent
        load = (self._area - area) / life if life > 0 else float(self.in_flight)
        self.in_flight -= 1
        self.records.append(RampRecord(load, outcome))
        if self.done:
            return 0
        window = max(self._window, self.streams)
        recent = self.records[-window:]
        for slo in self._slos:
            misses = sum(not _within(r.outcome, slo) for r in recent)
            # (the tolerance keeps 2 misses in 20 within an objective of 0.9 despite rounding)
            if misses > (1.0 - slo.objective) * window + 1e-9:
                self.stopped = "misses"
                return 0
        if self.streams >= self._max:
            self._at_max += 1
            if self._at_max >= window:
                self.stopped = "max_concurrency"
            return 0
        self.streams += 1
        return 1

    def summary(self) -> RampSummary:
        """The knee estimate and where the search starts: ``max_concurrency`` when the ramp
        reached it without missing; concurrency 1 when the ramp missed too often below
        ``RAMP_LOW`` requests in flight; else the estimate rounded to the nearest level (it
        errs either way: about one request per load, and a ramp's requests see the prefill of
        the streams added under them)."""
        knee = estimate_knee(self.records, self._slos)
        if self.stopped == "max_concurrency":
            start = self._max
        elif knee < RAMP_LOW:
            start = 1
        else:
            start = min(self._max, math.floor(knee + 0.5))
        return RampSummary(start=start, knee=knee, streams=self.streams,
                           requests=len(self.records),
                           seconds=self._ended - (self._ended if self._started is None
                                                  else self._started),
                           stopped=self.stopped or "misses")


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
    ``probes`` every probe in the order run, ``ramp`` the opening ramp's summary when the
    search started from one (``Ramp``)."""

    best: Probe | None
    failed: Probe | None
    probes: tuple[Probe, ...]
    ramp: RampSummary | None = None


def _gallop(c: int, up: bool, moves: int, precision: float, max_concurrency: int) -> int:
    """The next level after ``moves`` earlier moves the same way: a factor of ``1 +
    precision x 2 ** moves`` up (rounded down) or down (rounded up), at least one step. The
    first move is one ``precision`` away, so a start just below or above the knee is bracketed
    within the precision by one more probe; each further move doubles the step, so a start
    far off reaches the knee in a few probes."""
    factor = 1.0 + precision * (1 << moves)
    if up:
        return min(max_concurrency, max(c + 1, math.floor(c * factor)))
    return max(1, min(c - 1, math.ceil(c / factor)))


def _steps(max_concurrency: int, precision: float,
           start: int | None = None) -> Generator[int, Probe, SearchResult]:
    """The search as a generator: it yields the next concurrency to probe and is sent that
    probe, so the async and the sync drivers share one algorithm.

    ``start`` None: doubling from 1 until a probe fails. Else galloping from ``start`` (an
    estimate of the knee, the opening ramp's): up while the probes pass, down while they fail
    (``_gallop``), until one pass and one failure bracket the knee. Then, either way,
    bisection between the highest pass and the lowest failure."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency!r}")
    if not precision > 0:
        raise ValueError(f"precision must be more than 0, not {precision!r}")
    probes: list[Probe] = []
    best: Probe | None = None
    failed: Probe | None = None
    if start is None:
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
    else:
        c = min(max(1, start), max_concurrency)
        moves = 0
        while True:
            p = yield c
            probes.append(p)
            if p.passed:
                best = p
                if c >= max_concurrency:
                    break
            else:
                failed = p
                if c <= 1:
                    break
            if best is not None and failed is not None:
                break  # the first change of direction brackets the knee
            c = _gallop(c, p.passed, moves, precision, max_concurrency)
            moves += 1
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
                 precision: float, start: int | None = None) -> SearchResult:
    """The highest concurrency (requests in flight) whose probe passes: from ``start`` (an
    estimate of the knee) outward by growing factors until a pass and a failure bracket it,
    or without ``start`` 1, 2, 4, ... up to ``max_concurrency`` until one fails; then
    bisection until ``(fail - pass) / pass <= precision`` (ratio, e.g. 0.10) or the two are
    adjacent (``_steps``)."""
    steps = _steps(max_concurrency, precision, start)
    try:
        c = next(steps)
        while True:
            c = steps.send(await probe(c))
    except StopIteration as done:
        result: SearchResult = done.value
        return result


def search_sync(probe: Callable[[int], Probe], *, max_concurrency: int,
                precision: float, start: int | None = None) -> SearchResult:
    """``search`` with a synchronous probe function (virtual-time simulator runs, tests)."""
    steps = _steps(max_concurrency, precision, start)
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
    ramp = result.ramp
    if ramp is not None:
        notes.append(f"opening ramp: 1 to {ramp.streams} streams, {ramp.requests} requests in "
                     f"{ramp.seconds:.0f} s, knee estimated at {ramp.knee:.1f} in flight; "
                     f"levels probed from {ramp.start}: "
                     + ", ".join(f"{p.concurrency} {'pass' if p.passed else 'fail'}"
                                 for p in result.probes))
    decided = [p.concurrency for p in result.probes if unresolved(p, slos, confidence)]
    if decided:
        notes.append("decided on the point estimate (interval still straddled the objective, "
                     "within the indifference band or at the request limit): concurrency "
                     + ", ".join(map(str, decided)))
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

