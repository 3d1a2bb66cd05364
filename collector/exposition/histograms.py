"""Histogram validation, both formats: ``le`` grows, counts add up, ``+Inf`` ends each set."""

from __future__ import annotations

import math
from dataclasses import dataclass

from collector.exposition.problems import Bad, q, series

__all__ = ["INF", "HistGroup", "finish_histogram", "hist_bucket", "le_value"]

INF = math.inf


@dataclass(slots=True)
class HistGroup:
    """One histogram label set (and timestamp, in OpenMetrics), validated as its lines stream."""

    line: int  # last bucket line; the group's first line until a bucket shows up
    labels: dict[str, str]  # a sample's labels, for messages (le is left out)
    le: float = math.nan  # NaN compares false, so any first bucket passes (even le="-Inf")
    value: float = -INF
    inf: float | None = None
    count: float | None = None
    count_line: int = 0
    has_sum: bool = False
    has_gsum: bool = False
    negative_bucket: bool = False
    negative_gsum: bool = False


def hist_bucket(family: str, group: HistGroup, le_text: str, value: float, line: int,
                les: dict[str, float]) -> None:
    """Check one bucket against the previous one of its label set: le grows, counts add up.

    ``line`` is the bucket's 1-based line; ``les`` caches le text -> bound for the parse.
    """
    le = les.get(le_text)
    if le is None:
        le = les[le_text] = le_value(le_text, line)
    if le <= group.le:
        raise Bad(f"histogram {_group_name(family, group)}: le={q(le_text)} does not increase")
    if value < group.value:
        raise Bad(f"histogram {_group_name(family, group)}: bucket counts are not cumulative "
                  f"(le={q(le_text)} has {value}, less than the bucket before)")
    group.le = le
    group.value = value
    group.line = line
    if le == INF:
        group.inf = value
    elif le < 0:
        group.negative_bucket = True


def finish_histogram(family: str, groups: dict, *, openmetrics: bool) -> None:
    """Raise ``Bad`` unless every label set ended with ``+Inf`` and ``_count`` matches it.

    For OpenMetrics also the library's ``_sum``/``_count`` pairing and negative-bucket rules.
    """
    for group in groups.values():
        problem = _unfinished(group, openmetrics)
        if problem:
            reason, line = problem
            raise Bad(f"histogram {_group_name(family, group)}{reason}", line)


def _unfinished(group: HistGroup, openmetrics: bool) -> tuple[str, int] | None:
    """What is wrong with a finished label set, as ``(message tail, 1-based line)``, or None."""
    if group.inf is None:
        return ' has no le="+Inf" bucket', group.line
    if group.count is not None and group.count != group.inf:
        return (f": _count {group.count} differs from the +Inf bucket {group.inf}",
                group.count_line)
    if not openmetrics:
        return None
    if group.has_sum and group.count is None:
        return ": _sum without _count", group.line
    if group.has_gsum and group.count is None:
        return ": _gsum without _gcount", group.line
    if not (group.has_sum or group.has_gsum) and group.count is not None:
        return ": _count without _sum", group.count_line
    if group.negative_bucket and group.has_sum:
        return ": _sum not allowed with negative buckets", group.line
    if not group.negative_bucket and group.negative_gsum:
        return ": negative _gsum with non-negative buckets", group.line
    return None


def _group_name(family: str, group: HistGroup) -> str:
    return series(family, {k: v for k, v in group.labels.items() if k != "le"})


def le_value(le_text: str, line: int) -> float:
    """The bound an ``le`` label's text spells; ``Bad`` (at 1-based ``line``) if it is not one."""
    try:
        le = float(le_text)
    except ValueError:
        le = math.nan
    if math.isnan(le) or "_" in le_text or " " in le_text:
        raise Bad(f"invalid le label {q(le_text)}", line)
    return le
