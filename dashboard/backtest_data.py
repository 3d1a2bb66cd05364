"""What the Backtest page shows, computed by plain functions: the SLO's generated burn-rate
alerts replayed over the range (``slo.backtest.run.backtest``), shaped into the timeline
chart's lines and shaded spans, the tables of alerts and missed burns, the attainment per day
of a latency SLO (``slo.backtest.attainment``) and the what-if table
(``slo.backtest.whatif.what_if``), with the parsing of the what-if inputs.

The page caches ``slo_page`` and the what-if rows (``dashboard/views/backtest.py``); nothing
here touches Streamlit. The timeline's Altair chart is built here too (on top of
``dashboard.charts.lines``), so that its layers can be checked without a browser.

Units: times are Unix seconds, durations seconds, burn rates multiples of the rate that spends
exactly the period's budget, budget shares ratios of the period's budget (1 = all of it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from dashboard import charts
from dashboard import format as fmt
from dashboard.charts import NEUTRAL_COLOR, PAGE_COLOR, TICKET_COLOR, Rule
from slo.backtest.attainment import attainment
from slo.backtest.run import AlertEpisode, Backtest, MissedBurn, SloBacktest, backtest
from slo.backtest.scorecard import scorecard
from slo.backtest.whatif import costing_for, what_if
from slo.objectives.burn_rate import SloBurnAlert
from slo.objectives.spec import SloSpec, effective_slos
from slo.promql.tracks import Grid
from slo.scaling.policy import SIGNAL_LABELS
from slo.sources.protocol import RangeSource, RequestLog
from vigil.config import Config
from vigil.conventions import ENDPOINT_ALL, SEVERITY_PAGE, SEVERITY_TICKET
from vigil.durations import format_duration, parse_duration

__all__ = [
    "ALIGN_STEPS",
    "AUTO_MAX_INSTANTS",
    "MAX_CHART_POINTS",
    "MAX_INSTANTS",
    "MAX_WHAT_IF_VALUES",
    "MISSED_COLOR",
    "MISSED_KIND",
    "SloPage",
    "alert_rows",
    "attainment_rows",
    "backtest_range",
    "chart_rules",
    "chart_windows",
    "evaluation_interval",
    "filter_specs",
    "instants",
    "missed_rows",
    "page_of",
    "parse_objectives",
    "parse_thresholds",
    "peaks",
    "scale_in_rows",
    "scale_out_rows",
    "scaling_card",
    "series_name",
    "slo_page",
    "span_rows",
    "spans_frame",
    "timeline",
    "trigger_rows",
    "what_if_rows",
    "what_if_table",
]

#: Up to this many evaluations (a day at the rules' 30 s) the page backtests as soon as it is
#: opened; a longer range waits for the user to ask (one SLO over 30 days at 30 s costs
#: seconds, see docs/benchmarks.md#backtest).
AUTO_MAX_INSTANTS = 3_000
#: At most this many evaluations (35 days at 30 s): beyond, the interval is widened to a
#: multiple of the rules' one, so that a long custom range stays within memory and seconds.
MAX_INSTANTS = 100_000
#: A live range's ends move in steps of 1/ALIGN_STEPS of its span (5 minutes for a day), so
#: that the refreshes within a step ask for the same backtest and hit the cache.
ALIGN_STEPS = 288
#: Points per line of the timeline: more than a chart's width in pixels draws nothing more.
MAX_CHART_POINTS = 1_000
#: What-if inputs: at most this many objectives and as many thresholds (each objective ×
#: threshold is one more backtest of the SLO).
MAX_WHAT_IF_VALUES = 6
#: The shaded span of a missed burn, beside one per severity (Streamlit's violet: neither a
#: page's red nor a ticket's orange).
MISSED_KIND = "missed burn"
MISSED_COLOR = "#803df5"
_SEVERITY_COLORS = {SEVERITY_PAGE: PAGE_COLOR, SEVERITY_TICKET: TICKET_COLOR}


# --- the range -------------------------------------------------------------------------------
def evaluation_interval(rules_interval_s: float, span_s: float,
                        max_instants: int = MAX_INSTANTS) -> float:
    """The evaluation interval (seconds): the rules' own (``[rules] interval``, what Prometheus
    evaluates), or the least multiple of it that keeps the range within ``max_instants``."""
    n = span_s / rules_interval_s + 1
    return rules_interval_s * max(1, math.ceil(n / max_instants))


def backtest_range(start_s: float, end_s: float, interval_s: float, *, live: bool
                   ) -> tuple[float, float]:
    """``(start, end)`` to backtest: a pinned range as it is (a link to an incident must show
    its last minutes); a live one moved down to multiples of a step of 1/``ALIGN_STEPS`` of
    its span (a multiple of ``interval_s``), so that refreshes within a step hit the cache."""
    if not live:
        return start_s, end_s
    step = interval_s * max(1, math.ceil((end_s - start_s) / ALIGN_STEPS / interval_s))
    return math.floor(start_s / step) * step, math.floor(end_s / step) * step


def instants(start_s: float, end_s: float, interval_s: float) -> int:
    """Evaluation instants of the grid from ``start_s`` to ``end_s`` (0 when none)."""
    try:
        return Grid.between(math.ceil(start_s * 1000), math.floor(end_s * 1000),
                            round(interval_s * 1000)).n
    except ValueError:
        return 0


def filter_specs(specs: Sequence[SloSpec], *, pools: Sequence[str] = (),
                 models: Sequence[str] = (), endpoint: str = ENDPOINT_ALL) -> list[SloSpec]:
    """The SLOs the controls keep (``dashboard.status_view.filter_slos`` on specs): by pool,
    model and endpoint; an empty filter (``"all"`` for the endpoint) keeps everything."""
    return [s for s in specs
            if (not pools or s.pool in pools) and (not models or s.model in models)
            and (not endpoint or endpoint == ENDPOINT_ALL or s.endpoint == endpoint)]


# --- one SLO's backtest, shaped ---------------------------------------------------------------
@dataclass(frozen=True)
class SloPage:
    """One SLO backtested over ``[start_s, end_s]`` every ``interval_s`` (``instants``
    evaluations; ``source`` the kind of the source read), as the page draws it.

    ``rows``: the alert table as it applies to the SLO (its own factors); ``alerts`` and
    ``missed`` the backtest's episodes; ``budget_remaining`` at the end (ratio, ``None``
    without data); ``per_30_days`` alerts of each severity scaled to 30 days;
    ``median_delay_s`` the median detection delay; ``lines`` the timeline's ``(t, series,
    burn rate)`` rows over ``windows`` (at most ``MAX_CHART_POINTS`` per series: each the
    highest of its stretch); ``attainment`` ``slo.backtest.attainment.attainment``'s rows
    (empty for an SLO that is not a latency one); ``has_data`` whether any instant had a burn
    rate (a pool without traffic has none)."""

    spec: SloSpec
    start_s: float
    end_s: float
    interval_s: float
    instants: int
    source: str
    rows: tuple[SloBurnAlert, ...]
    alerts: tuple[AlertEpisode, ...]
    missed: tuple[MissedBurn, ...]
    budget_remaining: float | None
    per_30_days: dict[str, float | None]
    median_delay_s: float | None
    windows: tuple[float, ...]
    lines: tuple[tuple[float, str, float | None], ...]
    attainment: tuple[dict[str, Any], ...]
    has_data: bool

    @property
    def name(self) -> str:
        """The SLO's name."""
        return self.spec.name

    def count(self, severity: str) -> int:
        """Alerts of ``severity`` over the range."""
        return sum(1 for a in self.alerts if a.severity == severity)


def chart_windows(rows: Sequence[SloBurnAlert]) -> list[float]:
    """The windows the timeline draws (seconds, ascending): the table's shortest (the one
    whose burn the detection delay and the missed burns are judged on) and each long window
    of the page rows (what a page waits for)."""
    if not rows:
        return []
    shortest = min(w for r in rows for w in (r.long_window, r.short_window))
    pages = {r.long_window for r in rows if r.severity == SEVERITY_PAGE}
    return sorted({shortest, *pages})


def series_name(window_s: float) -> str:
    """The timeline's name of the burn rate over ``window_s``."""
    return f"burn rate over {format_duration(window_s)}"


def peaks(times: np.ndarray, values: np.ndarray, max_points: int = MAX_CHART_POINTS
          ) -> list[tuple[float, float | None]]:
    """``(t, value)`` of at most ``max_points`` points: the instants cut into equal stretches,
    each drawn as its highest value at the instant it happened — a short burn stays on the
    chart instead of being averaged away. A stretch without data (all NaN) is ``None``."""
    n = len(values)
    if n == 0:
        return []
    k = max(1, math.ceil(n / max_points))
    out: list[tuple[float, float | None]] = []
    for a in range(0, n, k):
        chunk = values[a:a + k]
        finite = np.isfinite(chunk)
        if not finite.any():
            out.append((float(times[a]), None))
            continue
        i = int(np.argmax(np.where(finite, chunk, -np.inf)))
        out.append((float(times[a + i]), float(chunk[i])))
    return out


def page_of(result: Backtest, s: SloBacktest, *, attained: Sequence[dict[str, Any]] = (),
            max_points: int = MAX_CHART_POINTS) -> SloPage:
    """``SloPage`` of one SLO of ``result``: its tables' episodes and its timeline's lines
    (the burn rate over each of ``chart_windows``: the error ratio the backtest computed at
    every instant ÷ the SLO's error budget, as ``slo.backtest.run`` does)."""
    times = result.grid.instants_ms() / 1000
    budget = s.spec.error_budget
    windows = chart_windows(s.rows)
    lines: list[tuple[float, str, float | None]] = []
    has_data = False
    for w in windows:
        track = s.ratios.get(w)
        if track is None or budget <= 0:
            continue
        with np.errstate(all="ignore"):
            burn = track.values / budget
        has_data = has_data or bool(np.isfinite(burn).any())
        lines += [(t, series_name(w), v) for t, v in peaks(times, burn, max_points)]
    span = result.end - result.start + result.interval_s
    doc = s.to_dict(span)
    return SloPage(
        spec=s.spec, start_s=result.start, end_s=result.end, interval_s=result.interval_s,
        instants=result.grid.n, source=result.source, rows=s.rows, alerts=tuple(s.alerts),
        missed=tuple(s.missed_burns), budget_remaining=s.budget_remaining,
        per_30_days=dict(doc["per_30_days"]), median_delay_s=s.median_detection_delay(),
        windows=tuple(windows), lines=tuple(lines), attainment=tuple(attained),
        has_data=has_data)


def slo_page(config: Config, source: RangeSource, spec: SloSpec, start_s: float,
             end_s: float, interval_s: float, *, request_log: RequestLog | None = None,
             with_attainment: bool = True) -> SloPage:
    """``spec`` backtested from ``start_s`` to ``end_s`` every ``interval_s`` seconds (the
    ``vigil slo backtest`` of this SLO alone), with, for a latency SLO, the attainment of its
    candidate thresholds over the same range."""
    result = backtest(config, source, start_s, end_s, interval_s=interval_s, slos=[spec],
                      request_log=request_log)
    attained = (attainment(spec, source, start_s, end_s, request_log=request_log)
                if with_attainment else [])
    return page_of(result, result.slos[0], attained=attained)


# --- tables ----------------------------------------------------------------------------------
def _row_text(a: AlertEpisode) -> str:
    return (f"{a.factor:g}x over {format_duration(a.long_window)} & "
            f"{format_duration(a.short_window)}")


def alert_rows(alerts: Sequence[AlertEpisode]) -> list[dict[str, Any]]:
    """The alerts table: one row per firing, as ``vigil slo backtest`` prints it (``end``
    "firing" while it still fired at the end of the range; the budget consumed as a share of
    the period's budget; "quiet" when almost none of it burned)."""
    return [{
        "severity": a.severity,
        "start": fmt.timestamp(a.start),
        "end": "firing" if a.end is None else fmt.timestamp(a.end),
        "peak burn": fmt.ratio(a.peak_burn_rate, 1),
        "budget consumed": fmt.percent(a.budget_consumed, 1),
        "detection delay": fmt.duration(a.detection_delay_s),
        "fired on": _row_text(a),
        "quiet": a.quiet,
    } for a in alerts]


def missed_rows(missed: Sequence[MissedBurn]) -> list[dict[str, Any]]:
    """The missed burns table: the stretches no alert caught, what they consumed."""
    return [{
        "start": fmt.timestamp(m.start),
        "end": fmt.timestamp(m.end),
        "peak burn": fmt.ratio(m.peak_burn_rate, 1),
        "budget consumed": fmt.percent(m.budget_consumed, 1),
    } for m in missed]


def span_rows(alerts: Sequence[AlertEpisode], missed: Sequence[MissedBurn], end_s: float
              ) -> list[dict[str, Any]]:
    """The timeline's shaded spans (Unix seconds): each alert from its first firing evaluation
    to its resolution (``end_s``, the range's last instant, while it still fires), each
    missed burn over its stretch; ``kind`` is ``"<severity> alert"`` or ``MISSED_KIND``."""
    rows = [{"start": a.start, "end": a.end if a.end is not None else end_s,
             "kind": f"{a.severity} alert", "peak": a.peak_burn_rate,
             "consumed": a.budget_consumed} for a in alerts]
    rows += [{"start": m.start, "end": m.end, "kind": MISSED_KIND, "peak": m.peak_burn_rate,
              "consumed": m.budget_consumed} for m in missed]
    return rows


def spans_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``span_rows`` as the chart's frame (times as UTC datetimes, as ``charts.long_frame``)."""
    df = pd.DataFrame(list(rows), columns=["start", "end", "kind", "peak", "consumed"])
    for col in ("start", "end"):
        df[col] = pd.to_datetime(df[col], unit="s", utc=True)
    return df


def attainment_rows(rows: Sequence[Mapping[str, Any]], spec: SloSpec
                    ) -> list[dict[str, Any]]:
    """The attainment table: per candidate threshold the share of requests within it over
    the range, the whole UTC days and weeks that met the objective, and one column per day
    (its date)."""
    out = []
    for r in rows:
        threshold = r["threshold_seconds"]
        configured = spec.threshold_seconds is not None and math.isclose(
            threshold, spec.threshold_seconds)
        row: dict[str, Any] = {
            "threshold": fmt.seconds(threshold) + (" (configured)" if configured else ""),
            "over the range": fmt.percent(r["good_ratio"], 2),
            "days met": f"{r['days_met']} of {r['days']}" if r["days"] else fmt.NULL,
            "weeks met": f"{r['weeks_met']} of {r['weeks']}" if r["weeks"] else fmt.NULL,
        }
        for day in r["per_day"]:
            row[day["date"]] = fmt.percent(day["good_ratio"], 2)
        out.append(row)
    return out


def _per_30(value: float | None) -> str:
    return fmt.NULL if value is None or not math.isfinite(value) else f"{value:.1f}"


def what_if_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The what-if table from ``WhatIfRow.to_dict`` rows (the configured SLO first): one row
    per variant, as ``vigil slo backtest --objective/--threshold`` prints it."""
    out = []
    for i, r in enumerate(rows):
        per = r["per_30_days"]
        cost = r["cost"]
        priced = (f"{fmt.usd(cost['gpu_cost_per_month_usd'])}/month, "
                  f"{cost['peak_replicas']} × {cost['configuration']}" if cost
                  else r["cost_note"] or fmt.NULL)
        threshold = r["threshold_seconds"]
        out.append({
            "variant": "configured" if i == 0 else "what if",
            "objective": f"{r['objective'] * 100:g}%",
            "threshold": fmt.NULL if threshold is None else fmt.seconds(threshold),
            "pages / 30 d": _per_30(per.get(SEVERITY_PAGE)),
            "tickets / 30 d": _per_30(per.get(SEVERITY_TICKET)),
            "missed burns": int(r["missed_burns"]),
            "median detection delay": fmt.duration(r["median_detection_delay_seconds"]),
            "budget left": fmt.percent(r["budget_remaining"], 1),
            "cost": priced,
        })
    return out


# --- what-if inputs --------------------------------------------------------------------------
_SEPARATORS = re.compile(r"[,;\s]+")


def _values(text: str, what: str) -> list[str]:
    found = [v for v in _SEPARATORS.split(text.strip()) if v]
    if len(found) > MAX_WHAT_IF_VALUES:
        raise ValueError(f"at most {MAX_WHAT_IF_VALUES} {what} at once (each is one more "
                         f"backtest), got {len(found)}")
    return found


def parse_objectives(text: str) -> list[float]:
    """Objectives from ``text``: ratios or percentages separated by commas or spaces
    (``"0.95, 99.9%"`` -> ``[0.95, 0.999]``), each strictly between 0 and 1. ``ValueError``
    names the value that is not one."""
    out = []
    for v in _values(text, "objectives"):
        try:
            value = float(v[:-1]) / 100 if v.endswith("%") else float(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an objective: give a ratio such as 0.995 or a "
                             "percentage such as 99.5%") from None
        if not (math.isfinite(value) and 0 < value < 1):
            raise ValueError(f"{v!r} is not an objective: a share of good requests strictly "
                             "between 0 and 1 (0.995, or 99.5%)")
        out.append(value)
    return out


def parse_thresholds(text: str) -> list[float]:
    """Latency thresholds in seconds from ``text``: seconds or durations separated by commas
    or spaces (``"0.5, 2.5s, 800ms"`` -> ``[0.5, 2.5, 0.8]``), each more than 0.
    ``ValueError`` names the value that is not one."""
    out = []
    for v in _values(text, "thresholds"):
        try:
            value = float(v)
        except ValueError:
            try:
                value = parse_duration(v)
            except ValueError:
                raise ValueError(f"{v!r} is not a threshold: give seconds such as 0.5 or a "
                                 "duration such as 500ms or 2.5s") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{v!r} is not a threshold: a latency of more than 0 seconds")
        out.append(value)
    return out


def what_if_table(config: Config, source: RangeSource, spec: SloSpec, start_s: float,
                  end_s: float, interval_s: float, *, objectives: Sequence[float] = (),
                  thresholds: Sequence[float] = (), request_log: RequestLog | None = None
                  ) -> list[dict[str, Any]]:
    """``slo.backtest.whatif.what_if`` of ``spec`` over the grid ``slo_page`` backtests (the
    configured SLO first, then each objective × threshold), priced with ``costing``: its
    rows as ``WhatIfRow.to_dict`` (the JSON of ``vigil slo backtest --objective``)."""
    grid = Grid.between(math.ceil(start_s * 1000), math.floor(end_s * 1000),
                        round(interval_s * 1000))
    pool = config.pool(spec.pool)
    table = what_if(config, source, grid, objectives=objectives, thresholds=thresholds,
                    costings={pool.name: costing_for(config, pool, source, start_s, end_s)},
                    request_log=request_log, slos=[spec])
    span = (grid.end_ms - grid.start_ms) / 1000 + interval_s
    return [r.to_dict(span) for r in table[spec.name]]


# --- the timeline chart ----------------------------------------------------------------------
def chart_rules(rows: Sequence[SloBurnAlert]) -> list[Rule]:
    """A dashed line at each row's factor (the SLO's own: a 1-day SLO pages at another
    factor than a 30-day one), coloured by severity."""
    seen: set[tuple[str, float]] = set()
    out = []
    for r in rows:
        if (r.severity, r.factor) in seen:
            continue
        seen.add((r.severity, r.factor))
        out.append(Rule(r.factor, f"{r.factor:g}x {r.severity} "
                                  f"({format_duration(r.long_window)} & "
                                  f"{format_duration(r.short_window)})",
                        _SEVERITY_COLORS.get(r.severity, NEUTRAL_COLOR)))
    return out


def timeline(lines: pd.DataFrame, spans: pd.DataFrame, rules: Sequence[Rule] = (), *,
             height: int = charts.HEIGHT) -> alt.LayerChart:
    """The burn-rate lines (``charts.lines`` over ``lines``, a ``charts.long_frame``) with the
    alert table's factors as dashed rules, over shaded spans (``spans_frame``): the alerts of
    each severity and the missed burns, in a legend of their own."""
    chart = charts.lines(lines, y_title="burn rate (x budget)", y_format=".1f", rules=rules,
                         height=height)
    if spans.empty:
        return chart
    kinds = list(dict.fromkeys(spans["kind"]))
    colors = [MISSED_COLOR if k == MISSED_KIND
              else _SEVERITY_COLORS.get(k.removesuffix(" alert"), NEUTRAL_COLOR) for k in kinds]
    # Only x and x2: a rect without a y encoding spans the plot's whole height.
    band = alt.Chart(spans).mark_rect(opacity=0.18).encode(
        x=alt.X("start:T", title=None, scale=alt.Scale(type="utc"), axis=None),
        x2="end:T",
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=kinds, range=colors),
                        legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("kind:N", title="span"),
                 alt.Tooltip("start:T", title="start (UTC)", format="%Y-%m-%d %H:%M:%S"),
                 alt.Tooltip("end:T", title="end (UTC)", format="%Y-%m-%d %H:%M:%S"),
                 alt.Tooltip("peak:Q", title="peak burn", format=".1f"),
                 alt.Tooltip("consumed:Q", title="budget consumed", format=".1%")])
    # The spans under the lines; every layer keeps its own colours (lines, rules, spans).
    layered: alt.LayerChart = alt.layer(band, *chart.layer).resolve_scale(
        color="independent").properties(height=height)
    return layered


# --- the scaling-advice scorecard ------------------------------------------------------------


def scaling_card(config: Config, source: RangeSource, pool: str, start_s: float,
                 end_s: float, interval_s: float, *,
                 request_log: RequestLog | None = None) -> dict[str, Any]:
    """The pool's scaling-advice scorecard over the range (``slo.backtest.scorecard``, the
    ``scaling.<pool>`` of ``vigil slo backtest --json``): judged by all of the pool's SLOs,
    backtested every ``interval_s`` seconds."""
    specs = [s for s in effective_slos(config) if s.pool == pool]
    result = backtest(config, source, start_s, end_s, interval_s=interval_s, slos=specs,
                      request_log=request_log)
    return scorecard(result, source, config, config.pool(pool)).to_dict()


def trigger_rows(card: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per scale-out trigger: its threshold, its firings split into early warnings,
    late and noise, the burns it fired around out of all, how often it fired first, the
    median lead (seconds) of its early warnings."""
    total = len(card["burns"])
    return [{
        "trigger": SIGNAL_LABELS.get(sig, sig), "threshold": t["threshold"],
        "firings": t["firings"], "early warnings": t["early_warnings"], "late": t["late"],
        "noise": t["noise"], "burns warned": f"{t['burns_warned']} of {total}",
        "fired first": t["first"],
        "median lead": (None if t["median_lead_seconds"] is None
                        else format_duration(t["median_lead_seconds"])),
    } for sig, t in card["triggers"].items()]


def scale_out_rows(card: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per scale-out: when (UTC), replicas, its triggers, whether the pool was
    burning, the outcome within spin-up + cooldown and the replicas up by then."""
    rows = []
    for o in card["scale_outs"]:
        after = o["burn_stopped_after_seconds"] or o["burn_began_after_seconds"]
        rows.append({
            "at": fmt.timestamp(o["at"]), "replicas": f"{o['current']} → {o['desired']}",
            "triggers": ", ".join(SIGNAL_LABELS.get(t, t) for t in o["triggers"]),
            "burning": o["burning"],
            "outcome": o["outcome"] + ("" if after is None
                                       else f" after {format_duration(after)}"),
            "replicas added": o["replicas_added"], "serve's decision": o["kept"],
        })
    return rows


def scale_in_rows(card: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per scale-in: when (UTC), replicas, since when the lower bound allowed it,
    how late beyond the hold, the GPU-hours above the bound meanwhile (``None`` without a
    capacity profile)."""
    return [{
        "at": fmt.timestamp(s["at"]), "replicas": f"{s['current']} → {s['desired']}",
        "bound allowed it from": (None if s["lower_bound_since"] is None
                                  else fmt.timestamp(s["lower_bound_since"])),
        "late by": (None if s["late_by_seconds"] is None
                    else format_duration(s["late_by_seconds"])),
        "too late": s["too_late"],
        "GPU-hours above the bound": s["gpu_hours_above_lower_bound"],
    } for s in card["scale_ins"]]
