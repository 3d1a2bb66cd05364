"""Anomalies: requests with more than ``[anomaly] token_multiplier`` × the mean tokens per
request (10× by default), from ``slo.objectives.anomaly.pool_anomalies``: exactly, request by
request, where the gateway recorded them; else the lower bound vLLM's token histograms allow."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import charts, data, layout
from dashboard import format as fmt
from dashboard.timeseries import chart_times
from vigil.conventions import ANOMALY_HISTOGRAM_LOWER_BOUND
from vigil.durations import format_duration

ctx = data.context()
#: The most anomaly windows one page evaluates (the window grows on long ranges instead).
MAX_WINDOWS = 48


def _windows(at_s: float) -> tuple[float, list[float]]:
    """The anomaly window (``[anomaly] window``, or longer on long ranges) and the ends of the
    windows tiling the range (multiples of it, so they are cached across refreshes)."""
    start, end = ctx.view.window(at_s)
    w = max(ctx.config.anomaly.window, (end - start) / MAX_WINDOWS)
    return w, chart_times(end, end - start, w)


def body() -> None:
    at_s = data.now(ctx)
    with data.empty_states(ctx):
        multiplier = ctx.config.anomaly.token_multiplier
        layout.header(ctx, "Anomalies", at_s,
                      f"a request is anomalous above {multiplier:g}× the mean tokens per "
                      "request (prompt + generated)")
        window, ends = _windows(at_s)
        exact_rows: list[dict[str, object]] = []
        estimates: list[dict[str, object]] = []
        with_records = False
        for pool in layout.pools(ctx):
            exact = [v for _, v in data.series(ctx, "exact_anomalies", ends, pool.name, window)
                     if v is not None]
            if any(v["records"] for v in exact):
                with_records = True
                seen = {str(r["id"]) for r in exact_rows}
                for v in exact:  # a request in two overlapping windows is listed once
                    exact_rows += [r for r in v["rows"] if str(r["id"]) not in seen]
                    seen.update(str(r["id"]) for r in v["rows"])
                continue
            for t, anomalies in data.series(ctx, "anomalies", ends, pool.name, window):
                for a in anomalies:
                    if a["kind"] == ANOMALY_HISTOGRAM_LOWER_BOUND:
                        estimates.append({"window end": t, **a})
        if ctx.view.models:
            exact_rows = [r for r in exact_rows if r["model"] in ctx.view.models]
            estimates = [r for r in estimates if r["model"] in ctx.view.models]

        st.subheader("Requests over the threshold (gateway records)", anchor=False)
        if exact_rows:
            df = pd.DataFrame(sorted(exact_rows, key=lambda r: -float(r["time"] or 0.0)))
            df["time"] = [fmt.timestamp(t) if t else "" for t in df["time"]]
            st.dataframe(df, hide_index=True, key="anomalies-exact", column_config={
                "tokens": st.column_config.NumberColumn(format="%d"),
                "threshold_tokens": st.column_config.NumberColumn("threshold", format="%.0f"),
                "mean_tokens": st.column_config.NumberColumn("mean", format="%.0f"),
                "cost_usd": st.column_config.NumberColumn("cost", format="$%.4f"),
            })
            st.caption(f"{len(exact_rows)} request(s), each compared with the mean of its "
                       f"pool and model over its {format_duration(window)} window.")
        elif with_records:
            st.success("No request in the gateway's records went over the threshold.",
                       icon=":material/check_circle:")
        else:
            st.info("**No gateway data.** Each request's tokens, tier and cost are known only "
                    f"to the gateway: run `vigil gateway --config {ctx.path}` in front of the "
                    "pools. Until then, the estimate below comes from vLLM's histograms.",
                    icon=":material/alt_route:")

        st.subheader("Estimate from vLLM's token histograms", anchor=False)
        if not estimates:
            st.success(f"No {format_duration(window)} window of the range has a request "
                       "certainly over the threshold (pools with gateway data are counted "
                       "exactly above).", icon=":material/check_circle:")
            return
        df = pd.DataFrame([{
            "window end": fmt.timestamp(e["window end"]), "pool": e["pool"],
            "model": e["model"], "at least": e["requests_above"],
            "of requests": e["requests"], "threshold tokens": e["threshold_tokens"],
            "mean tokens": e["mean_tokens_per_request"],
        } for e in sorted(estimates, key=lambda e: -float(e["window end"]))])
        ordered = sorted(estimates, key=lambda e: float(e["window end"]))
        chart_df = pd.DataFrame([{
            "window": f"{fmt.timestamp(float(e['window end']))[5:16]} {e['pool']}",
            "requests": e["requests_above"]} for e in ordered])
        st.markdown(f"**Requests certainly over the threshold**, per {format_duration(window)} "
                    "window (labelled by its end, UTC)")
        layout.chart(charts.bars(chart_df, x="window", y="requests", x_title="window end",
                                 y_title="requests (at least)", y_format="d",
                                 sort=list(chart_df["window"])), chart_df, "")
        st.dataframe(df, hide_index=True, key="anomalies-estimate", column_config={
            "of requests": st.column_config.NumberColumn(format="%.0f"),
            "threshold tokens": st.column_config.NumberColumn(format="%.0f"),
            "mean tokens": st.column_config.NumberColumn(format="%.0f"),
        })
        st.caption("A lower bound: a request counts only when its prompt alone, or its "
                   "generation alone, falls in a histogram bucket wholly above the threshold. "
                   f"Windows of {format_duration(window)}"
                   + ("" if math.isclose(window, ctx.config.anomaly.window)
                      else f" (the range is long: `[anomaly] window` is "
                           f"{format_duration(ctx.config.anomaly.window)})") + ".")


layout.live_fragment(ctx, body)
