"""What-if: the same backtest over other objectives, thresholds and alert tables, side by
side, with what meeting each would have cost.

For every SLO and every variant (each ``objective`` × each ``threshold`` for a latency SLO;
the configured values when none are given), under the configured alert table and each other
table given (``AlertTable``: other windows and factors), one row: pages and tickets per 30
days, missed burns, the median detection delay, the budget left at the end, and — for a
latency SLO of a pool with a capacity profile (saved, observed or estimated:
``slo.planning.candidates``) — the cheapest configuration the planner finds that serves the
pool's traffic (forecast from the same history) within this variant and the pool's other
latency SLOs: its replicas at the peak and its GPU cost per month. An objective changes the
budget, not the error ratio, so the ratios are computed once per threshold and window,
whatever the table that asks for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slo.backtest.run import (
    DEFAULT_MISSED_SHARE,
    DEFAULT_QUIET_SHARE,
    SloBacktest,
    backtest_slo,
)
from slo.backtest.sli import sli_tracks
from slo.objectives.burn_rate import burn_windows, slo_burn_alerts
from slo.objectives.spec import SloSpec, effective_slos
from slo.planning.plan import plan, required_slos
from slo.promql.tracks import Grid, Track
from slo.sources.protocol import RangeSource, RequestLog, Source
from vigil.capacity import CapacityProfile, SloTarget
from vigil.config import BurnRateAlert, Config, PoolConfig
from vigil.errors import ConfigError

__all__ = ["CONFIGURED_TABLE", "AlertTable", "Costing", "WhatIfRow", "costing_for", "variants",
           "what_if"]

#: The name of the config's own alert table in the what-if rows.
CONFIGURED_TABLE = "configured"


@dataclass(frozen=True)
class AlertTable:
    """An alert table to judge the variants with: ``[engine] burn_rate_alerts`` rows under a
    name (a file's stem)."""

    name: str
    rows: tuple[BurnRateAlert, ...]


@dataclass(frozen=True)
class WhatIfRow:
    """One variant of one SLO, backtested (``result``), and its cost (``cost``: the cheapest
    plan's figures, or ``None`` with ``cost_note`` saying why)."""

    spec: SloSpec
    result: SloBacktest
    cost: dict[str, Any] | None
    cost_note: str | None
    table: str = CONFIGURED_TABLE

    def to_dict(self, span_s: float) -> dict[str, Any]:
        doc = self.result.to_dict(span_s)
        return {
            "alert_table": self.table,
            "objective": self.spec.objective,
            "threshold_seconds": self.spec.threshold_seconds,
            "per_30_days": doc["per_30_days"],
            "missed_burns": len(doc["missed_burns"]),
            "median_detection_delay_seconds": doc["median_detection_delay_seconds"],
            "budget_remaining": doc["budget_remaining"],
            "cost": self.cost,
            "cost_note": self.cost_note,
        }


def variants(spec: SloSpec, objectives: Sequence[float],
             thresholds: Sequence[float]) -> list[SloSpec]:
    """The configured ``spec`` first, then each objective × each threshold (a latency SLO's
    only; the configured value stands in for an empty list), each variant once."""
    objs = list(objectives) or [spec.objective]
    ths = list(thresholds) if spec.is_latency and thresholds else [spec.threshold_seconds]
    out = [spec]
    for o in objs:
        for t in ths:
            v = dataclasses.replace(spec, objective=o, threshold_seconds=t)
            if v not in out:
                out.append(v)
    return out


@dataclass
class Costing:
    """What pricing a variant needs per pool: the traffic forecast from the history and the
    capacity profiles (``None`` with a note when there are none)."""

    traffic: Any
    candidates: Sequence[CapacityProfile]
    note: str | None = None


def costing_for(config: Config, pool: PoolConfig, source: Source, start_s: float,
                end_s: float) -> Costing:
    """What the cost column needs for ``pool``, as ``vigil plan`` gathers it: the traffic
    forecast from the history ending at ``end_s`` (its last 7 whole days at most, at least
    one) and the capacity profiles (saved, observed, estimated); a note instead when either
    is missing or the saved profiles cannot be read."""
    from slo.planning import estimate
    from slo.planning.candidates import gather_candidates
    from slo.planning.forecast import SECONDS_PER_DAY, forecast_from_history

    days = max(1, min(7, int((end_s - start_s) // SECONDS_PER_DAY)))
    try:
        traffic = forecast_from_history(source, config, pool, end_s, days)
        candidates, _ = gather_candidates(config, pool, source=source, at_s=end_s,
                                          span_s=days * SECONDS_PER_DAY, estimator=estimate)
    except ValueError as exc:
        return Costing(None, (), f"no traffic to plan for: {exc}")
    except ConfigError as exc:
        return Costing(None, (), f"the saved capacity profiles cannot be read: {exc}")
    return Costing(traffic, candidates)


def _cost(config: Config, pool: PoolConfig, spec: SloSpec,
          costing: Costing | None) -> tuple[dict[str, Any] | None, str | None]:
    if not spec.is_latency:
        return None, "the planner sizes for latency SLOs only"
    if costing is None or costing.note is not None or not costing.candidates:
        return None, (costing.note if costing is not None and costing.note
                      else "no capacity profile for this pool")
    required = [t for t in required_slos(config, pool) if t.name != spec.name]
    required.append(SloTarget(name=spec.name, indicator=spec.indicator,  # type: ignore[arg-type]
                              threshold_seconds=float(spec.threshold_seconds or 0.0),
                              objective=spec.objective))
    result = plan(config, pool, costing.traffic, costing.candidates, required=required)
    meeting = [c for c in result.candidates if c.meets_slo]
    if not meeting:
        return None, "no capacity profile meets this SLO (none was measured against one as strict)"
    best = meeting[0]
    return {
        "configuration": best.profile.identity.label(),
        "basis": best.basis,
        "peak_replicas": best.peak_replicas,
        "gpu_cost_per_month_usd": best.cost_per_month_usd,
        "cost_per_1000_requests_usd": best.cost_per_1000_requests,
    }, None


def _with_table(config: Config, rows: Sequence[BurnRateAlert]) -> Config:
    return config.model_copy(update={"engine": config.engine.model_copy(
        update={"burn_rate_alerts": list(rows)})})


def what_if(config: Config, source: RangeSource, grid: Grid, *,
            objectives: Sequence[float] = (), thresholds: Sequence[float] = (),
            tables: Sequence[AlertTable] = (),
            costings: dict[str, Costing] | None = None,
            missed_share: float = DEFAULT_MISSED_SHARE,
            quiet_share: float = DEFAULT_QUIET_SHARE,
            request_log: RequestLog | None = None,
            slos: Sequence[SloSpec] | None = None) -> dict[str, list[WhatIfRow]]:
    """Per SLO (default: the config's), one backtested row per variant and alert table (the
    configured one first, then ``tables``), over ``grid``. ``costings``: per pool name, what
    the cost column needs (absent: no cost)."""
    judged = [(CONFIGURED_TABLE, config), *((t.name, _with_table(config, t.rows))
                                             for t in tables)]
    out: dict[str, list[WhatIfRow]] = {}
    for spec in (slos if slos is not None else effective_slos(config)):
        pool = config.pool(spec.pool)
        # Error ratio per threshold and window: the same whatever the objective or table.
        cached: dict[float | None, dict[float, Track]] = {}
        rows = []
        for name, cfg in judged:
            for v in variants(spec, objectives, thresholds):
                have = cached.setdefault(v.threshold_seconds, {})
                windows = burn_windows(slo_burn_alerts(cfg.engine.burn_rate_alerts,
                                                       v.period_s))
                missing = [w for w in windows if w not in have]
                if missing:
                    have.update(sli_tracks(v, source, grid, missing, request_log=request_log))
                result = backtest_slo(v, cfg, source, grid, missed_share=missed_share,
                                      quiet_share=quiet_share, request_log=request_log,
                                      ratios={w: have[w] for w in windows})
                cost, note = _cost(config, pool, v, (costings or {}).get(spec.pool))
                rows.append(WhatIfRow(v, result, cost, note, name))
        out[spec.name] = rows
    return out
