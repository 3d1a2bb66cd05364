"""What the Business page's "Cost by tenant" section shows, computed by plain functions: the
chargeback of the range (``slo.cost.report.cost_report``: one row per tenant, or per tenant and
tier, model or pool), a bar per tenant with the idle and unattributed lines apart, each pool's
reconciliation line (tenants + idle + unattributed = the pool's cost, to the cent), and this
month's ``[[budgets]]`` (``slo.cost.budgets.BudgetTracker``).

A figure the chargeback cannot give is absent (``None``), never 0: no row at all when the range
has neither billed GPU time nor a recorded request; a ratio without its denominator (per 1000
requests of the idle line); a budget's spend when its month holds no data. The page caches
these functions (``dashboard/views/business.py``); nothing here touches Streamlit.

Units: Unix seconds, the ``[cost] currency`` (named in every money column's header), GPU-hours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dashboard import format as fmt
from slo.cost.budgets import BudgetStatus
from slo.cost.ledger import IDLE_TENANT, UNATTRIBUTED_TENANT
from slo.cost.report import cost_report
from slo.sources.protocol import RequestLog, Source
from vigil.config import Config

__all__ = [
    "BAR_COLORS",
    "GROUP_CHOICES",
    "KIND_IDLE",
    "KIND_TENANT",
    "KIND_UNATTRIBUTED",
    "MAX_BARS",
    "OTHER_TENANTS",
    "TenantCost",
    "bar_rows",
    "budget_rows",
    "money",
    "over_budget",
    "table_rows",
    "tenant_cost",
]

#: The groupings the page offers (label -> ``slo.cost.ledger.GROUPINGS`` keys): a tenant
#: alone, or split by tier, model or pool.
GROUP_CHOICES: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant",),
    "tenant and tier": ("tenant", "tier"),
    "tenant and model": ("tenant", "model"),
    "tenant and pool": ("tenant", "pool"),
}
#: What a bar stands for: a tenant's requests, the pools' idle time, traffic no record knows.
KIND_TENANT = "tenant"
KIND_IDLE = "idle"
KIND_UNATTRIBUTED = "unattributed"
#: Bar colours per kind: Streamlit's blue for tenants; idle in the neutral grey the charts use
#: for what nobody ordered, unattributed in the ticket orange (a gap worth a look).
BAR_COLORS = {KIND_TENANT: "#0068c9", KIND_IDLE: "#808495", KIND_UNATTRIBUTED: "#ffa421"}
#: Bars drawn at most for tenants (a chart of hundreds of bars reads as nothing); the rest are
#: summed as one bar, ``OTHER_TENANTS`` (in parentheses: no tenant name has them).
MAX_BARS = 15
OTHER_TENANTS = "(other tenants)"
#: Column headers of the grouping keys.
_KEY_HEADERS = {"tenant": "tenant", "tier": "tier", "model": "model", "pool": "pool"}


@dataclass(frozen=True)
class TenantCost:
    """The chargeback of ``(start_s, end_s]`` grouped ``by``.

    ``rows``: ``slo.cost.ledger.line_figures`` per group, costliest first (empty when the range
    has no billed time and no request); ``total`` their sum (None then); ``reconciliation``:
    each pool's line as ``vigil cost report`` prints it, and ``unbalanced`` the pools whose
    lines do not add up to their cost (never, unless the ledger is wrong); ``warnings`` the
    ledger's; ``records``: whether the gateway's (or ``[otlp]``'s) records could be read.
    """

    currency: str
    by: tuple[str, ...]
    start_s: float
    end_s: float
    idle_policy: str
    records: bool
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: float | None = None
    reconciliation: list[str] = field(default_factory=list)
    unbalanced: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def tenant_cost(source: Source, config: Config, log: RequestLog | None, start_s: float,
                end_s: float, pools: Sequence[str], by: Sequence[str]) -> TenantCost:
    """The chargeback of ``(start_s, end_s]`` for ``pools``, grouped ``by`` (of
    ``GROUP_CHOICES``' values). ``ValueError`` when the range is empty."""
    report = cost_report(source, config, log, by=list(by), start_s=start_s, end_s=end_s,
                         at_s=end_s, pools=list(pools))
    rows = list(report["rows"])
    # Without data the per-pool lines only say "no replica billed": the page says why instead.
    billed = [p for p in report["pools"] if p.get("cost") is not None]
    return TenantCost(
        currency=str(report["currency"]), by=tuple(by), start_s=start_s, end_s=end_s,
        idle_policy=str(report["idle_policy"]), records=log is not None, rows=rows,
        total=report["total"],
        reconciliation=[str(p["text"]) for p in report["pools"]] if rows else [],
        unbalanced=[str(p["pool"]) for p in billed if not p.get("adds_up", True)],
        warnings=list(report["warnings"]))


def money(label: str, currency: str) -> str:
    """A money column's header: ``"cost (USD)"``."""
    return f"{label} ({currency})"


def _kind(tenant: str) -> str:
    if tenant == IDLE_TENANT:
        return KIND_IDLE
    if tenant == UNATTRIBUTED_TENANT:
        return KIND_UNATTRIBUTED
    return KIND_TENANT


#: Where each kind of line goes in the table and the chart: customers first.
_KIND_ORDER = {KIND_TENANT: 0, KIND_UNATTRIBUTED: 1, KIND_IDLE: 2}


def table_rows(tc: TenantCost) -> list[dict[str, Any]]:
    """One row per group: its keys, cost, GPU-hours, requests, cost per 1000 requests and per
    1M output tokens, the share of its served requests that met every SLO of their pool, and
    what one such request cost. Ratios are ``None`` without a denominator (the idle line has
    no request), never 0. The tenants' rows come first, costliest first, then the
    unattributed and the idle ones (often the largest: they would hide the customers)."""
    cur = tc.currency
    out = []
    # A stable sort: within a kind, the report's order (costliest first) stays.
    for r in sorted(tc.rows, key=lambda r: _KIND_ORDER[_kind(r["tenant"])]):
        row: dict[str, Any] = {_KEY_HEADERS[k]: (r[k] or None) for k in tc.by}
        row.update({
            money("cost", cur): r["cost"],
            "GPU-hours": r["gpu_hours"],
            "requests": r["requests"],
            money("per 1000 requests", cur): r["per_1000_requests"],
            money("per 1M output tokens", cur): r["per_million_output_tokens"],
            "SLO met": r["slo_met_share"],
            money("per SLO-met request", cur): r["per_slo_met_request"],
        })
        out.append(row)
    return out


def bar_rows(tc: TenantCost, limit: int = MAX_BARS) -> list[dict[str, Any]]:
    """The cost per tenant (whatever the table's grouping), rounded to the cent, with its
    ``kind`` and ``color``: the ``limit`` costliest tenants first (the others summed as
    ``OTHER_TENANTS``), then the unattributed and the idle lines (each summed over the pools),
    so that those two never read as a customer."""
    per: dict[str, float] = {}
    for r in tc.rows:
        per[r["tenant"]] = per.get(r["tenant"], 0.0) + r["cost"]
    tenants = sorted(((t, c) for t, c in per.items() if _kind(t) == KIND_TENANT),
                     key=lambda tc_: (-tc_[1], tc_[0]))
    kept = tenants[:limit]
    if len(tenants) > limit:
        kept.append((OTHER_TENANTS, sum(c for _, c in tenants[limit:])))
    kept += [(t, per[t]) for t in (UNATTRIBUTED_TENANT, IDLE_TENANT) if t in per]
    # The rows' costs are whole cents already: rounding only removes float dust.
    return [{"tenant": t, "cost": round(c, 2), "kind": _kind(t), "color": BAR_COLORS[_kind(t)]}
            for t, c in kept]


def budget_rows(statuses: Sequence[BudgetStatus], *, has_data: bool,
                pools: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per budget: what it covers, its amount, what it spent this month, the share,
    the forecast for the month's end at the trailing rate and when that rate would exhaust it
    (UTC). ``has_data``: whether the month holds any billed time or request; without, the
    spend and what follows from it are absent rather than 0. ``pools``: the pools the page
    shows (empty: all); a budget of another pool is left out."""
    out = []
    for b in statuses:
        if b.pool and pools and b.pool not in pools:
            continue
        out.append({
            "budget": b.name, "tenant": b.tenant, "pool": b.pool or "every pool",
            "tier": b.tier or "every tier", "month": b.month,
            money("amount", b.currency): b.monthly,
            money("spent", b.currency): b.spent if has_data else None,
            "spent share": b.share if has_data else None,
            money("forecast", b.currency): b.forecast if has_data else None,
            "runs out (UTC)": (fmt.timestamp(b.exhausted_at)
                               if has_data and b.exhausted_at is not None else None),
            "enforce": b.enforce,
        })
    return out


def over_budget(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The budgets of ``rows`` already spent (share at least 1)."""
    return [str(r["budget"]) for r in rows
            if r["spent share"] is not None and r["spent share"] >= 1.0]
