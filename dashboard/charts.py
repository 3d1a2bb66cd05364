"""Altair charts (Vega-Lite, which ships with Streamlit): lines over time with threshold rules,
and bars with rules. Pure builders: data in, ``alt.Chart`` out; the views hand them to
``st.altair_chart``.

The data is long-format: one row per ``(time, series, value)`` (``time`` timezone-aware UTC).
Times are drawn in UTC, as every Vigil command prints them.

Rule labels never overlap: the y domain is set here (``y_domain``, not "nice"d by Vega), so a
rule's height in pixels is a linear function of the chart's ``height`` signal, and each label
is placed by a Vega expression of it (``label_expressions``): above its rule, moved up just
enough to keep one line of text between neighbours, inside the frame, whatever height the
chart is drawn at. A white halo keeps a label readable over a line or a bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import altair as alt
import pandas as pd

__all__ = ["HEIGHT", "LABEL_GAP", "Layers", "Rule", "bars", "label_centres", "label_expressions",
           "lines", "long_frame", "time_axis", "y_domain"]

#: Chart height in pixels: two charts side by side stay readable on a laptop screen.
HEIGHT = 240
#: Severity colours, shared with the badges (Streamlit's red/orange).
PAGE_COLOR = "#ff4b4b"
TICKET_COLOR = "#ffa421"
NEUTRAL_COLOR = "#808495"
#: Rule labels: font size, the least distance between two labels' centres, how far above its
#: rule a label sits and how far from the frame it stays (pixels).
LABEL_FONT = 11
LABEL_GAP = 13.0
_LABEL_ABOVE = 8.0
_LABEL_EDGE = 7.0
#: Room above the highest line or rule (share of the domain), so neither sits on the frame.
_HEADROOM = 0.15


class Layers(alt.LayerChart):
    """The builders' layered chart: an ``alt.LayerChart`` that is not checked against the
    Vega-Lite schema each time Streamlit draws it (``to_dict``'s ``validate`` off unless
    asked). The builders below make a handful of fixed shapes, which the tests check against
    the schema (``tests/test_dashboard_units.py``); checking again on every draw cost ~45 ms
    a chart, a fifth of a page's render."""

    def to_dict(self, *args: Any, validate: bool = False, **kwargs: Any) -> dict[str, Any]:
        """``alt.LayerChart.to_dict`` without the schema check unless ``validate``."""
        return super().to_dict(*args, validate=validate, **kwargs)


def _layers(layers: list[alt.Chart], height: int) -> Layers:
    """``layers`` over one another, colours independent (the lines' palette has a legend,
    the rules carry their own colour), ``height`` pixels high: made in one step, since each
    of ``resolve_scale`` and ``properties`` copies every layer again."""
    return Layers(layer=layers, height=height,
                  resolve=alt.Resolve(scale=alt.ScaleResolveMap(color="independent")))


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


def y_domain(values: Sequence[float], *, zero: bool = True) -> tuple[float, float]:
    """The y domain ``(low, high)`` of a chart of ``values`` (its data and rules): from 0 (or
    a little below the lowest value when ``zero`` is false) to ``_HEADROOM`` above the highest."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if zero:
        low, high = min(low, 0.0), max(high, 0.0)
    spread = high - low or abs(high) or 1.0
    return (low if zero else low - 0.05 * spread), high + _HEADROOM * spread


def _label_order(values: Sequence[float]) -> list[int]:
    """Indices of ``values`` from the highest (top of the chart) down; ties keep their order."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def label_centres(values: Sequence[float], domain: tuple[float, float], height: float
                  ) -> list[float]:
    """The vertical centre (pixels from the top) of each rule's label in a plot ``height``
    pixels high: ``_LABEL_ABOVE`` above its rule; where two would be closer than
    ``LABEL_GAP``, the upper one moves up (so neither crosses its own rule), and only the
    frame's top edge pushes labels down. ``label_expressions`` is the same computation as
    Vega expressions of ``height``."""
    low, high = domain
    order = _label_order(values)
    want = [height * (high - values[i]) / (high - low) - _LABEL_ABOVE for i in order]
    up = list(want)
    for k in range(len(up) - 1, -1, -1):
        up[k] = min(want[k], height - _LABEL_EDGE if k == len(up) - 1 else up[k + 1] - LABEL_GAP)
    down: list[float] = []
    for k, u in enumerate(up):
        down.append(max(u, _LABEL_EDGE if k == 0 else down[-1] + LABEL_GAP))
    out = [0.0] * len(values)
    for k, i in enumerate(order):
        out[i] = down[k]
    return out


def label_expressions(values: Sequence[float], domain: tuple[float, float]) -> list[str]:
    """``label_centres`` as one Vega expression per rule, of the ``height`` signal (the plot's
    height as drawn), in the order of ``values``. Closed forms of the two passes, top label
    first: moved up, ``u[k] = min(height - edge - (n-1-k)·gap, want[m] - (m-k)·gap for m >=
    k)``; then pushed down, ``max(edge + k·gap, u[j] + (k-j)·gap for j <= k)``."""
    low, high = domain
    order = _label_order(values)
    n = len(order)
    want = [f"height*{(high - values[i]) / (high - low):.6g}-{_LABEL_ABOVE:g}" for i in order]
    up = [f"min(height-{_LABEL_EDGE + (n - 1 - k) * LABEL_GAP:g},"
          + ",".join(f"{want[m]}-{(m - k) * LABEL_GAP:g}" for m in range(k, n)) + ")"
          for k in range(n)]
    down = [f"max({_LABEL_EDGE + k * LABEL_GAP:g},"
            + ",".join(f"{up[j]}+{(k - j) * LABEL_GAP:g}" for j in range(k + 1)) + ")"
            for k in range(n)]
    out = [""] * n
    for k, i in enumerate(order):
        out[i] = down[k]
    return out


def _rules_layer(rules: Sequence[Rule], y_format: str, y_scale: alt.Scale,
                 domain: tuple[float, float], *, right: bool = False) -> list[alt.Chart]:
    """Dashed lines, and their labels (one layer each, placed by ``label_expressions``) at the
    left end (time charts: the newest data, on the right, is what one reads) or the right end
    (bars)."""
    if not rules:
        return []
    df = pd.DataFrame([{"value": r.value, "label": r.label, "color": r.color} for r in rules])
    line = alt.Chart(df).mark_rule(strokeDash=[6, 4], strokeWidth=1.5).encode(
        y=alt.Y("value:Q", scale=y_scale),
        color=alt.Color("color:N", scale=None),
        tooltip=[alt.Tooltip("label:N", title="line"),
                 alt.Tooltip("value:Q", format=y_format)])
    # Channel objects, not ``alt.value`` dicts: Altair turns a dict into its channel class
    # through ``from_dict``, which hashes its whole schema each time (~10 ms a call).
    x = alt.XValue(alt.ExprRef(expr="width")) if right else alt.XValue(0)
    text = {"align": "right" if right else "left", "baseline": "middle",
            "dx": -3 if right else 3, "fontSize": LABEL_FONT}
    layers: list[alt.Chart] = [line]
    for rule, expr in zip(rules, label_expressions([r.value for r in rules], domain),
                          strict=True):
        one = alt.Chart(pd.DataFrame([{"label": rule.label}]))
        enc = {"x": x, "y": alt.YValue(alt.ExprRef(expr=expr)), "text": alt.Text("label:N")}
        # The halo first, the text over it: a label stays readable across a line or a bar.
        layers.append(one.mark_text(**text, stroke="white", strokeWidth=3, strokeOpacity=0.85,
                                    strokeJoin="round").encode(**enc))
        layers.append(one.mark_text(**text, color=rule.color).encode(**enc))
    return layers


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
          ) -> Layers:
    """One line per ``series`` over ``time``, with dashed ``rules``. The y scale always
    includes the rules, so a threshold far above the data is still visible."""
    times = df["time"].map(pd.Timestamp.timestamp) if len(df) else pd.Series([0.0])
    x_format, tick_values = time_axis(float(times.min()), float(times.max()))
    domain = y_domain([*map(float, df["value"]), *(r.value for r in rules)], zero=y_zero)
    y_scale = alt.Scale(domain=list(domain), nice=False, zero=False)
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
    return _layers([chart, *_rules_layer(rules, y_format, y_scale, domain)], height)


def bars(df: pd.DataFrame, *, x: str, y: str, x_title: str, y_title: str,
         y_format: str = ".3~f", rules: Sequence[Rule] = (), color: str | None = None,
         sort: Sequence[str] | None = None, height: int = HEIGHT) -> Layers:
    """Bars of ``y`` per category ``x`` (in ``sort`` order), with dashed ``rules``; ``color``
    names a column holding each bar's colour."""
    domain = y_domain([*map(float, df[y].dropna()), *(r.value for r in rules)])
    y_scale = alt.Scale(domain=list(domain), nice=False, zero=False)
    enc = {
        "x": alt.X(f"{x}:N", title=x_title, sort=list(sort) if sort else None,
                   axis=alt.Axis(labelAngle=0)),
        "y": alt.Y(f"{y}:Q", title=y_title, axis=alt.Axis(format=y_format), scale=y_scale),
        "tooltip": [alt.Tooltip(f"{x}:N", title=x_title),
                    alt.Tooltip(f"{y}:Q", title=y_title, format=y_format)],
    }
    if color:
        enc["color"] = alt.Color(f"{color}:N", scale=None)
    chart = alt.Chart(df).mark_bar().encode(**enc)
    return _layers([chart, *_rules_layer(rules, y_format, y_scale, domain, right=True)],
                   height)
