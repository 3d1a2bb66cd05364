"""Calendar months in the ``[cost] timezone``: a month's bill and a budget's month begin and end
at that zone's midnight (a team in Seoul closes November at 15:00 UTC on 30 November)."""

from __future__ import annotations

import re
import zoneinfo
from datetime import UTC, datetime

from vigil.errors import ArgumentError

__all__ = ["month_bounds", "month_of", "next_month"]

_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


def month_bounds(month: str, tz: str) -> tuple[float, float]:
    """``(start, end)`` Unix seconds of ``month`` (``YYYY-MM``) in the IANA zone ``tz``: its
    first midnight and the next month's. ``ValueError`` for another spelling."""
    found = _MONTH.match(month)
    if found is None:
        raise ArgumentError(f"a month is spelled YYYY-MM (2026-11), not {month!r}")
    year, mon = int(found[1]), int(found[2])
    zone = zoneinfo.ZoneInfo(tz)
    start = datetime(year, mon, 1, tzinfo=zone)
    end = datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=zone)
    return start.astimezone(UTC).timestamp(), end.astimezone(UTC).timestamp()


def month_of(at_s: float, tz: str) -> str:
    """The month (``YYYY-MM``) ``at_s`` (Unix seconds) falls in, in the zone ``tz``."""
    return datetime.fromtimestamp(at_s, zoneinfo.ZoneInfo(tz)).strftime("%Y-%m")


def next_month(month: str) -> str:
    """The month after ``month`` (``YYYY-MM``)."""
    year, mon = int(month[:4]), int(month[5:7])
    return f"{year + mon // 12:04d}-{mon % 12 + 1:02d}"
