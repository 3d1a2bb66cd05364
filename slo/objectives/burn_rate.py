"""Burn rates, multiwindow multi-burn-rate alerts and the error budget of one SLO.

Definitions (Google SRE workbook, chapter 5 "Alerting on SLOs"):

* **burn rate** over a window = error ratio over that window / error budget, where the error
  budget is ``1 - objective``. 1 means "spending exactly the whole budget over the period";
  14.4 over 1 h spends 2 % of a 30-day budget in that hour.
* **alert**: a row ``(severity, factor, long window, short window)`` fires when the burn rate
  over BOTH windows exceeds ``factor``: the long window proves the burn is significant, the
  short one that it is still going on (so the alert resets soon after a fix).
* **factor** of a row for one SLO: the row's ``budget_share`` (share of the period's budget
  the alert may spend in its long window) × period / long window, as Sloth derives it; 0.02
  over 1 h is 14.4 for a 30-day period, 3.36 for a 7-day one. A row with a fixed ``factor``
  keeps it for every period.
* **budget remaining** = ``1 - error_ratio(period) / (1 - objective)``: 1 = untouched, 0 = spent,
  negative = overspent (reported as is; clamping would hide how far over we are).
* **time to exhaustion** = ``budget_remaining × period / burn_rate(1h)``: how long the remaining
  budget lasts if the last hour's burn continues; ``None`` unless both are positive.

Windows are seconds; ratios 0-1; ``at_s`` Unix seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slo.objectives.recorded import Recorded
from slo.objectives.sli import REASON_NO_DATA, REASON_NO_REQUESTS, SliResult, error_ratio
from slo.objectives.spec import SloSpec
from slo.sources.protocol import RequestLog, Source
from vigil.config import BurnRateAlert
from vigil.durations import format_duration, parse_duration

__all__ = [
    "EXHAUSTION_WINDOW_S",
    "FACTOR_DIGITS",
    "SloBurnAlert",
    "SloReport",
    "alert_factor",
    "budget_remaining",
    "burn_rate",
    "burn_windows",
    "evaluate_slo",
    "firing_alerts",
    "slo_burn_alerts",
    "status_burn_alerts",
    "time_to_exhaustion",
]

#: The burn rate that ``time_to_exhaustion`` extrapolates: the last hour's (seconds).
EXHAUSTION_WINDOW_S = 3600.0

#: Significant digits of a derived factor. ``share × period / window`` carries float error
#: (``0.1 × 7 d / 3 d`` is 0.23333333333333334); 12 digits drop it, so that a 30-day SLO's
#: factors equal the workbook's literals 14.4 / 6 / 3 / 1 exactly however the product is
#: computed, and stay far finer than any error ratio a fleet can resolve.
FACTOR_DIGITS = 12


@dataclass(frozen=True)
class SloBurnAlert:
    """One row of the alert table as it applies to one SLO: its own ``factor`` (a burn rate),
    windows in seconds, and the ``budget_share`` it came from (``None``: a fixed factor)."""

    severity: str
    factor: float
    long_window: float
    short_window: float
    budget_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row's entry of the status JSON (windows as durations: ``"1h"``)."""
        return {
            "severity": self.severity,
            "factor": self.factor,
            "budget_share": self.budget_share,
            "long_window": format_duration(self.long_window),
            "short_window": format_duration(self.short_window),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SloBurnAlert:
        """The row back from its ``to_dict`` form."""
        return cls(d["severity"], float(d["factor"]), parse_duration(d["long_window"]),
                   parse_duration(d["short_window"]), d.get("budget_share"))


def alert_factor(alert: BurnRateAlert, period_s: float) -> float:
    """The burn rate above which ``alert`` fires for an SLO of period ``period_s`` (seconds):
    its fixed ``factor``, else ``budget_share × period / long_window`` rounded to
    ``FACTOR_DIGITS`` significant digits."""
    if alert.factor is not None:
        return alert.factor
    if alert.budget_share is None:  # the config's validator forbids it; a clear error anyway
        raise ValueError("a burn-rate alert needs budget_share or factor")
    raw = alert.budget_share * period_s / alert.long_window
    return float(f"{raw:.{FACTOR_DIGITS}g}")


def slo_burn_alerts(alerts: Sequence[BurnRateAlert], period_s: float) -> list[SloBurnAlert]:
    """The alert table for an SLO of period ``period_s`` (seconds), in table order."""
    return [
        SloBurnAlert(a.severity, alert_factor(a, period_s), a.long_window, a.short_window,
                     a.budget_share)
        for a in alerts
    ]


def status_burn_alerts(entry: Mapping[str, Any],
                       alerts: Sequence[BurnRateAlert]) -> list[SloBurnAlert]:
    """The alert table of one ``slos[]`` entry of the status JSON: its ``burn_rate_alerts``,
    else (an entry written without them) ``alerts`` at the entry's ``period``."""
    rows = entry.get("burn_rate_alerts")
    if rows is None:
        return slo_burn_alerts(alerts, parse_duration(entry["period"]))
    return [SloBurnAlert.from_dict(r) for r in rows]


def burn_windows(alerts: Sequence[BurnRateAlert | SloBurnAlert]) -> list[float]:
    """Every long and short window of the alert table, ascending and unique (seconds). The
    shipped table gives 5m, 30m, 1h, 2h, 6h, 1d, 3d."""
    return sorted({w for a in alerts for w in (a.long_window, a.short_window)})


def burn_rate(ratio: float | None, objective: float) -> float | None:
    """``error ratio / (1 - objective)``; ``None`` without an error ratio or with no budget
    at all (objective 1: any error is an infinite burn, which JSON cannot carry)."""
    budget = 1.0 - objective
    if ratio is None or budget <= 0:
        return None
    return ratio / budget


def firing_alerts(
    alerts: Sequence[SloBurnAlert], burn_rates: Mapping[float, float | None]
) -> list[str]:
    """The severities of the rows (one SLO's, ``slo_burn_alerts``) whose long AND short window
    both burn faster than their factor, each once, in table order. A window without data
    never fires."""
    fired: list[str] = []
    for a in alerts:
        long_burn = burn_rates.get(a.long_window)
        short_burn = burn_rates.get(a.short_window)
        if long_burn is None or short_burn is None:
            continue
        if long_burn > a.factor and short_burn > a.factor and a.severity not in fired:
            fired.append(a.severity)
    return fired


def budget_remaining(period_error_ratio: float | None, objective: float) -> float | None:
    """Share (1 = all, negative = overspent) of the period's error budget still unspent."""
    budget = 1.0 - objective
    if period_error_ratio is None or budget <= 0:
        return None
    return 1.0 - period_error_ratio / budget


def time_to_exhaustion(
    remaining: float | None, period_s: float, burn_1h: float | None
) -> float | None:
    """Seconds until the budget is gone at the last hour's burn rate; ``None`` unless both the
    remaining budget and the burn rate are positive (no budget left, or no burn)."""
    if remaining is None or burn_1h is None or remaining <= 0 or burn_1h <= 0:
        return None
    return remaining * period_s / burn_1h


@dataclass(frozen=True)
class SloReport:
    """One SLO evaluated at ``at_s``: its error ratio per window, burn rates, budget, alerts.

    ``windows`` and ``burn_rates`` are keyed by window seconds; ``period`` is the SLI over the
    whole period; ``current`` over the engine's window (the status "now"), if asked for;
    ``burn_alerts`` the alert table with this SLO's factors; ``recorded``: the store's
    recorded figures the ratios were read from (``slo.objectives.recorded``), ``None`` when
    they were computed from raw series.
    """

    spec: SloSpec
    at_s: float
    windows: dict[float, SliResult]
    burn_rates: dict[float, float | None]
    period: SliResult
    budget_remaining: float | None
    time_to_exhaustion_s: float | None
    alerts: list[str]
    current_window_s: float | None = None
    current: SliResult | None = None
    burn_alerts: tuple[SloBurnAlert, ...] = ()
    recorded: Recorded | None = None

    @property
    def sli(self) -> float | None:
        """The good ratio (0-1) over the period: ``1 - error_ratio(period)``."""
        r = self.period.error_ratio
        return None if r is None else 1.0 - r

    @property
    def interpolated(self) -> bool | None:
        """True when any window's latency ratio was interpolated inside a bucket; ``None``
        when no window had data to tell, or the ratios were read from recorded series
        (which do not say)."""
        if self.recorded is not None:
            return None
        results = [*self.windows.values(), self.period]
        if self.current is not None:
            results.append(self.current)
        with_data = [r for r in results if r.error_ratio is not None]
        if not with_data:
            return None
        return any(r.interpolated for r in with_data)

    def to_dict(self) -> dict[str, Any]:
        """The SLO's entry of the status JSON (ratios 0-1, seconds; ``None`` = no data)."""
        s = self.spec
        out: dict[str, Any] = {
            "name": s.name,
            "pool": s.pool,
            "model": s.model,
            "endpoint": s.endpoint,
            "indicator": s.indicator,
            "threshold_seconds": s.threshold_seconds,
            "objective": s.objective,
            "error_budget": s.error_budget,
            "interpolated": self.interpolated,
            "windows": {
                format_duration(w): {
                    "error_ratio": r.error_ratio,
                    "burn_rate": self.burn_rates.get(w),
                }
                for w, r in sorted(self.windows.items())
            },
            "period": format_duration(s.period_s),
            "period_error_ratio": self.period.error_ratio,
            "sli": self.sli,
            "budget_remaining": self.budget_remaining,
            "time_to_exhaustion_seconds": self.time_to_exhaustion_s,
            "alerts": list(self.alerts),
            "burn_rate_alerts": [a.to_dict() for a in self.burn_alerts],
        }
        if self.current_window_s is not None and self.current is not None:
            r = self.current.error_ratio
            out["current"] = {
                "window": format_duration(self.current_window_s),
                "error_ratio": r,
                "sli": None if r is None else 1.0 - r,
            }
        reason = self.period.reason or (self.current.reason if self.current else "")
        out["reason"] = reason or None
        out["read"] = "raw" if self.recorded is None else "recorded"
        out["recorded"] = None if self.recorded is None else self.recorded.to_dict()
        return out


def evaluate_slo(
    spec: SloSpec,
    source: Source,
    at_s: float,
    alerts: Sequence[BurnRateAlert],
    *,
    current_window_s: float | None = None,
    request_log: RequestLog | None = None,
    recorded: Recorded | None = None,
) -> SloReport:
    """Evaluate ``spec`` at ``at_s`` over the alert table's windows, its period, and (if
    given) ``current_window_s``; the alerts use the factors of the SLO's period. Each
    distinct window is computed once: from ``recorded`` (the store's recorded ratios) for
    the windows it records, else from ``source``'s raw series."""
    cache: dict[float, SliResult] = {}

    def sli(window_s: float) -> SliResult:
        if window_s not in cache:
            if recorded is not None and window_s in recorded.windows:
                cache[window_s] = _recorded_sli(recorded, window_s)
            else:
                cache[window_s] = error_ratio(spec, source, at_s, window_s,
                                              request_log=request_log)
        return cache[window_s]

    rows = slo_burn_alerts(alerts, spec.period_s)
    windows = {w: sli(w) for w in burn_windows(rows)}
    burns = {w: burn_rate(r.error_ratio, spec.objective) for w, r in windows.items()}
    period = sli(spec.period_s)
    remaining = budget_remaining(period.error_ratio, spec.objective)
    burn_1h = burn_rate(sli(EXHAUSTION_WINDOW_S).error_ratio, spec.objective)
    current = sli(current_window_s) if current_window_s is not None else None
    return SloReport(
        spec=spec,
        at_s=at_s,
        windows=windows,
        burn_rates=burns,
        period=period,
        budget_remaining=remaining,
        time_to_exhaustion_s=time_to_exhaustion(remaining, spec.period_s, burn_1h),
        alerts=firing_alerts(rows, burns),
        current_window_s=current_window_s,
        current=current,
        burn_alerts=tuple(rows),
        recorded=recorded,
    )


def _recorded_sli(recorded: Recorded, window_s: float) -> SliResult:
    """One window's SLI as the store recorded it: no series is no data (the rule's
    expression was empty), NaN a window without requests (0 / 0)."""
    if window_s not in recorded.ratios:
        return SliResult(None, reason=REASON_NO_DATA)
    ratio = recorded.ratios[window_s]
    return SliResult(ratio, reason="" if ratio is not None else REASON_NO_REQUESTS)
