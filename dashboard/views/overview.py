"""Overview: per pool, the SLO tiles, GPU cost per 1000 requests beside the scaling
recommendation, and the firing alerts. Every number is a field of ``slo.status.evaluate``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from dashboard import data, layout
from dashboard import format as fmt
from dashboard.alerts_view import FROM_SERVE
from dashboard.status_view import (
    ACTION_COLORS,
    STATE_COLORS,
    filter_slos,
    scaling_view,
    slo_goal,
    slo_state,
)
from dashboard.timeseries import chart_step, chart_times
from vigil.config import PoolConfig
from vigil.conventions import INDICATOR_REPLICA_UP, SOURCE_EMBEDDED

ctx = data.context()
#: Points of the cost sparkline (a glance at the trend; the Business page has the detail).
SPARK_POINTS = 30


def _targets(at_s: float) -> None:
    """Tell what to do when targets are missing, down or silent (embedded store only: with
    Prometheus, its own targets page says it)."""
    cfg = ctx.config
    if not cfg.targets and not cfg.discovery:
        st.info(f"**No targets are configured.** Add a `[[targets]]` entry per vLLM server "
                f"(its `/metrics` URL and pool) to `{ctx.path}`, then run "
                f"`vigil serve --config {ctx.path}`. See `vigil.example.toml`.",
                icon=":material/lan:")
        return
    states = data.point(ctx, "targets", at_s)
    down = [t for t in states if t.state == "down"]
    silent = [t for t in states if t.state == "no data"]
    if down:
        st.error("**Target down:** " + ", ".join(f"`{t.name}` ({t.url})" for t in down)
                 + ". Its last scrape failed; `vigil targets --config "
                 f"{ctx.path}` shows the error.", icon=":material/cloud_off:")
    if silent and len(silent) == len(states):
        st.warning("**No `up` sample from any target in the last lookback.** Each scrape "
                   "writes one: is the collector running? Start "
                   f"`vigil serve --config {ctx.path}`.", icon=":material/hourglass_empty:")
    elif silent:
        st.warning("**No `up` sample from** " + ", ".join(f"`{t.name}`" for t in silent)
                   + " in the last lookback.", icon=":material/hourglass_empty:")


def _cost_trend(pool: PoolConfig, at_s: float) -> list[float]:
    """Cost per 1000 requests over the view's range, for the metric's sparkline: the engine's
    ``pool_cost`` at ``SPARK_POINTS`` instants (the Business page draws it in full)."""
    start, end = ctx.view.window(at_s)
    step = chart_step(end - start, min_step_s=ctx.config.collector.scrape_interval,
                      max_points=SPARK_POINTS)
    window = max(step, ctx.config.engine.cost_window)
    return [c["per_1000_requests"] for _, c in data.series(
        ctx, "cost", chart_times(end, end - start, step), pool.name, window)
            if c["per_1000_requests"] is not None]


def _cost(col: Any, pool: PoolConfig, block: Mapping[str, Any], at_s: float) -> None:
    cost = block.get("cost") or {}
    with col:
        trend = _cost_trend(pool, at_s)
        st.metric("GPU cost per 1000 requests", fmt.usd(cost.get("per_1000_requests")),
                  help=f"GPU-hours the pool's replicas were up over the last "
                       f"{cost.get('window', '1h')} × {fmt.usd(cost.get('usd_per_gpu_hour'))} "
                       "per GPU-hour, divided by the requests finished in it. Idle time is "
                       "paid for, so it counts. The line: the same over the range.",
                  chart_data=trend if len(trend) > 1 else None, chart_type="area",
                  delta_color="gray")
        st.caption(
            f"per 1M output tokens **{fmt.usd(cost.get('per_million_output_tokens'))}** · "
            f"{fmt.usd(cost.get('cost_usd'))} over {cost.get('window', '')} "
            f"({fmt.count(cost.get('requests'))} requests) · idle "
            f"{fmt.percent(cost.get('idle_share'), 0)} = {fmt.usd(cost.get('idle_cost_usd'))}")


def _scaling(col: Any, block: Mapping[str, Any], at_s: float) -> None:
    sv = scaling_view(block.get("scaling"), at_s)
    with col:
        if sv is None:
            st.caption("No scaling recommendation (the engine's scaling module is missing).")
            return
        st.badge(sv.action.replace("_", " "), color=ACTION_COLORS.get(sv.action, "gray"),
                 icon=":material/swap_vert:")
        change = sv.change
        st.metric("Replicas: current → desired",
                  f"{fmt.count(sv.current)} → {fmt.count(sv.desired)}",
                  delta=None if not change else f"{change:+d} replica(s)",
                  delta_color="off" if not change else "inverse")
        reasons = sv.reasons or ["every signal is within its thresholds"]
        st.markdown("\n".join(f"- {r}" for r in reasons))
        when = fmt.timestamp(sv.next_decision_at) if sv.next_decision_at else fmt.NULL
        st.caption(f"Next decision: **{sv.next_decision}** ({when})")


def _signals(col: Any, block: Mapping[str, Any]) -> None:
    kv = block.get("kv_cache_usage") or {}
    signals = (block.get("scaling") or {}).get("signals") or {}
    with col:
        st.metric("KV-cache usage (mean / max)",
                  f"{fmt.percent(kv.get('avg'), 0)} / {fmt.percent(kv.get('max'), 0)}")
        st.metric("Queue (waiting requests)", fmt.count(block.get("queue_length")))
        st.metric("TTFT p95 (pool)", fmt.seconds(signals.get("ttft_p95_seconds")))


def _slo_tile(slo: Mapping[str, Any]) -> None:
    state = slo_state(slo)
    with st.container(border=True, key=f"slo-{slo['name']}"):
        st.markdown(f"**{slo['name']}** :{STATE_COLORS[state]}-badge[{state}]")
        st.caption(slo_goal(slo))
        sli, objective = slo.get("sli"), slo.get("objective")
        delta = None if sli is None or objective is None else (
            f"{(sli - objective) * 100:+.2f} pp vs objective")
        st.metric(f"SLI over {slo.get('period')}", fmt.percent(sli, 2), delta=delta,
                  help=slo.get("reason") or (
                      "Share of scrape time the replicas were up, over the period."
                      if slo.get("indicator") == INDICATOR_REPLICA_UP
                      else "Good requests over the period."))
        budget = slo.get("budget_remaining")
        st.progress(0.0 if budget is None else min(1.0, max(0.0, budget)),
                    text=f"Error budget left: **{fmt.percent(budget, 1)}**")
        windows = slo.get("windows") or {}
        current = slo.get("current") or {}
        burns = " · ".join(f"{w} {fmt.ratio((windows.get(w) or {}).get('burn_rate'), 1)}"
                           for w in ("5m", "1h", "6h") if w in windows)
        st.caption(f"now ({current.get('window', '')}): {fmt.percent(current.get('sli'), 2)}"
                   f"  \nburn {burns}")


def _pool(pool: PoolConfig, block: Mapping[str, Any], slos: list[Mapping[str, Any]],
          at_s: float) -> None:
    with st.container(border=True, key=f"pool-{pool.name}"):
        st.subheader(f"Pool {pool.name}", anchor=False)
        st.caption(f"{pool.model} · {pool.gpus_per_replica} × {pool.gpu} per replica · "
                   f"{fmt.count(block.get('replicas_up'))} replica(s) up · "
                   f"{pool.min_replicas}–{pool.max_replicas} allowed")
        cost_col, scaling_col, signal_col = st.columns([1.1, 2.0, 1.1], gap="medium")
        _cost(cost_col, pool, block, at_s)
        _scaling(scaling_col, block, at_s)
        _signals(signal_col, block)
        if not slos:
            st.caption("No SLO of this pool matches the filters.")
        for i in range(0, len(slos), 4):
            cols = st.columns(4)
            for col, slo in zip(cols, slos[i:i + 4], strict=False):
                with col:
                    _slo_tile(slo)


def _alerts(at_s: float) -> None:
    st.subheader("Firing alerts", anchor=False)
    rows, origin = data.firing_alerts(ctx, at_s)
    if ctx.view.pools:
        rows = [r for r in rows if not r["pool"] or r["pool"] in ctx.view.pools]
    if origin == FROM_SERVE:
        note = "from `vigil serve`'s last evaluation (being delivered)"
    else:
        note = ("evaluated here from the status above (`vigil serve` is not running for this "
                "config, or the view is pinned); start it to have them delivered")
    if not rows:
        st.success(f"Nothing is firing ({note}).", icon=":material/check_circle:")
        return
    for r in rows:
        r["since"] = fmt.timestamp(r["since"]) if r["since"] else ""
    columns = ["severity", "alert", "pool", "subject", "summary"]
    columns += [c for c in ("since", "routes") if any(r[c] for r in rows)]
    # Every alert visible without scrolling inside the table (rows of 35 px, as Streamlit's).
    st.dataframe(rows, hide_index=True, key="alerts", column_order=columns,
                 height=min(36 * (len(rows) + 1) + 2, 800))
    st.caption(f"{len(rows)} alert(s) {note}.")


def body() -> None:
    at_s = data.now(ctx)
    st.title("Overview")  # before the status: a missing store still gets its page
    with data.empty_states(ctx):
        status = data.status(ctx, at_s)
        layout.header(ctx, None, at_s,
                      f"source {status['source']} · PromQL {status['promql_semantics']} · "
                      f"SLI window {status['window']}")
        for warning in status.get("warnings") or []:
            # From the Prometheus-compatible server (a store that did not answer, a result cut
            # by a limit), a short retention, or SLOs computed from raw series where the
            # store's recorded ones were expected: the figures below may differ from its alerts.
            st.warning(f"**Warning:** {warning}. The figures on this page "
                       "may come from part of the data, or differ from the store's alerts.",
                       icon=":material/warning:")
        recorded = status.get("recorded_rules")
        if recorded is not None and recorded.get("read"):
            st.caption(f"SLO ratios of {', '.join(recorded['read'])}: the series the store's "
                       "evaluation of Vigil's recording rules recorded (what its alerts see).")
        if not ctx.config.pools:
            st.info(f"**No pools are configured.** Add a `[[pools]]` entry (name, model, GPU) "
                    f"and its `[[targets]]` to `{ctx.path}`; see `vigil.example.toml`.",
                    icon=":material/settings:")
            return
        if status["source"] == SOURCE_EMBEDDED:
            _targets(at_s)
        slos = filter_slos(status["slos"], pools=ctx.view.pools, models=ctx.view.models,
                           endpoint=ctx.view.endpoint)
        for pool in layout.pools(ctx):
            _pool(pool, status["pools"][pool.name], [s for s in slos if s["pool"] == pool.name],
                  at_s)
        _alerts(at_s)


layout.live_fragment(ctx, body)
