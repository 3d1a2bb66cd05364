"""``vigil cost report``'s answer: a window's chargeback grouped as asked, each pool's
reconciliation (tenants + idle + unattributed = the pool, to the cent), and for a closed month
the frozen statement with what late records restate.

A closed month (``[cost] close_after`` past its end) is frozen by the first report that reads
it (``vigil.storage.cost_statements``); later reports show the frozen lines and, when the
records have changed since, a ``restated`` list of the differences per group, so a bill
already sent changes only visibly.

Units: Unix seconds, the ``[cost] currency``, GPU-hours, tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from slo.cost.ledger import (
    GROUPINGS,
    IDLE_TENANT,
    UNATTRIBUTED_TENANT,
    Ledger,
    Line,
    group_lines,
    ledger,
    line_figures,
)
from slo.cost.months import month_bounds
from slo.sources.protocol import RequestLog, Source
from vigil.config import Config
from vigil.errors import ArgumentError
from vigil.storage.cost_statements import Statements

__all__ = ["cost_report", "reconciliation"]


def _cents(x: float) -> int:
    return round(x * 100)


def reconciliation(book: Ledger) -> list[dict[str, Any]]:
    """Per pool: its cost and the lines that add up to it, in cents and exactly; ``text``
    the printed line. A pool with no billed time has ``cost`` None."""
    out: list[dict[str, Any]] = []
    for p in book.pools:
        lines = [ln for ln in book.lines if ln.pool == p.pool]
        tenants = sum(_cents(ln.cost_cents) for ln in lines
                      if ln.tenant not in (IDLE_TENANT, UNATTRIBUTED_TENANT))
        idle = sum(_cents(ln.cost_cents) for ln in lines if ln.tenant == IDLE_TENANT)
        unattributed = sum(_cents(ln.cost_cents) for ln in lines
                           if ln.tenant == UNATTRIBUTED_TENANT)
        if p.cost is None:
            out.append({"pool": p.pool, "cost": None, "gpu_hours": None, "text":
                        f"{p.pool}: no replica billed in the window"})
            continue
        pool = _cents(p.cost)
        exact = math.fsum([p.tenants_cost, p.idle_cost, p.unattributed_cost])
        cur = book.currency
        added = (tenants + idle + unattributed) / 100
        text = (f"{p.pool}: tenants {tenants / 100:.2f} + idle {idle / 100:.2f} + "
                f"unattributed {unattributed / 100:.2f} = {added:.2f} {cur}; "
                f"pool cost {pool / 100:.2f} {cur}")
        if p.idle_allocated:
            text += f" (idle allocated to tenants: {p.idle_allocated:.2f} {cur})"
        out.append({
            "pool": p.pool, "cost": pool / 100, "gpu_hours": p.gpu_hours,
            "tenants": tenants / 100, "idle": idle / 100, "unattributed": unattributed / 100,
            "idle_allocated": p.idle_allocated, "unused_reserved": p.unused_reserved_cost,
            "unattributed_measured": p.unattributed_measured,
            "adds_up": tenants + idle + unattributed == pool,
            "exact": {"cost": p.cost, "tenants": p.tenants_cost, "idle": p.idle_cost,
                      "unattributed": p.unattributed_cost,
                      "difference": p.cost - exact},
            "text": text,
        })
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _lines_of(rows: list[dict[str, Any]]) -> list[Line]:
    names = {f.name for f in dataclasses.fields(Line)}
    return [Line(**{k: v for k, v in row.items() if k in names}) for row in rows]


def _restated(frozen: list[Line], now: list[Line], by: Sequence[str]) -> list[dict[str, Any]]:
    """The groups whose cost or request count differs between the frozen lines and now."""
    before = {tuple(getattr(ln, g) for g in GROUPINGS): ln for ln in group_lines(frozen, by)}
    after = {tuple(getattr(ln, g) for g in GROUPINGS): ln for ln in group_lines(now, by)}
    out = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        cost_b = _cents(b.cost_cents) if b else 0
        cost_a = _cents(a.cost_cents) if a else 0
        req_b, req_a = (b.requests if b else 0), (a.requests if a else 0)
        if cost_b != cost_a or req_b != req_a:
            out.append({**dict(zip(GROUPINGS, key, strict=True)),
                        "frozen_cost": cost_b / 100, "cost_now": cost_a / 100,
                        "difference": (cost_a - cost_b) / 100,
                        "frozen_requests": req_b, "requests_now": req_a})
    return out


def cost_report(source: Source, config: Config, request_log: RequestLog | None, *,
                by: Sequence[str], start_s: float | None = None, end_s: float | None = None,
                month: str | None = None, at_s: float, pools: Sequence[str] | None = None,
                statements: Statements | None = None) -> dict[str, Any]:
    """The report of ``month`` (``YYYY-MM`` in ``[cost] timezone``; up to ``at_s`` while it
    runs) or of ``(start_s, end_s]``, grouped ``by`` (of ``GROUPINGS``). ``statements``:
    where closed months are frozen (None: never frozen)."""
    tz = config.cost.timezone
    if month is not None:
        start_s, end_s = month_bounds(month, tz)
        closed = at_s >= end_s + config.cost.close_after
        end = min(end_s, at_s)
    else:
        if start_s is None or end_s is None or not end_s > start_s:
            raise ArgumentError("give a month, or a start before an end")
        closed, end = False, end_s
    if not end > start_s:
        raise ArgumentError(f"the month {month} starts after {_iso(at_s)}: nothing to report "
                            "yet")
    book = ledger(source, config, request_log, start_s, end, pools)
    lines = book.lines
    frozen_at = None
    restated: list[dict[str, Any]] = []
    if month is not None and closed and statements is not None and pools is None:
        now_rows = [dataclasses.asdict(ln) for ln in book.lines]
        stored = statements.get(month, tz, config.cost.currency)
        if stored is None:
            stored = statements.freeze(month, tz, config.cost.currency, at_s, now_rows)
        frozen_at = stored.frozen_at
        frozen_lines = _lines_of(stored.lines)
        restated = _restated(frozen_lines, book.lines, by)
        lines = frozen_lines
    rows = [line_figures(ln) for ln in group_lines(lines, by)]
    has_data = any(p.cost is not None for p in book.pools) or any(
        ln.requests or ln.cache_hits for ln in book.lines)
    total = sum(_cents(ln.cost_cents) for ln in lines)
    return {
        "currency": config.cost.currency,
        "timezone": tz,
        "month": month,
        "from": _iso(start_s),
        "to": _iso(end),
        "by": list(by),
        "idle_policy": config.cost.idle,
        # No billed time and no request: figures are absent, never 0.
        "rows": rows if has_data else [],
        "total": total / 100 if has_data else None,
        "pools": reconciliation(book),
        "frozen_at": None if frozen_at is None else _iso(frozen_at),
        "restated": restated,
        "warnings": book.warnings,
    }
