"""SLO design from history: which latency objectives the fleet actually met.

For a ``ttft`` or ``e2e`` SLO and each candidate threshold, the share of requests within it
(``1 - error_ratio``, the engine's SLI) over the whole history, per UTC calendar day and per
7-day week counted back from the end, and on how many of those days and weeks it reached the
SLO's objective: "≤ 800 ms for 99.2 % of requests; met on 27 of 30 days". Candidates default to
vLLM's bucket bounds from a quarter to four times the configured threshold (a bound is read
straight off the histogram; a threshold between bounds is interpolated) and the configured
threshold itself. Days and weeks without a request are left out, not counted as met.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from slo.objectives.sli import error_ratio
from slo.objectives.spec import SloSpec
from slo.sources.protocol import RequestLog, Source
from vigil.conventions import VLLM_REQUEST_LATENCY_BUCKETS, VLLM_TTFT_BUCKETS

__all__ = ["DAY_S", "WEEK_S", "attainment", "candidate_thresholds"]

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


def candidate_thresholds(spec: SloSpec) -> list[float]:
    """vLLM's bucket bounds within [¼, 4×] the configured threshold, and the threshold."""
    threshold = float(spec.threshold_seconds or 0.0)
    bounds = VLLM_TTFT_BUCKETS if spec.indicator == "ttft" else VLLM_REQUEST_LATENCY_BUCKETS
    chosen = {b for b in bounds if threshold / 4 <= b <= threshold * 4}
    chosen.add(threshold)
    return sorted(chosen)


def _good(spec: SloSpec, source: Source, at_s: float, window_s: float,
          request_log: RequestLog | None) -> float | None:
    ratio = error_ratio(spec, source, at_s, window_s, request_log=request_log).error_ratio
    return None if ratio is None or math.isnan(ratio) else 1.0 - ratio


def attainment(spec: SloSpec, source: Source, start_s: float, end_s: float, *,
               thresholds: Sequence[float] | None = None,
               request_log: RequestLog | None = None) -> list[dict[str, Any]]:
    """Per candidate threshold (seconds): the good ratio over ``(start_s, end_s]``, per day
    and per week, and the days and weeks that met ``spec.objective``. Empty for an SLO that
    is not a latency one."""
    if not spec.is_latency:
        return []
    day_ends = [d for d in _day_ends(start_s, end_s)]
    week_ends = []
    t = end_s
    while t - WEEK_S >= start_s - 1e-6:
        week_ends.append(t)
        t -= WEEK_S
    week_ends.reverse()
    rows = []
    for threshold in (thresholds if thresholds else candidate_thresholds(spec)):
        s = dataclasses.replace(spec, threshold_seconds=float(threshold))
        days = [(d, _good(s, source, d, DAY_S, request_log)) for d in day_ends]
        weeks = [(w, _good(s, source, w, WEEK_S, request_log)) for w in week_ends]
        rated_days = [g for _, g in days if g is not None]
        rated_weeks = [g for _, g in weeks if g is not None]
        rows.append({
            "threshold_seconds": float(threshold),
            "good_ratio": _good(s, source, end_s, end_s - start_s, request_log),
            "days_met": sum(1 for g in rated_days if g >= spec.objective),
            "days": len(rated_days),
            "weeks_met": sum(1 for g in rated_weeks if g >= spec.objective),
            "weeks": len(rated_weeks),
            "per_day": [{"date": datetime.fromtimestamp(d - DAY_S, tz=UTC).date().isoformat(),
                         "good_ratio": g} for d, g in days],
        })
    return rows


def _day_ends(start_s: float, end_s: float) -> list[float]:
    """The ends (UTC midnights) of the whole calendar days inside ``[start_s, end_s]``."""
    first = math.ceil(start_s / DAY_S) * DAY_S + DAY_S
    return [first + k * DAY_S for k in range(int((end_s - first) // DAY_S) + 1)
            if first + k * DAY_S <= end_s]
