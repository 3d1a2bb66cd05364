"""Each request's share of its pool's GPU bill, by what the engine spent on it while it ran.

The rule (pure; ``slo.cost.tenants`` reads its inputs from the store and the request log):

1. **What the pool pays, moment by moment.** Each replica is billed while it runs (the
   intervals its ``up`` samples stand for, ``slo.cost.pool``), at the rate in force
   (``slo.cost.prices``: on demand, reserved, spot, each from its date). Unused reserved
   replicas are paid too. The pool's cost over a window is the integral of these rates.
2. **What each request asked of the engine.** A request on a replica has two phases: from its
   arrival at the replica to its first token (prefill: its computed prompt tokens, each
   weighing ``[cost] prefill_token_weight`` decode steps, and its prompt tokens served from
   vLLM's prefix cache, each ``cached_token_weight``), and from its first token to its end
   (decode: one step per output token). Within a phase its work is spread evenly, so it
   asks ``units / phase length`` per second. A request whose first token is unknown (not
   streamed) spreads both over its whole time; one whose token counts are unknown asks
   the replica's mean rate.
3. **Who pays each moment.** At every moment, the replica's rate is split over the requests
   running on it in proportion to what each asks per second; with none running, the moment
   is idle. A cancelled or timed-out request pays for the time it ran; a cached answer never
   ran on a replica and pays nothing.
4. **Traffic that went around.** Per replica and ``[cost] step``, vLLM's own counters
   (``vllm:prompt_tokens_total``, ``vllm:prefix_cache_hits_total``,
   ``vllm:generation_tokens_total``) give the work the engine did, in the same units. Work
   above the records' (past ``unattributed_tolerance``, after the records' surplus of the
   step before, since a token is counted when the engine runs it and recorded when the
   request ends) came from requests no record knows. Since when in the step it ran is not
   known, it takes its share of the whole step: with unattributed work ``U`` and the
   records' ``W``, the step's cost is billed ``U / (U + W)`` to ``unattributed``, and the
   rest as above. A step whose cost found no record but whose counters moved is thus all
   unattributed, never idle.

By construction, for any window and pool: every request's cost + idle + unattributed = the
pool's cost (up to float rounding, which ``cents`` settles so that printed lines add up).
Replicas are told apart by name; a record without one (a router that did not say), or naming
one that was never billed under that name, is spread evenly over the replicas that ran during
the request.

Units: Unix seconds, the ``[cost] currency``, GPU-hours, work units (decode steps).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from slo.cost.prices import PoolPrices

__all__ = ["Attribution", "Run", "attribute", "cents", "merge_intervals"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
#: The shortest prefill or decode phase told apart (seconds).
_MIN_PHASE_S = 0.001


@dataclass(frozen=True)
class Run:
    """One request's time on a replica. ``key``: the caller's (its record); ``replica`` ""
    when unknown; ``first_s`` None when the first token is unknown; ``prefill_units`` and
    ``decode_units`` None when the token counts are unknown."""

    key: int
    replica: str
    start_s: float
    first_s: float | None
    end_s: float
    prefill_units: float | None
    decode_units: float | None


@dataclass(frozen=True)
class Runs:
    """Many ``Run``s as arrays, one entry per request (what ``attribute`` works on): NaN in
    ``first_s`` for an unknown first token, in ``prefill_units``/``decode_units`` for unknown
    token counts; ``replica`` "" when unknown."""

    key: IntArray
    replica: list[str]
    start_s: FloatArray
    first_s: FloatArray
    end_s: FloatArray
    prefill_units: FloatArray
    decode_units: FloatArray

    @classmethod
    def of(cls, runs: Sequence[Run]) -> Runs:
        """``runs`` as arrays."""
        nan = math.nan
        return cls(np.array([r.key for r in runs], dtype=np.int64),
                   [r.replica for r in runs],
                   np.array([r.start_s for r in runs], dtype=np.float64),
                   np.array([nan if r.first_s is None else r.first_s for r in runs],
                            dtype=np.float64),
                   np.array([r.end_s for r in runs], dtype=np.float64),
                   np.array([nan if r.prefill_units is None else r.prefill_units
                             for r in runs], dtype=np.float64),
                   np.array([nan if r.decode_units is None else r.decode_units
                             for r in runs], dtype=np.float64))


@dataclass
class Attribution:
    """One pool over one window: per run key its cost and GPU-hours; the idle and
    unattributed lines; and the pool's totals they add up to."""

    cost: dict[int, float] = field(default_factory=dict)
    gpu_hours: dict[int, float] = field(default_factory=dict)
    idle_cost: float = 0.0
    idle_gpu_hours: float = 0.0
    #: Part of ``idle_cost``: reserved replicas paid for and not running.
    unused_reserved_cost: float = 0.0
    unattributed_cost: float = 0.0
    unattributed_gpu_hours: float = 0.0
    total_cost: float = 0.0
    total_gpu_hours: float = 0.0
    #: Runs while no replica of the pool was billed (they cost nothing).
    unbilled_runs: int = 0
    #: Runs naming a replica that was never billed under that name (spread as unnamed).
    respread_runs: int = 0
    #: Replicas whose counters were read (their unattributed work is measured).
    measured_replicas: frozenset[str] = frozenset()


def merge_intervals(intervals: Sequence[tuple[float, float]], lo: float, hi: float
                    ) -> list[tuple[float, float]]:
    """The union of ``intervals`` clipped to ``[lo, hi]``, sorted, without empty ones: each
    second a replica ran is billed once."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


@dataclass
class _Phases:
    """One replica's phases as arrays: the run's key, start, end, work (NaN: unknown) and,
    once known, the work each asks per second."""

    key: IntArray
    start: FloatArray
    end: FloatArray
    units: FloatArray
    rate: FloatArray | None = None


@dataclass
class _Segment:
    start: float
    end: float
    per_s: float
    gpu_per_s: float


def _segments(billing: Mapping[str, list[tuple[float, float]]], prices: PoolPrices,
              lo: float, hi: float, out: Attribution) -> dict[str, list[_Segment]]:
    """Per replica, the stretches it was billed and at what rate; the unused reservation
    goes to ``out``'s idle and total."""
    edges = {lo, hi, *prices.changes(lo, hi)}
    for spans in billing.values():
        for a, b in spans:
            edges.update((a, b))
    times = sorted(edges)
    per: dict[str, list[_Segment]] = {r: [] for r in billing}
    cursor = dict.fromkeys(billing, 0)
    for a, b in itertools.pairwise(times):
        running = []
        for r, spans in billing.items():
            i = cursor[r]
            while i < len(spans) and spans[i][1] <= a:
                i += 1
            cursor[r] = i
            if i < len(spans) and spans[i][0] <= a and b <= spans[i][1]:
                running.append(r)
        rates = prices.rates(a, running)
        dt = b - a
        if rates.unused_reserved_per_s:
            out.idle_cost += rates.unused_reserved_per_s * dt
            out.unused_reserved_cost += rates.unused_reserved_per_s * dt
            out.idle_gpu_hours += rates.unused_reserved_gpu_hours_per_s * dt
            out.total_cost += rates.unused_reserved_per_s * dt
            out.total_gpu_hours += rates.unused_reserved_gpu_hours_per_s * dt
        for r in running:
            rate, gpu = rates.per_replica[r], rates.gpu_hours_per_replica_s
            segs = per[r]
            if segs and segs[-1].end == a and segs[-1].per_s == rate:
                segs[-1].end = b
            else:
                segs.append(_Segment(a, b, rate, gpu))
            out.total_cost += rate * dt
            out.total_gpu_hours += gpu * dt
    return per


def _phases(runs: Runs, idx: IntArray, share: FloatArray) -> _Phases:
    """The prefill and decode phases of the runs ``idx`` (one phase for a run whose first
    token or token counts are unknown), each with ``share`` of its units (a run spread over
    several replicas)."""
    start, first, end = runs.start_s[idx], runs.first_s[idx], runs.end_s[idx]
    pre, dec = runs.prefill_units[idx], runs.decode_units[idx]
    key = runs.key[idx]
    known = ~np.isnan(pre) & ~np.isnan(dec)
    # Phases shorter than a millisecond are not told apart: a request timed to the
    # microsecond would otherwise ask billions of units a second for an instant.
    with np.errstate(invalid="ignore"):
        split = known & (first > start + _MIN_PHASE_S) & (first < end - _MIN_PHASE_S)
    one = ~split
    return _Phases(
        np.concatenate([key[split], key[split], key[one]]),
        np.concatenate([start[split], first[split], start[one]]),
        np.concatenate([first[split], end[split], end[one]]),
        np.concatenate([(pre * share)[split], (dec * share)[split],
                        np.where(known, (pre + dec) * share, np.nan)[one]]))


def _unattributed_shares(recorded: FloatArray, counter: Sequence[tuple[float, float]] | None,
                         edges: FloatArray, tolerance: float) -> FloatArray:
    """Per step, the share of its cost that goes to traffic no record knows (see the module
    docstring, 4). ``recorded``: the records' work in each step."""
    n = len(edges) - 1
    shares = np.zeros(n)
    if not counter or n < 1:
        return shares
    t = np.array([c[0] for c in counter])
    w = np.array([c[1] for c in counter])
    inside = (t > edges[0]) & (t <= edges[-1])
    # The step (edges[i], edges[i + 1]] holding each count.
    k = np.clip(np.searchsorted(edges, t[inside], side="left") - 1, 0, n - 1)
    counted = np.bincount(k, weights=w[inside], minlength=n)
    seen = np.bincount(k, minlength=n) > 0
    carry = 0.0
    for i in range(n):  # a running balance: each step depends on the one before
        if not seen[i]:
            carry = 0.0
            continue
        extra = counted[i] - recorded[i] - carry
        carry = max(0.0, recorded[i] - counted[i])
        if extra > tolerance * counted[i] and extra > 0:
            shares[i] = extra / (extra + recorded[i])
    return shares


def _split(phases: _Phases, segments: list[_Segment], edges: FloatArray,
           counter: Sequence[tuple[float, float]] | None, tolerance: float, lo: float,
           hi: float, out: Attribution) -> tuple[IntArray, FloatArray, FloatArray]:
    """Split one replica's billed time over its phases, idle and unattributed (see the
    module docstring, 3-4), on the grid of every moment something changes. Keeps
    ``A = ∫ rate × (1 − u) / W dt`` (``W`` the running phases' summed rates, ``u`` the step's
    unattributed share): a phase of rate ``w`` pays ``w × (A(end) − A(start))``, so the
    whole split is a few array passes whatever the concurrency."""
    assert phases.rate is not None
    starts = np.maximum(phases.start, lo)
    ends = np.minimum(phases.end, hi)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    rates, keys = phases.rate[keep], phases.key[keep]
    seg_a = np.array([g.start for g in segments])
    seg_b = np.array([g.end for g in segments])
    times = np.unique(np.concatenate([[lo, hi], edges, seg_a, seg_b, starts, ends]))
    times = times[(times >= lo) & (times <= hi)]
    if len(times) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    t0, dt = times[:-1], np.diff(times)
    i_start = np.searchsorted(times, starts)
    i_end = np.searchsorted(times, ends)
    # W, the running sum of the rates: a month of additions and removals in extended
    # precision, restarted from exactly 0 wherever nothing runs, so that its rounding stays
    # far below the smallest rate (a request with no token known runs at a millionth of the
    # mean, and must still weigh more than nothing).
    delta = np.zeros(len(times), dtype=np.longdouble)
    np.add.at(delta, i_start, rates.astype(np.longdouble))
    np.add.at(delta, i_end, -rates.astype(np.longdouble))
    count = np.zeros(len(times), dtype=np.int64)
    np.add.at(count, i_start, 1)
    np.add.at(count, i_end, -1)
    running = np.cumsum(count)[:-1]
    active = running > 0
    summed = np.cumsum(delta)[:-1]
    idle_at = np.where(running == 0, np.arange(len(running)), -1)
    anchor = np.maximum.accumulate(idle_at)
    base = np.where(anchor >= 0, summed[np.clip(anchor, 0, None)], 0.0)
    smallest = float(rates.min()) if len(rates) else 0.0
    weight = np.where(active, np.maximum((summed - base).astype(np.float64), smallest), 0.0)
    j = np.searchsorted(seg_a, t0, side="right") - 1
    billed = (j >= 0) & (t0 < seg_b[np.clip(j, 0, None)]) if len(segments) else \
        np.zeros(len(t0), dtype=np.bool_)
    jj = np.clip(j, 0, None)
    per_s = np.where(billed, np.array([g.per_s for g in segments])[jj] if len(segments)
                     else 0.0, 0.0)
    gpu_s = np.where(billed, np.array([g.gpu_per_s for g in segments])[jj] if len(segments)
                     else 0.0, 0.0)
    # The records' work in each step: the running rates integrated up to every edge.
    work = np.concatenate([[0.0], np.cumsum(weight * dt)])
    at_edges = work[np.searchsorted(times, edges)]
    u = _unattributed_shares(np.diff(at_edges), counter, edges, tolerance)
    n = len(edges) - 1
    step = np.clip(np.searchsorted(edges, t0, side="right") - 1, 0, n - 1)
    share = u[step]
    cost, gpu = per_s * dt, gpu_s * dt
    out.unattributed_cost += math.fsum((cost * share).tolist())
    out.unattributed_gpu_hours += math.fsum((gpu * share).tolist())
    idle = ~active
    out.idle_cost += math.fsum((cost * (1.0 - share))[idle].tolist())
    out.idle_gpu_hours += math.fsum((gpu * (1.0 - share))[idle].tolist())
    safe = np.where(active, weight, 1.0)
    area = np.concatenate([[0.0], np.cumsum(np.where(active, cost * (1.0 - share) / safe,
                                                     0.0))])
    area_gpu = np.concatenate([[0.0], np.cumsum(np.where(active, gpu * (1.0 - share) / safe,
                                                         0.0))])
    paid = rates * (area[i_end] - area[i_start])
    paid_gpu = rates * (area_gpu[i_end] - area_gpu[i_start])
    return keys, paid, paid_gpu


def attribute(
    lo: float,
    hi: float,
    billing: Mapping[str, Sequence[tuple[float, float]]],
    prices: PoolPrices,
    runs: Sequence[Run] | Runs,
    counters: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    *,
    step_s: float = 300.0,
    tolerance: float = 0.05,
) -> Attribution:
    """Attribute one pool's cost over ``[lo, hi]`` (Unix seconds; see the module docstring).

    ``billing``: per replica, the intervals it was billed for. ``runs``: the requests that
    ran on the pool (any part of them in the window counts). ``counters``: per replica, the
    work vLLM's counters gained by each sample ``(t, units)``; None or a missing replica:
    not measured, no unattributed line for it. ``step_s``, ``tolerance``: ``[cost] step`` and
    ``unattributed_tolerance``."""
    out = Attribution()
    arrays = runs if isinstance(runs, Runs) else Runs.of(runs)
    merged = {r: merge_intervals(list(spans), lo, hi) for r, spans in billing.items()}
    merged = {r: spans for r, spans in merged.items() if spans}
    segments = _segments(merged, prices, lo, hi, out)
    inside = np.flatnonzero((arrays.end_s > arrays.start_s) & (arrays.end_s > lo)
                            & (arrays.start_s < hi))
    placed: dict[str, list[tuple[IntArray, FloatArray]]] = {r: [] for r in merged}
    by_name: dict[str, list[int]] = {}
    for i in inside.tolist():
        by_name.setdefault(arrays.replica[i], []).append(i)
    for name, members in by_name.items():
        idx = np.array(members, dtype=np.int64)
        if name in merged:
            placed[name].append((idx, np.ones(len(idx))))
            continue
        # No replica named, or one never billed under that name (a router's address for
        # it): each spread over the replicas that ran meanwhile.
        out.respread_runs += len(idx) if name else 0
        for i in idx.tolist():
            a, b = arrays.start_s[i], arrays.end_s[i]
            places = [r for r, spans in merged.items()
                      if any(x < b and a < y for x, y in spans)]
            if not places:
                out.unbilled_runs += 1
                continue
            for r in places:
                placed[r].append((np.array([i]), np.array([1.0 / len(places)])))
    edges = np.array([lo + k * step_s for k in range(math.ceil((hi - lo) / step_s))] + [hi])
    if len(edges) < 2:
        edges = np.array([lo, hi])
    measured = set()
    paid_keys, paid, paid_gpu = [], [], []
    for replica, parts in placed.items():
        if parts:
            idx = np.concatenate([p[0] for p in parts])
            share = np.concatenate([p[1] for p in parts])
        else:
            idx, share = np.zeros(0, dtype=np.int64), np.zeros(0)
        phases = _phases(arrays, idx, share)
        length = phases.end - phases.start
        known = ~np.isnan(phases.units)
        spent = float(length[known].sum())
        mean = float(phases.units[known].sum()) / spent if spent > 0 else 1.0
        mean = mean if mean > 0 else 1.0
        # A request that ran with no token known still ran: a rate a millionth of the mean
        # keeps it in the split (alone on the replica, it pays the whole moment).
        with np.errstate(invalid="ignore", divide="ignore"):
            phases.rate = np.where(known, np.maximum(phases.units / length, mean * 1e-6), mean)
        counter = None if counters is None else counters.get(replica)
        if counter:
            measured.add(replica)
        keys, c, g = _split(phases, segments[replica], edges, counter, tolerance, lo, hi, out)
        paid_keys.append(keys)
        paid.append(c)
        paid_gpu.append(g)
    out.measured_replicas = frozenset(measured)
    if paid_keys:
        keys = np.concatenate(paid_keys)
        if len(keys):
            # Per key, in one pass: its phases on every replica it ran on.
            found, at = np.unique(keys, return_inverse=True)
            costs = np.bincount(at, weights=np.concatenate(paid), minlength=len(found))
            hours = np.bincount(at, weights=np.concatenate(paid_gpu), minlength=len(found))
            out.cost = dict(zip(found.tolist(), costs.tolist(), strict=True))
            out.gpu_hours = dict(zip(found.tolist(), hours.tolist(), strict=True))
    return out


def cents(amounts: Sequence[float], total: float, unit: float = 0.01) -> list[float]:
    """``amounts`` rounded to ``unit`` so that they add up to ``total`` rounded to ``unit``
    (the largest-remainder method: each rounded down, the cents left over go to the largest
    remainders), as an invoice's lines must."""
    if not amounts:
        return []
    target = round(total / unit)
    floors = [math.floor(a / unit + 1e-9) for a in amounts]
    left = target - sum(floors)
    order = sorted(range(len(amounts)), key=lambda i: -(amounts[i] / unit - floors[i]))
    k = 0
    while left > 0 and order:
        floors[order[k % len(order)]] += 1
        left -= 1
        k += 1
    k = 0
    while left < 0 and order:
        i = order[-1 - (k % len(order))]
        floors[i] -= 1
        left += 1
        k += 1
    return [f * unit for f in floors]
