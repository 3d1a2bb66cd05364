"""Quality: TTFT and end-to-end p50/p95/p99 over time with the SLO thresholds, finished
requests by class, and burn rates per window against the alert table's factors for the
chosen SLO's period."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, data, layout
from dashboard import format as fmt
from dashboard.charts import PAGE_COLOR, TICKET_COLOR, Rule
from dashboard.gateway_data import CLASS_OK
from dashboard.status_view import STATE_COLORS, filter_slos, slo_state
from dashboard.timeseries import chart_step, chart_times
from slo.objectives.burn_rate import burn_windows, status_burn_alerts
from vigil.config import PoolConfig
from vigil.conventions import (
    FINISHED_REASON_ABORT,
    FINISHED_REASON_ERROR,
    QP_SLO,
    SEVERITY_PAGE,
    SEVERITY_TICKET,
    VLLM_E2E,
    VLLM_TTFT,
)
from vigil.durations import format_duration

ctx = data.context()
#: Points of the burn-rate history (each is one SLI per window: the heaviest chart).
BURN_POINTS = 60


def _models(pool: PoolConfig, slos: list[Mapping[str, Any]]) -> list[str]:
    models = sorted({pool.model} | {s["model"] for s in slos if s["pool"] == pool.name})
    return [m for m in models if not ctx.view.models or m in ctx.view.models]


def _latency(pool: PoolConfig, model: str, slos: list[Mapping[str, Any]], times: list[float],
             window_s: float, indicator: str) -> None:
    metric, name = (VLLM_TTFT, "TTFT") if indicator == "ttft" else (VLLM_E2E, "End-to-end")
    rows = [(t, q, v) for t, per_model in data.series(ctx, "quantile", times, pool.name,
                                                       window_s, metric)
            for q, v in (per_model.get(model) or {}).items()]
    df = charts.long_frame(rows)
    rules = [Rule(s["threshold_seconds"],
                  f"SLO {s['name']} ≤ {fmt.seconds(s['threshold_seconds'])}")
             for s in slos if s["indicator"] == indicator and s["pool"] == pool.name
             and s["model"] == model and s.get("threshold_seconds")]
    if indicator == "ttft" and rules:
        limit = min(r.value for r in rules) * ctx.config.scaling.scale_out_ttft_ratio
        rules.append(Rule(limit, f"scale out above {fmt.seconds(limit)}", TICKET_COLOR))
    st.markdown(f"**{name} latency** (p50 / p95 / p99 over {format_duration(window_s)})")
    layout.chart(charts.lines(df, y_title="seconds", y_format=".2f", rules=rules), df,
                 f"No {name} observation for {model} in this range.")


def _now_quantiles(status: Mapping[str, Any], pool: PoolConfig, model: str) -> None:
    """The engine's quantiles now, each as exact as its source allows: a figure from the
    gateway's records as a number, a histogram figure in a wide bucket as that bucket."""
    block = ((status.get("pools") or {}).get(pool.name) or {}).get("models", {}).get(model)
    if not block:
        return
    q = block.get("quantiles") or {}
    parts = [f"{name} " + " / ".join(fmt.quantile(q.get(key), k) for k in ("p50", "p95", "p99"))
             for name, key in (("TTFT", "ttft_seconds"), ("e2e", "e2e_seconds"),
                               ("queue", "queue_seconds"))]
    origin = fmt.quantile_origin([q.get("ttft_seconds"), q.get("e2e_seconds")])
    st.caption(f"Now, p50 / p95 / p99 over {q.get('window', '')}: {' · '.join(parts)} "
               f"({origin}; a range is the histogram bucket that holds the quantile). The "
               "charts draw vLLM's histogram quantiles.")


def _errors(pool: PoolConfig, model: str, slos: list[Mapping[str, Any]], times: list[float],
            window_s: float) -> None:
    rows: list[tuple[float, str, float | None]] = []
    for t, by_reason in data.series(ctx, "finished", times, pool.name, window_s, model):
        total = sum(by_reason.values())
        if total > 0:
            rows.append((t, "5xx / OOM (vLLM error)", by_reason.get(FINISHED_REASON_ERROR, 0.0)
                         / total))
            rows.append((t, "aborted by the server", by_reason.get(FINISHED_REASON_ABORT, 0.0)
                         / total))
    gateway = data.series(ctx, "error_classes", times, pool.name, window_s, model)
    for t, classes in gateway:
        total = sum((classes or {}).values())
        for cls, n in (classes or {}).items():
            if cls != CLASS_OK and total:
                rows.append((t, f"gateway: {cls.replace('_', ' ')}", n / total))
    df = charts.long_frame(rows)
    rules = [Rule(1.0 - s["objective"], f"SLO {s['name']}: {fmt.percent(1 - s['objective'], 2)}")
             for s in slos if s["indicator"] == "error_rate" and s["pool"] == pool.name
             and s["model"] == model]
    st.markdown(f"**Errors by class** (share of finished requests over "
                f"{format_duration(window_s)})")
    layout.chart(charts.lines(df, y_title="share of requests", y_format=".1%", rules=rules), df,
                 "No finished request in this range.")
    if not any(c for _, c in gateway):
        st.caption("Timeouts and client cancellations are seen by the gateway only: run "
                   "`vigil gateway` in front of the pool to see them here.")


def _burn_section(slos: list[Mapping[str, Any]], at_s: float) -> None:
    st.subheader("Burn rates", anchor=False)
    if not slos:
        st.info("No SLO matches the filters.")
        return
    table = []
    for s in slos:
        row: dict[str, Any] = {"SLO": s["name"], "state": slo_state(s)}
        for w, v in (s.get("windows") or {}).items():
            row[w] = v.get("burn_rate")
        table.append(row)
    st.dataframe(pd.DataFrame(table), hide_index=True, key="burn-table",
                 column_config={w: st.column_config.NumberColumn(w, format="%.2fx")
                                for w in (slos[0].get("windows") or {})})
    names = [s["name"] for s in slos]
    # The worst SLO first: one that pages, else one with a ticket, else the first.
    rank = {SEVERITY_PAGE: 0, SEVERITY_TICKET: 1}
    default = min(range(len(slos)), key=lambda i: (rank.get(slo_state(slos[i]), 2), i))
    name = st.selectbox("SLO", names, index=default, key=QP_SLO, bind="query-params",
                        help="The SLO whose burn rates are drawn below.")
    slo = next(s for s in slos if s["name"] == name)
    # The SLO's own factors: a 7-day SLO pages at 3.36x over 1h where a 30-day one needs 14.4x.
    alerts = status_burn_alerts(slo, ctx.config.engine.burn_rate_alerts)
    left, right = st.columns([2, 3], gap="medium")
    with left:
        st.markdown(f"**{name}: burn rate per window now** · state "
                    f":{STATE_COLORS[slo_state(slo)]}-badge[{slo_state(slo)}]")
        windows = slo.get("windows") or {}
        bars = pd.DataFrame([{"window": w, "burn rate": v.get("burn_rate")}
                             for w, v in windows.items() if v.get("burn_rate") is not None])
        rules = [Rule(a.factor, f"{a.factor:g}x {a.severity} "
                      f"({format_duration(a.long_window)} & {format_duration(a.short_window)})",
                      PAGE_COLOR if a.severity == SEVERITY_PAGE else TICKET_COLOR)
                 for a in alerts]
        layout.chart(charts.bars(bars, x="window", y="burn rate", x_title="window",
                                 y_title="burn rate (x budget)", y_format=".1f", rules=rules,
                                 sort=list(windows)) if not bars.empty else None, bars,
                     f"{name} has no data in any window.")
    with right:
        start, end = ctx.view.window(at_s)
        step = chart_step(end - start, min_step_s=ctx.config.collector.scrape_interval,
                          max_points=BURN_POINTS)
        times = chart_times(end, end - start, step)
        longs = sorted({a.long_window for a in alerts})
        rows = [(t, f"{format_duration(w)} window", v["burn_rate"])
                for w in longs for t, v in data.series(ctx, "burn", times, name, w)]
        df = charts.long_frame(rows)
        st.markdown("**Burn rate over time** (each long window of the alert table)")
        layout.chart(charts.lines(df, y_title="burn rate (x budget)", y_format=".1f",
                                  rules=rules), df, f"{name} has no data in this range.")
    derived = any(a.budget_share is not None for a in alerts)
    factors = (f"A factor is the share of {name}'s {slo.get('period')} budget the alert may "
               "spend in its long window × period ÷ long window. " if derived else
               "The factors are fixed in `[engine] burn_rate_alerts`. ")
    st.caption("An alert fires when the burn rate over both its long and its short window "
               "is above its factor (multiwindow, multi-burn-rate: SRE workbook, table 5-8). "
               f"{factors}"
               f"Windows: {', '.join(format_duration(w) for w in burn_windows(alerts))}.")


def body() -> None:
    at_s = data.now(ctx)
    with data.empty_states(ctx):
        layout.header(ctx, "Quality", at_s)
        status = data.status(ctx, at_s)
        slos = filter_slos(status["slos"], pools=ctx.view.pools, models=ctx.view.models,
                           endpoint=ctx.view.endpoint)
        start, end = ctx.view.window(at_s)
        step = chart_step(end - start, min_step_s=ctx.config.collector.scrape_interval)
        times = chart_times(end, end - start, step)
        window = max(step, ctx.config.engine.window)
        for pool in layout.pools(ctx):
            for model in _models(pool, slos):
                with st.container(border=True, key=f"quality-{pool.name}-{model}"):
                    st.subheader(f"Pool {pool.name} · {model}", anchor=False)
                    _now_quantiles(status, pool, model)
                    left, right = st.columns(2, gap="medium")
                    with left:
                        _latency(pool, model, slos, times, window, "ttft")
                    with right:
                        _latency(pool, model, slos, times, window, "e2e")
                    _errors(pool, model, slos, times, window)
        _burn_section(slos, at_s)


layout.live_fragment(ctx, body)
