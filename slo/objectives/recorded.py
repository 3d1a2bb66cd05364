"""What the store recorded: the SLO series of the rules ``vigil rules prometheus`` generates,
read back so that every reader takes the numbers the store's alerts take.

When the generated recording rules run in the store (Prometheus, a Thanos or Mimir ruler,
vmalert), each SLO's error ratio over every window of the burn-rate table, the engine's window
and its period is a series there: ``slo:sli_error:ratio_rate<window>{slo="<name>"}``. Reading
those instead of ``sum(increase(...[30d]))`` over the raw histogram series makes a 30-day SLO
over 500 replicas cost a few hundred samples per evaluation, and makes ``vigil slo status``,
``vigil serve``, the dashboard and the store's own ``ErrorBudgetBurn`` alerts agree by
construction (as Sloth's and Pyrra's dashboards read their own recorded SLIs). Burn rates and
the budget are computed from the recorded ratios with the same float operations the rules use
(``ratio / (1 - objective)``, ``1 - burn``), so they are equal too.

**Loaded and current.** The rules record ``slo:spec_info{slo, spec_version}`` every interval;
``slo.objectives.spec.spec_version`` gives the version this config means. An SLO is read from
its recorded series only when the freshest ``slo:spec_info`` of it is at most two rule
intervals old and carries that version; otherwise (no rules loaded, rules of another config,
a ruler that stopped) it is computed from raw series, and ``fallback`` says why. Once an SLO's
rules are current, a window they record but whose series is absent or stale is "no data"
(a rule whose expression is empty records nothing), not a reason to go back to raw queries.

**One query.** ``{__name__=~"slo:(sli_error:ratio_rate.+|spec_info)", slo=~"<names>"}[<range>]``
at the evaluation time: a range vector keeps each series' name and its samples' timestamps (an
instant vector would hide how old a period figure is, and ``last_over_time`` drops names), and
the range, twice the slower of the two rule intervals, sees a period group evaluated every
5 minutes. Extra labels the store adds (``cluster``, a replica label) are ignored; of several
series of one record (two rulers of an HA pair read without deduplication) the newest sample
wins.

Times are Unix seconds; windows and ages seconds; ratios 0-1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from slo.objectives.spec import SloSpec, spec_version
from slo.promql.tracks import Grid, Track
from vigil.conventions import (
    ENDPOINT_ALL,
    LABEL_SLO,
    LABEL_SPEC_VERSION,
    RULE_SLI_ERROR,
    RULE_SPEC_INFO,
)
from vigil.durations import format_duration, parse_duration, prom_duration
from vigil.errors import SourceError
from vigil.selectors import promql_string

__all__ = [
    "QuerySource",
    "RangeQuerySource",
    "Recorded",
    "RecordedRead",
    "read_recorded",
    "recordable",
    "recorded_query",
    "recorded_range_s",
    "recorded_tracks",
    "sli_record_name",
]

#: ``slo:sli_error:ratio_rate``: the record name before its window.
_SLI_PREFIX = RULE_SLI_ERROR.split("{", 1)[0]
_NAME = "__name__"


@runtime_checkable
class QuerySource(Protocol):
    """A source that evaluates any PromQL expression (``PrometheusSource.query``): the
    ``result`` list of the API's answer at ``at_s``."""

    def query(self, expr: str, at_s: float) -> list[dict[str, Any]]:
        ...


@runtime_checkable
class RangeQuerySource(QuerySource, Protocol):
    """A ``QuerySource`` that also evaluates an expression at every instant of a ``Grid``
    (``PrometheusSource.query_range``): the ``result`` matrix."""

    def query_range(self, expr: str, grid: Grid) -> list[dict[str, Any]]:
        ...


@dataclass(frozen=True)
class Recorded:
    """One SLO's recorded figures at an evaluation time.

    ``version``: the ``spec_version`` of the rules that recorded them; ``age_s``: how old the
    newest ``slo:spec_info`` sample is; ``windows``: the windows the rules record for the
    SLO; ``ratios``: error ratio per recorded window (``None``: the rule recorded NaN, a
    window without requests); ``ages``: each ratio's sample age. A window of ``windows``
    absent from ``ratios`` had no fresh series: no data. A window outside ``windows`` is not
    recorded at all (the reader computes it from raw series)."""

    version: str
    age_s: float
    windows: frozenset[float] = frozenset()
    ratios: dict[float, float | None] = field(default_factory=dict)
    ages: dict[float, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The SLO's ``"recorded"`` entry of the status JSON."""
        return {"spec_version": self.version, "age_seconds": self.age_s}


@dataclass(frozen=True)
class RecordedRead:
    """The answer of ``read_recorded``: per SLO name, its current recorded figures
    (``slos``) or why it is computed from raw series (``fallback``)."""

    slos: dict[str, Recorded]
    fallback: dict[str, str]


def sli_record_name(window_s: float) -> str:
    """``slo:sli_error:ratio_rate5m`` for 300 seconds: the record of an SLO's error ratio
    over a window, as the generator names it and readers read it."""
    return RULE_SLI_ERROR.format(window=prom_duration(window_s))


def recordable(spec: SloSpec, *, request_log: bool) -> bool:
    """Whether the store's rules record ``spec``'s ratios for the readers to take: not a
    per-endpoint SLO (no rule can express it), not an objective of 0 or 1 (no budget to
    burn), and not availability where the gateway's records exist (``request_log``: exact
    from them, where a rule sees only 5xx answers)."""
    return (spec.endpoint == ENDPOINT_ALL and 0.0 < spec.objective < 1.0
            and not (request_log and spec.indicator == "availability"))


def recorded_range_s(interval_s: float, period_interval_s: float) -> float:
    """How far back the query looks (seconds): two evaluations of the slower group."""
    return 2.0 * max(interval_s, period_interval_s)


def _regex_alternatives(names: Iterable[str]) -> str:
    # RE2 (PromQL's regex engine) accepts a backslash before any punctuation, which is what
    # re.escape writes; a name with '.' or '+' selects only itself.
    return "|".join(re.escape(n) for n in sorted(set(names)))


def recorded_query(names: Iterable[str], range_s: float) -> str:
    """The one query of ``read_recorded``: every SLI and spec-info series of the SLOs
    ``names`` over the last ``range_s`` seconds (a whole number of milliseconds)."""
    pattern = f"{re.escape(_SLI_PREFIX)}.+|{re.escape(RULE_SPEC_INFO)}"
    ms = round(range_s * 1000)
    return (f"{{{_NAME}=~{promql_string(pattern)}, "
            f"{LABEL_SLO}=~{promql_string(_regex_alternatives(names))}}}[{ms}ms]")


def _window_of(name: str) -> float | None:
    """The window (seconds) of an ``slo:sli_error:ratio_rate<window>`` record name."""
    if not name.startswith(_SLI_PREFIX):
        return None
    try:
        return parse_duration(name[len(_SLI_PREFIX):])
    except ValueError:
        return None


def _last_sample(item: Mapping[str, Any], expr: str, url: str) -> tuple[float, float] | None:
    """``(timestamp s, value)`` of a range-vector item's newest sample, ``None`` if none."""
    try:
        values = item["values"]
        if not values:
            return None
        t, v = values[-1]
        return float(t), float(v)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SourceError(f"expected a range vector, got {str(item)[:200]!r} ({exc})",
                          url=url, query=expr) from None


def read_recorded(
    source: QuerySource,
    specs: Sequence[SloSpec],
    at_s: float,
    *,
    windows_s: Iterable[float],
    interval_s: float,
    period_interval_s: float,
) -> RecordedRead:
    """The recorded figures of ``specs`` at ``at_s`` (see the module docs).

    ``windows_s``: the windows the generated rules record besides each SLO's period (the
    burn-rate table's and ``[engine] window``); ``interval_s`` / ``period_interval_s``: the
    rule groups' evaluation intervals (``[rules]``), seconds: a series older than two of its
    group's intervals is not current. Raises ``SourceError`` when the store does not answer.
    """
    windows = set(windows_s)
    if not specs:
        return RecordedRead({}, {})
    range_s = recorded_range_s(interval_s, period_interval_s)
    expr = recorded_query((s.name for s in specs), range_s)
    url = str(getattr(source, "url", ""))
    # Per SLO: spec_info versions with their newest sample; per (SLO, window) the newest one.
    infos: dict[str, tuple[float, str]] = {}
    ratios: dict[tuple[str, float], tuple[float, float]] = {}
    for item in source.query(expr, at_s):
        metric = item.get("metric") if isinstance(item, Mapping) else None
        if not isinstance(metric, Mapping):
            raise SourceError(f"expected a range vector, got {str(item)[:200]!r}", url=url,
                              query=expr)
        slo = str(metric.get(LABEL_SLO, ""))
        last = _last_sample(item, expr, url)
        if last is None:
            continue
        name = str(metric.get(_NAME, ""))
        if name == RULE_SPEC_INFO:
            if slo not in infos or last[0] > infos[slo][0]:
                infos[slo] = (last[0], str(metric.get(LABEL_SPEC_VERSION, "")))
            continue
        window = _window_of(name)
        if window is not None and ((slo, window) not in ratios
                                   or last[0] > ratios[(slo, window)][0]):
            ratios[(slo, window)] = last

    current: dict[str, Recorded] = {}
    fallback: dict[str, str] = {}
    for spec in specs:
        why = _why_not_current(spec, infos.get(spec.name), at_s, interval_s, range_s)
        if why:
            fallback[spec.name] = why
            continue
        t_info, version = infos[spec.name]
        got: dict[float, float | None] = {}
        ages: dict[float, float] = {}
        recorded = frozenset(windows | {spec.period_s})
        for window in recorded:
            sample = ratios.get((spec.name, window))
            # The period is recorded by the slower group unless the table has it too.
            max_age = 2.0 * (interval_s if window in windows else period_interval_s)
            if sample is None or at_s - sample[0] > max_age:
                continue  # the current rules recorded nothing: no data in the window
            t, v = sample
            got[window] = v if math.isfinite(v) else None
            ages[window] = at_s - t
        current[spec.name] = Recorded(version, at_s - t_info, recorded, got, ages)
    return RecordedRead(current, fallback)


def _why_not_current(spec: SloSpec, info: tuple[float, str] | None, at_s: float,
                     interval_s: float, range_s: float) -> str:
    """Why ``spec``'s recorded series cannot be used ("" when they can)."""
    if info is None:
        return (f"the store recorded no {RULE_SPEC_INFO} for it in the last "
                f"{format_duration(range_s)} (load the rules `vigil rules prometheus` writes "
                "into the store's ruler)")
    t, version = info
    if at_s - t > 2.0 * interval_s:
        return (f"its recording rules last ran {format_duration(at_s - t)} before the "
                "evaluation time (is the store's ruler evaluating them?)")
    want = spec_version(spec)
    if version != want:
        return (f"the store's rules are of spec version {version or '(none)'}, this "
                f"config's is {want} (reload the rules `vigil rules prometheus` writes)")
    return ""


def _present(item: Mapping[str, Any], grid: Grid) -> list[tuple[int, float]]:
    """``(grid index, value)`` of a range answer's samples (its instants are the grid's)."""
    out = []
    for t, v in item.get("values") or ():
        k = round((round(float(t) * 1000) - grid.start_ms) / grid.step_ms)
        if 0 <= k < grid.n:
            out.append((k, float(v)))
    return out


def recorded_tracks(source: RangeQuerySource, spec: SloSpec, grid: Grid,
                    windows_s: Sequence[float]) -> tuple[dict[float, Track] | None, str]:
    """``spec``'s recorded error ratio per window at every instant of ``grid`` (what its
    alerts saw at each evaluation: the newest recorded sample within the store's lookback),
    and ``""``; or ``None`` and why, when the store's rules of this config's spec version did
    not run over the whole history (the backtest then computes the SLO from raw series, all
    of it, so that one replay does not mix two definitions). A recorded NaN (no requests)
    is absent, as the engine's ``None``."""
    selector = f"{{{LABEL_SLO}={promql_string(spec.name)}}}"
    want = spec_version(spec)
    covered = np.zeros(grid.n, dtype=np.bool_)
    others: set[str] = set()
    for item in source.query_range(f"{RULE_SPEC_INFO}{selector}", grid):
        version = str((item.get("metric") or {}).get(LABEL_SPEC_VERSION, ""))
        if version != want:
            others.add(version)
            continue
        for k, _ in _present(item, grid):
            covered[k] = True
    if not covered.all():
        if covered.any():
            first = grid.start_ms + int(np.argmax(covered)) * grid.step_ms
            missing = int((~covered).sum())
            return None, (f"the store's rules of spec version {want} ran over part of the "
                          f"history only ({missing} of {grid.n} evaluations without them, "
                          f"first with them at {first / 1000:.0f})")
        if others:
            return None, (f"the store's rules over the history are of spec version "
                          f"{', '.join(sorted(others))}, this config's is {want}")
        return None, f"the store recorded no {RULE_SPEC_INFO} for it over the history"
    tracks: dict[float, Track] = {}
    for window in windows_s:
        values = np.full(grid.n, np.nan)
        present = np.zeros(grid.n, dtype=np.bool_)
        items = source.query_range(f"{sli_record_name(window)}{selector}", grid)
        # Several series of one record (an HA pair's rulers): the first in label order that
        # has a number at an instant gives it.
        for item in sorted(items, key=lambda i: sorted((i.get("metric") or {}).items())):
            for k, v in _present(item, grid):
                if not present[k] and math.isfinite(v):
                    values[k] = v
                    present[k] = True
        tracks[window] = Track(values, present)
    return tracks, ""
