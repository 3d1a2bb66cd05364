"""Frozen monthly statements: a closed month's chargeback as first reported after its close.

A bill sent is not silently rewritten: ``vigil cost report`` freezes a month the first time it
reads it ``[cost] close_after`` past its end, and afterwards shows the frozen lines, with any
difference that late records make restated beside them. One row per (month, time zone,
currency); the lines are the report's finest ones (pool, model, tenant, tier), as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vigil.storage.database import open_database

__all__ = ["FrozenStatement", "Statements"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cost_statements (
        month TEXT NOT NULL,
        timezone TEXT NOT NULL,
        currency TEXT NOT NULL,
        frozen_at REAL NOT NULL,
        lines TEXT NOT NULL,
        PRIMARY KEY (month, timezone, currency)
    )""",
)
_WHAT = "the frozen cost statements"


class FrozenStatement:
    """A month as frozen: when (Unix seconds) and its lines (dicts of ``line_figures``)."""

    def __init__(self, frozen_at: float, lines: list[dict[str, Any]]) -> None:
        self.frozen_at = frozen_at
        self.lines = lines


class Statements:
    """The frozen months in the SQLite file or PostgreSQL URL ``target``."""

    def __init__(self, target: str | Path) -> None:
        self.target = target

    def get(self, month: str, tz: str, currency: str) -> FrozenStatement | None:
        """The frozen statement of ``month``, if any."""
        if isinstance(self.target, Path) and not self.target.exists():
            return None
        db = open_database(self.target, what=_WHAT, schema=_SCHEMA)
        try:
            rows = db.query("SELECT frozen_at, lines FROM cost_statements WHERE month = ? AND "
                            "timezone = ? AND currency = ?", (month, tz, currency))
        finally:
            db.close()
        return FrozenStatement(float(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def freeze(self, month: str, tz: str, currency: str, at_s: float,
               lines: list[dict[str, Any]]) -> FrozenStatement:
        """Freeze ``lines`` as ``month``'s statement unless one is frozen already (another
        report got there first); returns the statement that stands."""
        db = open_database(self.target, what=_WHAT, schema=_SCHEMA)
        try:
            db.execute("INSERT INTO cost_statements (month, timezone, currency, frozen_at, lines) "
                       "VALUES (?, ?, ?, ?, ?) ON CONFLICT (month, timezone, currency) DO NOTHING",
                       (month, tz, currency, at_s, json.dumps(lines, allow_nan=False)))
            rows = db.query("SELECT frozen_at, lines FROM cost_statements WHERE month = ? AND "
                            "timezone = ? AND currency = ?", (month, tz, currency))
        finally:
            db.close()
        return FrozenStatement(float(rows[0][0]), json.loads(rows[0][1]))
