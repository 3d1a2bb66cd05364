"""Monthly budgets: what each ``[[budgets]]`` entry has spent this month, the shares of it
crossed, and when the trailing rate would spend it.

A budget's spend is the cost of the chargeback lines (``slo.cost.ledger``) of its tenant,
and of its pool and tier when it names them, idle time included as ``[cost] idle``
allocates it, since the month began in ``[cost] timezone``.

The forecast: the trailing rate is the budget's spend over the ``[cost] forecast_window``
before now divided by its length; spending on at that rate, the month ends at
``spent + rate × (month end − now)``; when that is more than the amount (and the budget is not
spent yet), ``exhausted_at`` is when it would be: ``now + (amount − spent) / rate``.

``BudgetTracker`` keeps what a long-running process needs not to recompute a month every
evaluation: the month and the trailing window are cut at the zone's midnights and where the
trailing window begins; spans that ended over an hour ago (``ledger.RECORD_MARGIN_S``) are
read once and kept, the others (today, and the day the trailing window begins in) are read
again at each evaluation.

Units: Unix seconds, the ``[cost] currency``.
"""

from __future__ import annotations

import itertools
import math
import zoneinfo
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from slo.cost.ledger import RECORD_MARGIN_S, Line, ledger
from slo.cost.months import month_bounds, month_of
from slo.sources.protocol import RequestLog, Source
from vigil.config import BudgetConfig, Config

__all__ = ["BudgetStatus", "BudgetTracker", "budget_spend", "budget_status", "day_starts"]


@dataclass(frozen=True)
class BudgetStatus:
    """One budget at one moment (see the module docstring)."""

    name: str
    tenant: str
    pool: str
    tier: str
    month: str
    monthly: float
    spent: float
    #: The highest of the budget's ``alert_at`` shares reached (None: none yet).
    crossed: float | None
    #: Spend at the month's end at the trailing rate; None without a rate.
    forecast: float | None
    #: When the trailing rate would spend the budget, if before the month ends and not yet.
    exhausted_at: float | None
    enforce: str
    severity: str
    currency: str

    @property
    def share(self) -> float:
        """Spent over the amount (1.0 = spent)."""
        return self.spent / self.monthly

    @property
    def over(self) -> bool:
        """The budget is spent."""
        return self.spent >= self.monthly

    def as_dict(self) -> dict[str, object]:
        """As ``/budgets`` and the dashboard show it (times ISO 8601 UTC)."""
        return {
            "name": self.name, "tenant": self.tenant, "pool": self.pool, "tier": self.tier,
            "month": self.month, "monthly": self.monthly, "spent": self.spent,
            "share": self.share, "over": self.over, "crossed": self.crossed,
            "forecast": self.forecast,
            "exhausted_at": None if self.exhausted_at is None else
            datetime.fromtimestamp(self.exhausted_at, UTC).isoformat().replace("+00:00", "Z"),
            "enforce": self.enforce, "severity": self.severity, "currency": self.currency,
        }


def budget_spend(lines: Iterable[Line], budget: BudgetConfig) -> float:
    """What ``lines`` cost that ``budget`` covers (its tenant; its pool and tier if named)."""
    return math.fsum(ln.cost for ln in lines
                     if ln.tenant == budget.tenant and (not budget.pool or ln.pool == budget.pool)
                     and (not budget.tier or ln.tier == budget.tier))


def budget_status(config: Config, budget: BudgetConfig, at_s: float, spent: float,
                  trailing: float | None, trailing_s: float) -> BudgetStatus:
    """``budget`` at ``at_s`` having spent ``spent`` this month and ``trailing`` over the
    ``trailing_s`` seconds before ``at_s`` (None: unknown)."""
    month = month_of(at_s, config.cost.timezone)
    _, end = month_bounds(month, config.cost.timezone)
    crossed = max((s for s in budget.alert_at if spent >= s * budget.monthly), default=None)
    forecast = exhausted = None
    if trailing is not None and trailing_s > 0:
        rate = trailing / trailing_s
        forecast = spent + rate * max(0.0, end - at_s)
        if rate > 0 and spent < budget.monthly < forecast:
            exhausted = at_s + (budget.monthly - spent) / rate
    return BudgetStatus(budget.display_name(), budget.tenant, budget.pool, budget.tier, month,
                        budget.monthly, spent, crossed, forecast, exhausted, budget.enforce,
                        budget.severity, config.cost.currency)


def day_starts(start_s: float, end_s: float, tz: str) -> list[float]:
    """The midnights (in ``tz``) in ``[start_s, end_s)``, with ``start_s`` first: the days
    that cut ``[start_s, end_s)``."""
    zone = zoneinfo.ZoneInfo(tz)
    day = datetime.fromtimestamp(start_s, zone).replace(hour=0, minute=0, second=0,
                                                       microsecond=0)
    out = [start_s]
    while True:
        # Midnight of the next calendar day, whatever the zone's offset did in between.
        nxt = (day + timedelta(days=1, hours=12)).replace(hour=0, tzinfo=None)
        day = nxt.replace(tzinfo=zone)
        t = day.timestamp()
        if t >= end_s:
            return out
        if t > start_s:
            out.append(t)


class BudgetTracker:
    """Every budget's status, with closed days kept between evaluations (see the module
    docstring). ``pools``: the pools to read (default every pool)."""

    def __init__(self, config: Config, pools: Sequence[str] | None = None) -> None:
        self.config = config
        self.pools = pools
        #: (day start, day end) -> the chargeback lines of a day that is over.
        self._days: dict[tuple[float, float], list[Line]] = {}
        #: The last evaluation's lines since the month began (for ``/metrics``).
        self.month_lines: list[Line] = []

    def _lines(self, source: Source, log: RequestLog | None, lo: float, hi: float,
               at_s: float) -> list[Line]:
        """The lines of ``(lo, hi]``, kept when the span ended over an hour ago."""
        kept = self._days.get((lo, hi))
        if kept is not None:
            return kept
        lines = ledger(source, self.config, log, lo, hi, self.pools).lines
        if hi <= at_s - RECORD_MARGIN_S:
            self._days[(lo, hi)] = lines
        return lines

    def evaluate(self, source: Source, log: RequestLog | None, at_s: float
                 ) -> list[BudgetStatus]:
        """Every budget at ``at_s``."""
        tz = self.config.cost.timezone
        start, _ = month_bounds(month_of(at_s, tz), tz)
        window = self.config.cost.forecast_window
        trailing_lo = at_s - window
        # Days, cut where the trailing window begins too: both sums are of whole spans.
        cuts = sorted({*day_starts(min(start, trailing_lo), at_s, tz), trailing_lo, at_s})
        spans = {(a, b): self._lines(source, log, a, b, at_s)
                 for a, b in itertools.pairwise(cuts) if b > a}
        self._days = {k: v for k, v in self._days.items() if k in spans}
        self.month_lines = [ln for (a, _), lines in spans.items() if a >= start
                            for ln in lines]
        out = []
        for b in self.config.budgets:
            spent = math.fsum(budget_spend(lines, b) for (a, _), lines in spans.items()
                              if a >= start)
            trailing = math.fsum(budget_spend(lines, b) for (a, _), lines in spans.items()
                                 if a >= trailing_lo)
            out.append(budget_status(self.config, b, at_s, spent, trailing, window))
        return out
