"""Altair charts (Vega-Lite, which ships with Streamlit): lines over time with threshold rules,
and bars with rules. Pure builders: data in, ``alt.Chart`` out; the views hand them to
``st.altair_chart``.

The data is long-format: one row per ``(time, series, value)`` (``time`` timezone-aware UTC).
Times are drawn in UTC, as every Vigil command prints them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import altair as alt
import pandas as pd

__all__ = ["HEIGHT", "Rule", "bars", "lines", "long_frame", "time_axis"]

#: Chart height in pixels: two charts side by side stay readable on a laptop screen.
HEIGHT = 240
#: Severity colours, shared with the badges (Streamlit's red/orange).
PAGE_COLOR = "#ff4b4b"
TICKET_COLOR = "#ffa421"
NEUTRAL_COLOR = "#808495"


@dataclass(frozen=True)
class Rule:
    """A horizontal line at ``value`` (a threshold, an SLO, an alert factor), labelled."""

    value: float
    label: str
    color: str = PAGE_COLOR


def long_frame(rows: Sequence[tuple[float, str, float | None]]) -> pd.DataFrame:
    """``(unix seconds, series, value)`` rows as the charts' frame; ``None`` values are
    dropped (a gap in the line rather than a false 0)."""
    kept = [(t, s, v) for t, s, v in rows if v is not None]
    df = pd.DataFrame(kept, columns=["t", "series", "value"])
    df["time"] = pd.to_datetime(df["t"], unit="s", utc=True)
    return df[["time", "series", "value"]]


def _rules_layer(rules: Sequence[Rule], y_format: str, *, right: bool = False
                 ) -> list[alt.Chart]:
    """Dashed lines with their labels above them, at the left end (time charts: the newest
    data, on the right, is what one reads) or the right end (bars)."""
    if not rules:
        return []
    df = pd.DataFrame([{"value": r.value, "label": r.label, "color": r.color} for r in rules])
    base = alt.Chart(df)
    line = base.mark_rule(strokeDash=[6, 4], strokeWidth=1.5).encode(
        y="value:Q", color=alt.Color("color:N", scale=None),
        tooltip=[alt.Tooltip("label:N", title="line"),
                 alt.Tooltip("value:Q", format=y_format)])
    text = base.mark_text(align="right" if right else "left", baseline="bottom",
                          dx=-2 if right else 2, dy=-2, fontSize=11).encode(
        y="value:Q", x=alt.value({"expr": "width"}) if right else alt.value(0),
        text="label:N", color=alt.Color("color:N", scale=None))
    return [line, text]


#: Nice tick steps for a time axis (seconds): minutes, hours, days.
_TICK_STEPS = (60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0, 21600.0,
               43200.0, 86400.0, 172800.0, 604800.0)


def time_axis(start_s: float, end_s: float, ticks: int = 7
              ) -> tuple[str, list[dict[str, int | bool]]]:
    """Label format and tick positions (Vega-Lite UTC date-times) of a time axis from
    ``start_s`` to ``end_s``:
    about ``ticks`` ticks on whole minutes, hours or days — Vega's own choice falls on half
    minutes, which "%H:%M" prints twice — and the date beyond a day (d3-time-format)."""
    span = max(0.0, end_s - start_s)
    step = next((s for s in _TICK_STEPS if span / s <= ticks), _TICK_STEPS[-1])
    fmt = "%H:%M" if span <= 86400 else ("%b %d" if step >= 86400 else "%b %d %H:%M")
    first = math.ceil(start_s / step) * step
    return fmt, [_datetime(first + k * step) for k in range(int((end_s - first) // step) + 1)]


def _datetime(seconds: float) -> dict[str, int | bool]:
    """A Vega-Lite DateTime object in UTC (an axis' ``values`` for a temporal field)."""
    dt = datetime.fromtimestamp(seconds, UTC)
    return {"year": dt.year, "month": dt.month, "date": dt.day, "hours": dt.hour,
            "minutes": dt.minute, "seconds": dt.second, "utc": True}


def lines(df: pd.DataFrame, *, y_title: str, y_format: str = ".3~f",
          rules: Sequence[Rule] = (), height: int = HEIGHT, y_zero: bool = True,
          ) -> alt.LayerChart:
    """One line per ``series`` over ``time``, with dashed ``rules``. The y scale always
    includes the rules, so a threshold far above the data is still visible."""
    times = df["time"].map(pd.Timestamp.timestamp) if len(df) else pd.Series([0.0])
    x_format, tick_values = time_axis(float(times.min()), float(times.max()))
    top = max([float(df["value"].max()) if len(df) else 0.0, *(r.value for r in rules)])
    # Headroom above the highest line or rule, so that neither sits on the frame.
    domain_max = top * 1.15 if top > 0 else None
    y_scale = alt.Scale(zero=y_zero, domainMax=domain_max) if domain_max else alt.Scale(
        zero=y_zero)
    # A series of one or two points draws no visible line (a young store, a long range):
    # mark the points then.
    sparse = len(df) == 0 or int(df.groupby("series").size().max()) < 3
    chart = alt.Chart(df).mark_line(interpolate="linear", point=sparse).encode(
        x=alt.X("time:T", title=None, scale=alt.Scale(type="utc"),
                axis=alt.Axis(format=x_format, values=tick_values, labelOverlap=True)),
        y=alt.Y("value:Q", title=y_title, axis=alt.Axis(format=y_format), scale=y_scale),
        color=alt.Color("series:N", title=None,
                        legend=alt.Legend(orient="bottom", labelLimit=360, columns=4)),
        tooltip=[alt.Tooltip("time:T", title="time (UTC)", format="%Y-%m-%d %H:%M:%S"),
                 alt.Tooltip("series:N"), alt.Tooltip("value:Q", format=y_format)],
    )
    # Independent colours: the lines' palette has a legend, the rules carry their own colour.
    return alt.layer(chart, *_rules_layer(rules, y_format)).resolve_scale(
        color="independent").properties(height=height)


def bars(df: pd.DataFrame, *, x: str, y: str, x_title: str, y_title: str,
         y_format: str = ".3~f", rules: Sequence[Rule] = (), color: str | None = None,
         sort: Sequence[str] | None = None, height: int = HEIGHT) -> alt.LayerChart:
    """Bars of ``y`` per category ``x`` (in ``sort`` order), with dashed ``rules``; ``color``
    names a column holding each bar's colour."""
    enc = {
        "x": alt.X(f"{x}:N", title=x_title, sort=list(sort) if sort else None,
                   axis=alt.Axis(labelAngle=0)),
        "y": alt.Y(f"{y}:Q", title=y_title, axis=alt.Axis(format=y_format)),
        "tooltip": [alt.Tooltip(f"{x}:N", title=x_title),
                    alt.Tooltip(f"{y}:Q", title=y_title, format=y_format)],
    }
    if color:
        enc["color"] = alt.Color(f"{color}:N", scale=None)
    chart = alt.Chart(df).mark_bar().encode(**enc)
    return alt.layer(chart, *_rules_layer(rules, y_format, right=True)).resolve_scale(
        color="independent").properties(height=height)
