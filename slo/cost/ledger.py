"""The chargeback of a window: every pool's GPU cost split over (model, tenant, tier), with its
idle and unattributed lines, adding up to the pool's cost to the cent.

``ledger`` reads what ``slo.cost.attribution`` needs: each replica's billed time (its ``up``
samples, ``slo.cost.pool.billed_intervals``), vLLM's token counters per replica, and the
request records of the gateway and of ``[otlp]`` (one table: records from another router
count exactly as the gateway's), from any ``Source``, so the embedded store and a Prometheus
holding the same series give the same figures. Records of every gateway instance are read
together, so what ran on a replica at each moment is every instance's traffic.

A line per ``(pool, model, tenant, tier)`` carries:

* ``cost`` (= ``busy_cost`` + ``idle_cost``, the idle time ``[cost] idle`` allocates to it)
  and ``gpu_hours``; ``cost_cents`` the same rounded so that the pool's lines add up to its
  rounded cost (``attribution.cents``);
* ``requests``: those a replica finished in the window (what vLLM's ``request_success_total``
  counts; a request is counted where it ended), ``cancelled``, ``timed_out``, ``cache_hits``
  and what they saved (``saved``: the cost of the request that filled the entry);
* tokens: ``prompt_tokens``, ``cached_tokens`` (from vLLM's prefix cache), ``output_tokens``;
* ``slo_judged`` / ``slo_met``: of the requests a replica served (cancellations left out),
  those that met every SLO of their pool (``slo.objectives.sli.request_met_slos``).

Besides the tenants' lines, a pool has an ``idle`` line (tenant ``(idle)``: billed time with
nothing running, unused reservations; what ``[cost] idle`` leaves unallocated) and an
``unattributed`` line (tenant ``(unattributed)``: traffic vLLM counted that no record
knows). A request that started before the window pays only for its part inside it.

Units: Unix seconds, the ``[cost] currency``, GPU-hours, tokens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from slo.cost.attribution import Attribution, Runs, attribute, cents
from slo.cost.pool import billed_intervals, reached_engine, samples_between
from slo.cost.prices import pool_prices
from slo.objectives.sli import replica_label, replica_of, request_met_slos, vllm_matchers
from slo.objectives.spec import SloSpec, effective_slos
from slo.promql.tracks import Grid
from slo.sources.protocol import RangeSource, RequestLog, Source
from vigil.config import Config, PoolConfig
from vigil.conventions import (
    ERROR_CLIENT_CANCEL,
    ERROR_TIMEOUT,
    TOKENS_UNKNOWN,
    VLLM_GENERATION_TOKENS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PROMPT_TOKENS,
)
from vigil.errors import ArgumentError
from vigil.model import RequestRecord

__all__ = [
    "GROUPINGS",
    "IDLE_TENANT",
    "RECORD_MARGIN_S",
    "UNATTRIBUTED_TENANT",
    "Ledger",
    "Line",
    "PoolLedger",
    "chunk_bounds",
    "group_lines",
    "ledger",
    "line_figures",
    "top_tenants",
]

#: The tenant of a pool's idle line and of its unattributed line.
IDLE_TENANT = "(idle)"
UNATTRIBUTED_TENANT = "(unattributed)"
#: What a report can group by, in the order a line's key holds them.
GROUPINGS = ("pool", "model", "tenant", "tier")
#: How long after the window its records are still read (seconds): a request that ran in the
#: window and ended after it pays for its part inside (the gateway's timeouts are far shorter).
RECORD_MARGIN_S = 3600.0


@dataclass
class Line:
    """One ``(pool, model, tenant, tier)`` of the window (see the module docstring)."""

    pool: str
    model: str
    tenant: str
    tier: str
    cost: float = 0.0
    busy_cost: float = 0.0
    idle_cost: float = 0.0
    cost_cents: float = 0.0
    gpu_hours: float = 0.0
    requests: int = 0
    cancelled: int = 0
    timed_out: int = 0
    cache_hits: int = 0
    saved: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    slo_judged: int = 0
    slo_met: int = 0

    def add(self, other: Line) -> None:
        """Add ``other``'s figures to this line's."""
        for f in fields(self):
            if f.name not in GROUPINGS:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class PoolLedger:
    """One pool's totals and how they reconcile: ``cost`` = ``tenants_cost`` + ``idle_cost``
    + ``unattributed_cost`` (``idle_allocated`` is inside ``tenants_cost``)."""

    pool: str
    cost: float | None
    gpu_hours: float | None
    tenants_cost: float = 0.0
    idle_cost: float = 0.0
    idle_allocated: float = 0.0
    unused_reserved_cost: float = 0.0
    unattributed_cost: float = 0.0
    #: False when no replica's counters were read (the unattributed line is not measured).
    unattributed_measured: bool = False
    #: Requests while none of the pool's replicas was billed; records naming a replica
    #: never billed under that name (spread over those that ran).
    unbilled_runs: int = 0
    respread_runs: int = 0


@dataclass
class Ledger:
    """The chargeback of ``(start_s, end_s]``: lines and per-pool totals."""

    start_s: float
    end_s: float
    currency: str
    lines: list[Line] = field(default_factory=list)
    pools: list[PoolLedger] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _runs(records: Sequence[RequestRecord], config: Config) -> Runs:
    """Each record's time on its replica (``slo.cost.attribution.Runs``), keyed by its index:
    from its arrival there (after the gateway's admission wait) to its end, its first token,
    and its prefill and decode work (decode steps; NaN when its token counts are unknown).
    Records that never ran on a replica are left out."""
    c = config.cost
    nan = math.nan
    keys, replicas, rows = [], [], []
    for i, r in enumerate(records):
        if not reached_engine(r) or r.e2e_s is None or not math.isfinite(r.e2e_s):
            continue
        keys.append(i)
        replicas.append(r.replica)
        untold = r.tokens_source == TOKENS_UNKNOWN or (r.prompt_tokens == 0
                                                       and r.generated_tokens == 0)
        rows.append((r.ts_s, r.e2e_s, max(r.queue_s, 0.0),
                     nan if r.ttft_s is None else r.ttft_s, float(r.prompt_tokens),
                     float(r.cached_tokens or 0), float(r.generated_tokens),
                     1.0 if untold else 0.0))
    a = np.array(rows, dtype=np.float64).reshape(len(rows), 8)
    end, e2e, queue, ttft, prompt, cached, generated, unknown = a.T
    begin = end - e2e
    cached = np.clip(cached, 0.0, prompt)
    pre = (prompt - cached) * c.prefill_token_weight + cached * c.cached_token_weight
    return Runs(np.array(keys, dtype=np.int64), replicas, np.minimum(begin + queue, end),
                begin + ttft, end, np.where(unknown > 0, nan, pre),
                np.where(unknown > 0, nan, generated))


def _counter_work(source: Source, config: Config, pool: PoolConfig, lo: float, hi: float
                  ) -> dict[str, list[tuple[float, float]]]:
    """Per replica, the work vLLM's counters gained in each ``[cost] step`` of ``(lo, hi]``
    ``(step end, units)``: computed prompt tokens, prefix-cache hits and output tokens at
    their weights. One range query per counter (its value at each step's end); a source
    without range queries is read sample by sample. A counter that went down restarted: its
    new value is what it gained."""
    c = config.cost
    weights = {VLLM_PROMPT_TOKENS: c.prefill_token_weight, VLLM_GENERATION_TOKENS: 1.0,
               VLLM_PREFIX_CACHE_HITS: c.cached_token_weight - c.prefill_token_weight}
    m = vllm_matchers(pool, source)
    label = replica_label(pool, source)
    work: dict[str, dict[float, float]] = {}
    if isinstance(source, RangeSource):
        # Each counter's value at every step's end (its last sample, as an instant query
        # reads it): the differences are exactly what it counted in each step, without
        # increase()'s extrapolation, which would add up to a twentieth to a step's jump.
        full = math.floor((hi - lo) / c.step + 1e-9)
        grid = Grid(round(lo * 1000), round(c.step * 1000), full + 1)
        ends = [lo + k * c.step for k in range(full + 1)]
        last = hi if hi - ends[-1] > 1e-6 else None  # a shorter last step ends at hi
        for name, weight in weights.items():
            tail = source.instant(name, m, last) if last is not None else {}
            for labels, track in source.instant_range(name, m, grid).items():
                per = work.setdefault(replica_of(labels, label), {})
                prev = None
                values = track.values.tolist()
                there = track.present.tolist()
                if last is not None:
                    values.append(tail.get(labels, math.nan))
                    there.append(labels in tail)
                for t, value, present in zip([*ends, *([last] if last else [])], values,
                                             there, strict=True):
                    if not (present and math.isfinite(value)):
                        prev = None
                        continue
                    if prev is not None:
                        gained = value - prev if value >= prev else value
                        per[t] = per.get(t, 0.0) + gained * weight
                    prev = value
        return {r: [(t, max(0.0, w)) for t, w in sorted(per.items())]
                for r, per in work.items() if per}
    for name, weight in weights.items():
        read = samples_between(source, name, m, lo - c.step, hi + config.engine.lookback)
        for labels, points in read.items():
            per = work.setdefault(replica_of(labels, label), {})
            prev = None
            for p in points:
                if p.value is None or not math.isfinite(p.value):
                    continue
                if prev is not None:
                    gained = p.value - prev if p.value >= prev else p.value
                    per[p.ts_ms / 1000.0] = per.get(p.ts_ms / 1000.0, 0.0) + gained * weight
                prev = p.value
    return {r: [(t, max(0.0, w)) for t, w in sorted(per.items())]
            for r, per in work.items() if per}


def _key(r: RequestRecord) -> tuple[str, str, str, str]:
    return (r.pool, r.model, r.tenant or "", r.tier or "")


def _pool_lines(config: Config, pool: PoolConfig, records: Sequence[RequestRecord],
                att: Attribution, specs: Sequence[SloSpec], lo: float, hi: float
                ) -> dict[tuple[str, str, str, str], Line]:
    lines: dict[tuple[str, str, str, str], Line] = {}
    for i, r in enumerate(records):
        k = _key(r)
        line = lines.get(k)
        if line is None:
            line = lines[k] = Line(*k)
        line.busy_cost += att.cost.get(i, 0.0)
        line.gpu_hours += att.gpu_hours.get(i, 0.0)
        if not lo < r.ts_s <= hi:
            continue  # counted in the window it ended in
        if r.cache_hit:
            line.cache_hits += 1
            if r.saved_usd is not None and math.isfinite(r.saved_usd):
                line.saved += r.saved_usd
            continue
        if not reached_engine(r):
            continue
        line.prompt_tokens += r.prompt_tokens
        line.cached_tokens += r.cached_tokens or 0
        line.output_tokens += r.generated_tokens
        if r.error_class == ERROR_CLIENT_CANCEL:
            line.cancelled += 1
            continue
        if r.error_class == ERROR_TIMEOUT:
            line.timed_out += 1
        else:
            line.requests += 1
        line.slo_judged += 1
        line.slo_met += request_met_slos(r, specs)
    return lines


def _allocate_idle(config: Config, lines: Iterable[Line], idle: float) -> float:
    """Allocate ``idle`` over ``lines`` as ``[cost] idle`` says, in proportion to their busy
    cost; returns what is left unallocated (all of it for ``platform``, or when no line
    can carry it)."""
    policy = config.cost.idle
    if policy == "platform" or idle <= 0:
        return idle
    takers = [ln for ln in lines
              if ln.busy_cost > 0 and (policy == "pro_rata" or ln.tier in config.cost.idle_tiers)]
    base = math.fsum(ln.busy_cost for ln in takers)
    if base <= 0:
        return idle
    for ln in takers:
        ln.idle_cost += idle * ln.busy_cost / base
    return 0.0


def chunk_bounds(start_s: float, end_s: float, step_s: float) -> list[float]:
    """``start_s``, then every whole number of steps in a day after it, then ``end_s``: the
    spans a long window is attributed in (about a day each, a whole number of ``[cost]
    step``s, so that each span's steps are the window's). Attribution is additive over
    spans cut so; a span at a time bounds the records held in memory to a day's."""
    chunk = step_s * max(1, math.floor(86400.0 / step_s))
    cuts = [start_s]
    while cuts[-1] + chunk < end_s:
        cuts.append(cuts[-1] + chunk)
    return [*cuts, end_s]


def _merge(into: Attribution, part: Attribution) -> None:
    """Add ``part``'s totals to ``into`` (the per-request figures are summed in the lines)."""
    for name in ("idle_cost", "idle_gpu_hours", "unused_reserved_cost", "unattributed_cost",
                 "unattributed_gpu_hours", "total_cost", "total_gpu_hours", "unbilled_runs",
                 "respread_runs"):
        setattr(into, name, getattr(into, name) + getattr(part, name))
    into.measured_replicas = into.measured_replicas | part.measured_replicas


def _attribute_pool(source: Source, config: Config, pool: PoolConfig,
                    request_log: RequestLog | None, specs: Sequence[SloSpec], start_s: float,
                    end_s: float) -> tuple[Attribution, dict[tuple[str, str, str, str], Line],
                                           bool]:
    """One pool over ``(start_s, end_s]``, a day-long span at a time (``chunk_bounds``): the
    summed attribution, the lines before idle allocation, and whether any replica was
    billed."""
    total = Attribution()
    lines: dict[tuple[str, str, str, str], Line] = {}
    billed = False
    prices = pool_prices(config, pool)
    for lo, hi in itertools.pairwise(chunk_bounds(start_s, end_s, config.cost.step)):
        billing = billed_intervals(source, config, pool, lo, hi)
        billed = billed or bool(billing)
        records: list[RequestRecord] = []
        if request_log is not None:
            records = list(request_log.records(pool.name, hi + RECORD_MARGIN_S,
                                               hi + RECORD_MARGIN_S - lo))
        runs = _runs(records, config)
        counters = _counter_work(source, config, pool, lo, hi)
        att = attribute(lo, hi, billing, prices, runs, counters, step_s=config.cost.step,
                        tolerance=config.cost.unattributed_tolerance)
        _merge(total, att)
        for key, line in _pool_lines(config, pool, records, att, specs, lo, hi).items():
            if key in lines:
                lines[key].add(line)
            else:
                lines[key] = line
    return total, lines, billed


def ledger(source: Source, config: Config, request_log: RequestLog | None, start_s: float,
           end_s: float, pools: Sequence[str] | None = None) -> Ledger:
    """The chargeback of ``(start_s, end_s]`` for ``pools`` (default every pool)."""
    out = Ledger(start_s, end_s, config.cost.currency)
    specs = effective_slos(config)
    for pool in config.pools:
        if pools is not None and pool.name not in pools:
            continue
        att, lines, billed = _attribute_pool(source, config, pool, request_log, specs,
                                             start_s, end_s)
        if not billed:
            out.pools.append(PoolLedger(pool.name, None, None))
            if lines:
                out.lines.extend(lines.values())
                out.warnings.append(f"pool {pool.name}: requests but no replica billed in the "
                                    "window (no up samples): no cost to split")
            continue
        left = _allocate_idle(config, lines.values(), att.idle_cost)
        pl = PoolLedger(pool.name, att.total_cost, att.total_gpu_hours,
                        idle_cost=left, idle_allocated=att.idle_cost - left,
                        unused_reserved_cost=att.unused_reserved_cost,
                        unattributed_cost=att.unattributed_cost,
                        unattributed_measured=bool(att.measured_replicas),
                        unbilled_runs=att.unbilled_runs, respread_runs=att.respread_runs)
        idle_hours = att.idle_gpu_hours * (left / att.idle_cost if att.idle_cost else 1.0)
        allocated_hours = att.idle_gpu_hours - idle_hours
        for ln in lines.values():
            ln.cost = ln.busy_cost + ln.idle_cost
            if ln.idle_cost and att.idle_cost:
                ln.gpu_hours += allocated_hours * ln.idle_cost / (att.idle_cost - left)
        extra = [Line(pool.name, pool.model, IDLE_TENANT, "", cost=left, idle_cost=left,
                      gpu_hours=idle_hours),
                 Line(pool.name, pool.model, UNATTRIBUTED_TENANT, "",
                      cost=att.unattributed_cost, busy_cost=att.unattributed_cost,
                      gpu_hours=att.unattributed_gpu_hours)]
        pool_lines = [*sorted(lines.values(), key=lambda x: (x.model, x.tenant, x.tier)), *extra]
        for ln, c in zip(pool_lines, cents([ln.cost for ln in pool_lines], att.total_cost),
                         strict=True):
            ln.cost_cents = c
        pl.tenants_cost = math.fsum(ln.cost for ln in lines.values())
        out.pools.append(pl)
        out.lines.extend(pool_lines)
        if att.respread_runs:
            out.warnings.append(f"pool {pool.name}: {att.respread_runs} request(s) name a replica "
                                "never billed under that name; spread over the replicas that ran")
        if not att.measured_replicas:
            out.warnings.append(f"pool {pool.name}: no vLLM token counters read; traffic "
                                "around the gateway is not measured")
    return out


def group_lines(lines: Iterable[Line], by: Sequence[str]) -> list[Line]:
    """``lines`` summed per value of the ``by`` groupings (of ``GROUPINGS``); the others are
    "" in the result. Ordered by cost, highest first."""
    unknown = [b for b in by if b not in GROUPINGS]
    if unknown:
        raise ArgumentError(f"cannot group by {', '.join(unknown)}: one of "
                         f"{', '.join(GROUPINGS)}")
    out: dict[tuple[str, ...], Line] = {}
    for ln in lines:
        key = tuple(getattr(ln, g) if g in by else "" for g in GROUPINGS)
        acc = out.get(key)
        if acc is None:
            acc = out[key] = Line(pool=key[0], model=key[1], tenant=key[2], tier=key[3])
        acc.add(ln)
    return sorted(out.values(), key=lambda x: (-x.cost_cents, -x.cost,
                                               tuple(getattr(x, g) for g in GROUPINGS)))


def _ratio(num: float, den: float, unit: float = 1.0) -> float | None:
    """``num / den × unit``; None without a denominator (absent, never 0 or NaN)."""
    return num / den * unit if den > 0 else None


def line_figures(line: Line) -> dict[str, object]:
    """A line as a report shows it: its groupings, cost (``cost`` rounded to the cent so that
    a pool's lines add up, ``cost_exact`` unrounded), GPU-hours, counts and tokens, and the
    derived figures (None when their denominator is 0): ``per_1000_requests``,
    ``per_million_output_tokens``, ``slo_met_share`` (0-1) and ``per_slo_met_request`` (what a
    good answer cost)."""
    return {
        **{g: getattr(line, g) for g in GROUPINGS},
        "cost": round(line.cost_cents, 2),
        "cost_exact": line.cost,
        "busy_cost": line.busy_cost,
        "idle_cost": line.idle_cost,
        "gpu_hours": line.gpu_hours,
        "requests": line.requests,
        "cancelled": line.cancelled,
        "timed_out": line.timed_out,
        "cache_hits": line.cache_hits,
        "saved": line.saved,
        "prompt_tokens": line.prompt_tokens,
        "cached_tokens": line.cached_tokens,
        "output_tokens": line.output_tokens,
        "per_1000_requests": _ratio(line.cost, line.requests, 1000.0),
        "per_million_output_tokens": _ratio(line.cost, line.output_tokens, 1e6),
        "slo_met_share": _ratio(line.slo_met, line.slo_judged),
        "per_slo_met_request": _ratio(line.cost, line.slo_met),
    }


def top_tenants(lines: Iterable[Line], n: int, other: str) -> list[tuple[str, str, float]]:
    """``(tenant, pool, cost)`` per pool for the ``n`` tenants that cost most over ``lines``
    (ties by name), the others summed as ``other``; the idle and unattributed lines kept as
    their own, so that each pool's figures still add up to its cost. Bounds the tenant
    labels of ``/metrics``."""
    per: dict[tuple[str, str], float] = {}
    totals: dict[str, float] = {}
    for ln in lines:
        per[(ln.tenant, ln.pool)] = per.get((ln.tenant, ln.pool), 0.0) + ln.cost
        if ln.tenant not in (IDLE_TENANT, UNATTRIBUTED_TENANT):
            totals[ln.tenant] = totals.get(ln.tenant, 0.0) + ln.cost
    kept = {t for t, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]}
    out: dict[tuple[str, str], float] = {}
    for (tenant, pool), cost in per.items():
        name = tenant if tenant in kept or tenant in (IDLE_TENANT, UNATTRIBUTED_TENANT) else other
        out[(name, pool)] = out.get((name, pool), 0.0) + cost
    return [(t, p, c) for (t, p), c in sorted(out.items())]
