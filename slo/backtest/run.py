"""``backtest``: the generated burn-rate alerts replayed over a history, per SLO.

At every instant of the rules' evaluation grid (``[rules] interval``, aligned to the epoch)
from ``start`` to ``end``, each SLO's error ratio over every window of the alert table is the
engine's (``slo.backtest.sli``), and ``ErrorBudgetBurn`` of each severity fires exactly where
the generated rule would: the rule has no ``for``, so its state at an instant is its
expression's value there. Prometheus evaluates the SLI recording rules and the alert rules in
groups of their own, each at its own offset inside the interval; ``promtool test rules``
evaluates them all at the same instants, and so does the backtest.

Budget arithmetic (ratios of the period's budget, 1 = all of it):

* **consumed** over ``(a, b]`` = burn rate over that span × its length / period: the SRE
  workbook's measure (14.4 for an hour spends 2 % of a 30-day budget), the one the alert
  factors are derived from;
* **budget remaining** at ``t`` = ``1 - error_ratio(period ending at t) / (1 - objective)``, as
  ``vigil slo status`` reports it.

What the report holds per SLO: every alert (severity, start, resolved time or ``None`` while
still firing at the end, peak burn rate over the severity's shortest window, budget consumed
while it fired, detection delay), the fast burns nothing caught that consumed at least
``missed_share`` of the budget, the alerts during which less than ``quiet_share`` burned, and
the budget left at the end of each period counted back from ``end``.

**Read from the store's recorded series.** Reading a Prometheus-compatible store whose ruler
ran the generated rules over the whole history (``[engine] recorded_rules = "auto"``), an
SLO's ratios per window are the series it recorded (``slo.objectives.recorded.recorded_tracks``):
the replay then shows what the store's own alerts saw, at the cost of one range query per
window instead of a month of raw samples. Otherwise, and for the spans the budget figures
need (arbitrary ``(a, b]``), raw series as above; each SLO's ``read`` says which.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from slo.backtest.episodes import burn_runs, onset, row_firing, runs
from slo.backtest.sli import sli_tracks
from slo.objectives.burn_rate import (
    SloBurnAlert,
    budget_remaining,
    burn_rate,
    burn_windows,
    slo_burn_alerts,
)
from slo.objectives.recorded import RangeQuerySource, recordable, recorded_tracks
from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec, effective_slos
from slo.promql.lookup import FloatArray
from slo.promql.tracks import Grid, Track
from slo.sources.protocol import RangeSource, RequestLog, is_external, source_kind
from vigil.config import Config
from vigil.durations import format_duration

__all__ = [
    "DEFAULT_MISSED_SHARE",
    "DEFAULT_QUIET_SHARE",
    "AlertEpisode",
    "Backtest",
    "MissedBurn",
    "SloBacktest",
    "backtest",
    "backtest_slo",
    "budget_consumed",
]

#: A fast burn nothing caught is reported when it consumed at least this share of the
#: period's budget: half of what the workbook lets a ticket's 3-day window spend (10 %).
DEFAULT_MISSED_SHARE = 0.05
#: An alert during which less than this share of the budget burned is flagged as quiet
#: (0.1 %: a page's 1-hour row spends 2 %).
DEFAULT_QUIET_SHARE = 0.001
#: Days the per-30-days rates are scaled to.
_MONTH_S = 30 * 86400.0


@dataclass(frozen=True)
class AlertEpisode:
    """One firing of ``ErrorBudgetBurn`` of one severity: Unix seconds; ``end`` the
    resolved time (``None``: still firing at the end of the history); ``budget_consumed``
    a ratio of the period's budget; ``detection_delay_s`` ``None`` when the shortest window
    never burned above the firing row's factor before the start, or already did at the first
    instant of the history (the burn began before it)."""

    severity: str
    start: float
    end: float | None
    peak_burn_rate: float | None
    budget_consumed: float | None
    detection_delay_s: float | None
    factor: float
    long_window: float
    short_window: float
    quiet: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "start": self.start,
            "end": self.end,
            "peak_burn_rate": self.peak_burn_rate,
            "budget_consumed": self.budget_consumed,
            "detection_delay_seconds": self.detection_delay_s,
            "row": {"factor": self.factor, "long_window": format_duration(self.long_window),
                    "short_window": format_duration(self.short_window)},
            "quiet": self.quiet,
        }


@dataclass(frozen=True)
class MissedBurn:
    """A stretch (Unix seconds) in which the budget burned faster than the period allows
    while no alert fired, and what it consumed (ratio of the period's budget)."""

    start: float
    end: float
    budget_consumed: float
    peak_burn_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "budget_consumed": self.budget_consumed,
                "peak_burn_rate": self.peak_burn_rate}


@dataclass(frozen=True)
class SloBacktest:
    """One SLO over the history. ``firing`` maps each severity to its state at every
    instant of the grid; ``burn`` the burn rate over the shortest window there (NaN: no
    data); ``periods`` ``(start, end, budget remaining)`` back from the end."""

    spec: SloSpec
    rows: tuple[SloBurnAlert, ...]
    alerts: list[AlertEpisode]
    missed_burns: list[MissedBurn]
    budget_remaining: float | None
    periods: list[tuple[float, float, float | None]]
    base_window_s: float
    burn: FloatArray = field(repr=False)
    firing: dict[str, np.ndarray] = field(repr=False)
    ratios: dict[float, Track] = field(repr=False, default_factory=dict)
    #: "recorded": the ratios are the store's recorded series; "raw": computed from raw
    #: series, ``read_reason`` saying why when the store's could have been read.
    read: str = "raw"
    read_reason: str = ""

    def count(self, severity: str) -> int:
        """Alerts of ``severity``."""
        return sum(1 for a in self.alerts if a.severity == severity)

    def median_detection_delay(self) -> float | None:
        """Median detection delay of the alerts that have one (seconds)."""
        delays = [a.detection_delay_s for a in self.alerts if a.detection_delay_s is not None]
        return statistics.median(delays) if delays else None

    def to_dict(self, span_s: float) -> dict[str, Any]:
        s = self.spec
        scale = _MONTH_S / span_s if span_s > 0 else math.nan
        severities = list(dict.fromkeys(r.severity for r in self.rows))
        return {
            "pool": s.pool,
            "model": s.model,
            "endpoint": s.endpoint,
            "indicator": s.indicator,
            "objective": s.objective,
            "threshold_seconds": s.threshold_seconds,
            "period": format_duration(s.period_s),
            "alerts": [a.to_dict() for a in self.alerts],
            "missed_burns": [m.to_dict() for m in self.missed_burns],
            "quiet_alerts": sum(1 for a in self.alerts if a.quiet),
            "budget_remaining": self.budget_remaining,
            "periods": [{"start": a, "end": b, "budget_remaining": r}
                        for a, b, r in self.periods],
            "per_30_days": {sev: _finite(self.count(sev) * scale) for sev in severities},
            "median_detection_delay_seconds": self.median_detection_delay(),
            "read": self.read,
            "read_reason": self.read_reason or None,
        }


@dataclass(frozen=True)
class Backtest:
    """Every SLO over one history (Unix seconds, the evaluation grid's first and last
    instants)."""

    start: float
    end: float
    interval_s: float
    source: str
    slos: list[SloBacktest]
    grid: Grid = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``vigil slo backtest --json``."""
        span = self.end - self.start + self.interval_s
        return {
            "from": self.start,
            "to": self.end,
            "interval_seconds": self.interval_s,
            "evaluations": self.grid.n,
            "source": self.source,
            "slos": {r.spec.name: r.to_dict(span) for r in self.slos},
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def budget_consumed(spec: SloSpec, source: RangeSource, start_s: float, end_s: float, *,
                    request_log: RequestLog | None = None) -> float | None:
    """Share of the period's budget spent over ``(start_s, end_s]``: the burn rate over that
    span × its length / the period; ``None`` without data or without a budget."""
    span = end_s - start_s
    if span <= 0:
        return None
    ratio = error_ratio(spec, source, end_s, span, request_log=request_log).error_ratio
    burn = burn_rate(ratio, spec.objective)
    return None if burn is None else burn * span / spec.period_s


def _peak(values: FloatArray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def backtest_slo(spec: SloSpec, config: Config, source: RangeSource, grid: Grid, *,
                 missed_share: float = DEFAULT_MISSED_SHARE,
                 quiet_share: float = DEFAULT_QUIET_SHARE,
                 request_log: RequestLog | None = None,
                 ratios: dict[float, Track] | None = None) -> SloBacktest:
    """One SLO over ``grid``. ``ratios``: its error ratio per window when already known (an
    objective changes the budget, not the ratio: the what-if reuses them)."""
    rows = tuple(slo_burn_alerts(config.engine.burn_rate_alerts, spec.period_s))
    windows = burn_windows(rows)
    base = windows[0]
    if ratios is None:
        ratios = sli_tracks(spec, source, grid, windows, request_log=request_log)
    budget = spec.error_budget
    with np.errstate(all="ignore"):
        burns = {w: (t.values / budget if budget > 0 else np.full(grid.n, np.nan))
                 for w, t in ratios.items()}
    step_s = grid.step_ms / 1000
    instants = grid.instants_ms() / 1000
    firing: dict[str, np.ndarray] = {}
    episodes: list[AlertEpisode] = []
    for severity in dict.fromkeys(r.severity for r in rows):
        mine = [r for r in rows if r.severity == severity]
        per_row = [row_firing(burns[r.long_window], burns[r.short_window], r.factor)
                   for r in mine]
        state = np.logical_or.reduce(per_row)
        firing[severity] = state
        watched = min(r.short_window for r in mine)
        for a, b in runs(state):
            row_i = next(i for i, f in enumerate(per_row) if f[a])
            row = mine[row_i]
            end = float(instants[b]) if b < grid.n else None
            # Still firing at the end: counted up to the history's last instant, not beyond.
            span_end = end if end is not None else float(instants[-1])
            # The span opens one interval before the first firing evaluation: the
            # evaluation before it saw nothing to fire on.
            consumed = budget_consumed(spec, source, float(instants[a]) - step_s, span_end,
                                       request_log=request_log)
            earliest = max(0, a - int(row.long_window // step_s))
            begun = onset(burns[base], row.factor, a, earliest)
            if begun == 0:
                begun = None  # burning since before the history began: the onset is unknown
            episodes.append(AlertEpisode(
                severity=severity, start=float(instants[a]), end=end,
                peak_burn_rate=_peak(burns[watched][a:b]),
                budget_consumed=consumed,
                detection_delay_s=None if begun is None else float(instants[a] - instants[begun]),
                factor=row.factor, long_window=row.long_window, short_window=row.short_window,
                # One still firing at the end of the history is not judged yet.
                quiet=end is not None and consumed is not None and consumed < quiet_share,
            ))
    episodes.sort(key=lambda e: (e.start, e.severity))
    quiet = ~np.logical_or.reduce(list(firing.values())) if firing else np.ones(grid.n, bool)
    merge = max(1, int(min(r.long_window for r in rows) // step_s)) if rows else 1
    missed: list[MissedBurn] = []
    for a, b in burn_runs(burns[base], quiet, merge):
        start = float(instants[a]) - base
        end = float(instants[b - 1])
        consumed = budget_consumed(spec, source, start, end, request_log=request_log)
        if consumed is not None and consumed >= missed_share:
            missed.append(MissedBurn(start, end, consumed, _peak(burns[base][a:b])))
    end_s = float(instants[-1])
    periods: list[tuple[float, float, float | None]] = []
    stop = end_s
    while True:
        ratio = error_ratio(spec, source, stop, spec.period_s,
                            request_log=request_log).error_ratio
        periods.append((stop - spec.period_s, stop, budget_remaining(ratio, spec.objective)))
        stop -= spec.period_s
        if stop <= float(instants[0]):
            break
    return SloBacktest(spec=spec, rows=rows, alerts=episodes, missed_burns=missed,
                       budget_remaining=periods[0][2], periods=periods, base_window_s=base,
                       burn=burns[base], firing=firing, ratios=ratios)


def backtest(config: Config, source: RangeSource, start_s: float, end_s: float, *,
             interval_s: float | None = None, slos: Sequence[SloSpec] | None = None,
             missed_share: float = DEFAULT_MISSED_SHARE,
             quiet_share: float = DEFAULT_QUIET_SHARE,
             request_log: RequestLog | None = None) -> Backtest:
    """The generated alerts of ``slos`` (default: the config's) replayed from ``start_s`` to
    ``end_s`` (Unix seconds) at ``interval_s`` (default ``[rules] interval``)."""
    if not isinstance(source, RangeSource):
        raise TypeError(f"{source!r} cannot answer range queries")
    step = float(interval_s if interval_s is not None else config.rules.interval)
    grid = Grid.between(math.ceil(start_s * 1000), math.floor(end_s * 1000), round(step * 1000))
    specs = list(slos) if slos is not None else effective_slos(config)
    results = []
    for spec in specs:
        ratios, why = _recorded_ratios(config, source, spec, grid, request_log)
        result = backtest_slo(spec, config, source, grid, missed_share=missed_share,
                              quiet_share=quiet_share, request_log=request_log, ratios=ratios)
        results.append(replace(result, read="raw" if ratios is None else "recorded",
                               read_reason=why))
    return Backtest(start=grid.start_ms / 1000, end=grid.end_ms / 1000, interval_s=step,
                    source=source_kind(source), slos=results,
                    grid=grid)


def _recorded_ratios(config: Config, source: RangeSource, spec: SloSpec, grid: Grid,
                     request_log: RequestLog | None) -> tuple[dict[float, Track] | None, str]:
    """``spec``'s ratios per window of its alert table from the store's recorded series, or
    ``None`` and why not ("" where the store's could not be read at all: the embedded store,
    ``recorded_rules = "off"``, an SLO no rule expresses)."""
    if config.engine.recorded_rules == "off" or not is_external(source) \
            or not isinstance(source, RangeQuerySource):
        return None, ""
    if not recordable(spec, request_log=request_log is not None):
        return None, ""
    windows = burn_windows(slo_burn_alerts(config.engine.burn_rate_alerts, spec.period_s))
    return recorded_tracks(source, spec, grid, windows)
